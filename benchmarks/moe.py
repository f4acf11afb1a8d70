"""One mixture-of-experts layer: the fused Triton MoE (``kernels.fused_moe``: router top-k, tokens sorted per
expert, two grouped GEMMs) against the per-expert loop of torch GEMMs (its twin, ``kernels.moe_reference``) and
against transformers' own MoE block, in the same run, at decode and prefill token counts of Qwen3-30B-A3B's
layer shape (128 experts, top-8, hidden 2048, expert intermediate 768), random weights in bf16 (``--fp8``: the
fused layer's experts in FP8 per channel).

Each variant runs the whole layer from hidden states (router matmul included). The fused layer is timed as
a CUDA graph (``benchmarks.lib.common.time_graph``: it never waits on the host, so it can be captured) that
cycles through inputs routed to different experts; the loop and transformers' block wait on the host for
their per-expert counts and are timed eagerly. At decode the fused layer's time is also given as a share of
the HBM roofline counted on the bytes of the experts its tokens actually read.

    python -m benchmarks.moe --device cuda [--tokens 1,8,64,512,2048] [--fp8] [--sweep] [--out FILE]
    python -m benchmarks.moe --device cpu --preset tiny   # the Triton interpreter: correctness, not speed
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from dataclasses import dataclass
from typing import Any

from benchmarks.lib.common import ResultLog, add_out_argument, ratio, rel_err


@dataclass(frozen=True)
class Preset:
    experts: int
    top_k: int
    hidden: int
    inter: int


PRESETS = {"qwen3-30b-a3b": Preset(128, 8, 2048, 768), "tiny": Preset(8, 2, 64, 32)}
# HBM bandwidth of the GPUs the roofline is counted on (bytes/s), by a piece of the device name.
HBM_PEAK = {"H100": 3.35e12, "H200": 4.8e12, "A100": 2.0e12}


def _eager_s(fn: Any, inputs: list[Any], device: Any, repeats: int) -> float:
    import torch

    for x in inputs[:2]:
        fn(x)
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    sync()
    start = time.perf_counter()
    for i in range(repeats):
        fn(inputs[i % len(inputs)])
    sync()
    return (time.perf_counter() - start) / repeats


def _hf_block(preset: Preset, router: Any, w13: Any, w2: Any) -> Any:
    from transformers import Qwen3MoeConfig
    from transformers.models.qwen3_moe.modeling_qwen3_moe import Qwen3MoeSparseMoeBlock

    config = Qwen3MoeConfig(
        hidden_size=preset.hidden,
        moe_intermediate_size=preset.inter,
        num_experts=preset.experts,
        num_experts_per_tok=preset.top_k,
        norm_topk_prob=True,
    )
    # What from_pretrained picks where torch has grouped_mm (the CUDA default); the loop of its experts elsewhere.
    config._experts_implementation = "grouped_mm" if w13.is_cuda else "eager"
    print(f"transformers' MoE block runs its experts with {config._experts_implementation!r}", flush=True)
    block = Qwen3MoeSparseMoeBlock(config).to(device=w13.device, dtype=w13.dtype).eval()
    block.gate.weight.data.copy_(router)
    block.experts.gate_up_proj.data.copy_(w13)
    block.experts.down_proj.data.copy_(w2)
    return block


def _sweep(rows_per_expert: float, config: Any) -> list[Any]:
    """Tile configs worth trying: narrow row blocks and a range of weight tiles where experts get few rows,
    wider row blocks where they get many."""
    if rows_per_expert <= 16:
        return [config(16, bn, bk, 4, 4) for bn in (32, 64, 128) for bk in (128, 256)]
    tiles = [(32, 64, 64, 4), (64, 64, 64, 4), (64, 128, 64, 4), (64, 128, 64, 8), (64, 128, 128, 8)]
    return [config(bm, bn, bk, warps, 3) for bm, bn, bk, warps in tiles if bm <= 2 * rows_per_expert]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    parser.add_argument("--preset", choices=tuple(PRESETS), default=None, help="default: qwen3-30b-a3b (tiny on cpu)")
    parser.add_argument("--tokens", default=None, help="comma-separated token counts (default 1,8,64,512,2048)")
    parser.add_argument("--fp8", action="store_true", help="the fused layer's experts in FP8 per channel")
    parser.add_argument("--sweep", action="store_true", help="also try other tile configs per token count")
    add_out_argument(parser, "moe")
    args = parser.parse_args()
    if args.device == "cpu":
        os.environ["TRITON_INTERPRET"] = "1"  # before Triton is first imported
    import torch
    from omni_gateway.kernels import moe_reference as ref
    from omni_gateway.kernels.fused_moe import MoeConfig, default_config, fused_moe
    from triton.runtime.errors import OutOfResources

    from benchmarks.lib.common import time_graph

    if args.device == "cuda" and not torch.cuda.is_available():
        print("--device cuda needs a CUDA GPU", file=sys.stderr)
        return 2
    preset = PRESETS[args.preset or ("qwen3-30b-a3b" if args.device == "cuda" else "tiny")]
    tokens = [int(t) for t in (args.tokens or ("1,8,64,512,2048" if args.device == "cuda" else "1,16")).split(",")]
    device = torch.device(args.device)
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    name = torch.cuda.get_device_name() if device.type == "cuda" else "cpu (Triton interpreter)"
    peak = next((bw for key, bw in HBM_PEAK.items() if key in name), None)
    print(f"{name}, torch {torch.__version__}, {preset}, {dtype}, fp8 experts: {args.fp8}", flush=True)
    torch.manual_seed(0)
    e, h, inter = preset.experts, preset.hidden, preset.inter
    router = torch.randn(e, h, device=device, dtype=dtype) * 0.02
    w13 = torch.randn(e, 2 * inter, h, device=device, dtype=dtype) * h**-0.5
    w2 = torch.randn(e, h, inter, device=device, dtype=dtype) * inter**-0.5
    scales: dict[str, Any] = {}
    experts = (w13, w2)
    if args.fp8:
        (q13, s13), (q2, s2) = ref.quantize_experts(w13), ref.quantize_experts(w2)
        experts, scales = (q13, q2), {"w13_scale": s13, "w2_scale": s2}
    hf = _hf_block(preset, router, w13, w2)
    expert_bytes = sum(w[0].numel() * w.element_size() for w in experts)

    def routed(x: Any) -> tuple[Any, Any]:
        return ref.route(x @ router.T, preset.top_k, renormalize=True)

    def fused(x: Any, config: MoeConfig | None = None) -> Any:
        return fused_moe(x, *experts, *routed(x), config=config, **scales)

    def loop(x: Any) -> Any:
        return ref.fused_moe(x, w13, w2, *routed(x))

    log = ResultLog(args.out, "moe", device=name, preset=repr(preset), fp8=args.fp8)
    with torch.inference_mode():
        for count in tokens:
            inputs = [torch.randn(count, h, device=device, dtype=dtype) for _ in range(8)]
            expected = loop(inputs[0])
            err = rel_err(fused(inputs[0]), expected)
            hf_err = rel_err(hf(inputs[0][None])[0], expected)
            repeats = 20 if device.type == "cuda" else 2
            loop_s = _eager_s(loop, inputs, device, repeats)
            hf_s = _eager_s(lambda x: hf(x[None]), inputs, device, repeats)
            candidates = {default_config(count, preset.top_k, e)}
            if args.sweep:
                candidates |= set(_sweep(count * preset.top_k / e, MoeConfig))
            timed = []
            for config in candidates:
                try:
                    if device.type == "cuda":
                        seconds = time_graph(lambda i, c=config: fused(inputs[i], c), len(inputs), 50e-6)
                    else:
                        seconds = _eager_s(lambda x, c=config: fused(x, c), inputs, device, repeats)
                except OutOfResources as exc:  # a swept tile that needs more shared memory than the GPU has
                    print(f"    skipped {config}: {exc}", flush=True)
                    continue
                timed.append((seconds, config))
            timed.sort(key=lambda t: t[0])
            default_s = next(s for s, c in timed if c == default_config(count, preset.top_k, e))
            hit = sum(int(torch.unique(routed(x)[1]).numel()) for x in inputs) / len(inputs)
            read_bytes = hit * expert_bytes
            share = read_bytes / default_s / peak if peak else None
            print(
                f"T={count:5d}: fused {default_s * 1e6:9.1f} us | per-expert loop {loop_s * 1e6:9.1f} us "
                f"({ratio(loop_s, default_s)} of fused) | transformers {hf_s * 1e6:9.1f} us ({ratio(hf_s, default_s)}) "
                f"| experts read {hit:.1f}, {read_bytes / default_s / 1e9:.0f} GB/s"
                + (f" = {share:.0%} of HBM peak" if share else "")
                + f" | rel err {err:.1e} (transformers {hf_err:.1e})",
                flush=True,
            )
            if args.sweep:
                for seconds, config in timed[:3]:
                    print(f"    {seconds * 1e6:9.1f} us  {config}", flush=True)
            log.write(
                "layer",
                tokens=count,
                fused_us=default_s * 1e6,
                loop_us=loop_s * 1e6,
                transformers_us=hf_s * 1e6,
                speedup_vs_loop=loop_s / default_s,
                speedup_vs_transformers=hf_s / default_s,
                experts_read=hit,
                read_gbps=read_bytes / default_s / 1e9,
                hbm_share=share,
                rel_err=err,
                config=repr(default_config(count, preset.top_k, e)),
                best=[(s * 1e6, repr(c)) for s, c in timed[:3]],
            )
    log.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
