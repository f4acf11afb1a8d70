"""Does prefetching a matmul's weights into L2, on a side stream while latency-bound kernels run,
speed up a batch-1 decoder layer of Llama-3.1-8B's shape?

    python -m benchmarks.experiments.l2_prefetch

Eight layers with distinct random bf16 weights (so L2 holds nothing from one layer to the next),
twice over, run our Triton kernels and ``F.linear`` in one CUDA graph; the baseline is that graph
without prefetches. Each variant forks a side stream after a matmul and prefetches the next
matmul's weights (all of o_proj, or its first 16 MiB, during rotary and attention; optionally also
the first 16/32 MiB of gate/up, 8/16 MiB of down and 16/32 MiB of the next layer's q/k/v, each
forked behind the matmul before it) with one of: plain loads in a
Triton kernel (``load``: one CTA per 64 KiB, ``loadN``: N CTAs), ``prefetch.global.L2`` per 128-byte
line (``line``), or Hopper's bulk ``cp.async.bulk.prefetch.L2`` in N-KiB pieces (``bulkN``).
Prints microseconds per layer and the weight bandwidth; every variant's output is checked against
the baseline's.

Answer (one H200, 2026-12-03 08:11 UTC, the script's first draft): no. No variant beat the baseline by
more than the baseline's own spread (134.0-138.8 us per layer); the best, bulk prefetches of the first
16 MiB of o_proj, took 137.2 us, and every Triton-load or per-line variant was slower than either
baseline run. The side stream's fork and join and the prefetch traffic cost about what the L2 hits
save, so the engine does not prefetch.
"""

import argparse
import math
import os
import traceback

import torch
import torch.nn.functional as F
import triton
import triton.language as tl
from omni_gateway.kernels.activation import silu_and_mul
from omni_gateway.kernels.norm import fused_add_rms_norm, rms_norm
from omni_gateway.kernels.paged_decode import paged_decode_attention
from omni_gateway.kernels.rotary import rotary_write_kv

from benchmarks.lib.common import time_graph

H, I, HQ, HKV, D = 4096, 14336, 32, 8, 128
NL = 8  # distinct weight sets (L2 cannot hold them across layers)
CTX = 1100
dev = torch.device("cuda")
bf = torch.bfloat16


@triton.jit
def _load_prefetch(ptr, n_words, magic, sink, BLOCK: tl.constexpr, ITERS: tl.constexpr):
    pid = tl.program_id(0)
    acc = tl.zeros([BLOCK], dtype=tl.int32)
    for i in range(ITERS):
        offs = (pid * ITERS + i).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
        acc ^= tl.load(ptr + offs, mask=offs < n_words, other=0, eviction_policy="evict_last")
    s = tl.xor_sum(acc, axis=0)
    if s == magic:
        tl.store(sink + pid, s)


@triton.jit
def _line_prefetch(ptr, n_lines, BLOCK: tl.constexpr, ITERS: tl.constexpr):
    pid = tl.program_id(0)
    for i in range(ITERS):
        idx = (pid * ITERS + i).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
        p = ptr + idx * 32  # int32 words: 128-byte lines
        ok = (idx < n_lines).to(tl.int32)
        tl.inline_asm_elementwise(
            "{ .reg .pred q; setp.ne.b32 q, $2, 0; @q prefetch.global.L2::evict_last [$1]; mov.b32 $0, 0; }",
            "=r,l,r",
            [p, ok],
            dtype=tl.int32,
            is_pure=False,
            pack=1,
        )


@triton.jit
def _bulk_prefetch(ptr, n_chunks, CHUNK_WORDS: tl.constexpr):
    pid = tl.program_id(0)
    idx = pid * 32 + tl.arange(0, 32)
    p = ptr + idx.to(tl.int64) * CHUNK_WORDS
    ok = (idx < n_chunks).to(tl.int32)
    size = tl.full([32], CHUNK_WORDS * 4, tl.int32)
    tl.inline_asm_elementwise(
        "{ .reg .pred q; setp.ne.b32 q, $2, 0; @q cp.async.bulk.prefetch.L2.global [$1], $3; mov.b32 $0, 0; }",
        "=r,l,r,r",
        [p, ok, size],
        dtype=tl.int32,
        is_pure=False,
        pack=1,
    )


SINK = None


def prefetch(kind: str, w: torch.Tensor, nbytes: int) -> None:
    """Prefetch the first ``nbytes`` of ``w`` (any dtype, a whole number of 32-bit words) into L2 with ``kind``."""
    words = w.view(-1).view(torch.int32)
    n = min(nbytes, w.numel() * w.element_size()) // 4
    if n <= 0:
        return
    if kind == "load":
        block, iters = 1024, 16
        grid = (math.ceil(n / (block * iters)),)
        _load_prefetch[grid](words, n, 0x7FFFFFF1, SINK, BLOCK=block, ITERS=iters, num_warps=4)
    elif kind.startswith("load"):
        ctas = int(kind[4:])
        block = 1024
        iters = math.ceil(n / (block * ctas))
        _load_prefetch[(ctas,)](words, n, 0x7FFFFFF1, SINK, BLOCK=block, ITERS=iters, num_warps=4)
    elif kind == "line":
        lines = n // 32
        block, iters = 128, 8
        _line_prefetch[(math.ceil(lines / (block * iters)),)](words, lines, BLOCK=block, ITERS=iters, num_warps=4)
    elif kind.startswith("bulk"):
        chunk_words = int(kind[4:]) * 1024 // 4
        chunks = n // chunk_words
        _bulk_prefetch[(math.ceil(chunks / 32),)](words, chunks, CHUNK_WORDS=chunk_words, num_warps=1)
    else:
        raise ValueError(kind)


def make_layers():
    g = torch.Generator(device=dev).manual_seed(0)

    def rnd(*s):
        return torch.randn(*s, device=dev, dtype=bf, generator=g) * 0.02

    layers = []
    for _ in range(NL):
        layers.append(
            dict(
                qkv=rnd((HQ + 2 * HKV) * D, H),
                o=rnd(H, HQ * D),
                gu=rnd(2 * I, H),
                down=rnd(H, I),
                n1=torch.ones(H, device=dev, dtype=bf),
                n2=torch.ones(H, device=dev, dtype=bf),
            )
        )
    return layers


def main() -> None:
    global SINK
    argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter).parse_args()
    SINK = torch.zeros(1 << 20, dtype=torch.int32, device=dev)
    out_dir = os.environ.get("OUT", "/tmp")
    layers = make_layers()
    nblocks = math.ceil(CTX / 16) + 1
    k_caches = [torch.randn(nblocks, 16, HKV, D, device=dev, dtype=bf) for _ in range(NL)]
    v_caches = [torch.randn(nblocks, 16, HKV, D, device=dev, dtype=bf) for _ in range(NL)]
    table = torch.arange(nblocks, dtype=torch.int32, device=dev).view(1, -1)
    seq_lens = torch.tensor([CTX], dtype=torch.int32, device=dev)
    positions = torch.tensor([CTX - 1], dtype=torch.int64, device=dev)
    slots = torch.tensor([CTX - 1], dtype=torch.int64, device=dev)
    cos_sin = torch.randn(4096, D, device=dev)
    hidden0 = torch.randn(1, H, device=dev, dtype=bf)
    side = torch.cuda.Stream()
    q_size, kv = HQ * D, HKV * D

    def forward(plan: dict) -> torch.Tensor:
        """plan: kind, and bytes to prefetch of o (after q/k/v), gu (after o), down (after gate/up) and the
        next layer's qkv (after down)."""
        kind = plan.get("kind")
        main = torch.cuda.current_stream()
        used = []

        def pf(w, nbytes):
            if not kind or nbytes <= 0:
                return
            used.append(1)
            side.wait_stream(main)
            with torch.cuda.stream(side):
                prefetch(kind, w, nbytes)

        hidden, residual = hidden0, None
        for _rep in range(2):
            for li, L in enumerate(layers):
                if residual is None:
                    residual = hidden
                    x = rms_norm(hidden, L["n1"], 1e-5)
                else:
                    x, residual = fused_add_rms_norm(hidden, residual, L["n1"], 1e-5)
                qkv = F.linear(x, L["qkv"])
                pf(L["o"], plan.get("o", 0))
                q, k, v = qkv.split((q_size, kv, kv), dim=-1)
                q = rotary_write_kv(
                    q.reshape(1, HQ, D),
                    k.reshape(1, HKV, D),
                    v.reshape(1, HKV, D),
                    positions,
                    cos_sin,
                    k_caches[li],
                    v_caches[li],
                    slots,
                )
                attn = paged_decode_attention(q, k_caches[li], v_caches[li], seq_lens, table, D**-0.5)
                o = F.linear(attn.reshape(1, q_size), L["o"])
                pf(L["gu"], plan.get("gu", 0))
                x, residual = fused_add_rms_norm(o, residual, L["n2"], 1e-5)
                gu = F.linear(x, L["gu"])
                pf(L["down"], plan.get("down", 0))
                act = silu_and_mul(gu)
                hidden = F.linear(act, L["down"])
                nxt = layers[(li + 1) % NL]
                pf(nxt["qkv"], plan.get("qkv", 0))
        if used:
            main.wait_stream(side)
        return hidden + residual

    def timed(plan: dict) -> tuple[float, torch.Tensor]:
        """us per layer of the graphed forward, and its output."""
        out = forward(plan).clone()
        seconds = time_graph(lambda _: forward(plan), 1, 2e-3, replays=20)
        return seconds * 1e6 / (2 * NL), out

    layer_bytes = sum(layers[0][k].numel() * 2 for k in ("qkv", "o", "gu", "down"))
    print(f"layer weight bytes {layer_bytes / 1e6:.1f} MB", flush=True)
    MB = 1 << 20
    plans = [("base", {})]
    for kind in ("load", "load132", "load32", "line", "bulk16", "bulk64"):
        plans += [
            (f"{kind} o=all", dict(kind=kind, o=64 * MB)),
            (f"{kind} o=16M", dict(kind=kind, o=16 * MB)),
            (f"{kind} o=all gu=16M down=8M qkv=16M", dict(kind=kind, o=64 * MB, gu=16 * MB, down=8 * MB, qkv=16 * MB)),
            (
                f"{kind} o=all gu=32M down=16M qkv=32M",
                dict(kind=kind, o=64 * MB, gu=32 * MB, down=16 * MB, qkv=32 * MB),
            ),
        ]
    plans.append(("base again", {}))
    ref = None
    lines = []
    for name, plan in plans:
        try:
            t, res = timed(plan)
            if ref is None:
                ref = res
            same = torch.equal(res, ref)
            line = f"{name:45s} {t:8.2f} us/layer  {layer_bytes / t / 1e6:6.2f} TB/s  same={same}"
        except Exception as e:  # noqa: BLE001
            line = f"{name:45s} FAILED {type(e).__name__}: {str(e)[:300]}"
            traceback.print_exc()
            if "illegal" in str(e).lower() or "CUDA error" in str(e):
                print(line, flush=True)
                break
        print(line, flush=True)
        lines.append(line)
    with open(os.path.join(out_dir, "l2_prefetch.txt"), "w") as f:
        f.write("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
