"""The decode-attention benchmark's sweep planning, which needs no GPU: --grid parsing and the
launches a sweep would time.

The benchmark imports Triton, so it is imported inside the tests: tests/kernels/conftest.py must
set TRITON_INTERPRET before Triton's first import, and it runs when pytest collects that
directory, after this module has been collected."""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def test_grid_parses_integer_and_flag_fields():
    from benchmarks.kernels import parse_grid

    assert parse_grid("num_stages=3,5") == ("num_stages", [3, 5])
    assert parse_grid("fused_reduce=0,1") == ("fused_reduce", [False, True])
    for bad in ("stages=3", "num_stages=", "fused_reduce=2", "block_n=a"):
        with pytest.raises(argparse.ArgumentTypeError):
            parse_grid(bad)


def test_sweep_is_the_product_around_the_base():
    from omni_gateway.kernels.attention_config import DecodeConfig

    from benchmarks.lib.attention_cases import decode_sweep

    base = DecodeConfig(min_split_tokens=64)
    configs = decode_sweep(base, {"block_n": [64, 128], "num_stages": [3, 5, 6]})
    assert len(configs) == 6 and len(set(configs)) == 6
    assert {(c.block_n, c.num_stages) for c in configs} == {(b, s) for b in (64, 128) for s in (3, 5, 6)}
    assert all(c.min_split_tokens == 64 for c in configs)


def test_plan_counts_distinct_launches_without_a_gpu():
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "benchmarks.kernels",
            "--plan",
            "--heads",
            "32:4",
            "--batches",
            "16",
            "--contexts",
            "1024",
            "--grid",
            "target_programs=64,128,264",
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    # 64 (sequence, KV head) pairs: 1, 2 and 4 splits are three launches besides the 396-program base (6).
    assert "4 distinct launches" in out
    assert "1 splits" in out and "2 splits" in out and "4 splits" in out and "6 splits" in out
