"""The sweep prints its winners as the tuning tables' literals: int4 at 2-16 rows into the per-shape table.

The sweep and the tuning module import Triton, so they are imported inside the test: tests/kernels/conftest.py
must set TRITON_INTERPRET before Triton's first import, and it runs after this module is collected."""

from __future__ import annotations

import ast

import pytest


def _tables(text: str) -> dict[str, dict[object, tuple[int, ...]]]:
    out = {}
    for block in text.strip().split("\n\n"):
        name, literal = block.split(" = ", 1)
        # the format names are the module's constants; as strings they parse the same
        for const in ("FP8_CHANNEL", "FP8_BLOCKWISE", "INT4_GROUPED"):
            literal = literal.replace(const, repr(const))
        out[name] = ast.literal_eval(literal)
    return out


def test_int4_above_one_row_goes_to_the_per_shape_table(capsys: pytest.CaptureFixture[str]) -> None:
    from omni_gateway.kernels.quant_tuning import QuantLinearConfig

    from benchmarks.quant_sweep import print_tables

    one_row = QuantLinearConfig(block_n=128, block_k=256, num_warps=8, stages=1, split_k=8)
    four_rows = QuantLinearConfig(block_n=128, block_k=128, stages=1, split_k=4)
    fp8 = QuantLinearConfig(block_n=32, block_k=256)
    print_tables(
        {
            (2, 1, 4096, 4096): (one_row, 9.4e-6, 16e-6),
            (2, 4, 28672, 4096): (four_rows, 65.1e-6, 84.8e-6),
            (0, 4, 6144, 4096): (fp8, 13.8e-6, 15.6e-6),
        }
    )
    tables = _tables(capsys.readouterr().out)
    assert tables["_TUNED"] == {
        ("FP8_CHANNEL", 4, 6144, 4096): (32, 256, 4, 3, 1),
        ("INT4_GROUPED", 1, 4096, 4096): (128, 256, 8, 1, 8),
    }
    assert tables["_TUNED_INT4_DOT"] == {(28672, 4096): (128, 128, 4, 1, 4)}
