"""Every bad model input fails with ModelLoadError and a message naming the problem."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from omni_gateway.engine.config import EngineConfig
from omni_gateway.engine.errors import ModelLoadError
from omni_gateway.engine.runner.loader import default_model_path, load_model
from safetensors.torch import load_file, save_file

from tests.harness.checkpoints import save_tiny_checkpoint


@pytest.fixture(scope="module")
def good_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    directory = tmp_path_factory.mktemp("good")
    save_tiny_checkpoint("qwen3", directory)
    return directory


def _copy(good: Path, tmp_path: Path) -> Path:
    target = tmp_path / "model"
    shutil.copytree(good, target)
    return target


def _load(path: Path | str) -> None:
    load_model(EngineConfig(model=str(path)))


def test_good_directory_loads(good_dir: Path) -> None:
    loaded = load_model(EngineConfig(model=str(good_dir)))
    assert loaded.architecture == "Qwen3ForCausalLM"
    assert loaded.eos_token_ids == frozenset({0})
    assert loaded.vocab_size == 384 and loaded.max_model_len == 256
    assert loaded.chat_template is not None


def test_missing_path() -> None:
    with pytest.raises(ModelLoadError, match="does not exist"):
        _load("/nonexistent/model/dir")


def test_directory_without_config(good_dir: Path, tmp_path: Path) -> None:
    path = _copy(good_dir, tmp_path)
    (path / "config.json").unlink()
    with pytest.raises(ModelLoadError, match="no config.json"):
        _load(path)


def test_directory_without_weights(good_dir: Path, tmp_path: Path) -> None:
    path = _copy(good_dir, tmp_path)
    for f in path.glob("*.safetensors"):
        f.unlink()
    with pytest.raises(ModelLoadError, match=r"no \*\.safetensors"):
        _load(path)


def test_corrupt_safetensors(good_dir: Path, tmp_path: Path) -> None:
    path = _copy(good_dir, tmp_path)
    weights = next(path.glob("*.safetensors"))
    weights.write_bytes(weights.read_bytes()[:100])
    with pytest.raises(ModelLoadError, match="corrupt safetensors"):
        _load(path)


def test_unsupported_architecture_lists_supported(good_dir: Path, tmp_path: Path) -> None:
    path = _copy(good_dir, tmp_path)
    config = json.loads((path / "config.json").read_text())
    config.update(architectures=["GPT2LMHeadModel"], model_type="gpt2")
    (path / "config.json").write_text(json.dumps(config))
    with pytest.raises(ModelLoadError, match="unsupported architecture.*LlamaForCausalLM.*Qwen3ForCausalLM"):
        _load(path)


def test_missing_tensors_are_named(good_dir: Path, tmp_path: Path) -> None:
    path = _copy(good_dir, tmp_path)
    weights = next(path.glob("*.safetensors"))
    tensors = load_file(str(weights))
    del tensors["model.layers.1.self_attn.k_norm.weight"]
    save_file(tensors, str(weights), metadata={"format": "pt"})
    with pytest.raises(ModelLoadError, match=r"lacks 1 required tensor\(s\): model\.layers\.1\.self_attn\.k_norm"):
        _load(path)


def test_corrupt_gguf(tmp_path: Path) -> None:
    garbage = tmp_path / "broken.gguf"
    garbage.write_bytes(b"not a gguf file at all" * 100)
    with pytest.raises(ModelLoadError, match="corrupt or unreadable GGUF"):
        _load(garbage)
    truncated = tmp_path / "truncated.gguf"
    with open(default_model_path(), "rb") as src:
        truncated.write_bytes(src.read(1 << 16))
    with pytest.raises(ModelLoadError, match="GGUF"):
        _load(truncated)


def test_file_of_unknown_kind(tmp_path: Path) -> None:
    path = tmp_path / "model.bin"
    path.write_bytes(b"\0" * 16)
    with pytest.raises(ModelLoadError, match="neither a directory nor a .gguf"):
        _load(path)


def test_context_longer_than_model(good_dir: Path) -> None:
    with pytest.raises(ModelLoadError, match="exceeds the model's context length 256"):
        load_model(EngineConfig(model=str(good_dir), max_model_len=1024))


def test_sliding_window_caps_the_context(tmp_path: Path) -> None:
    save_tiny_checkpoint("mistral", tmp_path)
    loaded = load_model(EngineConfig(model=str(tmp_path)))
    assert loaded.architecture == "MistralForCausalLM"
    assert loaded.max_model_len == 64  # full attention equals windowed attention only up to the window
