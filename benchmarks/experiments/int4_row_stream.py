"""What the float32 residual stream of kernels/int4_row_stream.py saves at each 8B shape of a batch-1 decode
layer against bfloat16 rows, one row timed in CUDA graphs over weight sets larger than L2:

- rows (the design before, ``LlamaModel.ROW_STREAM`` off): every split ends in the last program's tail (the
  norm's scale, the residual add, the gate, q rotated and k and v cached), the norms in the loops;
- stream: the o and down projections add into the stream and the gate/up projection into ``GateSums``, split by
  split; the qkv and gate/up projections stage the normed stream before their loops, the down projection the
  gate; the qkv projection keeps its tail (rotary).

    python -m benchmarks.experiments.int4_row_stream [--splits 8 16 28]

``--splits`` also times the adding launches at those split counts (where they divide the groups). Every output
is checked against the unfused layer's twin (kernels/reference.py ``row_linear``, and ``rotary_write_kv`` for
the qkv projection). Needs an sm_90 GPU. Raw records: ``benchmarks/results/int4_row_stream.jsonl`` (under
``$OUT`` when set).
"""

from __future__ import annotations

import argparse
import math
import os
from collections.abc import Callable
from pathlib import Path

import torch
import torch.nn.functional as F
from omni_gateway.kernels import int4_fragments as fr
from omni_gateway.kernels import quant_gemv
from omni_gateway.kernels import quant_reference as qref
from omni_gateway.kernels import reference as ref
from omni_gateway.kernels.int4_row_epilogue import RotaryWrite
from omni_gateway.kernels.int4_row_stream import GateSums, StreamRow
from omni_gateway.kernels.quant_linear import int4_row_linear
from omni_gateway.kernels.rotary import rotary_write_kv

from benchmarks.lib.common import RESULTS_DIR, ResultLog, rel_err, time_graph

DEV = torch.device("cuda")
HQ, HKV, D, H, I = 32, 8, 128, 4096, 14336
SHAPES = {"qkv": ((HQ + 2 * HKV) * D, H), "o": (H, HQ * D), "gate_up": (2 * I, H), "down": (H, I)}
Weights = tuple[torch.Tensor, torch.Tensor, torch.Tensor]


def _sets(n: int, k: int) -> tuple[list[Weights], torch.Tensor]:
    """Enough quantized weight sets to cover 240 MB, and the first one de-quantized (float32)."""
    sets = []
    for i in range(max(1, math.ceil(240e6 / (n * k / 2)))):
        packed, scales, zeros = qref.quantize_int4(torch.randn(n, k, device=DEV, dtype=torch.bfloat16) * 0.02)
        if i == 0:
            first = qref.dequantize_int4(packed, scales, zeros, torch.float32)
        sets.append((qref.tile_int4(packed, 128), scales, zeros))
    return sets, first


def _designs(shape: str, w0: torch.Tensor) -> dict[str, tuple[Callable[[Weights], object], Callable[[], float]]]:
    """Each design's ``call(weights)`` and ``check()`` (its relative error against the unfused twin, after a
    call on the first weight set)."""
    n, k = SHAPES[shape]
    x = torch.randn(1, k, device=DEV, dtype=torch.bfloat16)
    g = torch.rand(k, device=DEV, dtype=torch.bfloat16) + 0.5
    stream = StreamRow(x.float())
    if shape == "qkv":
        pos, slot = torch.tensor([700], device=DEV), torch.tensor([1234], device=DEV)
        table = torch.randn(2048, D, device=DEV)

        def rotary() -> RotaryWrite:
            caches = [torch.zeros(256, 16, HKV, D, device=DEV, dtype=torch.bfloat16) for _ in range(2)]
            return RotaryWrite(pos, table, *caches, slot, HQ, HKV)

        unfused = ref.row_linear(x, w0, norm_weight=g, eps=1e-5)
        q, kk, v = (t.view(1, -1, D) for t in unfused.split((HQ * D, HKV * D, HKV * D), dim=-1))
        want = rotary_write_kv(q, kk, v, pos, table, *rotary()[2:4], slot).view(1, -1)
        rot = rotary()
        out: dict[str, torch.Tensor] = {}

        def qkv(src: object) -> Callable[[Weights], object]:
            def call(w: Weights) -> object:
                out["q"] = int4_row_linear(src, *w, norm_weight=g, eps=1e-5, rotary=rot)  # type: ignore[arg-type]
                return out["q"]

            return call

        return {
            name: (call, lambda: rel_err(out["q"][:, : HQ * D], want))
            for name, call in (("rows", qkv(x)), ("stream", qkv(stream)))
        }
    if shape == "gate_up":
        sums = GateSums.zeros(1, I, k, 1e-5, DEV)[0]
        act = ref.row_linear(x, w0, norm_weight=g, eps=1e-5, gated=True)
        unscaled = (x.float() * g.float()).to(torch.bfloat16).double() @ w0.double().T
        got: dict[str, torch.Tensor] = {}
        return {
            "rows": (
                lambda w: got.update(act=int4_row_linear(x, *w, norm_weight=g, eps=1e-5, gated=True)),
                lambda: rel_err(got["act"], act),
            ),
            "stream": (
                lambda w: int4_row_linear(stream, *w, norm_weight=g, eps=1e-5, gated=True, into=sums),
                lambda: max(rel_err(sums.sums, unscaled), rel_err(sums.squares, x.double().square().sum())),
            ),
        }
    if shape == "down":
        sums = GateSums(torch.randn(1, 2 * k, device=DEV) * 30, torch.full((1,), H * 900.0, device=DEV), H, 1e-5)
        scale = torch.rsqrt(sums.squares / H + 1e-5)
        gate, up = (sums.sums * scale).to(torch.bfloat16).float().split(k, dim=1)
        x = (F.silu(gate) * up).to(torch.bfloat16)
    residual = torch.randn(1, n, device=DEV, dtype=torch.bfloat16)
    target = StreamRow(torch.zeros(1, n, device=DEV))
    got = {}
    product = x.double() @ w0.double().T
    return {  # o and down
        "rows": (
            lambda w: got.update(row=int4_row_linear(x, *w, residual=residual)),
            lambda: rel_err(got["row"], ref.row_linear(x, w0, residual=residual)),
        ),
        "stream": (
            lambda w: int4_row_linear(sums if shape == "down" else x, *w, into=target),
            lambda: rel_err(target.row, product),
        ),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--splits", type=int, nargs="*", default=[8, 16, 28])
    args = parser.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("benchmarks.experiments.int4_row_stream needs a CUDA GPU")
    quant_gemv.prepare_device(DEV)
    out_path = Path(os.environ["OUT"]) / "int4_row_stream.jsonl" if os.environ.get("OUT") else None
    torch.manual_seed(0)
    ok, total = True, {"rows": 0.0, "stream": 0.0}
    shipped = fr.add_split_for
    with ResultLog(out_path or RESULTS_DIR / "int4_row_stream.jsonl", "experiments.int4_row_stream") as log:
        for shape, (n, k) in SHAPES.items():
            sets, w0 = _sets(n, k)
            groups, line = k // fr.GROUP, []
            for design in ("rows", "stream"):
                splits = [0] + (args.splits if design == "stream" and shape != "qkv" else [])
                for split in [s for s in splits if not s or groups % s == 0]:
                    fr.add_split_for = (lambda gr, bl, s=split: s) if split else shipped
                    try:
                        call, check = _designs(shape, w0)[design]
                        call(sets[0])
                        err = check()
                        us = time_graph(lambda i, c=call: c(sets[i]), len(sets), max(5e-6, n * k / 5e12), replays=7)
                        used = fr.add_split_for(groups, n // fr.BLOCK_N) if design == "stream" else None
                    finally:
                        fr.add_split_for = shipped
                    passed = err < (3e-2 if shape in ("gate_up", "down") else 1e-2)
                    ok &= passed
                    us *= 1e6
                    total[design] += 0.0 if split else us
                    log.write("case", shape=shape, design=design, split=used, us=us, rel_err=err, ok=passed)
                    label = f"stream/s{split}" if split else design
                    line.append(f"{label} {us:6.2f}{'' if passed else ' WRONG'}")
            print(f"{shape:8s} " + "  ".join(line), flush=True)
        ratio = total["rows"] / total["stream"]
        log.write("layer", **total, ratio=ratio, ok=ok)
        summary = f"rows {total['rows']:.1f} us, stream {total['stream']:.1f} us ({ratio:.2f}x)"
        print(f"a layer's four: {summary}", flush=True)
    if not ok:
        raise SystemExit("SOME CHECKS FAILED")


if __name__ == "__main__":
    main()
