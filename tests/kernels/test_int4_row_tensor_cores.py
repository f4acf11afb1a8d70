"""The int4 tensor-core row experiment (benchmarks/experiments/int4_row_tensor_cores.py): the Triton tile forms
give the twin's sums under the interpreter, split or not; a bad config names what it expected. The Gluon
fragment kernel is tested with its shipped form (tests/kernels/test_int4_fragments.py)."""

import argparse

import pytest
import torch
from omni_gateway.kernels import quant_reference as qref

from benchmarks.experiments import int4_row_layout as layout
from benchmarks.experiments import int4_row_tensor_cores as tensor_cores


def _case(n: int, k: int) -> tuple[torch.Tensor, tuple[torch.Tensor, ...], torch.Tensor]:
    torch.manual_seed(0)
    weights = layout._weights(n, k, 64, "cpu")
    x = torch.randn(1, k, dtype=torch.bfloat16)
    words, _, scales, zeros = weights[0]
    ref = x.double() @ qref.dequantize_int4(words.view(torch.uint8), scales, zeros, dtype=torch.float64).T
    return x, weights[0], ref


@pytest.mark.parametrize("variant", tensor_cores.TRITON_VARIANTS)
@pytest.mark.parametrize("split", [1, 2])
def test_triton_variants_match_twin(variant: str, split: int, rel_err) -> None:
    x, weight, ref = _case(128, 512)
    out = tensor_cores._call((variant, 64, 4, split), x, weight)
    assert out.shape == (1, 128)
    assert rel_err(out, ref) < tensor_cores.TOLERANCE


def test_config_parsing() -> None:
    assert tensor_cores.parse_config("fragments,128,4,2") == ("fragments", 128, 4, 2)
    with pytest.raises(argparse.ArgumentTypeError, match="variant,block_n,warps,split"):
        tensor_cores.parse_config("dense,128,4,2")
    with pytest.raises(argparse.ArgumentTypeError, match="variant,block_n,warps,split"):
        tensor_cores.parse_config("joined,128,4")
