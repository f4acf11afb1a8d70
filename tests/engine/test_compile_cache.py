"""The compile cache location: Triton's and torch inductor's variables point under the chosen directory;
and the record of the configurations a full warm-up filled it for."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from omni_gateway.engine.config import EngineConfig
from omni_gateway.engine.runner.compile_cache import configuration_key, is_warmed, mark_warmed, use_compile_cache
from omni_gateway.engine.runner.warmup import resolve_mode


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


def test_a_full_warm_up_is_recorded_per_configuration(tmp_path: Path) -> None:
    parts = {"model": "m", "max_num_seqs": 64, "gpu": "H200"}
    key = configuration_key(parts)
    assert key == configuration_key(dict(reversed(parts.items())))  # order of the parts does not matter
    assert key != configuration_key({**parts, "max_num_seqs": 128})
    assert not is_warmed(str(tmp_path), key)
    mark_warmed(str(tmp_path), key, parts)
    assert is_warmed(str(tmp_path), key)
    assert not is_warmed(str(tmp_path), configuration_key({**parts, "gpu": "H100"}))
    assert [p.name for p in (tmp_path / "warmed").iterdir()] == [key]  # no partial record left behind


@pytest.mark.parametrize(
    ("mode", "on_cuda", "cache_warmed", "runs"),
    [
        ("auto", True, False, "full"),
        ("auto", True, True, "minimal"),
        ("auto", False, False, "minimal"),
        ("full", True, True, "full"),
        ("off", True, False, "off"),
    ],
)
def test_auto_warm_up_is_full_until_the_cache_holds_the_configuration(
    mode: str, on_cuda: bool, cache_warmed: bool, runs: str
) -> None:
    assert resolve_mode(mode, on_cuda=on_cuda, cache_warmed=cache_warmed) == runs
