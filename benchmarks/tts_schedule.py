"""The TTS batcher's schedule under load: N spoken replies at once through ``TtsHead`` and ``BatchedSynthesizer``.

    python -m benchmarks.tts_schedule [--streams 8 32 64] [--words 48] [--tokens-per-s 40] [--spread-s 2]
        [--pass-ms 40] [--pass-us-per-row-frame 2.5] [--step-ms 30] [--run-on] [--seeds 5]

The synthesizer is a stand-in for VITS in the MMS shape on a GPU: its audio is silence of MMS's length (16 kHz,
256 samples a frame, about 4.5 frames a character), a batch's model pass takes ``--pass-ms`` plus
``--pass-us-per-row-frame`` for each frame of its padded rows, and each vocoder window ``--step-ms`` (with CUDA
graphs a VITS call is bound by launching it more than by its rows: 40 and 30 ms are about what the H200 gave
beside a busy server, and 2.5 us a row-frame its idle passes' growth: the VITS call parts in
benchmarks/results/history.jsonl), and its windows are those ``HfVitsSynthesizer`` takes. Everything else is
the product's own code: the text chunker, the head, the batcher's queue and worker. So this measures the
schedule alone, in seconds, on any machine.

Each stream gets a reply of ``--words`` words at ``--tokens-per-s`` (a word a token), starting at a random
moment within ``--spread-s`` (``--run-on``: without punctuation, as a random-weight LLM answers, so that after
its first two words the chunker cuts 250-character clauses). Two designs run in the same command:
- ``previous``: a stream's next clause is queued only once its last one's audio is out, a batch's audio goes
  out when the whole batch is rendered, and text without punctuation is cut at 250 characters;
- ``current``: clauses are queued as the chunker cuts them (``TtsHead.lookahead``), each vocoder window's audio
  goes out as it is decoded, and unpunctuated later segments grow fourfold (``ChunkerConfig.growth``).
Both run on today's batcher and its queue (later clauses by when their listeners need them).

Reported per N and design, each the median of ``--seeds`` runs with different replies and start times (near
saturation one run says little: the replies stalled at 64 streams ranged 14-41 between seeds): a reply's first
audio from its first text delta (p50/p90), the silence a listener hears inside a reply when playing from its
first chunk at real-time pace (p50/p90 per reply, and the replies with 100 ms or more), and the stand-in's busy
share; then the previous design's figures over the current one's. Results go to
``benchmarks/results/tts_schedule.jsonl`` (``--out``).
"""

from __future__ import annotations

import argparse
import asyncio
import math
import random
import statistics
import time
from collections.abc import AsyncIterator
from typing import Any

import numpy as np
from omni_gateway.omni.heads.tts.batch import BatchedSynthesizer
from omni_gateway.omni.heads.tts.head import TtsHead
from omni_gateway.omni.heads.tts.text_chunker import ChunkerConfig
from omni_gateway.omni.heads.vits.vocoder_batch import window_frames

from benchmarks.lib.common import ResultLog, add_out_argument, percentile
from benchmarks.lib.voice_client import play

SAMPLE_RATE, FRAME_SAMPLES, FRAMES_PER_CHAR, WINDOW_ROW_FRAMES = 16000, 256, 4.5, 2048
SENTENCES = (
    "Sure, I can help with that.",
    "The weather today is sunny with a high of twenty degrees.",
    "Tomorrow brings some rain in the afternoon, so take an umbrella when you go out.",
    "If you want, I can also look up the forecast for the weekend and the week after.",
    "The museum opens at nine and closes at five, except on Mondays.",
    "Tickets cost twelve euros for adults; children under ten go in for free.",
    "The quickest way there is the number four tram, which leaves every ten minutes.",
    "Let me know if there is anything else you would like to plan for your trip.",
)


class TimedVits:
    """A ``BatchSynthesizer`` whose calls take the cost model's time; ``streaming``: each window's audio goes
    out as it is decoded (else, as ``VitsRender`` did before, when the whole batch is)."""

    sample_rate = SAMPLE_RATE
    voices = ("stand-in",)

    def __init__(self, pass_s: float, step_s: float, streaming: bool, row_frame_s: float = 0.0) -> None:
        self.pass_s, self.step_s, self.streaming, self.row_frame_s = pass_s, step_s, streaming, row_frame_s

    def prepare(self) -> None:
        pass

    def start_batch(self, texts: list[str], *, speed: float = 1.0, voice: str | None = None) -> TimedRender:
        frames = [math.ceil(len(t) * FRAMES_PER_CHAR / speed) for t in texts]
        time.sleep(self.pass_s + self.row_frame_s * len(texts) * max(frames))  # the flow runs on padded rows
        window = window_frames(max(frames), len(texts), WINDOW_ROW_FRAMES)
        return TimedRender(self, frames, window)


class TimedRender:
    def __init__(self, vits: TimedVits, frames: list[int], window: int) -> None:
        self.vits, self.frames, self.window = vits, frames, window
        self.decoded = self.given = 0  # frames per row

    def step(self) -> bool:
        time.sleep(self.vits.step_s)
        self.decoded += self.window
        return self.decoded >= max(self.frames)

    def take(self) -> list[tuple[np.ndarray, bool]]:
        done = self.decoded >= max(self.frames)
        if not (self.vits.streaming or done):
            return [(np.zeros(0, np.float32), False) for _ in self.frames]
        taken = [
            (np.zeros(max(0, min(f, self.decoded) - self.given) * FRAME_SAMPLES, np.float32), self.decoded >= f)
            for f in self.frames
        ]
        self.given = self.decoded
        return taken


def reply(words: int, rng: random.Random, run_on: bool) -> str:
    """``words`` words of the sentences above, from a random one on."""
    pool = " ".join(SENTENCES[rng.randrange(len(SENTENCES)) :] + SENTENCES * (words // 40 + 1)).split()
    text = " ".join(pool[:words])
    return "".join(c for c in text if c.isalnum() or c == " ").lower() if run_on else text


async def deltas(text: str, tokens_per_s: float) -> AsyncIterator[str]:
    for i, word in enumerate(text.split(" ")):
        await asyncio.sleep(1 / tokens_per_s)
        yield word if i == 0 else " " + word


async def listen(head: TtsHead, text: str, delay_s: float, tokens_per_s: float) -> dict[str, float]:
    """One reply: its first audio from its first text delta, and the silence its listener hears inside it."""
    await asyncio.sleep(delay_s)
    started = time.perf_counter() + 1 / tokens_per_s  # when the first delta is out
    first, arrivals = None, []
    async for chunk in head.stream(deltas(text, tokens_per_s)):
        now = time.perf_counter()
        if not chunk.pcm16:
            continue
        if first is None:
            first = now - started
        arrivals.append((now, len(chunk.pcm16) / 2 / chunk.sample_rate))
    return {"first_s": first if first is not None else math.nan, "stall_s": play(arrivals).stall_s}


async def run(streams: int, design: str, seed: int, args: argparse.Namespace) -> dict[str, Any]:
    vits = TimedVits(args.pass_ms / 1000, args.step_ms / 1000, design == "current", args.pass_us_per_row_frame / 1e6)
    batcher = BatchedSynthesizer(vits)
    if design == "previous":
        head = TtsHead(batcher, chunker=ChunkerConfig(growth=None), lookahead=0)
    else:
        head = TtsHead(batcher)
    rng = random.Random(seed * 1000 + streams)
    began = time.perf_counter()
    try:
        replies = await asyncio.gather(
            *(
                listen(head, reply(args.words, rng, args.run_on), rng.uniform(0, args.spread_s), args.tokens_per_s)
                for _ in range(streams)
            )
        )
    finally:
        batcher.close()
    wall = time.perf_counter() - began
    firsts = [r["first_s"] for r in replies]
    stalls = [r["stall_s"] for r in replies]
    return {
        "streams": streams,
        "design": design,
        "seed": seed,
        "first_p50_ms": round(statistics.median(firsts) * 1000, 1),
        "first_p90_ms": round(percentile(firsts, 0.9) * 1000, 1),
        "stall_p50_ms": round(statistics.median(stalls) * 1000, 1),
        "stall_p90_ms": round(percentile(stalls, 0.9) * 1000, 1),
        "replies_stalled": sum(s >= 0.1 for s in stalls),
        "busy": round(batcher.busy_s / wall, 2),
        "batch_p50": statistics.median(batcher.batch_sizes),
    }


METRICS = ("first_p50_ms", "first_p90_ms", "stall_p50_ms", "stall_p90_ms", "replies_stalled", "busy", "batch_p50")


def median(runs: list[dict[str, Any]], key: str) -> float:
    return round(statistics.median(r[key] for r in runs), 2)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--streams", type=int, nargs="+", default=[8, 32, 64])
    parser.add_argument("--words", type=int, default=48)
    parser.add_argument("--tokens-per-s", type=float, default=40.0)
    parser.add_argument("--spread-s", type=float, default=2.0, help="replies start at random within this")
    parser.add_argument("--pass-ms", type=float, default=40.0)
    parser.add_argument("--step-ms", type=float, default=30.0)
    parser.add_argument("--pass-us-per-row-frame", type=float, default=2.5, help="the pass's cost of padded rows")
    parser.add_argument("--run-on", action="store_true", help="replies without punctuation")
    parser.add_argument("--seeds", type=int, default=5, help="runs per N and design, each its own replies")
    add_out_argument(parser, "tts_schedule")
    args = parser.parse_args()
    settings = {k: v for k, v in vars(args).items() if k not in ("streams", "out")}
    with ResultLog(args.out, "tts_schedule", **settings) as log:
        for streams in args.streams:
            rows = {}
            for design in ("previous", "current"):
                runs = [asyncio.run(run(streams, design, seed, args)) for seed in range(args.seeds)]
                for row in runs:
                    log.write("run", **row)
                rows[design] = {"streams": streams, "design": design, **{k: median(runs, k) for k in METRICS}}
                rows[design]["replies_stalled_each"] = [r["replies_stalled"] for r in runs]
                print(rows[design], flush=True)
                log.write("median", **rows[design])
            old, new = rows["previous"], rows["current"]
            ratios = {
                key: round(old[key] / new[key], 2) if new[key] else None
                for key in ("first_p50_ms", "first_p90_ms", "stall_p50_ms", "stall_p90_ms")
            }
            print(f"N={streams}: previous / current: {ratios}", flush=True)
            log.write("ratio", streams=streams, **ratios)


if __name__ == "__main__":
    main()
