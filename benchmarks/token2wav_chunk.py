"""token2wav's first audio chunk (or a later one): ours against transformers, in the same command.

A speaking model's first audio waits for the first chunk's token2wav call: the flow-matching ODE over the
chunk's window of codes (40 DiT evaluations at 10 steps) and the vocoder. Later chunks are larger
(``--chunk later``): many streams' later chunks are what keeps the GPU's arithmetic busy. Ours is
``Token2Wav._chunk_group`` (``token2wav.dit.FastDiT`` and ``token2wav.vocoder.FastVocoder``, every row of a
batch in one call; with ``--graphs`` replayed from CUDA graphs); the baseline is transformers' own
``Qwen2_5OmniToken2WavDiTModel.sample`` and BigVGAN forward over the same window, once per row. Random
weights in Qwen2.5-Omni-7B's token2wav shapes (``--shapes 7b``) or the tiny test checkpoint's (``tiny``),
float32 as the checkpoint's authors run it (ours with ``--dit-dtype bfloat16``: the DiT on tensor cores).

    python -m benchmarks.token2wav_chunk                              # CUDA: 7B shapes, 1 and 8 rows, 10 and 4 steps
    python -m benchmarks.token2wav_chunk --shapes tiny --device cpu --rows 1 --steps 4
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable
from typing import Any

import torch

from benchmarks.lib.common import ResultLog, add_out_argument


def build(shapes: str, device: torch.device) -> tuple[Any, Any]:
    """transformers' token2wav model with random weights (snake parameters drawn away from zero) and a voice."""
    from omni_gateway.omni.heads.token2wav.loader import Speaker
    from transformers import Qwen2_5OmniConfig
    from transformers.models.qwen2_5_omni.modeling_qwen2_5_omni import Qwen2_5OmniToken2WavModel

    if shapes == "tiny":
        from tests.harness.tiny_omni import tiny_omni_config

        config = tiny_omni_config().token2wav_config
    else:
        config = Qwen2_5OmniConfig().token2wav_config
    config._attn_implementation = "sdpa"
    torch.manual_seed(0)
    model = Qwen2_5OmniToken2WavModel(config).float().eval().to(device)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if name.endswith(("alpha", "beta")):
                param.copy_(torch.randn_like(param) * 0.3)
    dit = config.dit_config
    voice = Speaker(
        cond=torch.randn(1, dit.enc_emb_dim, device=device),
        ref_mel=torch.randn(1, 300, dit.mel_dim, device=device),
        bos_token=1,
    )
    return model, voice


def timed(fn: Callable[[], Any], device: torch.device, repeats: int) -> float:
    """Mean seconds of ``fn`` after one warm-up call, the device synchronized around each."""
    fn()
    total = 0.0
    for _ in range(repeats):
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        start = time.perf_counter()
        fn()
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        total += time.perf_counter() - start
    return total / repeats


def main() -> None:
    from omni_gateway.omni.heads.token2wav.chunking import DIT_DTYPES
    from omni_gateway.omni.heads.token2wav.head import Token2Wav, Token2WavConfig
    from omni_gateway.omni.heads.token2wav.loader import Token2WavModels

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--shapes", choices=("7b", "tiny"), default="7b")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--rows", type=int, nargs="+", default=[1, 8], help="streams whose first chunks share a call")
    parser.add_argument("--steps", type=int, nargs="+", default=[10, 4], help="ODE steps of the first chunk")
    parser.add_argument("--graphs", action="store_true", help="ours replayed from CUDA graphs (CUDA only)")
    parser.add_argument("--dit-dtype", choices=DIT_DTYPES, default="float32", help="our DiT's precision")
    parser.add_argument(
        "--chunk", choices=("first", "later"), default="first", help="a stream's first chunk or a later, larger one"
    )
    parser.add_argument("--repeats", type=int, default=3)
    add_out_argument(parser, "token2wav_chunk")
    args = parser.parse_args()
    device = torch.device(args.device)
    model, voice = build(args.shapes, device)
    models = Token2WavModels(model.code2wav_dit_model, model.code2wav_bigvgan_model, {"voice": voice}, device)
    gen = torch.Generator().manual_seed(1)
    print(
        f"token2wav {args.chunk} chunk, {args.shapes} shapes, {device}, our DiT in {args.dit_dtype}: ours vs "
        "transformers (sample + BigVGAN per row)"
    )
    log_fields = {"shapes": args.shapes, "graphs": args.graphs, "dit_dtype": args.dit_dtype, "chunk": args.chunk}
    with ResultLog(args.out, "token2wav_chunk", **log_fields) as log:
        for steps in args.steps:
            graphs = args.graphs and device.type == "cuda"
            if args.chunk == "first":
                config = Token2WavConfig(first_chunk_steps=steps, cuda_graphs=graphs, dit_dtype=args.dit_dtype)
            else:
                config = Token2WavConfig(num_steps=steps, cuda_graphs=graphs, dit_dtype=args.dit_dtype)
            t2w = Token2Wav(models, config)
            window, left, chunk = t2w.regular_shapes()[0 if args.chunk == "first" else 1]
            lane = 0 if args.chunk == "first" else config.lanes - 1  # the lane that runs such chunks
            code = torch.randint(0, t2w.num_codes, (1, window), generator=gen)
            noise = torch.randn(1, window * t2w.repeats, t2w.mel_dim, generator=gen)
            edge = torch.zeros(1, t2w.mel_dim, left, device=device)
            on_device = code.to(device)

            def transformers_row() -> None:
                with torch.inference_mode():
                    mel = model.code2wav_dit_model.sample(voice.cond, voice.ref_mel, on_device, num_steps=steps)
                    model.code2wav_bigvgan_model(mel)

            for rows in args.rows:
                calls = [(code, noise, voice, edge, chunk)] * rows
                ours = timed(lambda calls=calls: t2w._chunk_group(calls, lane), device, args.repeats)
                baseline = timed(lambda rows=rows: [transformers_row() for _ in range(rows)], device, args.repeats)
                speedup = baseline / ours
                print(
                    f"  {steps:>2} steps, {rows:>2} rows: ours {1e3 * ours:8.1f} ms   "
                    f"transformers {1e3 * baseline:8.1f} ms   {speedup:5.2f}x",
                    flush=True,
                )
                log.write(
                    "chunk",
                    steps=steps,
                    rows=rows,
                    window_codes=window,
                    ours_ms=1e3 * ours,
                    transformers_ms=1e3 * baseline,
                    speedup=speedup,
                )
            t2w.close()


if __name__ == "__main__":
    main()
