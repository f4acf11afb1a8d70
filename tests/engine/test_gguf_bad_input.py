"""Bad GGUF tensor data fails at load with ModelLoadError naming the problem, never as garbage output."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from gguf import GGMLQuantizationType, GGUFReader
from omni_gateway.engine.config import EngineConfig
from omni_gateway.engine.errors import ModelLoadError
from omni_gateway.engine.quant.gguf_blocks import SUPPORTED
from omni_gateway.engine.runner.loader import load_model

from tests.harness.gguf_files import write_tiny_gguf


def _load(path: Path) -> None:
    load_model(EngineConfig(model=str(path), tokenizer="unused-the-weights-fail-first"))


def _tensor_offset(path: Path, name: str) -> int:
    [tensor] = [t for t in GGUFReader(str(path)).tensors if t.name == name]
    return int(tensor.data_offset)


def test_unsupported_tensor_type_names_itself_and_the_supported_list(tmp_path: Path) -> None:
    path = write_tiny_gguf(tmp_path / "iq.gguf", GGMLQuantizationType.Q4_0, embed_type=GGMLQuantizationType.IQ4_NL)
    with pytest.raises(ModelLoadError, match="token_embd.weight.*IQ4_NL") as info:
        _load(path)
    assert all(name in str(info.value) for name in SUPPORTED)


@pytest.mark.parametrize("qtype", [GGMLQuantizationType.Q4_1, GGMLQuantizationType.Q4_K, GGMLQuantizationType.Q6_K])
@pytest.mark.parametrize("bad", [np.nan, np.inf])
def test_non_finite_block_scale_is_a_load_error(tmp_path: Path, qtype: GGMLQuantizationType, bad: float) -> None:
    path = write_tiny_gguf(tmp_path / "bad.gguf", qtype)
    offset = _tensor_offset(path, "blk.1.ffn_up.weight")
    # d sits first in Q4_1/Q4_K blocks and last (bytes 208..209) in Q6_K ones.
    offset += 208 if qtype == GGMLQuantizationType.Q6_K else 0
    data = bytearray(path.read_bytes())
    data[offset : offset + 2] = np.array([bad], dtype=np.float16).tobytes()
    path.write_bytes(bytes(data))
    with pytest.raises(ModelLoadError, match=r"blk\.1\.ffn_up\.weight.*non-finite"):
        _load(path)


def test_non_finite_float_tensor_is_a_load_error(tmp_path: Path) -> None:
    path = write_tiny_gguf(tmp_path / "bad.gguf", GGMLQuantizationType.Q8_0)
    offset = _tensor_offset(path, "output_norm.weight")
    data = bytearray(path.read_bytes())
    data[offset + 8 : offset + 12] = np.array([np.nan], dtype=np.float32).tobytes()
    path.write_bytes(bytes(data))
    with pytest.raises(ModelLoadError, match="output_norm.weight.*non-finite"):
        _load(path)


def test_truncated_tensor_data_is_a_load_error(tmp_path: Path) -> None:
    path = write_tiny_gguf(tmp_path / "cut.gguf", GGMLQuantizationType.Q4_1)
    data = path.read_bytes()
    path.write_bytes(data[: _tensor_offset(path, "blk.1.ffn_down.weight") + 100])
    with pytest.raises(ModelLoadError, match="GGUF"):
        _load(path)
