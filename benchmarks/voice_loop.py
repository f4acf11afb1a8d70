"""Voice-to-voice latency of the whole loop on the embedded models, over the realtime socket.

    python -m benchmarks.voice_loop [--turns 10] [--device cpu|cuda] [--dtype auto|float32|bfloat16] [--out FILE]
        [--turn-detection server_vad semantic_vad]

Each turn speaks a short question (the served TTS head's voice) into /v1/realtime in a session of its own,
in 40 ms chunks at real-time pace, and the server's turn detector ends the turn (``--turn-detection
server_vad``, 500 ms of silence, or ``semantic_vad``, the Smart Turn model of ``pipecat-ai``; several run
one after the other and their p50s are compared). The client (``benchmarks/lib/voice_client.py``, shared
with ``voice_sessions``) measures the latency a person feels: from the end of the speech (when it sent the
chunk holding the question's last voiced sample) to the first `response.output_audio.delta` it receives,
p50/p90/p99, split into the turn decision (-> `speech_stopped`), the transcript, `response.created`, the
first token and the first audio, each from the end of the one before; and it plays each reply from a
simulated buffer at real time (underruns, the longest gap, the RTF of each reply).

The server's own timeline splits `speech_stopped` -> first audio delta into stages, each counted from where
the previous one ended or from the stop, whichever is later (work done during the VAD's silence wait costs
nothing): ASR (-> the transcript the reply answers is ready; transcription starts at the pause), LLM (-> the
first segment the TTS head speaks is complete; replayed with the head's own chunker on the timed deltas),
TTS (-> the first audio chunk leaves the head) and delivery (-> the client holds it). "reply@" is when the
reply started relative to the stop: negative when it was prepared from the pause's transcript. Per turn it
also reports the engine's time to the first token and per decode step, and the prompt tokens served from
the prefix cache.

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
import time
from collections.abc import AsyncIterator
from typing import Any

import numpy as np
from omni_gateway.omni.heads.tts.text_chunker import TextChunker

from benchmarks.lib.common import ResultLog, add_out_argument, ratio
from benchmarks.lib.voice_client import TURN_DETECTIONS, compare, session, summarize, table, turn_row
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
SERVER_STAGES = ("asr", "llm", "tts", "delivery")


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


def server_split(clock: StageClock, stop: float, first_delta: float) -> dict[str, Any]:
    """The server's side of a turn from ``speech_stopped`` to the first audio delta: its stages, each from where
    the previous one ended or from the stop, whichever is later, and the engine's first token and decode steps."""
    reply = clock.replies[-1]
    heard = max(t for t in clock.transcribed if t <= reply["started"])
    segment_at, steps = clock.first_segment(reply)
    first_token = reply["deltas"][0][0]
    first_audio = reply["audio"][0][0]
    return {
        "asr": max(0.0, heard - stop),
        "llm": max(0.0, segment_at - max(stop, heard)),
        "tts": max(0.0, first_audio - max(stop, segment_at)),
        "delivery": first_delta - max(stop, first_audio),
        "prepared": reply["started"] < stop,
        "reply_start_s": reply["started"] - stop,
        "engine_first_token_s": first_token - reply["started"],
        "decode_step_s": (segment_at - first_token) / (steps - 1) if steps > 1 else 0.0,
        "decode_steps": steps - 1,
    }


def run_turns(url: str, clock: StageClock, pipeline: Any, mode: str, turns: int) -> list[dict[str, Any]]:
    """``turns`` questions, each in a session of its own under the ``mode`` turn detector."""
    rows = []
    for turn in range(turns):
        question = QUESTIONS[turn % len(QUESTIONS)]
        pcm = (np.clip(pipeline.tts.synthesize(question), -1, 1) * 32767).astype("<i2").tobytes()
        before = pipeline.metrics()
        (timeline,) = asyncio.run(session(url, [question], {question: pcm}, 300.0, mode))
        after = pipeline.metrics()
        row = turn_row(timeline)
        if row["lost"]:
            print(f"{mode} turn {turn + 1:2d}: lost (saw {row['seen']})", flush=True)
            rows.append(row)
            continue
        row.update(server_split(clock, timeline["stopped"], timeline["first_audio"]))
        row.update(
            cached_tokens=after["prefix_cache_hit_tokens"] - before["prefix_cache_hit_tokens"],
            prompt_tokens=after["prefix_cache_query_tokens"] - before["prefix_cache_query_tokens"],
        )
        rows.append(row)
        print(
            f"{mode} turn {turn + 1:2d}: {row['latency_s'] * 1000:5.0f} ms from the end of speech, "
            f"{row['stopped_to_audio_s'] * 1000:.0f} from speech_stopped (asr {row['asr'] * 1000:.0f}, llm "
            f"{row['llm'] * 1000:.0f}, tts {row['tts'] * 1000:.0f}, delivery {row['delivery'] * 1000:.0f}; "
            f"reply@{row['reply_start_s'] * 1000:+.0f}, first token {row['engine_first_token_s'] * 1000:.0f} + "
            f"{row['decode_steps']} x {row['decode_step_s'] * 1000:.0f} ms, cached {row['cached_tokens']:.0f}/"
            f"{row['prompt_tokens']:.0f}, {row['underruns']} underruns, RTF {row['rtf'] or 0:.2f})"
            f"  {row['transcript']!r} -> {row['answer']!r}",
            flush=True,
        )
    return rows


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
    parser.add_argument(
        "--turn-detection",
        nargs="+",
        choices=TURN_DETECTIONS,
        default=["server_vad"],
        help="the turn detector; several: each runs every turn, and their p50s are compared",
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
    p50s: dict[str, float] = {}
    with (
        ResultLog(
            args.out,
            "voice_loop",
            turns=args.turns,
            device=args.device,
            dtype=args.dtype,
            block_size=args.block_size,
            first_words=args.first_words,
            turn_detection=args.turn_detection,
        ) as log,
        serve(pipeline) as port,
    ):
        url = f"ws://127.0.0.1:{port}/v1/realtime"
        for mode in args.turn_detection:
            load = os.getloadavg()[0]
            rows = run_turns(url, clock, pipeline, mode, args.turns)
            for turn, row in enumerate(rows, 1):
                log.write("turn", turn=turn, turn_detection=mode, **row)
            summary = summarize(rows)
            kept = [r for r in rows if not r["lost"]]
            print(table(f"\n{mode}", summary), flush=True)
            if kept:
                p50s[mode] = summary["latency_p50_s"]
                whole = sum(r["stopped_to_audio_s"] for r in kept)
                print(
                    f"  the server's side of speech_stopped -> first audio ({sum(r['prepared'] for r in kept)} "
                    "replies prepared during the pause):"
                )
                for stage in SERVER_STAGES:
                    part = sum(r[stage] for r in kept)
                    print(f"    {stage:<8} {part / len(kept) * 1000:6.0f} ms mean, {part / whole:5.1%}")
                print(f"  vs GPT-4o's 320 ms average: {ratio(summary['latency_p50_s'], 0.320)}", flush=True)
                summary["prepared"] = sum(r["prepared"] for r in kept)
            log.write(
                "summary",
                turn_detection=mode,
                load_before=round(load, 2),
                load_after=round(os.getloadavg()[0], 2),
                **summary,
            )
        if len(p50s) > 1:
            print(compare(p50s, "end of speech -> first audio, by turn detector: "), flush=True)
            log.write("comparison", latency_p50_s=p50s)
    pipeline.shutdown()


if __name__ == "__main__":
    main()
