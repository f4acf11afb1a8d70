"""Does prefetching the next linear's int4 weights into L2, on a side stream while the latency-bound
kernels before it run, speed up a batch-1 decoder layer of Llama-3.1-8B's shape?

    python -m benchmarks.experiments.int4_l2_prefetch

The layer is the engine's folded int4 chain (kernels/quant_linear.py ``int4_row_linear``): the qkv
projection rotating q and k and writing the cache, the decode attention over 1,100 tokens, the o projection
writing the next norm's input, gate/up and down. Eight layers with distinct random weights (more than L2
holds), twice over, run in one CUDA graph; the baseline is that graph without prefetches. A variant forks
a side stream after a kernel and prefetches the next linear's words, scales and zero points with
Hopper's bulk ``cp.async.bulk.prefetch.L2`` (``bulkN``: N-KiB pieces) or ``prefetch.global.L2`` per
128-byte line (``line``): all of o during the attention, optionally the first MiBs of gate/up during o,
of down during gate/up and of the next layer's qkv during down. Prints microseconds per layer; every
variant's output is checked against the baseline's (the prefetches change no value).
(The bf16 form of this question: benchmarks/experiments/l2_prefetch.py.)

Answer (one H100 80GB, 2026-12-07 09:37 UTC, run 20261207T093713Z-591): no. The layer took 68.6 and 70.2 us
without prefetches (first and last) and 69.7-79.8 us with them: the fewer bytes prefetched, the closer to the
baseline (all of o in 64-KiB pieces, 69.7; adding the first MiBs of gate/up, down and qkv, up to 79.0). Every
variant's output matched the baseline's exactly. The int4 linears wait on their own launches and split
reductions rather than on their weights' first bytes, so the engine does not prefetch.
"""

from __future__ import annotations

import argparse
import math
import os
from pathlib import Path

import torch
from omni_gateway.kernels import quant_gemv
from omni_gateway.kernels import quant_reference as qref
from omni_gateway.kernels.int4_row_epilogue import RotaryWrite
from omni_gateway.kernels.paged_decode import paged_decode_attention
from omni_gateway.kernels.quant_linear import int4_row_linear

from benchmarks.common import RESULTS_DIR, ResultLog, time_graph
from benchmarks.experiments.l2_prefetch import prefetch

H, I, HQ, HKV, D = 4096, 14336, 32, 8, 128
NL, CTX, MB = 8, 1100, 1 << 20
DEV = torch.device("cuda")


def prefetch_all(kind: str, tensors: tuple[torch.Tensor, ...], budget: int) -> None:
    """Prefetch up to ``budget`` bytes of ``tensors`` (in order) into L2 with ``kind``."""
    for t in tensors:
        size = t.numel() * t.element_size()
        if budget <= 0:
            break
        prefetch(kind, t, budget)
        budget -= size


def _int4(n: int, k: int, gen: torch.Generator) -> tuple[torch.Tensor, ...]:
    packed, scales, zeros = qref.quantize_int4(
        torch.randn(n, k, device=DEV, dtype=torch.bfloat16, generator=gen) * 0.02
    )
    return qref.tile_int4(packed, 128), scales, zeros


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--kinds", default="bulk16,bulk64,line")
    args = parser.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("benchmarks.experiments.int4_l2_prefetch needs a CUDA GPU")
    quant_gemv.prepare_device(DEV)
    gen = torch.Generator(device=DEV).manual_seed(0)
    layers = []
    for _ in range(NL):
        norms = [torch.rand(H, device=DEV, dtype=torch.bfloat16, generator=gen) + 0.5 for _ in range(2)]
        layers.append(dict(qkv=_int4((HQ + 2 * HKV) * D, H, gen), o=_int4(H, HQ * D, gen),
                           gu=_int4(2 * I, H, gen), down=_int4(H, I, gen), n1=norms[0], n2=norms[1]))  # fmt: skip
    blocks = math.ceil(CTX / 16) + 1
    caches = [
        tuple(torch.randn(blocks, 16, HKV, D, device=DEV, dtype=torch.bfloat16) for _ in range(2)) for _ in range(NL)
    ]
    table = torch.arange(blocks, dtype=torch.int32, device=DEV).view(1, -1)
    seq_lens = torch.tensor([CTX], dtype=torch.int32, device=DEV)
    pos = torch.tensor([CTX - 1], device=DEV)
    cos_sin = torch.randn(4096, D, device=DEV)
    hidden0 = torch.randn(1, H, device=DEV, dtype=torch.bfloat16)
    side = torch.cuda.Stream()

    def forward(plan: dict[str, object]) -> torch.Tensor:
        kind, main = plan.get("kind"), torch.cuda.current_stream()
        forked = False

        def pf(weights: tuple[torch.Tensor, ...], name: str) -> None:
            nonlocal forked
            budget = int(plan.get(name, 0))  # type: ignore[call-overload]
            if kind and budget > 0:
                forked = True
                side.wait_stream(main)
                with torch.cuda.stream(side):
                    prefetch_all(str(kind), weights, budget)

        hidden, row = hidden0, hidden0
        for _rep in range(2):
            for li, lw in enumerate(layers):
                kc, vc = caches[li]
                rotary = RotaryWrite(pos, cos_sin, kc, vc, pos, HQ, HKV)
                q = int4_row_linear(row, *lw["qkv"], norm_weight=lw["n1"], eps=1e-5, rotary=rotary)
                pf(lw["o"], "o")
                attn = paged_decode_attention(q[:, : HQ * D].view(1, HQ, D), kc, vc, seq_lens, table, D**-0.5)
                row = int4_row_linear(attn.view(1, HQ * D), *lw["o"], residual=hidden, next_norm=lw["n2"])
                pf(lw["gu"], "gu")
                hidden = row.hidden
                act = int4_row_linear(row, *lw["gu"], norm_weight=lw["n2"], eps=1e-5, gated=True)
                pf(lw["down"], "down")
                following = layers[(li + 1) % NL]
                row = int4_row_linear(act, *lw["down"], residual=hidden, next_norm=following["n1"])
                pf(following["qkv"], "qkv")
                hidden = row.hidden
        if forked:
            main.wait_stream(side)
        return hidden

    plans: list[tuple[str, dict[str, object]]] = [("base", {})]
    for kind in args.kinds.split(","):
        plans += [
            (f"{kind} o", dict(kind=kind, o=64 * MB)),
            (f"{kind} o gu=8M", dict(kind=kind, o=64 * MB, gu=8 * MB)),
            (f"{kind} o gu=8M down=4M qkv=4M", dict(kind=kind, o=64 * MB, gu=8 * MB, down=4 * MB, qkv=4 * MB)),
            (f"{kind} o gu=16M down=8M qkv=all", dict(kind=kind, o=64 * MB, gu=16 * MB, down=8 * MB, qkv=64 * MB)),
        ]
    plans.append(("base again", {}))
    out_path = Path(os.environ["OUT"]) / "int4_l2_prefetch.jsonl" if os.environ.get("OUT") else None
    ref = None
    with ResultLog(out_path or RESULTS_DIR / "int4_l2_prefetch.jsonl", "experiments.int4_l2_prefetch") as log:
        for name, plan in plans:
            out = forward(plan).clone()
            ref = out if ref is None else ref
            same = torch.equal(out, ref)
            us = time_graph(lambda _, p=plan: forward(p), 1, 2e-3, replays=20) * 1e6 / (2 * NL)
            log.write("plan", plan=name, us_per_layer=us, same=same)
            print(f"{name:36s} {us:8.2f} us a layer  same={same}", flush=True)


if __name__ == "__main__":
    main()
