"""Instructions per weight of the decode linears, compiled for Hopper (sm_90) on any machine, a GPU or
not: what instruction issue alone allows of the HBM bandwidth roofline on an H100 and an H200.

    python -m benchmarks.analysis.kernel_sass                    # bf16, FP8 per channel and int4 on the 8B shapes
    python -m benchmarks.analysis.kernel_sass --shapes o         # one shape
    python -m benchmarks.analysis.kernel_sass --rows 4 --formats fp8-channel,int4   # a decode step of 4 sequences
    python -m benchmarks.analysis.kernel_sass --attention 256    # decode attention over a bf16 and an FP8 KV cache

A decode linear streams its weight once, so its floor is the weight's bytes over the HBM bandwidth. Its
main loop also issues instructions, at most four warp instructions per clock per SM: a loop that issues
``i`` instructions per weight byte runs at no more than ``issue rate / (i x bandwidth)`` of the roofline,
however well its loads overlap. Each case goes through the public linear function with the batch-1
fusions of that shape (``benchmarks.quant_sweep.ROW_FUSIONS``) and its shipped config; the launch is
caught before it runs and the same kernel is compiled by Triton for sm_90 and disassembled with the
``cuobjdump`` that Triton ships. The loop is the body of the widest backward branch.

Run it under the Triton the GPU runs: versions lay the same kernel out differently (one int4 variant counted
4.5 instructions a weight under Triton 3.9 and 9.4 under 3.6, and took twice the time on an H100).
"""

from __future__ import annotations

import argparse
import collections
import os
import re
import shutil
import subprocess
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from unittest import mock

from benchmarks.lib.common import ResultLog, add_out_argument
from benchmarks.quant_sweep import ROW_FUSIONS
from benchmarks.quant_sweep import SHAPES as SWEEP_SHAPES

SHAPES = {name: shape for name, shape in SWEEP_SHAPES.items() if name != "lm_head"}  # a layer's linears
FORMATS = ("bf16", "fp8-channel", "int4")
GROUP = 128
LAYERS = 32  # Llama-3.1-8B


@dataclass(frozen=True)
class Machine:
    name: str
    sms: int
    clock_hz: float  # boost clock
    hbm_bytes_s: float

    def issue_rate(self) -> float:
        """Thread instructions a second the SMs can issue: 4 warp instructions a clock each."""
        return self.sms * 4 * 32 * self.clock_hz

    def issue_per_byte(self) -> float:
        """Thread instructions the SMs can issue per byte the HBM delivers."""
        return self.issue_rate() / self.hbm_bytes_s


MACHINES = (Machine("H100 SXM", 132, 1.98e9, 3.35e12), Machine("H200", 132, 1.98e9, 4.8e12))


@dataclass(frozen=True)
class Launch:
    """A kernel launch caught before it runs: the kernel, its positional arguments and keywords."""

    fn: Any
    args: tuple[Any, ...]
    kwargs: dict[str, Any]


class LaunchCatcher:
    """Stands in for a Triton kernel: ``catcher[grid](*args, **kwargs)`` records the launch and runs nothing."""

    def __init__(self, fn: Any) -> None:
        self.fn = fn
        self.launches: list[Launch] = []

    def __getitem__(self, grid: object) -> Callable[..., None]:
        def launch(*args: Any, **kwargs: Any) -> None:
            self.launches.append(Launch(self.fn, args, kwargs))

        return launch


def _type(value: Any) -> str:
    import torch

    names = {
        torch.bfloat16: "bf16",
        torch.float16: "fp16",
        torch.float32: "fp32",
        torch.int32: "i32",
        torch.int64: "i64",
        torch.uint8: "u8",
        torch.float8_e4m3fn: "fp8e4nv",
    }
    if isinstance(value, torch.Tensor):
        return "*" + names[value.dtype]
    if isinstance(value, bool):
        return "i1"
    return "i32" if isinstance(value, int) else "fp32"


def compile_sm90(launch: Launch) -> bytes:
    """The cubin Triton builds for ``launch`` on sm_90, specialized as its launcher would on a GPU: pointers
    and integers that are multiples of 16 marked so, integers equal to 1 made constants."""
    import torch
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    fn = launch.fn
    skip = set(getattr(fn, "do_not_specialize", ()))
    skip |= {fn.arg_names[i] for i in skip if isinstance(i, int)}
    names = [p.name for p in fn.params if not p.is_constexpr]
    if len(names) != len(launch.args):
        raise ValueError(f"{fn.__name__}: expected {len(names)} positional arguments, got {len(launch.args)}")
    signature: dict[str, str] = {}
    constants: dict[str, Any] = {}
    attrs: dict[tuple[int, ...], list[list[Any]]] = {}
    for name, value in zip(names, launch.args, strict=True):
        if isinstance(value, int) and not isinstance(value, bool) and value == 1 and name not in skip:
            signature[name], constants[name] = "constexpr", 1
            continue
        signature[name] = _type(value)
        aligned = value.data_ptr() % 16 == 0 if isinstance(value, torch.Tensor) else isinstance(value, int)
        if name not in skip and aligned and (not isinstance(value, int) or value % 16 == 0):
            attrs[(fn.arg_names.index(name),)] = [["tt.divisibility", 16]]
    options = {k: launch.kwargs[k] for k in ("num_warps", "num_stages") if k in launch.kwargs}
    for name, value in launch.kwargs.items():
        if name not in ("num_warps", "num_stages", "launch_pdl"):
            signature[name], constants[name] = "constexpr", value
    signature = {name: signature[name] for name in fn.arg_names}  # the kernel's order
    from triton.experimental.gluon._runtime import GluonASTSource, GluonJITFunction

    source = (GluonASTSource if isinstance(fn, GluonJITFunction) else ASTSource)(fn, signature, constants, attrs)
    return triton.compile(source, target=GPUTarget("cuda", 90, 32), options=options).asm["cubin"]


def _cuobjdump() -> str:
    import triton

    bundled = Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "cuobjdump"
    found = str(bundled) if bundled.is_file() else shutil.which("cuobjdump")
    if found is None:
        raise SystemExit(f"benchmarks.analysis.kernel_sass needs cuobjdump: neither {bundled} nor one on PATH")
    return found


def disassemble(cubin: bytes) -> list[tuple[int, str]]:
    """``(address, instruction)`` of each SASS instruction in ``cubin``."""
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "kernel.cubin")
        Path(path).write_bytes(cubin)
        listing = subprocess.run([_cuobjdump(), "-sass", path], capture_output=True, text=True, check=True).stdout
    return parse_sass(listing)


_LINE = re.compile(r"^\s*/\*([0-9a-f]{4,})\*/\s+(.*?)\s*;")


def parse_sass(listing: str) -> list[tuple[int, str]]:
    return [(int(m.group(1), 16), m.group(2)) for m in map(_LINE.match, listing.splitlines()) if m]


def main_loop(instructions: list[tuple[int, str]]) -> list[str]:
    """The instructions of the widest loop: from a backward branch's target to the branch."""
    spans = []
    for address, text in instructions:
        target = re.search(r"\bBRA\s+(0x[0-9a-f]+)", text)
        if target and int(target.group(1), 16) < address:
            spans.append((address - int(target.group(1), 16), int(target.group(1), 16), address))
    if not spans:
        raise ValueError("no loop: the kernel has no backward branch")
    _, start, end = max(spans)
    return [text for address, text in instructions if start <= address <= end]


def opcode(instruction: str) -> str:
    """``LDG.E.128`` of ``@!P0 LDG.E.128 R4, desc[UR4][R2.64]``."""
    return re.sub(r"^@!?U?P\w+\s+", "", instruction).split()[0]


def loop_weights(launch: Launch) -> int:
    """Weights one thread reads in one pass of the loop: a ``BLOCK_N x BLOCK_K`` tile over the program's
    threads."""
    kw = launch.kwargs
    return kw["BLOCK_N"] * kw["BLOCK_K"] // (32 * kw["num_warps"])


@dataclass(frozen=True)
class LoopCount:
    """A launch's main loop compiled for sm_90: its instructions, by opcode."""

    opcodes: collections.Counter[str]

    @classmethod
    def of(cls, launch: Launch) -> LoopCount:
        return cls(collections.Counter(map(opcode, main_loop(disassemble(compile_sm90(launch))))))

    @property
    def instructions(self) -> int:
        return self.opcodes.total()

    def top(self, n: int = 4) -> str:
        return ", ".join(f"{op} {count}" for op, count in self.opcodes.most_common(n))


def roofline_ceilings(per_byte: float) -> dict[str, float]:
    """Per machine, the share of its HBM roofline a loop issuing ``per_byte`` instructions a byte can reach."""
    return {m.name: min(1.0, m.issue_per_byte() / per_byte) for m in MACHINES}


def row_launch(fmt: str, shape: str, rows: int = 1) -> Launch:
    """The launch a decode step of ``rows`` sequences makes for ``shape`` in ``fmt``, caught on the CPU: at
    one row the fused row linear (the batch-1 decode's), at 2 to 16 the quantized linear's ``tl.dot`` path."""
    import torch
    from omni_gateway.kernels import gemv, quant_gemv, quant_linear, validation

    if rows > 1 and fmt == "bf16":
        raise ValueError("bf16 is a one-row kernel here: above one row it runs cuBLAS")
    n, k = SHAPES[shape]
    fusion = ROW_FUSIONS[shape]
    features = n // 2 if fusion.get("gated") else n
    x = torch.empty(rows, k, dtype=torch.bfloat16)
    operands: dict[str, Any] = dict(
        norm_weight=torch.empty(k, dtype=torch.bfloat16) if fusion.get("norm") else None,
        eps=1e-5,
        residual=torch.empty(1, features, dtype=torch.bfloat16) if fusion.get("residual") else None,
        gated=bool(fusion.get("gated")),
    )
    module = gemv if fmt == "bf16" else quant_gemv
    catcher = LaunchCatcher(module._gemv_kernel)
    with (
        mock.patch.object(module, "_gemv_kernel", catcher),
        # what pdl() says on sm_90; the argument checks take CPU tensors as under the interpreter, while the
        # dispatch decides as on a GPU
        mock.patch.object(module, "pdl", lambda device: True),
        mock.patch.object(validation, "interpreting", lambda: True),
        mock.patch.object(quant_linear, "interpreting", lambda: False),
    ):
        if fmt == "bf16":
            gemv.row_linear(x, torch.empty(n, k, dtype=torch.bfloat16), **operands)
        elif fmt == "int4":
            packed = torch.empty(n, k // 2, dtype=torch.uint8)
            scales = torch.empty(n, k // GROUP, dtype=torch.bfloat16)
            zeros = torch.empty(n, k // GROUP, dtype=torch.uint8)
            if rows == 1:
                quant_linear.int4_row_linear(x, packed, scales, zeros, **operands)
            else:
                quant_linear.int4_linear(x, packed, scales, zeros)
        else:
            weight, scale = torch.empty(n, k, dtype=torch.float8_e4m3fn), torch.empty(n, dtype=torch.float32)
            if rows == 1:
                quant_linear.fp8_row_linear(x, weight, scale, **operands)
            else:
                quant_linear.fp8_linear(x, weight, scale)
    (launch,) = catcher.launches
    return launch


def attention_launch(cache: str, batch: int, context: int = 2048) -> Launch:
    """The decode attention launch of ``batch`` sequences of the 8B shape (32 query heads over 8 KV heads of
    128) with ``context`` cached tokens each, over a bf16 or an FP8 cache, as an H200 (132 SMs) would make it,
    caught on the CPU."""
    import torch
    from omni_gateway.kernels import attention_config, paged_decode, validation

    heads, kv_heads, dim, page = 32, 8, 128, 16
    dtype = {"bf16": torch.bfloat16, "fp8": torch.float8_e4m3fn}[cache]
    blocks = batch * context // page
    k_cache, v_cache = (torch.empty(blocks, page, kv_heads, dim, dtype=dtype) for _ in range(2))
    config = attention_config.gpu_decode_config(132, batch, kv_heads, context, head_dim=dim, element_size=2)
    catcher = LaunchCatcher(paged_decode._decode_split_kernel)
    with (
        mock.patch.object(paged_decode, "_decode_split_kernel", catcher),
        mock.patch.object(validation, "interpreting", lambda: True),
    ):
        paged_decode.paged_decode_attention(
            torch.empty(batch, heads, dim, dtype=torch.bfloat16),
            k_cache,
            v_cache,
            torch.empty(batch, dtype=torch.int32),
            torch.empty(batch, context // page, dtype=torch.int32),
            0.1,
            config=config,
        )
    return catcher.launches[0]


def attention_table(log: ResultLog, batch: int) -> None:
    """Decode attention's main loop per byte of K and V it reads, over a bf16 and an FP8 cache."""
    print(f"decode attention, {batch} sequences x 2,048 tokens: loop instructions per K/V byte")
    for cache in ("bf16", "fp8"):
        launch = attention_launch(cache, batch)
        count = LoopCount.of(launch)
        kw, k_cache = launch.kwargs, launch.args[1]
        kv_bytes = kw["BLOCK_N"] * kw["HEAD_DIM"] * 2 * k_cache.element_size() / (32 * kw["num_warps"])
        per_byte = count.instructions / kv_bytes
        ceilings = roofline_ceilings(per_byte)
        log.write(
            "attention",
            cache=cache,
            batch=batch,
            config={key: kw[key] for key in ("BLOCK_N", "num_warps", "num_stages")},
            loop_instructions=count.instructions,
            per_byte=round(per_byte, 3),
            roofline_ceiling=ceilings,
            opcodes=dict(count.opcodes.most_common()),
        )
        cells = "".join(f"  {name} ceiling {c:.0%}" for name, c in ceilings.items())
        print(
            f"{cache:5} {count.instructions:5d} instructions, {per_byte:.2f} a byte{cells}  {count.top()}", flush=True
        )


def linear_table(log: ResultLog, shapes: list[str], formats: list[str], rows: int) -> None:
    """Each shape's decode linear in each format: its main loop per weight and per byte, then what a token's
    pass over these shapes takes at least, to issue and to read."""
    header = "".join(f"{m.name + ' ceiling':>18}" for m in MACHINES)
    print(f"{'shape':8} {'format':12} {'loop':>6} {'per weight':>11} {'per byte':>9}{header}  top opcodes")
    per_weight_of: dict[tuple[str, str], float] = {}
    for shape in shapes:
        for fmt in formats:
            launch = row_launch(fmt, shape, rows)
            count = LoopCount.of(launch)
            per_weight = per_weight_of[shape, fmt] = count.instructions / loop_weights(launch)
            per_byte = per_weight / bytes_per_weight(fmt, SHAPES[shape][1])
            ceilings = roofline_ceilings(per_byte)
            log.write(
                "loop",
                shape=shape,
                format=fmt,
                config={key: launch.kwargs[key] for key in ("BLOCK_N", "BLOCK_K", "num_warps")},
                loop_instructions=count.instructions,
                weights_per_pass=loop_weights(launch),
                per_weight=round(per_weight, 3),
                per_byte=round(per_byte, 3),
                roofline_ceiling=ceilings,
                opcodes=dict(count.opcodes.most_common()),
            )
            cells = "".join(f"{ceilings[m.name]:>17.0%} " for m in MACHINES)
            print(
                f"{shape:8} {fmt:12} {count.instructions:6d} {per_weight:11.2f} {per_byte:9.2f}{cells} {count.top()}",
                flush=True,
            )
    step = f"one decode step of {rows} rows" if rows > 1 else "one token"
    print(f"\nthese linears of {LAYERS} layers, {step}: the loops' issue floor against the bandwidth floor")
    for fmt in formats:
        floors = token_floors(fmt, {shape: per_weight_of[shape, fmt] for shape in shapes})
        log.write("token", format=fmt, shapes=shapes, layers=LAYERS, floors_ms=floors)
        print(
            f"{fmt:12}"
            + "".join(
                f"  {name}: issue {f['issue']:.3f} ms, bandwidth {f['bandwidth']:.3f} ms" for name, f in floors.items()
            )
        )


def bytes_per_weight(fmt: str, k: int) -> float:
    """HBM bytes per weight: the weight and its scales (per group, or per channel over ``k``)."""
    if fmt == "int4":
        return 0.5 + 3 / GROUP
    return {"bf16": 2.0, "fp8-channel": 1.0 + 4 / k}[fmt]


def token_floors(fmt: str, per_weight: dict[str, float]) -> dict[str, dict[str, float]]:
    """Per machine, the milliseconds a token's pass over these shapes in ``LAYERS`` layers takes at least: to
    issue the loops' instructions, and to read the weights' bytes."""
    weights = {shape: SHAPES[shape][0] * SHAPES[shape][1] * LAYERS for shape in per_weight}
    instructions = sum(weights[s] * per_weight[s] for s in per_weight)
    data = sum(weights[s] * bytes_per_weight(fmt, SHAPES[s][1]) for s in per_weight)
    return {
        m.name: {"issue": 1e3 * instructions / m.issue_rate(), "bandwidth": 1e3 * data / m.hbm_bytes_s}
        for m in MACHINES
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--shapes", default=",".join(SHAPES), help="comma-separated, of " + ",".join(SHAPES))
    parser.add_argument("--formats", default=",".join(FORMATS), help="comma-separated, of " + ",".join(FORMATS))
    parser.add_argument(
        "--rows", type=int, default=1, help="sequences in the decode step, 1 to 16 (bf16 only at 1; default 1)"
    )
    parser.add_argument(
        "--attention",
        type=int,
        metavar="BATCH",
        help="count decode attention over a bf16 and an FP8 cache for BATCH sequences instead of the linears",
    )
    add_out_argument(parser, "kernel_sass")
    args = parser.parse_args()
    shapes, formats = args.shapes.split(","), args.formats.split(",")
    unknown = [s for s in shapes if s not in SHAPES] + [f for f in formats if f not in FORMATS]
    if unknown:
        raise SystemExit(f"unknown {unknown}: shapes {list(SHAPES)}, formats {list(FORMATS)}")
    if not 1 <= args.rows <= 16 or (args.rows > 1 and "bf16" in formats):
        raise SystemExit(f"--rows: expected 1 to 16, and bf16 (a one-row kernel here) only at 1; got {args.rows}")
    if os.environ.get("TRITON_INTERPRET", "0") == "1":
        raise SystemExit(
            "benchmarks.analysis.kernel_sass compiles for sm_90: unset TRITON_INTERPRET (it compiles nothing)"
        )
    import triton

    fields: dict[str, Any] = {"attention_batch": args.attention} if args.attention is not None else {"rows": args.rows}
    with ResultLog(args.out, "kernel_sass", triton=triton.__version__, target="sm_90", **fields) as log:
        if args.attention is not None:
            attention_table(log, args.attention)
        else:
            linear_table(log, shapes, formats, args.rows)


if __name__ == "__main__":
    main()
