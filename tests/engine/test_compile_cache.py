"""The compile cache location: Triton's and torch inductor's variables point under the chosen directory."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from omni_gateway.engine.compile_cache import use_compile_cache
from omni_gateway.engine.config import EngineConfig


def test_the_cache_directory_is_created_and_both_compilers_point_into_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("TRITON_CACHE_DIR", raising=False)
    monkeypatch.delenv("TORCHINDUCTOR_CACHE_DIR", raising=False)
    root = use_compile_cache(str(tmp_path / "kernels"))
    assert root == (tmp_path / "kernels").resolve() and root.is_dir()
    assert Path(os.environ["TRITON_CACHE_DIR"]).parent == root
    assert Path(os.environ["TORCHINDUCTOR_CACHE_DIR"]).parent == root


def test_triton_reads_the_directory_when_it_compiles(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from triton import knobs

    monkeypatch.delenv("TRITON_CACHE_DIR", raising=False)
    use_compile_cache(str(tmp_path))
    assert Path(knobs.cache.dir) == tmp_path.resolve() / "triton"


def test_config_checks_the_warmup_mode_and_the_cache_path() -> None:
    with pytest.raises(ValueError, match="warmup must be"):
        EngineConfig(warmup="sometimes")
    with pytest.raises(ValueError, match="compile_cache_dir"):
        EngineConfig(compile_cache_dir="")
    assert EngineConfig().warmup == "auto" and EngineConfig().compile_cache_dir is None
