"""Decode-size linear layers on a CUDA GPU: ``kernels.fused_linear`` against cuBLAS plus the
separate norm / activation / residual kernels it replaces, in the same process.

For a model shape, builds ``--layers`` layers of random bf16 weights (enough bytes that the 60 MB
L2 cannot serve repeated reads) and times, as CUDA-graph replays:
- the chain of one decoder layer's linear work for M rows, both ways:
  unfused = rms_norm, qkv matmul, o matmul, add+rms_norm, gate/up matmul, silu_and_mul, down
  matmul, add; fused = four ``fused_linear`` calls. The ratio is the speed-up of that chain.
- each of the four matmuls alone, both ways, as weight bytes over time against the device copy
  bandwidth.
Every fused result is first checked against the unfused chain (relative error).

    python demos/bench_fused_linear.py --shape llama-3.1-8b --rows 1,4,16
    python demos/bench_fused_linear.py --shape llama-3.1-8b --rows 1 --sweep    # every LinearConfig in SWEEP
"""
from __future__ import annotations

import argparse
import itertools
import json
import statistics
import sys
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Callable

import torch
import torch.nn.functional as F
import triton.testing

from kernels.activation import silu_and_mul
from kernels.fused_linear import LinearConfig, default_linear_config, fused_linear
from kernels.norm import fused_add_rms_norm, rms_norm

SHAPES = {  # hidden, intermediate, q heads, kv heads, head_dim
    "llama-3.1-8b": (4096, 14336, 32, 8, 128),
    "qwen2.5-0.5b": (896, 4864, 14, 2, 64),
}
SWEEP = [LinearConfig(block_n=bn, block_k=bk, num_warps=w, num_stages=s)
         for bn, bk, (w, s) in itertools.product((4, 8, 16, 32), (128, 256, 512, 1024), ((2, 2), (4, 1), (4, 2), (8, 2)))]
MAX_PRODUCTS_PER_THREAD = 128  # sweep configs whose accumulator would need more registers are skipped


@dataclass
class Layer:
    qkv: torch.Tensor
    o: torch.Tensor
    gate_up: torch.Tensor
    down: torch.Tensor
    norm1: torch.Tensor
    norm2: torch.Tensor


def make_layers(shape: str, count: int) -> list[Layer]:
    hidden, inter, hq, hkv, d = SHAPES[shape]
    gen = torch.Generator(device="cuda").manual_seed(0)

    def w(n: int, k: int) -> torch.Tensor:
        return (torch.randn(n, k, device="cuda", generator=gen) * k ** -0.5).to(torch.bfloat16)

    return [Layer(w((hq + 2 * hkv) * d, hidden), w(hidden, hq * d), w(2 * inter, hidden), w(hidden, inter),
                  1 + 0.1 * torch.randn(hidden, device="cuda", generator=gen).to(torch.bfloat16),
                  1 + 0.1 * torch.randn(hidden, device="cuda", generator=gen).to(torch.bfloat16))
            for _ in range(count)]


def time_graph(fn: Callable[[], object], replays: int = 20) -> float:
    """Median seconds of one call of ``fn`` (which runs all layers), replayed from a CUDA graph."""
    fn()
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fn()
    graph.replay()
    torch.cuda.synchronize()
    times = []
    for _ in range(replays):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        graph.replay()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) / 1e3)
    return statistics.median(times)


def copy_bandwidth() -> float:
    n = 1 << 30
    src = torch.empty(n, dtype=torch.uint8, device="cuda")
    dst = torch.empty_like(src)
    t = triton.testing.do_bench(lambda: dst.copy_(src), warmup=20, rep=200, return_mode="median") / 1e3
    return 2 * n / t


def unfused_layer(layer: Layer, res: torch.Tensor, attn: torch.Tensor, eps: float) -> tuple[torch.Tensor, torch.Tensor]:
    qkv = F.linear(rms_norm(res, layer.norm1, eps), layer.qkv)
    x, res = fused_add_rms_norm(F.linear(attn, layer.o), res, layer.norm2, eps)
    return qkv, F.linear(silu_and_mul(F.linear(x, layer.gate_up)), layer.down) + res


def fused_layer(layer: Layer, res: torch.Tensor, attn: torch.Tensor, eps: float,
                cfg: dict[str, LinearConfig | None]) -> tuple[torch.Tensor, torch.Tensor]:
    qkv = fused_linear(res, layer.qkv, norm_weight=layer.norm1, eps=eps, config=cfg["qkv"])
    res = fused_linear(attn, layer.o, residual=res, config=cfg["o"])
    gate_up = fused_linear(res, layer.gate_up, norm_weight=layer.norm2, eps=eps, config=cfg["gate_up"])
    return qkv, fused_linear(gate_up, layer.down, silu_mul=True, residual=res, config=cfg["down"])


def op_calls(layer: Layer, res: torch.Tensor, attn: torch.Tensor, gate_up: torch.Tensor, eps: float,
             cfg: LinearConfig | None) -> dict[str, tuple[Callable[[], object], Callable[[], object], int]]:
    """Per matmul: (fused call, cuBLAS call, weight bytes)."""
    return {
        "qkv": (lambda: fused_linear(res, layer.qkv, norm_weight=layer.norm1, eps=eps, config=cfg),
                lambda: F.linear(res, layer.qkv), layer.qkv.numel() * 2),
        "o": (lambda: fused_linear(attn, layer.o, residual=res, config=cfg),
              lambda: F.linear(attn, layer.o), layer.o.numel() * 2),
        "gate_up": (lambda: fused_linear(res, layer.gate_up, norm_weight=layer.norm2, eps=eps, config=cfg),
                    lambda: F.linear(res, layer.gate_up), layer.gate_up.numel() * 2),
        "down": (lambda: fused_linear(gate_up, layer.down, silu_mul=True, residual=res, config=cfg),
                 lambda: F.linear(gate_up[:, :layer.down.shape[1]], layer.down), layer.down.numel() * 2),
    }


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--shape", choices=sorted(SHAPES), default="llama-3.1-8b")
    p.add_argument("--rows", default="1,4,16", help="comma-separated row counts (decode batch sizes)")
    p.add_argument("--layers", type=int, default=8, help="layers of distinct weights per replay")
    p.add_argument("--sweep", action="store_true", help="time each matmul under every LinearConfig in SWEEP")
    p.add_argument("--json", type=Path, help="write the results here too")
    args = p.parse_args()
    if not torch.cuda.is_available():
        print("needs a CUDA GPU", file=sys.stderr)
        return 2
    hidden, inter, hq, hkv, d = SHAPES[args.shape]
    eps = 1e-5
    layers = make_layers(args.shape, args.layers)
    copy_bw = copy_bandwidth()
    layer_bytes = sum(t.numel() * 2 for t in (layers[0].qkv, layers[0].o, layers[0].gate_up, layers[0].down))
    print(f"{torch.cuda.get_device_name()} | shape {args.shape} | {args.layers} layers of {layer_bytes/1e6:.0f} MB "
          f"of linear weights | copy bandwidth {copy_bw/1e9:.0f} GB/s")
    results: dict[str, object] = {"shape": args.shape, "copy_gbps": copy_bw / 1e9, "chain": [], "ops": [], "sweep": []}
    default_cfg = {"qkv": None, "o": None, "gate_up": None, "down": None}
    print("\n| rows | unfused chain us/layer | fused us/layer | fused / unfused speed | fused GB/s | % copy | rel err |")
    print("|---|---|---|---|---|---|---|")
    for rows in [int(r) for r in args.rows.split(",")]:
        gen = torch.Generator(device="cuda").manual_seed(rows)
        res0 = torch.randn(rows, hidden, device="cuda", generator=gen).to(torch.bfloat16)
        attn = torch.randn(rows, hq * d, device="cuda", generator=gen).to(torch.bfloat16)

        def run(step: Callable[..., tuple[torch.Tensor, torch.Tensor]], *extra: object) -> torch.Tensor:
            res = res0
            for layer in layers:
                _, res = step(layer, res, attn, eps, *extra)
            return res

        got = run(fused_layer, default_cfg)
        want = run(unfused_layer)
        err = float((got.double() - want.double()).norm() / want.double().norm())
        t_unfused = time_graph(lambda: run(unfused_layer)) / args.layers
        t_fused = time_graph(lambda: run(fused_layer, default_cfg)) / args.layers
        gbps = layer_bytes / t_fused / 1e9
        print(f"| {rows} | {t_unfused*1e6:.1f} | {t_fused*1e6:.1f} | {t_unfused/t_fused:.2f}x | {gbps:.0f} | "
              f"{100*gbps*1e9/copy_bw:.0f}% | {err:.1e} |", flush=True)
        results["chain"].append({"rows": rows, "unfused_us": t_unfused * 1e6, "fused_us": t_fused * 1e6, "rel_err": err})

    print("\n| rows | matmul | config | fused us | fused TB/s | cuBLAS us (matmul alone) | cuBLAS TB/s |")
    print("|---|---|---|---|---|---|---|")
    for rows in [int(r) for r in args.rows.split(",")]:
        res = torch.randn(rows, hidden, device="cuda").to(torch.bfloat16)
        attn = torch.randn(rows, hq * d, device="cuda").to(torch.bfloat16)
        gate_up = torch.randn(rows, 2 * inter, device="cuda").to(torch.bfloat16)
        for name in ("qkv", "o", "gate_up", "down"):
            calls = [op_calls(layer, res, attn, gate_up, eps, None)[name] for layer in layers]
            nbytes = calls[0][2]
            t_f = time_graph(lambda: [c[0]() for c in calls]) / args.layers
            t_c = time_graph(lambda: [c[1]() for c in calls]) / args.layers
            cfg = default_linear_config(getattr(layers[0], name), rows)
            print(f"| {rows} | {name} | {cfg.block_n}/{cfg.block_k}/{cfg.num_warps}/{cfg.num_stages} | "
                  f"{t_f*1e6:.1f} | {nbytes/t_f/1e12:.2f} | {t_c*1e6:.1f} | {nbytes/t_c/1e12:.2f} |", flush=True)
            results["ops"].append({"rows": rows, "op": name, "fused_us": t_f * 1e6, "cublas_us": t_c * 1e6,
                                   "bytes": nbytes, "config": asdict(cfg)})
        if args.sweep:
            for name in ("qkv", "o", "gate_up", "down"):
                best: tuple[float, LinearConfig] | None = None
                block_m = 1 << max(0, rows - 1).bit_length()
                for cfg in SWEEP:
                    if block_m * cfg.block_n * cfg.block_k > MAX_PRODUCTS_PER_THREAD * 32 * cfg.num_warps:
                        continue
                    calls = [op_calls(layer, res, attn, gate_up, eps, cfg)[name] for layer in layers]
                    try:
                        t = time_graph(lambda: [c[0]() for c in calls], replays=10) / args.layers
                    except Exception as exc:  # noqa: BLE001 - a config that fails to compile is reported and skipped
                        print(f"  {name} {cfg}: failed ({type(exc).__name__}: {str(exc)[:80]})")
                        continue
                    results["sweep"].append({"rows": rows, "op": name, "us": t * 1e6, "config": asdict(cfg)})
                    if best is None or t < best[0]:
                        best = (t, cfg)
                if best is not None:
                    nbytes = calls[0][2]
                    c = best[1]
                    print(f"  sweep best rows {rows} {name}: {best[0]*1e6:.1f} us, {nbytes/best[0]/1e12:.2f} TB/s, "
                          f"block_n {c.block_n} block_k {c.block_k} warps {c.num_warps} stages {c.num_stages}",
                          flush=True)
    if args.json:
        args.json.write_text(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
