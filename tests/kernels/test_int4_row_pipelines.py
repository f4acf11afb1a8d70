"""The int4 row-pipeline experiment's kernels (benchmarks/experiments/int4_row_pipelines.py) under the
interpreter: the words loaded straight, through pipeline stages or as TMA tiles give the twin's sums."""

import pytest
import torch
from omni_gateway.kernels import quant_reference as qref

from benchmarks.experiments import int4_row_pipelines as pipelines


@pytest.mark.parametrize("load", pipelines.LOADS)
@pytest.mark.parametrize("config", [(64, 256, 4, 1, 2), (64, 256, 4, 3, 1)], ids=["split2", "stages3"])
def test_row_matches_twin(load: str, config: tuple[int, ...]) -> None:
    torch.manual_seed(0)
    n, k = 128, 1024
    (weight,) = pipelines._weights(n, k, "cpu", config, tinygemm=False)
    x = torch.randn(1, k, dtype=torch.bfloat16)
    out = pipelines._row_call(load, config, x, weight)
    ref = x.double() @ qref.dequantize_int4(*weight[:3], dtype=torch.float64).T
    assert out.shape == (1, n)
    assert pipelines._rel_err(out, ref) < pipelines.TOLERANCE
