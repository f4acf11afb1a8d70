"""What the folds of kernels/int4_fragments.py save at each 8B shape of a batch-1 decode layer, one bfloat16
row timed in CUDA graphs over weight sets larger than L2, each output checked against the unfused layer's
twin (kernels/reference.py ``row_linear``, and ``rotary_write_kv`` for the qkv projection):

- the gate/up and qkv projections with their RMSNorm in the loop (the previous design, the baseline) and
  folded into the linear before (``NormedRow``: the activations come scaled, the squares summed);
- the o and down projections plain and writing the next norm's input (``next_norm``);
- the qkv projection with the rotary kernel after it, and rotating and caching in its epilogue (``rotary``).

    python -m benchmarks.experiments.int4_row_folds

Needs an sm_90 GPU. Raw records: ``benchmarks/results/int4_row_folds.jsonl`` (under ``$OUT`` when set).
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from omni_gateway.kernels import int4_fragments as fr
from omni_gateway.kernels import quant_gemv
from omni_gateway.kernels import quant_reference as qref
from omni_gateway.kernels import reference as ref
from omni_gateway.kernels.int4_row_epilogue import RotaryWrite
from omni_gateway.kernels.rotary import rotary_write_kv

from benchmarks.common import RESULTS_DIR, ResultLog, rel_err, time_graph

DEV = torch.device("cuda")
HQ, HKV, D = 32, 8, 128
# shape: (N, K, the fusions of the baseline, the fusions of the folded design)
CASES: dict[str, tuple[int, int, dict[str, Any], dict[str, Any]]] = {
    "gate_up": (28672, 4096, dict(norm=True, gated=True), dict(norm=True, gated=True, given=True)),
    "qkv": (6144, 4096, dict(norm=True, rope_after=True), dict(norm=True, given=True, rotary=True)),
    "o": (4096, 4096, dict(residual=True), dict(residual=True, next_norm=True)),
    "down": (4096, 14336, dict(residual=True), dict(residual=True, next_norm=True)),
}


def _sets(n: int, k: int) -> tuple[list[tuple[torch.Tensor, ...]], torch.Tensor]:
    """Enough quantized weight sets to cover 240 MB, and the first one de-quantized (float32)."""
    sets = []
    for i in range(max(1, math.ceil(240e6 / (n * k / 2)))):
        packed, scales, zeros = qref.quantize_int4(torch.randn(n, k, device=DEV, dtype=torch.bfloat16) * 0.02)
        if i == 0:
            first = qref.dequantize_int4(packed, scales, zeros, torch.float32)
        sets.append((qref.tile_int4(packed, 128), scales, zeros))
    return sets, first


def _case(n: int, k: int, f: dict[str, Any], x: torch.Tensor, g: torch.Tensor, operands: dict[str, torch.Tensor]):
    """``call(weights)`` running one design, and what its output is compared on."""
    gated, feats = bool(f.get("gated")), n // 2 if f.get("gated") else n
    kw: dict[str, Any] = dict(norm_weight=g if f.get("norm") else None, eps=1e-5, gated=gated)
    kw["residual"] = operands["residual"][:, :feats] if f.get("residual") else None
    kw["next_norm"] = operands["next"][:n] if f.get("next_norm") else None
    src = x
    if f.get("given"):
        src, kw["squares"] = operands["scaled"], operands["squares"]
    caches = (operands["k_cache"], operands["v_cache"])

    def call(w: tuple[torch.Tensor, ...]) -> torch.Tensor:
        out = torch.empty(1, feats, device=DEV, dtype=torch.bfloat16)
        locks = quant_gemv.split_locks(DEV, n // fr.BLOCK_N)
        if f.get("rotary"):
            kw["rotary"] = RotaryWrite(operands["pos"], operands["table"], *caches, operands["slot"], HQ, HKV)
        res = fr.launch(src, *w, None, out, locks, **kw)
        row = res if isinstance(res, torch.Tensor) else res.hidden
        if f.get("rope_after"):
            return _rope(row, operands, caches)
        return row[:, : HQ * D] if f.get("rotary") else row

    return call


def operands(n: int, x: torch.Tensor, g: torch.Tensor) -> dict[str, torch.Tensor]:
    """What the fusions read beside the row ``x`` and the norm weight ``g``: a residual, the next norm's
    weight, the folded norm's operands and a token's rotary position, cache slot and caches."""
    return dict(
        residual=torch.randn(1, n, device=DEV, dtype=torch.bfloat16),
        next=torch.rand(n, device=DEV, dtype=torch.bfloat16) + 0.5,
        scaled=(x.float() * g.float()).to(torch.bfloat16),
        squares=x.float().square().view(-1, fr.BLOCK_N).sum(1),
        pos=torch.tensor([700], device=DEV),
        slot=torch.tensor([1234], device=DEV),
        table=torch.randn(2048, D, device=DEV),
        k_cache=torch.zeros(256, 16, HKV, D, device=DEV, dtype=torch.bfloat16),
        v_cache=torch.zeros(256, 16, HKV, D, device=DEV, dtype=torch.bfloat16),
    )


def _expected(n: int, w: torch.Tensor, f: dict[str, Any], x: torch.Tensor, g: torch.Tensor, ops: dict[str, Any]):
    feats = n // 2 if f.get("gated") else n
    out = ref.row_linear(
        x,
        w,
        norm_weight=g if f.get("norm") else None,
        eps=1e-5,
        residual=ops["residual"][:, :feats] if f.get("residual") else None,
        gated=bool(f.get("gated")),
    )
    if f.get("rope_after") or f.get("rotary"):
        out = _rope(out, ops, (torch.zeros_like(ops["k_cache"]), torch.zeros_like(ops["v_cache"])))
    return out.double()


def _rope(qkv: torch.Tensor, ops: dict[str, Any], caches: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
    """The rotary kernel after a qkv row, as the unfused layer runs it: the rotated q ``[1, HQ * D]``."""
    q, k, v = (t.view(1, -1, D) for t in qkv.split((HQ * D, HKV * D, HKV * D), dim=-1))
    return rotary_write_kv(q, k, v, ops["pos"], ops["table"], *caches, ops["slot"]).view(1, -1)


def main() -> None:
    if not torch.cuda.is_available():
        raise SystemExit("benchmarks.experiments.int4_row_folds needs a CUDA GPU")
    quant_gemv.prepare_device(DEV)
    out_path = Path(os.environ["OUT"]) / "int4_row_folds.jsonl" if os.environ.get("OUT") else None
    torch.manual_seed(0)
    ok, total = True, {"in the loop": 0.0, "folded": 0.0}
    with ResultLog(out_path or RESULTS_DIR / "int4_row_folds.jsonl", "experiments.int4_row_folds") as log:
        for shape, (n, k, before, after) in CASES.items():
            sets, w0 = _sets(n, k)
            x = torch.randn(1, k, device=DEV, dtype=torch.bfloat16)
            g = torch.rand(k, device=DEV, dtype=torch.bfloat16) + 0.5
            ops = operands(n, x, g)
            line = []
            for design, f in (("in the loop", before), ("folded", after)):
                call: Callable[[tuple[torch.Tensor, ...]], torch.Tensor] = _case(n, k, f, x, g, ops)
                err = rel_err(call(sets[0]).double(), _expected(n, w0, f, x, g, ops))
                passed = err < (3e-2 if f.get("gated") else 1e-2)
                ok &= passed
                us = time_graph(lambda i, c=call: c(sets[i]), len(sets), max(5e-6, n * k / 5e12), replays=7) * 1e6
                total[design] += us
                log.write("case", shape=shape, design=design, fusions=sorted(f), us=us, rel_err=err, ok=passed)
                line.append(f"{design} {us:6.2f} us{'' if passed else ' WRONG'}")
            print(f"{shape:8s} " + ", ".join(line), flush=True)
        ratio = total["in the loop"] / total["folded"]
        log.write("layer", **{k.replace(" ", "_"): v for k, v in total.items()}, ratio=ratio, ok=ok)
        print(f"a layer's four: in the loop {total['in the loop']:.1f} us, folded {total['folded']:.1f} us "
              f"({ratio:.2f}x)", flush=True)  # fmt: skip
    if not ok:
        raise SystemExit("SOME CHECKS FAILED")


if __name__ == "__main__":
    main()
