"""Speech out of Qwen3-Omni: first audio, real-time factor and underruns per stream, ours against transformers.

A directory of config.json (``--model``: Qwen3-Omni-30B-A3B-Instruct's shapes from ``tests.harness.model_shapes``,
or the tiny speaking checkpoint's), a word tokenizer over the whole vocabulary and the preprocessor config, and
nothing else: every weight is random, made on the device from the config (``load_format="dummy"``).

transformers' ``generate(return_audio=True)`` at concurrency 1 is the baseline; it runs first on its own random
weights built on the device and is freed before ours loads (both do not fit one 80 GB GPU at bf16). Its audio
arrives all at once, so its first audio is its whole run. Ours: the thinker on the paged engine (dummy weights,
``--quantization fp8`` to quantize it at load when bf16 leaves too little room for the KV caches), the talker,
code predictor and code2wav of ``omni.qwen3_speech.Qwen3SpokenModel`` (dummy weights) and the audio tower (loaded
for its memory; prompts are text), driven through ``Qwen3SpokenModel.speak`` with no web stack.

Per stream: first audio (the request handed to the pipeline -> its first PCM chunk); real-time factor (wall time
/ seconds of audio); underruns: a player that starts at the first chunk and plays the chunks back to back, each
time a chunk arrives after the audio before it ran out (``stall_s``: the longest such wait); ``gap_s``: the longest
time between two chunks after the first.

    python -m benchmarks.qwen3_omni_speech --model qwen3-omni-30b-a3b --concurrency 1 8 32 64   # one H100/H200
    python -m benchmarks.qwen3_omni_speech --model qwen3-omni-30b-a3b --quantization fp8 --concurrency 1 8 32 64
    python -m benchmarks.qwen3_omni_speech --model tiny-qwen3-omni --device cpu --concurrency 1 2   # smoke run
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import gc
import statistics
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from benchmarks.lib.common import ResultLog, add_out_argument, summary
from benchmarks.lib.spoken_turns import speak_timed, speech_times

MODELS = ("qwen3-omni-30b-a3b", "tiny-qwen3-omni")
VOICE = "ethan"
SAMPLE_RATE = 24000


def model_config(model: str) -> Any:
    if model == "qwen3-omni-30b-a3b":
        from tests.harness.model_shapes import shape_config

        return shape_config(model)
    from tests.harness.tiny_qwen3_omni import tiny_qwen3_omni_config

    config = tiny_qwen3_omni_config(speech=True)
    config.architectures = ["Qwen3OmniMoeForConditionalGeneration"]
    return config


def write_model_dir(model: str, directory: Path) -> Any:
    """config.json, a tokenizer covering the thinker's vocabulary and the audio preprocessor config."""
    from transformers import WhisperFeatureExtractor

    from tests.harness.model_shapes import word_tokenizer

    config = model_config(model)
    config.save_pretrained(directory)
    word_tokenizer(int(config.thinker_config.text_config.vocab_size)).save_pretrained(directory)
    bins = int(config.thinker_config.audio_config.num_mel_bins)
    WhisperFeatureExtractor(feature_size=bins, sampling_rate=16000).save_pretrained(directory)
    return config


def prompts(config: Any, n: int, words: int, generator: torch.Generator) -> list[list[int]]:
    """A user turn of ``words`` random ordinary ids and the assistant's start, in the ChatML ids of ``config``."""
    vocab = min(1000, int(config.thinker_config.text_config.vocab_size))  # clear of the special ids
    user, assistant = int(config.user_token_id), int(config.assistant_token_id)
    start, end, newline = int(config.im_start_token_id), int(config.im_end_token_id), 198 % vocab
    out = []
    for _ in range(n):
        body = torch.randint(200, vocab, (words,), generator=generator).tolist()
        out.append([start, user, newline, *body, end, newline, start, assistant, newline])
    return out


def free_device() -> None:
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.synchronize()
        torch.cuda.empty_cache()


def hf_baseline(config: Any, prompt: list[int], text_tokens: int, frames: int, device: torch.device) -> dict:
    """transformers' ``generate(return_audio=True)`` on random weights built on ``device``: a warm-up, then one
    timed run of ``text_tokens`` thinker tokens and ``frames`` codec frames (both forced: no early end)."""
    from transformers import Qwen3OmniMoeForConditionalGeneration

    from tests.harness.model_shapes import fill_fused_experts

    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    torch.manual_seed(0)
    with device:
        hf = Qwen3OmniMoeForConditionalGeneration._from_config(config, dtype=dtype).eval()
    fill_fused_experts(hf)
    ids = torch.tensor([prompt], device=device)

    def run(model: Any, tokens: int, codes: int) -> tuple[float, float]:
        start = time.perf_counter()
        _, wav = model.generate(
            input_ids=ids,
            attention_mask=torch.ones_like(ids),
            speaker=VOICE,
            return_audio=True,
            thinker_max_new_tokens=tokens,
            thinker_min_new_tokens=tokens,
            thinker_do_sample=True,
            talker_max_new_tokens=codes,
            talker_min_new_tokens=codes,
        )
        if device.type == "cuda":
            torch.cuda.synchronize()
        return time.perf_counter() - start, (wav.numel() if wav is not None else 0) / SAMPLE_RATE

    try:
        with torch.inference_mode():
            run(hf, 4, 8)
            wall, audio_s = run(hf, text_tokens, frames)
    finally:
        del hf
        free_device()
    return speech_times(wall, wall, audio_s)


def playback(arrivals: Sequence[tuple[float, float]]) -> dict[str, float]:
    """``arrivals``: (time after the request, seconds of audio) of each chunk, in order. A player starts at the
    first chunk and plays them back to back, waiting where the next one has not come yet."""
    if not arrivals:
        return {"underruns": 0, "stall_s": 0.0, "gap_s": 0.0}
    played_until = arrivals[0][0] + arrivals[0][1]
    underruns, stall, gap = 0, 0.0, 0.0
    for (before, _), (at, seconds) in zip(arrivals, arrivals[1:]):
        gap = max(gap, at - before)
        if at > played_until + 1e-6:
            underruns += 1
            stall = max(stall, at - played_until)
            played_until = at
        played_until += seconds
    return {"underruns": underruns, "stall_s": stall, "gap_s": gap}


@dataclasses.dataclass
class Ours:
    thinker: Any
    speech: Any
    audio: Any

    def shutdown(self) -> None:
        self.thinker.shutdown()
        self.speech.shutdown()


def build_ours(directory: Path, args: argparse.Namespace, device: torch.device, max_seqs: int) -> Ours:
    from omni_gateway.encoders.audio_tower import load_audio_encoder
    from omni_gateway.engine.config import EngineConfig, default_block_size
    from omni_gateway.engine.frontend.launch import start_engine
    from omni_gateway.omni.qwen3_dummy import audio_fill
    from omni_gateway.omni.qwen3_speech import Qwen3SpeechConfig, Qwen3SpokenModel

    block = default_block_size(device.type)
    thinker_len = args.prompt_words + 16 + args.text_tokens
    talker_len = args.prompt_words + 16 + args.frames
    common: dict[str, Any] = dict(max_num_seqs=max_seqs, enforce_eager=args.enforce_eager, block_size=block)
    if device.type == "cpu":
        common["attention_backend"] = "torch"
    dtype = "bfloat16" if device.type == "cuda" else "float32"
    thinker_config = EngineConfig(
        model=str(directory),
        load_format="dummy",
        device=device.type,
        dtype=dtype,
        quantization=args.quantization,
        max_model_len=max(thinker_len, 256),
        num_kv_blocks=max_seqs * -(-thinker_len // block) + 64,
        engine_in_process=True,
        **common,
    )
    thinker = start_engine(thinker_config)
    speech = Qwen3SpokenModel.load(
        directory,
        device=device.type,
        config=Qwen3SpeechConfig(max_frames=args.frames),
        load_format="dummy",
        engine_options=dict(
            max_model_len=max(talker_len, 256), num_kv_blocks=max_seqs * -(-talker_len // block) + 64, **common
        ),
    )
    torch_dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    fill = audio_fill(0, device, torch_dtype)
    audio = load_audio_encoder(directory, device=device, dtype=torch_dtype, fill=fill)
    return Ours(thinker, speech, audio)


async def speak_all(
    ours: Ours, batch: list[list[int]], text_tokens: int, arrival_s: float = 0.0
) -> list[dict[str, Any]]:
    """Each prompt's answer spoken, the i-th sent ``i * arrival_s`` after the first; times from its own sending."""
    from omni_gateway.engine.sampling_params import SamplingParams

    params = SamplingParams(max_tokens=text_tokens, ignore_eos=True, temperature=0.7)

    async def one(i: int, prompt: list[int]) -> dict[str, Any]:
        await asyncio.sleep(i * arrival_s)
        turn = await speak_timed(ours.speech, ours.thinker, i, prompt, params, VOICE, SAMPLE_RATE)
        arrivals = [(at, n / turn.sample_rate) for at, n in turn.arrivals]
        audio_s = sum(seconds for _, seconds in arrivals)
        first = arrivals[0][0] if arrivals else turn.wall_s
        return {**speech_times(first, turn.wall_s, audio_s), **playback(arrivals)}

    return list(await asyncio.gather(*(one(i, p) for i, p in enumerate(batch))))


def memory_note(device: torch.device) -> dict[str, float]:
    if device.type != "cuda":
        return {}
    free, total = torch.cuda.mem_get_info()
    return {
        "gpu_allocated_gb": torch.cuda.memory_allocated() / 1e9,
        "gpu_free_gb": free / 1e9,
        "gpu_total_gb": total / 1e9,
    }


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", choices=MODELS, default="qwen3-omni-30b-a3b")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 8, 32, 64])
    parser.add_argument("--quantization", choices=("none", "fp8"), default="none", help="the thinker's, at load")
    parser.add_argument("--prompt-words", type=int, default=48, help="random ids in each user turn")
    parser.add_argument("--text-tokens", type=int, default=48, help="thinker tokens per answer")
    parser.add_argument("--frames", type=int, default=100, help="codec frames per answer (12.5 a second: 8 s)")
    parser.add_argument("--arrival-ms", type=float, default=0.0, help="send a run's requests this far apart")
    parser.add_argument("--no-baseline", action="store_true")
    parser.add_argument("--enforce-eager", action="store_true", help="thinker and talker without CUDA graphs")
    add_out_argument(parser, "qwen3_omni_speech")
    args = parser.parse_args(argv)
    if min(args.concurrency) < 1 or args.frames < 1 or args.text_tokens < 1:
        parser.error("--concurrency, --frames and --text-tokens must be 1 or more")
    from omni_gateway.omni.loading import STAGE_SWITCH_INTERVAL_S

    sys.setswitchinterval(STAGE_SWITCH_INTERVAL_S)  # stage threads beside the event loop, as omni serve runs them
    device = torch.device(args.device)
    quantization = None if args.quantization == "none" else args.quantization
    args.quantization = quantization
    g = torch.Generator().manual_seed(1)
    with tempfile.TemporaryDirectory(prefix="qwen3-omni-dummy-") as tmp:
        directory = Path(tmp)
        config = write_model_dir(args.model, directory)
        with ResultLog(
            args.out,
            "qwen3_omni_speech",
            model=args.model,
            device=str(device),
            quantization=args.quantization or "none",
            prompt_words=args.prompt_words,
            text_tokens=args.text_tokens,
            frames=args.frames,
            arrival_ms=args.arrival_ms,
            cuda_graphs=not args.enforce_eager and device.type == "cuda",
        ) as log:
            weights = "float32" if device.type == "cpu" else "bfloat16"
            print(f"{args.model} on {device}: {weights} weights, thinker quantization {args.quantization or 'none'}")
            if not args.no_baseline:  # first, and freed: transformers' model and ours do not fit one GPU together
                base = hf_baseline(
                    config, prompts(config, 1, args.prompt_words, g)[0], args.text_tokens, args.frames, device
                )
                log.write("result", system="transformers", concurrency=1, **base)
                print(
                    f"transformers c=1: first audio {base['first_audio_s'] * 1000:.0f} ms (its whole run), "
                    f"RTF {base['rtf']:.3f}, {base['audio_s']:.3f} s audio"
                )
            ours = build_ours(directory, args, device, max(args.concurrency))
            memory = memory_note(device)
            log.write("memory", **memory)
            if memory:
                print(
                    f"loaded: {memory['gpu_allocated_gb']:.1f} GB allocated, {memory['gpu_free_gb']:.1f} GB free "
                    f"of {memory['gpu_total_gb']:.1f} GB"
                )
            try:
                asyncio.run(speak_all(ours, prompts(config, 1, args.prompt_words, g), 4))  # first-call costs
                arrival_s = args.arrival_ms / 1e3
                for c in args.concurrency:
                    # Untimed, as long as the timed run: first calls at this batch size stay out of it.
                    asyncio.run(speak_all(ours, prompts(config, c, args.prompt_words, g), args.text_tokens, arrival_s))
                    runs = asyncio.run(
                        speak_all(ours, prompts(config, c, args.prompt_words, g), args.text_tokens, arrival_s)
                    )
                    first = summary([r["first_audio_s"] for r in runs])
                    rtf = summary([r["rtf"] for r in runs])
                    record = dict(
                        first_audio=first,
                        rtf=rtf,
                        audio_s_mean=statistics.mean(r["audio_s"] for r in runs),
                        underruns=sum(r["underruns"] for r in runs),
                        streams_with_underruns=sum(1 for r in runs if r["underruns"]),
                        stall_s_max=max(r["stall_s"] for r in runs),
                        gap_s_max=max(r["gap_s"] for r in runs),
                    )
                    log.write("result", system="omni-gateway", concurrency=c, **record)
                    print(
                        f"omni-gateway c={c}: first audio median {first['median'] * 1000:.0f} ms "
                        f"p90 {first['p90'] * 1000:.0f} ms, RTF median {rtf['median']:.3f} max {rtf['max']:.3f}, "
                        f"{record['audio_s_mean']:.3f} s audio each, {record['underruns']} underruns in "
                        f"{record['streams_with_underruns']}/{c} streams (longest stall "
                        f"{record['stall_s_max'] * 1000:.0f} ms), longest gap {record['gap_s_max'] * 1000:.0f} ms"
                    )
            finally:
                ours.shutdown()


if __name__ == "__main__":
    main()
