"""Throughput and time to first preview of the image head against a plain diffusers pipeline call.

Random weights (no downloads): the ``pixart512`` preset has PixArt-alpha 512's transformer shape
(28 layers, hidden 1152, 16 heads, patch 2, ~610M parameters) and the SD VAE's shape; its text encoder
is a one-layer random T5 with d_model 4096 (PixArt's caption width) over a word-level vocabulary,
far cheaper than T5-XXL, so the numbers are about the denoiser and the VAE. ``tiny`` is the test-sized
model for a CPU reference figure.

Measured in one process, same pipeline object, same prompts and sizes:
  plain      pipe(prompt) one image at a time (batch 1), and one call over all prompts (batch N)
  head       ImageHead.generate: one request alone (time to first preview, total), and N concurrent
             requests, which the head batches into one denoising loop

Prints every figure and the head's ratios to the plain calls, and appends them as one record to
``benchmarks/results/dit.jsonl`` (``--out``).

    python -m benchmarks.dit --preset pixart512 --requests 8 --steps 20 --preview-every 5
    python -m benchmarks.dit --preset tiny --device cpu --steps 4 --size 32
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time
from typing import Any

import torch
from omni_gateway.omni.heads.dit.head import ImageHead
from omni_gateway.omni.heads.dit.loader import ImageHeadConfig, select_device
from omni_gateway.omni.protocol import ImageFinal, ImageOutputOptions, ImagePartial

from benchmarks.lib.common import ResultLog, add_out_argument
from tests.harness.tiny_dit import TINY_PIXART, pixart_pipeline

PROMPTS = [
    "a red cat on a mat",
    "a blue sky over a green tree",
    "a dog in the snow",
    "a city at night",
    "a bowl of fruit",
    "a sailing boat",
    "a mountain lake",
    "a portrait of an old man",
]

PRESETS: dict[str, dict[str, Any]] = {
    "pixart512": dict(
        transformer=dict(
            sample_size=64,
            num_layers=28,
            attention_head_dim=72,
            num_attention_heads=16,
            in_channels=4,
            out_channels=8,
            caption_channels=4096,
            cross_attention_dim=1152,
            patch_size=2,
            norm_type="ada_norm_single",
            num_embeds_ada_norm=1000,
            activation_fn="gelu-approximate",
            attention_bias=True,
            norm_elementwise_affine=False,
            norm_eps=1e-6,
        ),
        vae=dict(
            block_out_channels=(128, 256, 512, 512),
            layers_per_block=2,
            latent_channels=4,
            down_block_types=("DownEncoderBlock2D",) * 4,
            up_block_types=("UpDecoderBlock2D",) * 4,
            norm_num_groups=32,
            sample_size=512,
            scaling_factor=0.18215,
        ),
        t5=dict(d_model=4096, d_kv=64, d_ff=2048, num_layers=1, num_heads=16),
        vocab=4096,
        max_length=120,
    ),
    "tiny": dict(TINY_PIXART, vocab=64, max_length=16),
}


def build_pipeline(preset: dict[str, Any], device: torch.device, dtype: torch.dtype) -> Any:
    words = ["<pad>", "</s>", "<unk>"] + sorted({w for p in PROMPTS for w in p.split()})
    words += [f"w{i}" for i in range(preset["vocab"] - len(words))]
    pipe = pixart_pipeline(preset, words, preset["max_length"], str(device))
    pipe.to(device=device, dtype=dtype)
    pipe.set_progress_bar_config(disable=True)
    return pipe


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def plain_call(pipe: Any, prompts: list[str], args: argparse.Namespace, seed: int) -> float:
    generators = [torch.Generator("cpu").manual_seed(seed + i) for i in range(len(prompts))]
    t0 = time.perf_counter()
    pipe(
        prompt=prompts,
        num_inference_steps=args.steps,
        guidance_scale=args.guidance,
        height=args.size,
        width=args.size,
        generator=generators,
        output_type="np",
        use_resolution_binning=False,
        clean_caption=False,
    )
    return time.perf_counter() - t0


async def head_requests(
    head: ImageHead, prompts: list[str], args: argparse.Namespace, seed: int, preview_every: int
) -> tuple[float, list[float | None], list[float | None]]:
    """Wall time for all, and per request the time to its first preview and to its final image."""
    t0 = time.perf_counter()

    async def one(i: int, prompt: str) -> tuple[float | None, float | None]:
        first: float | None = None
        opts = ImageOutputOptions(
            size=(args.size, args.size),
            num_inference_steps=args.steps,
            guidance_scale=args.guidance,
            seed=seed + i,
            preview_every=preview_every,
        )
        done: float | None = None
        async for chunk in head.generate(prompt, opts):
            now = time.perf_counter() - t0
            if isinstance(chunk, ImagePartial) and first is None:
                first = now
            elif isinstance(chunk, ImageFinal):
                done = now
        return first, done

    results = await asyncio.gather(*(one(i, p) for i, p in enumerate(prompts)))
    return time.perf_counter() - t0, [r[0] for r in results], [r[1] for r in results]


def median(xs: list[float | None]) -> float:
    """Median of the values present (a request without previews has no first-preview time)."""
    present = [x for x in xs if x is not None]
    return statistics.median(present) if present else float("nan")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--preset", choices=sorted(PRESETS), default="pixart512")
    ap.add_argument("--device", default="auto")
    ap.add_argument("--size", type=int, default=512)
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--guidance", type=float, default=4.5)
    ap.add_argument("--preview-every", type=int, default=5)
    ap.add_argument("--requests", type=int, default=8, help="concurrent requests (and plain batch size)")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--threads", type=int, default=0, help="torch CPU threads (0: torch's default)")
    add_out_argument(ap, "dit")
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)

    device, dtype = select_device(args.device)
    t0 = time.perf_counter()
    pipe = build_pipeline(PRESETS[args.preset], device, dtype)
    sync(device)
    build_s = time.perf_counter() - t0
    n_params = sum(p.numel() for p in pipe.transformer.parameters())
    head = ImageHead(
        pipe, config=ImageHeadConfig(max_batch_images=args.requests, batch_window_s=0.02, max_images=1, min_side=16)
    )
    prompts = (PROMPTS * ((args.requests + len(PROMPTS) - 1) // len(PROMPTS)))[: args.requests]

    # warm-up: kernels, allocator, and the head's thread
    plain_call(pipe, prompts[:1], args, 0)
    plain_call(pipe, prompts, args, 0)
    asyncio.run(head_requests(head, prompts[:1], args, 0, args.preview_every))
    sync(device)

    plain_single = [plain_call(pipe, prompts[:1], args, 1) for _ in range(args.repeats)]
    plain_batch = [plain_call(pipe, prompts, args, 1) for _ in range(args.repeats)]
    head_single = [
        asyncio.run(head_requests(head, prompts[:1], args, 1, args.preview_every)) for _ in range(args.repeats)
    ]
    head_single_nopreview = [asyncio.run(head_requests(head, prompts[:1], args, 1, 0))[0] for _ in range(args.repeats)]
    head_many = [asyncio.run(head_requests(head, prompts, args, 1, args.preview_every)) for _ in range(args.repeats)]
    stats = head.metrics()
    head.close()

    n = len(prompts)
    res = {
        "preset": args.preset,
        "device": str(device),
        "dtype": str(dtype).removeprefix("torch."),
        "transformer_params_m": round(n_params / 1e6, 3),
        "build_s": round(build_s, 1),
        "size": args.size,
        "steps": args.steps,
        "guidance": args.guidance,
        "preview_every": args.preview_every,
        "requests": n,
        "repeats": args.repeats,
        "plain_single_s": median(plain_single),
        "plain_batch_s": median(plain_batch),
        "head_single_s": median([r[0] for r in head_single]),
        "head_single_first_preview_s": median([r[1][0] for r in head_single]),
        "head_single_no_preview_s": median(head_single_nopreview),
        "head_concurrent_s": median([r[0] for r in head_many]),
        "head_concurrent_first_preview_s": median([median(r[1]) for r in head_many]),
        "head_largest_batch": stats["image_largest_batch"],
    }
    res["plain_sequential_images_per_s"] = 1 / res["plain_single_s"]
    res["plain_batch_images_per_s"] = n / res["plain_batch_s"]
    res["head_concurrent_images_per_s"] = n / res["head_concurrent_s"]
    res["ratio_head_concurrent_vs_plain_sequential"] = (
        res["head_concurrent_images_per_s"] / res["plain_sequential_images_per_s"]
    )
    res["ratio_head_concurrent_vs_plain_batch"] = res["head_concurrent_images_per_s"] / res["plain_batch_images_per_s"]
    res["ratio_head_single_vs_plain_single_latency"] = res["head_single_s"] / res["plain_single_s"]
    with ResultLog(args.out, "dit") as log:
        log.write("result", **res)
    width = max(len(k) for k in res)
    for k, v in res.items():
        print(f"{k:<{width}}  {v:.4g}" if isinstance(v, float) else f"{k:<{width}}  {v}")


if __name__ == "__main__":
    main()
