"""Latency of image input: decode, vision tower, and LLM prefill per frame.

A random Qwen2-VL-shaped (or LLaVA-shaped) checkpoint is built in a temp dir (no download): the
numbers measure the code path and the model size, not a trained model's quality.

    python -m benchmarks.vision --family qwen2_vl --frames 8 --size 224
    python -m benchmarks.vision --device cuda --preset 2b --frames 16 --size 448   # on a GPU

``--preset 2b`` gives the layer sizes of Qwen2-VL-2B (LM 28 x 1536, tower 32 x 1280) or, with
``--family llava``, of LLaVA-1.5-7B (LM 32 x 4096, CLIP ViT-L/14 tower); the default ``tiny`` preset
is small enough for a CPU. On CUDA the weights are bfloat16 and every stage is timed to its end
(device synchronized).

Each frame is a different random picture (a webcam stream), prompted with the same text: decode
(PNG), encode (vision tower; the cache misses), prefill (engine step to the first token; the text
before the image comes from the prefix cache after the first frame). A repeated frame is timed too
(cache hit: no tower run, and the image's KV blocks are reused), and its ratio to a new frame printed.
Every frame's figures are appended to ``benchmarks/results/vision.jsonl`` (``--out``).
"""

from __future__ import annotations

import argparse
import io
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch
from PIL import Image

from benchmarks.lib.common import ResultLog, add_out_argument

SPECIALS = ["<eos>", "<bos>", "<image>", "<|vision_start|>", "<|image_pad|>", "<|video_pad|>", "<|vision_end|>"]


def build_tokenizer() -> Any:
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.train_from_iterator(
        ["describe what the camera sees right now in a few words"] * 4,
        trainers.BpeTrainer(
            vocab_size=300, special_tokens=SPECIALS, initial_alphabet=pre_tokenizers.ByteLevel.alphabet()
        ),
    )
    hf = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<eos>", bos_token="<bos>")
    hf.chat_template = (
        "{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}"
        "{% if add_generation_prompt %}assistant:{% endif %}"
    )
    return hf


# Layer sizes per preset: (text model, Qwen2-VL tower, CLIP tower).
PRESETS: dict[str, tuple[dict[str, int], dict[str, int], dict[str, int]]] = {
    "tiny": (
        dict(
            hidden_size=512, intermediate_size=1536, num_hidden_layers=4, num_attention_heads=8, num_key_value_heads=4
        ),
        dict(depth=4, embed_dim=256, hidden_size=512, num_heads=4),
        dict(hidden_size=256, intermediate_size=1024, num_hidden_layers=4, num_attention_heads=4),
    ),
    "2b": (
        dict(
            hidden_size=1536,
            intermediate_size=8960,
            num_hidden_layers=28,
            num_attention_heads=12,
            num_key_value_heads=2,
        ),
        dict(depth=32, embed_dim=1280, hidden_size=1536, num_heads=16),
        dict(hidden_size=1024, intermediate_size=4096, num_hidden_layers=24, num_attention_heads=16),
    ),
}


def build_checkpoint(family: str, directory: Path, size: int, preset: str = "tiny") -> None:
    tok = build_tokenizer()
    ids = {name: tok.convert_tokens_to_ids(name) for name in SPECIALS}
    text_sizes, qwen_tower, clip_tower = PRESETS[preset]
    if family == "llava" and preset != "tiny":
        text_sizes = dict(
            hidden_size=4096,
            intermediate_size=11008,
            num_hidden_layers=32,
            num_attention_heads=32,
            num_key_value_heads=32,
        )
    text = dict(vocab_size=512, max_position_embeddings=4096, eos_token_id=0, bos_token_id=1, **text_sizes)
    if family == "qwen2_vl":
        from transformers import Qwen2VLConfig, Qwen2VLForConditionalGeneration
        from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import (
            Qwen2VLImageProcessorPil,
        )

        half = text["hidden_size"] // text["num_attention_heads"] // 2
        section = [half // 4, (half - half // 4) // 2, half - half // 4 - (half - half // 4) // 2]
        text["rope_parameters"] = {"rope_type": "default", "rope_theta": 10000.0, "mrope_section": section}
        config = Qwen2VLConfig(
            text_config=text,
            vision_config=dict(mlp_ratio=4, patch_size=14, **qwen_tower),
            image_token_id=ids["<|image_pad|>"],
            video_token_id=ids["<|video_pad|>"],
            vision_start_token_id=ids["<|vision_start|>"],
            vision_end_token_id=ids["<|vision_end|>"],
        )
        Qwen2VLForConditionalGeneration(config).save_pretrained(directory)
        Qwen2VLImageProcessorPil(min_pixels=size * size, max_pixels=size * size).save_pretrained(directory)
    else:
        from transformers import (
            CLIPVisionConfig,
            LlamaConfig,
            LlavaConfig,
            LlavaForConditionalGeneration,
        )
        from transformers.models.clip.image_processing_pil_clip import (
            CLIPImageProcessorPil,
        )

        config = LlavaConfig(
            vision_config=CLIPVisionConfig(image_size=size, patch_size=14, **clip_tower),
            text_config=LlamaConfig(**text),
            image_token_id=ids["<image>"],
        )
        LlavaForConditionalGeneration(config).save_pretrained(directory)
        CLIPImageProcessorPil(size={"shortest_edge": size}, crop_size={"height": size, "width": size}).save_pretrained(
            directory
        )
    tok.save_pretrained(directory)


def frame_png(seed: int, size: int) -> bytes:
    rng = np.random.default_rng(seed)
    out = io.BytesIO()
    Image.fromarray(rng.integers(0, 256, (size, size, 3), dtype=np.uint8)).save(out, format="PNG")
    return out.getvalue()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--family", choices=["qwen2_vl", "llava"], default="qwen2_vl")
    parser.add_argument("--frames", type=int, default=8)
    parser.add_argument("--size", type=int, default=224, help="frame side in pixels (a multiple of 28)")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--device", default="cpu", help="cpu or cuda")
    parser.add_argument("--preset", choices=sorted(PRESETS), default="tiny")
    add_out_argument(parser, "vision")
    args = parser.parse_args()
    if args.frames < 1:
        parser.error(f"--frames: expected at least 1, got {args.frames}")
    torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32

    def sync() -> None:
        if device.type == "cuda":
            torch.cuda.synchronize(device)

    from omni_gateway.encoders.image import decode_image
    from omni_gateway.encoders.vision import load_vision_encoder
    from omni_gateway.engine.config import EngineConfig
    from omni_gateway.engine.core.llm_engine import LLMEngine
    from omni_gateway.engine.sampling_params import SamplingParams
    from omni_gateway.omni.protocol import ImagePart, Message, OmniRequest, TextPart
    from omni_gateway.omni.vision import build_vision_prompt

    with tempfile.TemporaryDirectory() as tmp:
        directory = Path(tmp)
        build_checkpoint(args.family, directory, args.size, args.preset)
        encoder = load_vision_encoder(directory, device=device, dtype=dtype)
        engine = LLMEngine(EngineConfig(model=str(directory), device=args.device, num_kv_blocks=512))
        params = SamplingParams(temperature=0, max_tokens=1, ignore_eos=True)
        pngs = [frame_png(i, args.size) for i in range(args.frames)] + [frame_png(0, args.size)]
        rows: list[tuple[float, float, float, int, int]] = []
        for i, png in enumerate(pngs):
            t0 = time.perf_counter()
            image = decode_image(png)
            t1 = time.perf_counter()
            features = encoder.encode_image(image)
            sync()
            t2 = time.perf_counter()
            request = OmniRequest(
                request_id=str(i),
                messages=(
                    Message(
                        "user", (TextPart("describe what the camera sees right now in a few words"), ImagePart(png))
                    ),
                ),
            )
            prompt = build_vision_prompt(request, engine.tokenizer, encoder)  # cache hit: the frame was encoded
            t3 = time.perf_counter()
            engine.add_request(str(i), prompt.token_ids, params, embed_spans=prompt.embed_spans)
            while engine.has_unfinished():
                engine.step()
            sync()
            t4 = time.perf_counter()
            (out,) = engine.pop_finished()
            rows.append(
                ((t1 - t0) * 1e3, (t2 - t1) * 1e3, (t4 - t3) * 1e3, len(prompt.token_ids), out.num_cached_tokens)
            )
            del features

    gpu = torch.cuda.get_device_name(device) if device.type == "cuda" else f"cpu, {args.threads} threads"
    print(
        f"family={args.family} preset={args.preset} frame={args.size}x{args.size} "
        f"image_tokens={prompt.num_image_tokens} device={gpu} {str(dtype).removeprefix('torch.')}"
    )
    print(f"{'frame':>5} {'decode ms':>10} {'encode ms':>10} {'prefill ms':>11} {'prompt':>7} {'cached':>7}")
    for i, (dec, enc, pre, n, cached) in enumerate(rows):
        label = "rep" if i == len(rows) - 1 else str(i)
        print(f"{label:>5} {dec:10.1f} {enc:10.1f} {pre:11.1f} {n:7d} {cached:7d}")
    fresh = rows[1:-1] or rows[:1]  # skip the first frame (warm-up) and the repeat
    print(
        f"median over new frames: decode {statistics.median(r[0] for r in fresh):.1f} ms, "
        f"encode {statistics.median(r[1] for r in fresh):.1f} ms, "
        f"prefill {statistics.median(r[2] for r in fresh):.1f} ms; "
        f"repeated frame: encode {rows[-1][1]:.2f} ms, prefill {rows[-1][2]:.1f} ms"
    )
    new_encode, new_prefill = statistics.median(r[1] for r in fresh), statistics.median(r[2] for r in fresh)
    print(
        f"repeated frame against a new one: encode {new_encode / rows[-1][1]:.1f}x faster, "
        f"prefill {new_prefill / rows[-1][2]:.2f}x faster"
    )
    with ResultLog(
        args.out,
        "vision",
        family=args.family,
        preset=args.preset,
        size=args.size,
        device=gpu,
        dtype=str(dtype).removeprefix("torch."),
        image_tokens=prompt.num_image_tokens,
    ) as log:
        for i, (dec, enc, pre, n, cached) in enumerate(rows):
            log.write(
                "frame",
                frame="repeat" if i == len(rows) - 1 else i,
                decode_ms=dec,
                encode_ms=enc,
                prefill_ms=pre,
                prompt_tokens=n,
                cached_tokens=cached,
            )


if __name__ == "__main__":
    main()
