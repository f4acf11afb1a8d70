"""Voice-to-voice latency of the whole loop on the embedded models, over the realtime socket.

    python -m benchmarks.voice_loop [--turns 10] [--device cpu|cuda] [--dtype auto|float32|bfloat16] [--out FILE]

Each turn speaks a short question (Piper voice) into /v1/realtime in 40 ms chunks at real-time pace,
server VAD ends the turn, and the latency is the time from `input_audio_buffer.speech_stopped` to the
first `response.output_audio.delta`. The server's own timeline splits it into stages, each counted
from where the previous one ended or from the stop, whichever is later (work done during the VAD's
silence wait costs nothing): ASR (-> the transcript the reply answers is ready; transcription starts
at the pause), LLM (-> the first segment the TTS head speaks is complete; replayed with the head's own
chunker on the timed deltas), TTS (-> the first audio chunk leaves the head) and delivery (-> the
client holds it). "reply@" is when the reply started relative to the stop: negative when it was
prepared from the pause's transcript. Per turn it also reports the engine's time to the first token
and per decode step, the prompt tokens served from the prefix cache, and "stall": how long playback
would run dry after the first chunk if the client played the audio as it arrived.

`--device` places the LLM and the ASR and TTS with it (CTranslate2 and onnxruntime; CUDA there needs
their GPU builds). Anchors: GPT-4o speech-to-speech averages 320 ms;
cascaded voice-agent stacks quote 500-800 ms. Every turn's figures are appended to
``benchmarks/results/voice_loop.jsonl`` (``--out``).
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import os
import statistics
import time
from collections.abc import AsyncIterator
from typing import Any

import numpy as np
from omni_gateway.omni.heads.tts.text_chunker import TextChunker

from benchmarks.lib.common import ResultLog, add_out_argument, percentile
from demos.voice_assistant import Progress, converse
from tests.harness.live_server import serve

QUESTIONS = [
    "What is the capital of France?",
    "How many days are in a week?",
    "What color is the sky on a clear day?",
    "Name a fruit that is yellow.",
    "What is two plus two?",
    "Which animal says moo?",
    "What is the opposite of hot?",
    "How many legs does a spider have?",
    "What do bees make?",
    "What is the largest ocean on Earth?",
    "What planet do we live on?",
    "What is frozen water called?",
]
STAGES = ("asr", "llm", "tts", "delivery")


class StageClock:
    """Wraps the transcriber and the TTS head of a loaded pipeline to time when transcripts are ready,
    when a reply starts, when its text arrives and when its audio leaves the head."""

    def __init__(self, pipeline: Any) -> None:
        self.replies: list[dict[str, Any]] = []
        self.transcribed: list[float] = []
        self._head = pipeline.tts
        speak, transcribe = self._head.stream, pipeline.transcribe

        async def timed_transcribe(*args: Any, **kwargs: Any) -> Any:
            result = await transcribe(*args, **kwargs)
            self.transcribed.append(time.monotonic())
            return result

        async def timed(deltas: AsyncIterator[str], options: Any) -> AsyncIterator[Any]:
            record: dict[str, Any] = {"started": time.monotonic(), "deltas": [], "audio": []}
            self.replies.append(record)

            async def text() -> AsyncIterator[str]:
                async for delta in deltas:
                    record["deltas"].append((time.monotonic(), delta))
                    yield delta

            async for chunk in speak(text(), options):
                record["audio"].append((time.monotonic(), len(chunk.pcm16) / 2 / chunk.sample_rate))
                yield chunk

        pipeline.transcribe = timed_transcribe
        self._head.stream = timed

    def first_segment(self, record: dict[str, Any]) -> tuple[float, int]:
        """When the first segment the head speaks was complete, and how many deltas that took."""
        chunker = TextChunker(self._head.chunker)
        for n, (at, delta) in enumerate(record["deltas"], 1):
            if chunker.push(delta):
                return at, n
        return record["deltas"][-1][0], len(record["deltas"])


def stall_s(audio: list[tuple[float, float]]) -> float:
    """Seconds a player starting at the first chunk and playing in real time would wait for audio."""
    clock, waited = audio[0][0], 0.0
    for arrived, seconds in audio:
        if arrived > clock:
            waited += arrived - clock
            clock = arrived
        clock += seconds
    return waited


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--turns", type=int, default=10)
    parser.add_argument("--device", default="auto", help="the LLM engine's device: auto, cpu or cuda")
    parser.add_argument("--dtype", default="auto", help="the engine's dtype (auto: bfloat16 on cuda, float32 on cpu)")
    parser.add_argument("--block-size", type=int, default=16, help="KV block size: the prefix cache's granularity")
    parser.add_argument(
        "--first-words",
        type=int,
        default=None,
        help="words of the first spoken segment when no clause ends sooner (default: the head's)",
    )
    add_out_argument(parser, "voice_loop")
    args = parser.parse_args()

    from omni_gateway.engine.config import EngineConfig
    from omni_gateway.omni import load_backend
    from omni_gateway.omni.config import OmniConfig

    print(
        f"cpus={os.cpu_count()} load={os.getloadavg()[0]:.2f} device={args.device} "
        f"dtype={args.dtype} block_size={args.block_size} first_words={args.first_words}",
        flush=True,
    )
    started = time.monotonic()
    pipeline = load_backend(
        OmniConfig(
            engine=EngineConfig(device=args.device, dtype=args.dtype, block_size=args.block_size),
            temperature=0.0,
            max_tokens=48,
            system_prompt="You are a helpful voice assistant. Answer in one short sentence.",
        )
    )
    print(f"models loaded in {time.monotonic() - started:.1f} s", flush=True)
    if args.first_words is not None:
        pipeline.tts.chunker = dataclasses.replace(pipeline.tts.chunker, first_max_words=args.first_words)
    clock = StageClock(pipeline)
    rows = []
    with serve(pipeline) as port:
        url = f"ws://127.0.0.1:{port}/v1/realtime"
        for turn in range(args.turns):
            question = QUESTIONS[turn % len(QUESTIONS)]
            audio = (np.clip(pipeline.tts.synthesize(question), -1, 1) * 32767).astype("<i2")
            before = pipeline.metrics()
            result = asyncio.run(
                converse(
                    url,
                    np.concatenate([np.zeros(12000, "<i2"), audio]),
                    api_key=None,
                    mic=False,
                    out=None,
                    play=False,
                    timeout=300,
                    progress=Progress(False),
                )
            )
            after = pipeline.metrics()
            events, reply = result["timeline"], clock.replies[-1]
            stop, first_delta = events["speech_stopped"], events["first_audio_delta"]
            heard = max(t for t in clock.transcribed if t <= reply["started"])
            segment_at, steps = clock.first_segment(reply)
            first_token = reply["deltas"][0][0]
            first_audio = reply["audio"][0][0]
            row = {
                "total": first_delta - stop,
                "asr": max(0.0, heard - stop),
                "llm": max(0.0, segment_at - max(stop, heard)),
                "tts": max(0.0, first_audio - max(stop, segment_at)),
                "delivery": first_delta - max(stop, first_audio),
                "prepared": reply["started"] < stop,
            }
            hits = after["prefix_cache_hit_tokens"] - before["prefix_cache_hit_tokens"]
            asked = after["prefix_cache_query_tokens"] - before["prefix_cache_query_tokens"]
            ttft = first_token - reply["started"]
            step = (segment_at - first_token) / (steps - 1) if steps > 1 else 0.0
            row.update(
                first_token_s=ttft,
                decode_step_s=step,
                transcript_in=result["transcript_in"],
                transcript_out=result["transcript_out"].strip(),
                reply_start_s=reply["started"] - stop,
                cached_tokens=hits,
                prompt_tokens=asked,
                stall_s=stall_s(reply["audio"]),
            )
            rows.append(row)
            print(
                f"turn {turn + 1:2d}: {row['total'] * 1000:5.0f} ms (asr {row['asr'] * 1000:.0f}, llm "
                f"{row['llm'] * 1000:.0f}, tts {row['tts'] * 1000:.0f}, delivery {row['delivery'] * 1000:.0f}; "
                f"reply@{(reply['started'] - stop) * 1000:+.0f}, first token {ttft * 1000:.0f} + {steps - 1} x "
                f"{step * 1000:.0f} ms, cached {hits:.0f}/{asked:.0f}, stall {stall_s(reply['audio']) * 1000:.0f} ms)"
                f"  {result['transcript_in']!r} -> {result['transcript_out'].strip()!r}",
                flush=True,
            )
    pipeline.shutdown()

    totals = [r["total"] for r in rows]
    print(
        f"\nvoice-to-voice (speech_stopped -> first audio delta) over {len(rows)} turns: "
        f"p50 {statistics.median(totals) * 1000:.0f} ms, p90 {percentile(totals, 0.9) * 1000:.0f} ms; "
        f"{sum(r['prepared'] for r in rows)} replies prepared during the pause"
    )
    whole = sum(totals)
    for stage in STAGES:
        part = sum(r[stage] for r in rows)
        print(f"  {stage:<8} {part / len(rows) * 1000:6.0f} ms mean, {part / whole:5.1%} of the latency")
    print(f"  vs GPT-4o's 320 ms average: {statistics.median(totals) / 0.320:.2f}x")
    with ResultLog(
        args.out,
        "voice_loop",
        turns=args.turns,
        device=args.device,
        dtype=args.dtype,
        block_size=args.block_size,
        first_words=args.first_words,
    ) as log:
        for turn, row in enumerate(rows, 1):
            log.write("turn", turn=turn, **row)
        log.write(
            "summary",
            p50_s=statistics.median(totals),
            p90_s=percentile(totals, 0.9),
            prepared=sum(r["prepared"] for r in rows),
        )


if __name__ == "__main__":
    main()
