"""Voice-to-voice latency of the whole loop on the embedded models, over the realtime socket.

    python demos/bench_voice_loop.py [--turns 10] [--device cpu]

Each turn speaks a short question (Piper voice) into /v1/realtime in 40 ms chunks at real-time pace,
server VAD ends the turn, and the latency is the time from `input_audio_buffer.speech_stopped` to the
first `response.output_audio.delta`. Each turn is split into stages from the server's own timeline:
ASR (speech stopped -> transcript ready), LLM (-> the first clause of text is complete; the clause
cut is replayed with the TTS head's own chunker on the timed deltas), TTS (-> first audio chunk out
of the head) and delivery (-> the client holds the first delta). Anchors: GPT-4o speech-to-speech
averages 320 ms; cascaded voice-agent stacks quote 500-800 ms.
"""
from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from demos.voice_assistant import Progress, converse  # noqa: E402
from omni.heads.text_chunker import TextChunker  # noqa: E402
from tests.gateway.live_server import serve  # noqa: E402

QUESTIONS = [
    "What is the capital of France?", "How many days are in a week?", "What color is the sky on a clear day?",
    "Name a fruit that is yellow.", "What is two plus two?", "Which animal says moo?",
    "What is the opposite of hot?", "How many legs does a spider have?", "What do bees make?",
    "What is the largest ocean on Earth?", "What planet do we live on?", "What is frozen water called?",
]


class StageClock:
    """Wraps the TTS head of a loaded pipeline to time when text arrives and when audio leaves it."""

    def __init__(self, pipeline: Any) -> None:
        self.turns: list[dict[str, Any]] = []
        self._head = pipeline.tts
        original = self._head.stream

        async def timed(deltas: AsyncIterator[str], options: Any) -> AsyncIterator[Any]:
            record: dict[str, Any] = {"deltas": [], "first_audio": None}
            self.turns.append(record)

            async def text() -> AsyncIterator[str]:
                async for delta in deltas:
                    record["deltas"].append((time.monotonic(), delta))
                    yield delta

            async for chunk in original(text(), options):
                if record["first_audio"] is None:
                    record["first_audio"] = time.monotonic()
                yield chunk

        self._head.stream = timed

    def first_clause_at(self, record: dict[str, Any]) -> float | None:
        chunker = TextChunker(self._head.chunker)
        for at, delta in record["deltas"]:
            if chunker.push(delta):
                return at
        return record["deltas"][-1][0] if record["deltas"] else None


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--turns", type=int, default=10)
    parser.add_argument("--device", default="auto")
    args = parser.parse_args()

    from engine.config import EngineConfig
    from omni import load_backend
    from omni.config import OmniConfig

    print(f"cpus={os.cpu_count()} load={os.getloadavg()[0]:.2f}", flush=True)
    started = time.monotonic()
    pipeline = load_backend(OmniConfig(engine=EngineConfig(device=args.device), device=args.device, temperature=0.0,
                                       max_tokens=48, system_prompt="You are a helpful voice assistant. "
                                                                    "Answer in one short sentence."))
    print(f"models loaded in {time.monotonic() - started:.1f} s", flush=True)
    clock = StageClock(pipeline)
    rows = []
    with serve(pipeline) as port:
        url = f"ws://127.0.0.1:{port}/v1/realtime"
        for turn in range(args.turns):
            question = QUESTIONS[turn % len(QUESTIONS)]
            audio = (np.clip(pipeline.tts.synthesize(question), -1, 1) * 32767).astype("<i2")
            result = asyncio.run(converse(url, np.concatenate([np.zeros(12000, "<i2"), audio]), api_key=None,
                                          mic=False, out=None, play=False, timeout=300,
                                          progress=Progress(False)))
            events = result["timeline"]
            record = clock.turns[-1]
            stopped, transcribed = events["speech_stopped"], events["transcription_completed"]
            first_delta = events["first_audio_delta"]
            clause = clock.first_clause_at(record) or transcribed
            row = {"total": first_delta - stopped, "asr": transcribed - stopped,
                   "llm": max(0.0, clause - transcribed), "tts": record["first_audio"] - clause,
                   "delivery": first_delta - record["first_audio"]}
            rows.append(row)
            print(f"turn {turn + 1:2d}: {row['total'] * 1000:6.0f} ms  (asr {row['asr'] * 1000:.0f}, llm "
                  f"{row['llm'] * 1000:.0f}, tts {row['tts'] * 1000:.0f}, delivery {row['delivery'] * 1000:.0f})"
                  f"  {result['transcript_in']!r} -> {result['transcript_out'].strip()!r}", flush=True)
    pipeline.shutdown()

    totals = [r["total"] for r in rows]
    print(f"\nvoice-to-voice (speech_stopped -> first audio delta) over {len(rows)} turns: "
          f"p50 {statistics.median(totals) * 1000:.0f} ms, p90 {percentile(totals, 0.9) * 1000:.0f} ms")
    whole = sum(totals)
    for stage in ("asr", "llm", "tts", "delivery"):
        part = sum(r[stage] for r in rows)
        print(f"  {stage:<8} {part / len(rows) * 1000:6.0f} ms mean, {part / whole:5.1%} of the latency")
    print(f"  vs GPT-4o's 320 ms average: {statistics.median(totals) / 0.320:.2f}x")


if __name__ == "__main__":
    main()
