"""The SASS counter finds a kernel's main loop, and counts the loop the batch-1 decode launches."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from benchmarks.analysis.kernel_sass import Machine, main_loop, opcode, parse_sass

LISTING = """
        /*0000*/                   MOV R1, c[0x0][0x28] ;                /* 0x00000a0000017a02 */
        /*0010*/                   S2R R0, SR_TID.X ;                    /* 0x0000000000007919 */
        /*0020*/                   LDG.E R2, desc[UR4][R4.64] ;          /* 0x0000000404027981 */
        /*0030*/                   FFMA R3, R2, R2, R3 ;                 /* 0x0000000202037223 */
        /*0040*/               @P0 BRA 0x20 ;                            /* 0xfffffffc00f40947 */
        /*0050*/                   ISETP.GE.AND P1, PT, R0, 0x4, PT ;    /* 0x000000040000780c */
        /*0060*/                   LDG.E R6, desc[UR4][R4.64] ;          /* 0x0000000404067981 */
        /*0070*/              @!P1 BRA 0x60 ;                            /* 0xfffffffc00f89947 */
        /*0080*/                   EXIT ;                                /* 0x000000000000794d */
        /*0090*/                   BRA 0x90;                             /* 0xfffffffc00fc7947 */
"""


def test_the_main_loop_is_the_widest_backward_branch() -> None:
    loop = main_loop(parse_sass(LISTING))
    assert [opcode(text) for text in loop] == ["LDG.E", "FFMA", "BRA"]
    assert opcode("@!P1 BRA 0x60") == "BRA"


def test_a_kernel_without_a_loop_is_refused() -> None:
    with pytest.raises(ValueError, match="no backward branch"):
        main_loop(parse_sass(LISTING.replace("@P0 BRA 0x20", "NOP").replace("@!P1 BRA 0x60", "NOP")))


def test_issue_ceiling_arithmetic() -> None:
    """One SM at 1 GHz issues 128e9 thread instructions a second: 1.28 per byte at 100 GB/s."""
    assert Machine("one SM", 1, 1e9, 1e11).issue_per_byte() == pytest.approx(1.28)


def test_the_int4_decode_loop_masks_each_weight_once(tmp_path: Path) -> None:
    """Compiled for sm_90 without a GPU: the int4 one-row loop of the o projection issues one mask-and-or
    (LOP3) per 4-bit weight (kernels/quant_tiles.py), in the tuned config's tile."""
    from omni_gateway.kernels.quant_tuning import INT4_GROUPED, tuned_config

    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    out = tmp_path / "sass.jsonl"
    cmd = [
        sys.executable,
        "-m",
        "benchmarks.analysis.kernel_sass",
        "--shapes",
        "o",
        "--formats",
        "int4",
        "--out",
        str(out),
    ]
    run = subprocess.run(cmd, capture_output=True, text=True, timeout=300, env=env)
    assert run.returncode == 0, run.stderr
    (record,) = [r for r in map(json.loads, out.read_text().splitlines()) if r["kind"] == "loop"]
    config = tuned_config(INT4_GROUPED, 1, 4096, 4096)
    assert record["config"] == {"BLOCK_N": config.block_n, "BLOCK_K": config.block_k, "num_warps": config.num_warps}
    weights = record["weights_per_pass"]
    assert weights == config.block_n * config.block_k // (32 * config.num_warps)
    assert weights <= record["opcodes"]["LOP3.LUT"] < 2 * weights
    assert record["per_weight"] == pytest.approx(record["loop_instructions"] / weights, abs=1e-3)


def test_int4_rows_on_the_tensor_cores_mask_two_weights_at_once(tmp_path: Path) -> None:
    """Four rows of int4 run ``dot_tile`` (kernels/quant_tiles.py): one mask-and-or per pair of weights and
    one tensor-core product per 16 x 8 x 16 (the activations' sums take some more)."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    out = tmp_path / "sass.jsonl"
    cmd = [
        sys.executable,
        "-m",
        "benchmarks.analysis.kernel_sass",
        "--shapes",
        "gate_up",
        "--formats",
        "int4",
        "--rows",
        "4",
    ]
    run = subprocess.run([*cmd, "--out", str(out)], capture_output=True, text=True, timeout=300, env=env)
    assert run.returncode == 0, run.stderr
    (dot,) = [r for r in map(json.loads, out.read_text().splitlines()) if r["kind"] == "loop"]
    weights = dot["weights_per_pass"]
    assert weights // 2 <= dot["opcodes"]["LOP3.LUT"] < weights
    assert dot["opcodes"]["HMMA.16816.F32.BF16"] >= weights // 4


def test_under_the_interpreter_it_says_why_it_cannot_run() -> None:
    env = {**os.environ, "TRITON_INTERPRET": "1"}
    run = subprocess.run(
        [sys.executable, "-m", "benchmarks.analysis.kernel_sass"], capture_output=True, text=True, timeout=120, env=env
    )
    assert run.returncode == 1 and "unset TRITON_INTERPRET" in run.stderr


def test_bf16_above_one_row_is_refused() -> None:
    """bf16 runs cuBLAS above one row: there is no kernel of ours to count."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    run = subprocess.run(
        [sys.executable, "-m", "benchmarks.analysis.kernel_sass", "--rows", "4"],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
    )
    assert run.returncode == 1 and "bf16 (a one-row kernel here) only at 1; got 4" in run.stderr


def test_decode_attention_widens_an_fp8_cache_in_one_conversion(tmp_path: Path) -> None:
    """Over an FP8 cache the decode loop turns each pair of bytes into float16 at once
    (``F2FP.F16.E4M3.UNPACK_B``) and never converts float16 to bfloat16 on top, which cost one more
    instruction per value; the bf16 cache's loop has neither."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    out = tmp_path / "sass.jsonl"
    cmd = [sys.executable, "-m", "benchmarks.analysis.kernel_sass", "--attention", "256", "--out", str(out)]
    run = subprocess.run(cmd, capture_output=True, text=True, timeout=300, env=env)
    assert run.returncode == 0, run.stderr
    bf16, fp8 = [r for r in map(json.loads, out.read_text().splitlines()) if r["kind"] == "attention"]
    assert (bf16["cache"], fp8["cache"]) == ("bf16", "fp8")
    assert fp8["opcodes"].get("F2FP.F16.E4M3.UNPACK_B", 0) > 0 and "F2F.BF16.F16" not in fp8["opcodes"]
    assert "F2FP.F16.E4M3.UNPACK_B" not in bf16["opcodes"]
