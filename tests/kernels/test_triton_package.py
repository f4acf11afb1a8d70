"""The kernels package imports neither Triton nor torch until a kernel module is asked for."""

from __future__ import annotations

import subprocess
import sys


def test_package_import_is_light():
    code = "import sys, omni_gateway.kernels; print(sorted(m for m in ('triton', 'torch') if m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"
