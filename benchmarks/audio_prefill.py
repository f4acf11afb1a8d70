"""Commit -> first token of a model that hears, with and without prefilling its reply while the user speaks.

    python -m benchmarks.audio_prefill [--seconds 5.5 9.5] [--turns 3] [--every-ms 1000] [--shape small|tiny]
        [--out FILE]

A random Qwen2.5-Omni thinker (``tests.harness.audio_checkpoints``, a 30 s audio window and the real tower's
``n_window`` of 100: attention chunks of 2 s) is served by ``OmniPipeline`` on the CPU. Each turn is a
distinct clip of ``--seconds`` of 24 kHz audio, answered as a realtime session answers it:

- ``off``: at the turn's end the reply's prompt (system prompt, the turn's audio) is built, the whole clip
  encoded by the audio tower and prefilled, and the first token generated;
- ``on``: while the turn is spoken, each ``--every-ms`` of it (the session's ``partial_transcript_ms``) sends
  the reply's prompt with the audio so far marked partial, as a one-token answer (the session's ``Prefill``
  task), which encodes the groups of audio frames settled since the last one and prefills them; each
  finishes before the next (``prefill_ms`` says whether that keeps up with speech on this machine). At the
  turn's end the same reply as ``off`` encodes and prefills only the tail.

Per turn it records commit -> first token (the wait a user feels beyond the turn decision) and, for ``on``,
the prefills' times; it prints the p50 of each mode per length and their ratio, and appends the records to
``benchmarks/results/audio_prefill.jsonl`` (``--out``). ``--shape tiny`` checks the command in seconds.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from benchmarks.lib.common import ResultLog, add_out_argument

RATE = 24000  # the realtime API's pcm16 rate
# (text config, audio config) over the harness's tiny ones: "small" is a 12-layer 768-wide thinker with a
# 6-layer 384-wide audio tower, large enough on a CPU for encoding and prefill to outweigh the per-request cost.
SHAPES: dict[str, tuple[dict[str, Any], dict[str, Any]]] = {
    "small": (
        dict(
            hidden_size=768,
            intermediate_size=2048,
            num_hidden_layers=12,
            num_attention_heads=12,
            num_key_value_heads=4,
            # head_dim 64: time, height and width share its 32 rotary frequencies as Qwen2.5-Omni's 128 do
            rope_parameters={"rope_type": "default", "rope_theta": 1000000.0, "mrope_section": [8, 12, 12]},
        ),
        dict(d_model=384, encoder_layers=6, encoder_attention_heads=6, encoder_ffn_dim=1536),
    ),
    "tiny": ({}, {}),
}


def save_checkpoint(directory: Path, shape: str) -> None:
    from tests.harness.audio_checkpoints import save_tiny_qwen2_5_omni

    text, audio = SHAPES[shape]
    save_tiny_qwen2_5_omni(directory, window_s=30, n_window=100, text=text, audio=audio)


def load(directory: Path) -> Any:
    from omni_gateway.omni.pipeline import OmniPipeline

    from tests.harness.real_engine import checkpoint_config

    config = checkpoint_config(directory, max_tokens=4, engine_args={"num_kv_blocks": 1024})
    return OmniPipeline.load(config)


def clip(seed: int, seconds: float) -> bytes:
    from omni_gateway.encoders.audio import float_to_pcm16, resample

    from tests.harness.audio_checkpoints import tone

    return float_to_pcm16(resample(tone(seed, seconds), 16000, RATE))


def request(request_id: str, pcm: bytes, *, partial: bool = False, max_tokens: int = 4) -> Any:
    from omni_gateway.omni.protocol import AudioPart, Message, OmniRequest, SamplingOptions, TextPart

    messages = (
        Message("system", (TextPart("You are a helpful voice assistant. Answer briefly."),)),
        Message("user", (AudioPart(pcm, RATE, partial=partial),)),
    )
    sampling = SamplingOptions(max_tokens=max_tokens, temperature=0.0)
    return OmniRequest(request_id, messages, modalities=("text",), sampling=sampling)


async def first_token_ms(pipeline: Any, req: Any) -> float | None:
    """Milliseconds from sending ``req`` to its first text delta (or to its end, for a one-token prefill);
    None for a prefill refused because none of its audio is settled yet (its first 2 s group)."""
    from omni_gateway.omni.protocol import Error, TextDelta

    start = time.perf_counter()
    first = None
    async for chunk in pipeline.generate(req):
        if isinstance(chunk, Error):
            if req.messages[-1].parts[0].partial:
                return None  # the session's Prefill task drops it the same way
            raise RuntimeError(f"{req.request_id}: {chunk.message}")
        if first is None and isinstance(chunk, TextDelta) and chunk.text:
            first = time.perf_counter()
    return 1000 * ((first or time.perf_counter()) - start)


async def turn(pipeline: Any, name: str, pcm: bytes, *, prefill: bool, every_ms: int) -> dict[str, Any]:
    prefills: list[float | None] = []
    if prefill:
        step = every_ms * RATE // 1000 * 2
        for i, end in enumerate(range(step, len(pcm), step)):
            req = request(f"{name}-prefill{i}", pcm[:end], partial=True, max_tokens=1)
            prefills.append(await first_token_ms(pipeline, req))
    commit = await first_token_ms(pipeline, request(f"{name}-reply", pcm))
    assert commit is not None
    return {
        "commit_to_first_token_ms": round(commit, 1),
        "prefill_ms": [None if p is None else round(p, 1) for p in prefills],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seconds", type=float, nargs="+", default=[5.5, 9.5], help="turn lengths")
    parser.add_argument("--turns", type=int, default=3, help="turns per length and mode")
    parser.add_argument("--every-ms", type=int, default=1000, help="speech between prefills")
    parser.add_argument("--shape", choices=sorted(SHAPES), default="small")
    add_out_argument(parser, "audio_prefill")
    args = parser.parse_args()

    with tempfile.TemporaryDirectory() as tmp:
        save_checkpoint(Path(tmp), args.shape)
        pipeline = load(Path(tmp))
    try:
        asyncio.run(turn(pipeline, "warm", clip(999, 2.5), prefill=True, every_ms=args.every_ms))
        with ResultLog(args.out, "audio_prefill", shape=args.shape, every_ms=args.every_ms) as log:
            seed = 0
            for seconds in args.seconds:
                times: dict[str, list[float]] = {"on": [], "off": []}
                for t in range(args.turns):
                    # alternating which mode goes first, each turn its own clip: no mode finds the other's cache
                    for mode in ("on", "off") if t % 2 == 0 else ("off", "on"):
                        seed += 1
                        row = asyncio.run(
                            turn(
                                pipeline, f"t{seed}", clip(seed, seconds), prefill=mode == "on", every_ms=args.every_ms
                            )
                        )
                        times[mode].append(row["commit_to_first_token_ms"])
                        log.write("turn", seconds=seconds, prefill=mode, **row)
                on, off = statistics.median(times["on"]), statistics.median(times["off"])
                log.write("summary", seconds=seconds, on_p50_ms=round(on, 1), off_p50_ms=round(off, 1))
                print(
                    f"{seconds:5.1f} s turn: commit -> first token p50 {off:7.1f} ms without, {on:7.1f} ms with "
                    f"prefill while speaking ({off / on:.2f}x)",
                    flush=True,
                )
    finally:
        pipeline.shutdown()


if __name__ == "__main__":
    main()
