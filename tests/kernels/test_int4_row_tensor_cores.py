"""The int4 tensor-core row experiment (benchmarks/experiments/int4_row_tensor_cores.py): the Triton tile forms
give the twin's sums under the interpreter, split or not; the Gluon fragment kernel's reduction order pairs
each weight with its own activation (its torch twin), and compiled for sm_90 it keeps the weights out of
shared memory; a bad config names what it expected."""

import argparse
import json
import os
import subprocess
import sys

import pytest
import torch
from omni_gateway.kernels import quant_reference as qref

from benchmarks.experiments import int4_row_fragments as fragments
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


def test_fragment_order_pairs_each_weight_with_its_activation(rel_err) -> None:
    x, (words, _, scales, zeros), ref = _case(64, 512)
    assert rel_err(fragments.twin(x, words, scales, zeros), ref) < 1e-12
    # the activations in the weights' natural order instead: the sums no longer match
    natural = fragments.X_ORDER
    try:
        fragments.X_ORDER = tuple(range(7))
        assert rel_err(fragments.twin(x, words, scales, zeros), ref) > 0.1
    finally:
        fragments.X_ORDER = natural


def test_fragment_layouts_refuse_rows_the_warps_cannot_share() -> None:
    with pytest.raises(ValueError, match="multiple of 16 x warps"):
        fragments.layouts(32, 4)


SASS = """
import collections, json
from benchmarks import kernel_sass as ks
from benchmarks.experiments import int4_row_fragments as fragments
launch = fragments.sm90_launch(4096, 4096, block_n=128, warps=4, split=2, prefetch=False)
loop = ks.main_loop(ks.disassemble(ks.compile_sm90(launch)))
print(json.dumps(collections.Counter(map(ks.opcode, loop))))
"""


def test_fragment_kernel_keeps_weights_in_registers() -> None:
    """Compiled for sm_90 without a GPU: one tensor-core product per 16 x 8 x 16, one packed subtraction per
    pair of weights, and nothing through shared memory (the operand's layout is asserted trivial too)."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    run = subprocess.run([sys.executable, "-c", SASS], capture_output=True, text=True, timeout=300, env=env)
    assert run.returncode == 0, run.stderr[-2000:]
    opcodes = json.loads(run.stdout.strip().splitlines()[-1])
    weights = 128 * 128 // 128  # a group of the program's rows over its 128 threads
    assert opcodes["HMMA.16816.F32.BF16"] == weights // 8
    assert weights // 2 <= opcodes["HADD2.BF16_V2"] <= weights // 2 + 4  # + the zero points, per row
    assert not [op for op in opcodes if op.startswith(("LDS", "STS", "SHFL", "BAR"))]


def test_config_parsing() -> None:
    assert tensor_cores.parse_config("fragments,128,4,2") == ("fragments", 128, 4, 2)
    with pytest.raises(argparse.ArgumentTypeError, match="variant,block_n,warps,split"):
        tensor_cores.parse_config("dense,128,4,2")
    with pytest.raises(argparse.ArgumentTypeError, match="variant,block_n,warps,split"):
        tensor_cores.parse_config("joined,128,4")
