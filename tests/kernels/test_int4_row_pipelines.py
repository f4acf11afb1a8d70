"""The int4 row-pipeline experiment's kernels (benchmarks/experiments/int4_row_pipelines.py) under the
interpreter: the words loaded straight, with every other wave of programs a sub-tile behind, through pipeline
stages or as TMA tiles give the twin's sums."""

import pytest
import torch
from omni_gateway.kernels import quant_reference as qref

from benchmarks.experiments import int4_row_pipelines as pipelines


@pytest.mark.parametrize("load", pipelines.LOADS)
@pytest.mark.parametrize("config", [(64, 256, 4, 1, 2), (64, 256, 4, 3, 1)], ids=["split2", "stages3"])
def test_row_matches_twin(load: str, config: tuple[int, ...], rel_err) -> None:
    torch.manual_seed(0)
    n, k = 128, 1024
    weights = pipelines.weight_sets(n, k, "cpu", tinygemm=False)
    (desc,) = pipelines._descriptors(weights, config[0])
    x = torch.randn(1, k, dtype=torch.bfloat16)
    out = pipelines._row_call(load, config, x, weights[0], desc)
    ref = x.double() @ qref.dequantize_int4(*weights[0], dtype=torch.float64).T
    assert out.shape == (1, n)
    assert rel_err(out, ref) < pipelines.TOLERANCE
