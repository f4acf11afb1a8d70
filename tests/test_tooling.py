"""The linter, the formatter and the type checker, as configured in pyproject.toml, pass on the checkout."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SOURCE_FOLDERS = ("gateway", "omni", "encoders", "engine", "kernels")


def _run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", *args], cwd=ROOT, capture_output=True, text=True, timeout=600)


def test_ruff_lint_is_clean() -> None:
    done = _run("ruff", "check", "--no-cache", ".")
    assert done.returncode == 0, done.stdout[-6000:] + done.stderr[-2000:]


def test_ruff_format_leaves_nothing_to_change() -> None:
    done = _run("ruff", "format", "--no-cache", "--check", ".")
    assert done.returncode == 0, "run `ruff format .`:\n" + done.stdout[-6000:] + done.stderr[-2000:]


@pytest.mark.slow
def test_mypy_strict_is_clean(tmp_path: Path) -> None:
    # The installed layout, made of links: mypy resolves omni_gateway.* imports to the checkout's files.
    view = tmp_path / "omni_gateway"
    view.mkdir()
    for folder in SOURCE_FOLDERS:
        (view / folder).symlink_to(ROOT / folder, target_is_directory=True)
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "mypy",
            "--config-file",
            str(ROOT / "pyproject.toml"),
            "--cache-dir",
            str(tmp_path / "cache"),
        ],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stdout[-6000:] + done.stderr[-2000:]
