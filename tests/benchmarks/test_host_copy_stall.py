"""The host-copy stall benchmark refuses what it cannot measure, saying why."""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch


def _run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "benchmarks.host_copy_stall", *args], capture_output=True, text=True, timeout=120
    )


def test_a_bad_duration_is_refused() -> None:
    out = _run("--seconds", "0")
    assert out.returncode == 2 and "--seconds must be positive, got 0.0" in out.stderr


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the refusal without a GPU")
def test_without_a_gpu_it_says_so() -> None:
    out = _run("--seconds", "1")
    assert out.returncode == 2 and "needs a CUDA GPU" in out.stderr
