"""Does programmatic dependent launch (PDL, Hopper) shorten a batch-1 decoder layer of Llama-3.1-8B's
shape, replayed from a CUDA graph?

    python -m benchmarks.experiments.pdl_chain [--layers 16] [--replays 50]

A layer here is the decode step's chain of kernels at one row, without attention: add + RMS norm, the
q/k/v GEMV, an elementwise stand-in for rotary, the o GEMV, add + RMS norm, gate/up GEMV, SiLU-and-mul
and the down GEMV (the GEMV is kernels/gemv.py's loop). ``--layers`` layers with distinct weights (more than
L2 holds) run in one graph, with bf16 weights and with FP8 (e4m3, 1024-element steps so a step moves the
same bytes; scales left out, they do not change the timing). Variants:

- ``none``: plain launches, the baseline;
- ``wait``: every kernel launched with PDL, waiting for its predecessor (``griddepcontrol.wait``) before
  its first load: the next grid's launch overlaps the previous one's tail;
- ``trigger``: as ``wait``, and every kernel lets its dependent launch right after its own wait
  (``griddepcontrol.launch_dependents``), so the dependent's programs are resident early;
- ``prefetch``: as ``trigger``, and each GEMV loads its first weight tile before waiting: weights do not
  depend on the previous kernel, so their stream starts while it drains;
- ``prefetch2``: as ``prefetch`` with the first two tiles.

Prints microseconds per layer and the weight bandwidth; every variant's output is checked against the
baseline's. Raw results: benchmarks/results/pdl_chain.jsonl.

Answer (one H100 80GB HBM3, 2026-12-05 13:59 UTC, 16 layers, 50 replays): a little, not enough to matter for
the FP8 target. bf16 156.1 us per layer plain, 152.9 at best (``prefetch``, 2.0%); FP8 88.8 plain, 83.7 at best
(``trigger``, 5.7%; prefetching the first tiles gained nothing more). About 0.6 us per launch, as
docs/kernels.md found for the attention kernel: across the 8B model's 32 layers 0.16 ms a token for FP8 and 0.1
for bf16, which moves the batch-1 FP8/bf16 ratio from 1.51x to about 1.57x. Every variant's output matched
the baseline's exactly.
"""

from __future__ import annotations

import argparse

import torch
import triton
import triton.language as tl

from benchmarks.lib.common import ResultLog, add_out_argument, time_graph

HIDDEN, QKV, INTER = 4096, 6144, 14336
BLOCK_N = 8
_BLOCK_N, _STAGES = tl.constexpr(BLOCK_N), tl.constexpr(3)  # the kernels' view of the constants
BLOCK_K = {torch.bfloat16: 512, torch.float8_e4m3fn: 1024}
VARIANTS = {  # name -> (launch with PDL, trigger dependents, weight tiles loaded before the wait)
    "none": (False, False, 0),
    "wait": (True, False, 0),
    "trigger": (True, True, 0),
    "prefetch": (True, True, 1),
    "prefetch2": (True, True, 2),
}


@triton.jit
def _gdc(PDL: tl.constexpr, TRIGGER: tl.constexpr):
    if PDL:
        tl.extra.cuda.gdc_wait()
    if TRIGGER:
        tl.extra.cuda.gdc_launch_dependents()


@triton.jit
def _gemv(x_ptr, w_ptr, out_ptr, K, BLOCK_K: tl.constexpr, PDL: tl.constexpr, TRIGGER: tl.constexpr, PRE: tl.constexpr):
    cols = tl.program_id(0) * _BLOCK_N + tl.arange(0, _BLOCK_N)
    w_rows = w_ptr + cols.to(tl.int64)[:, None] * K
    ks = tl.arange(0, BLOCK_K)
    # tiles loaded before the wait: the weights are no predecessor's output
    if PRE >= 1:
        w0 = tl.load(w_rows + ks[None, :], eviction_policy="evict_first")
    if PRE >= 2:
        w1 = tl.load(w_rows + BLOCK_K + ks[None, :], eviction_policy="evict_first")
    _gdc(PDL, TRIGGER)
    acc = tl.zeros([_BLOCK_N, BLOCK_K], tl.float32)
    if PRE >= 1:
        acc += w0.to(tl.float32) * tl.load(x_ptr + ks).to(tl.float32)[None, :]
    if PRE >= 2:
        acc += w1.to(tl.float32) * tl.load(x_ptr + BLOCK_K + ks).to(tl.float32)[None, :]
    for k0 in tl.range(PRE * BLOCK_K, K, BLOCK_K, num_stages=_STAGES):
        w = tl.load(w_rows + k0 + ks[None, :], eviction_policy="evict_first")
        acc += w.to(tl.float32) * tl.load(x_ptr + k0 + ks).to(tl.float32)[None, :]
    tl.store(out_ptr + cols, tl.sum(acc, 1).to(out_ptr.dtype.element_ty))


@triton.jit
def _add_norm(x_ptr, res_ptr, w_ptr, out_ptr, N: tl.constexpr, PDL: tl.constexpr, TRIGGER: tl.constexpr):
    _gdc(PDL, TRIGGER)
    cols = tl.arange(0, N)
    h = tl.load(x_ptr + cols).to(tl.float32) + tl.load(res_ptr + cols).to(tl.float32)
    tl.store(res_ptr + cols, h.to(res_ptr.dtype.element_ty))
    scale = tl.rsqrt(tl.sum(h * h, 0) / N + 1e-5)
    tl.store(out_ptr + cols, (h * scale * tl.load(w_ptr + cols).to(tl.float32)).to(out_ptr.dtype.element_ty))


@triton.jit
def _rotary_like(q_ptr, N: tl.constexpr, PDL: tl.constexpr, TRIGGER: tl.constexpr):
    _gdc(PDL, TRIGGER)
    cols = tl.arange(0, N)
    q = tl.load(q_ptr + cols).to(tl.float32)
    tl.store(q_ptr + cols, (q * 0.5).to(q_ptr.dtype.element_ty))


@triton.jit
def _silu_mul(x_ptr, out_ptr, INTER: tl.constexpr, BLOCK: tl.constexpr, PDL: tl.constexpr, TRIGGER: tl.constexpr):
    _gdc(PDL, TRIGGER)
    cols = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    gate = tl.load(x_ptr + cols).to(tl.float32)
    up = tl.load(x_ptr + INTER + cols).to(tl.float32)
    tl.store(out_ptr + cols, (gate / (1.0 + tl.exp(-gate)) * up).to(out_ptr.dtype.element_ty))


def make_layers(count: int, dtype: torch.dtype) -> list[dict[str, torch.Tensor]]:
    def w(n: int, k: int) -> torch.Tensor:
        return (torch.randn(n, k, device="cuda") * k**-0.5).to(dtype)

    return [
        dict(
            qkv=w(QKV, HIDDEN),
            o=w(HIDDEN, HIDDEN),
            gate_up=w(2 * INTER, HIDDEN),
            down=w(HIDDEN, INTER),
            n1=torch.ones(HIDDEN, device="cuda", dtype=torch.bfloat16),
            n2=torch.ones(HIDDEN, device="cuda", dtype=torch.bfloat16),
        )
        for _ in range(count)
    ]


def forward(layers: list[dict[str, torch.Tensor]], bufs: dict[str, torch.Tensor], variant: str) -> None:
    pdl, trigger, pre = VARIANTS[variant]
    flags = dict(PDL=pdl, TRIGGER=trigger)

    def gemv(x: torch.Tensor, w: torch.Tensor, out: torch.Tensor) -> None:
        n, k = w.shape
        block_k = BLOCK_K[w.dtype]
        _gemv[(n // BLOCK_N,)](x, w, out, k, BLOCK_K=block_k, PRE=pre, num_warps=4, launch_pdl=pdl, **flags)

    for layer in layers:
        _add_norm[(1,)](bufs["h"], bufs["res"], layer["n1"], bufs["x"], N=HIDDEN, num_warps=8, launch_pdl=pdl, **flags)
        gemv(bufs["x"], layer["qkv"], bufs["qkv"])
        _rotary_like[(1,)](bufs["qkv"], N=HIDDEN, num_warps=8, launch_pdl=pdl, **flags)
        gemv(bufs["qkv"], layer["o"], bufs["h"])
        _add_norm[(1,)](bufs["h"], bufs["res"], layer["n2"], bufs["x"], N=HIDDEN, num_warps=8, launch_pdl=pdl, **flags)
        gemv(bufs["x"], layer["gate_up"], bufs["gu"])
        _silu_mul[(INTER // 1024,)](bufs["gu"], bufs["act"], INTER=INTER, BLOCK=1024, launch_pdl=pdl, **flags)
        gemv(bufs["act"], layer["down"], bufs["h"])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--layers", type=int, default=16)
    parser.add_argument("--replays", type=int, default=50)
    parser.add_argument("--variants", nargs="+", default=list(VARIANTS), choices=list(VARIANTS))
    add_out_argument(parser, "pdl_chain")
    args = parser.parse_args()

    def fresh() -> dict[str, torch.Tensor]:
        g = torch.Generator(device="cuda").manual_seed(1)
        return dict(
            h=torch.randn(HIDDEN, device="cuda", generator=g).to(torch.bfloat16),
            res=torch.zeros(HIDDEN, device="cuda", dtype=torch.bfloat16),
            x=torch.empty(HIDDEN, device="cuda", dtype=torch.bfloat16),
            qkv=torch.empty(QKV, device="cuda", dtype=torch.bfloat16),
            gu=torch.empty(2 * INTER, device="cuda", dtype=torch.bfloat16),
            act=torch.empty(INTER, device="cuda", dtype=torch.bfloat16),
        )

    with ResultLog(args.out, "experiments.pdl_chain", layers=args.layers) as log:
        for dtype in (torch.bfloat16, torch.float8_e4m3fn):
            torch.manual_seed(0)
            layers = make_layers(args.layers, dtype)
            weight_bytes = sum(t.numel() * t.element_size() for layer in layers for t in layer.values())
            reference = None
            for variant in args.variants:
                bufs = fresh()
                forward(layers, bufs, variant)  # compile, then check one eager pass against the baseline's
                torch.cuda.synchronize()
                out = bufs["h"].float().clone()
                if reference is None:
                    reference = out
                error = (out - reference).abs().max().item()
                ok = torch.allclose(out, reference, rtol=2e-2, atol=2e-2)
                run = lambda _i, ls=layers, b=bufs, v=variant: forward(ls, b, v)  # noqa: E731
                us = time_graph(run, n_sets=1, est_s=150e-6 * args.layers, replays=args.replays) * 1e6
                per_layer = us / args.layers
                gbps = weight_bytes / (us * 1e-6) / 1e9
                name = str(dtype).removeprefix("torch.")
                print(
                    f"{name:14s} {variant:10s} {per_layer:7.1f} us/layer {gbps:6.0f} GB/s max|diff| {error:.3g} {ok=}"
                )
                log.write(
                    "variant", dtype=name, variant=variant, us_per_layer=per_layer, gb_per_s=gbps, max_diff=error, ok=ok
                )
            del layers, bufs
            torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
