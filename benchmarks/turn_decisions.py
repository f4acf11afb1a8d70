"""semantic_vad's turn decisions on the packaged Piper voice: how soon a finished question ends its turn, counted
from the end of the speech, and how many unfinished phrases end theirs early.

    python -m benchmarks.turn_decisions [--eagerness auto high low] [--out FILE]

Each phrase (20 finished questions, 25 phrases cut off mid-sentence) is spoken by the Piper voice and fed, in
40 ms chunks, through silero-vad and the end-of-turn detector (``encoders.turn.SemanticTurn``) with the real
Smart Turn model. What a live server would spend is laid on the stream's clock: the model's verdict lands the
measured scoring time after it was asked for, and the words land the measured time the packaged Whisper tiny.en
takes to transcribe the turn up to the pause after the pause began (the realtime session starts that
transcription at every pause). A turn's decision is its ``speech_stopped``; from the end of the speech (the
last sample above -34 dBFS) to there is what the user waits for the turn to end.

The baseline, in the same run, is the design before: the model's verdict at 200 ms of silence, no words, and the
turn ending at 300 ms of silence at the earliest. Prints, per variant, the finished questions' decision delay
(p50 / p90 / max), how many of them ended before the cap, and how many unfinished phrases ended early (a false
commit: the user was cut off).
"""

from __future__ import annotations

import argparse
import statistics
import time
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Any

import numpy as np

from benchmarks.lib.common import ResultLog, add_out_argument, percentile
from benchmarks.lib.voice_client import speak_all

RATE = 24000
CHUNK_MS = 40
VOICED = 0.02  # of full scale: -34 dBFS

FINISHED = [
    "What is the capital of France?",
    "How many legs does a spider have?",
    "Please turn on the kitchen lights.",
    "What time is it?",
    "Tell me a joke.",
    "I would like to book a table for two people tonight.",
    "What is two plus two?",
    "Who wrote Romeo and Juliet?",
    "Set a timer for ten minutes.",
    "What's the weather like in Paris today?",
    "Can you recommend a good book?",
    "How far is the moon from the earth?",
    "Play some jazz music.",
    "Remind me to call my mother tomorrow.",
    "What is the boiling point of water?",
    "How do I make pancakes?",
    "Which planet is the largest?",
    "Thank you, that's all.",
    "Turn off the music.",
    "What day is it today?",
]
UNFINISHED = [
    "I would like to book a table for two people and",
    "Can you tell me about the",
    "My name is John and I",
    "What's the weather like in",
    "I need to buy some milk, eggs, and",
    "Turn on the lights in the",
    "Could you remind me to",
    "Set a timer for",
    "How far is it from here to",
    "I was wondering if you could",
    "Tell me a story about a",
    "The meeting is at three o'clock on",
    "Please add bread to my",
    "What time does the",
    "I think the answer is",
    "Play some music by",
    "Send a message to my mother saying",
    "Remind me tomorrow morning that I",
    "How many calories are in a",
    "Book a flight from Boston to",
    "So what I really want to know is",
    "Order a large pizza with",
    "Call my brother and tell him",
    "Translate this sentence into",
    "What is the difference between",
]


@dataclass(frozen=True)
class Variant:
    name: str
    eagerness: str  # the policy's cap and thresholds
    words: bool  # the session's transcript reaches the detector
    scored_ms: int | None = None  # the design before: verdict at 200 ms
    floor_ms: int = 0  # the design before: no turn ended before 300 ms of silence


class StreamClockExecutor:
    """Scores at once but hands the verdict over only once the stream has advanced by the scoring's measured
    wall time, as a live server's pool would; ``clock`` is the detector's clock, the stream's time."""

    def __init__(self) -> None:
        self.now_ms = 0.0
        self.waiting: list[tuple[float, Future[tuple[float, float]], float]] = []
        self.score_ms: list[float] = []

    def clock(self) -> float:
        return self.now_ms / 1000

    def submit(self, fn: Any, *args: Any) -> Future[tuple[float, float]]:
        started = time.perf_counter()
        probability, _ = fn(*args)
        spent = (time.perf_counter() - started) * 1000
        self.score_ms.append(spent)
        future: Future[tuple[float, float]] = Future()
        self.waiting.append((self.now_ms + spent, future, probability))
        return future

    def advance(self, now_ms: float) -> None:
        self.now_ms = now_ms
        for due, future, probability in [w for w in self.waiting if w[0] <= now_ms]:
            if not future.cancelled():
                future.set_result((probability, due / 1000))
        self.waiting = [w for w in self.waiting if w[0] > now_ms]


def decide(variant: Variant, speech: np.ndarray, recognizer: Any) -> dict[str, Any]:
    """Feeds one phrase and the silence after it; returns when its turn ended, from the end of the speech."""
    from dataclasses import replace

    from omni_gateway.encoders.audio import float_to_pcm16
    from omni_gateway.encoders.turn import EAGERNESS, SemanticTurn
    from omni_gateway.encoders.vad import SileroVad

    policy = EAGERNESS[variant.eagerness]
    if variant.scored_ms is not None:
        policy = replace(policy, scored_silence_ms=variant.scored_ms, rescored_silence_ms=variant.scored_ms)
    x = np.concatenate(
        [np.zeros(RATE // 2, np.float32), speech, np.zeros(RATE * (policy.max_silence_ms + 1500) // 1000, np.float32)]
    )
    end_ms = np.nonzero(np.abs(x) > VOICED)[0][-1] * 1000 / RATE
    pool = StreamClockExecutor()
    vad = SileroVad(silence_duration_ms=policy.max_silence_ms)
    detector = SemanticTurn(vad, policy, executor=pool, clock=pool.clock)  # type: ignore[arg-type]
    pcm = float_to_pcm16(x)
    step = RATE * 2 * CHUNK_MS // 1000
    words_due: tuple[float, str] | None = None
    asr_ms = paused_ms = None
    heard = None
    for at in range(0, len(pcm), step):
        now_ms = (at + step) * 1000 / (2 * RATE)  # the chunk is fed once all of it has been spoken
        pool.advance(now_ms)
        if words_due is not None and now_ms >= words_due[0]:
            detector.hear(words_due[1])
            words_due = None
        for event in detector.feed(pcm[at : at + step]):
            if event.kind == "speech_paused":
                paused_ms = event.audio_ms
                if variant.words:
                    detector.expect_words()
                    started = time.perf_counter()
                    heard = recognizer.transcribe(x[: int(event.audio_ms * RATE / 1000)], sample_rate=RATE).text
                    asr_ms = (time.perf_counter() - started) * 1000
                    words_due = (event.audio_ms + asr_ms, heard)
            elif event.kind == "speech_resumed":
                words_due = None
            elif event.kind == "speech_stopped":
                assert paused_ms is not None
                stop_ms = max(event.audio_ms, paused_ms + variant.floor_ms)
                return {
                    "delay_ms": round(stop_ms - end_ms),
                    "early": event.audio_ms - paused_ms < policy.max_silence_ms,
                    "probability": detector.last_probability,
                    "score_ms": round(statistics.median(pool.score_ms), 1) if pool.score_ms else None,
                    "asr_ms": round(asr_ms, 1) if asr_ms is not None else None,
                    "heard": heard,
                }
    raise RuntimeError("the turn never ended")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument(
        "--eagerness", nargs="+", default=["auto", "high", "low"], choices=["auto", "high", "low", "medium"]
    )
    add_out_argument(ap, "turn_decisions")
    args = ap.parse_args()
    from omni_gateway.encoders.asr import load_recognizer

    recognizer = load_recognizer("default", device="cpu")
    spoken = speak_all(FINISHED + UNFINISHED, gain=0.6)
    variants = [Variant("before: sound alone, 300 ms floor", "auto", words=False, scored_ms=200, floor_ms=300)]
    variants += [Variant(f"{e}: sound and words", e, words=True) for e in args.eagerness]
    with ResultLog(args.out, "turn_decisions", phrases=len(spoken)) as log:
        summaries = []
        for variant in variants:
            rows = []
            for text, speech in spoken.items():
                row = {"text": text, "finished": text in FINISHED, **decide(variant, speech, recognizer)}
                rows.append(row)
            finished = [r["delay_ms"] for r in rows if r["finished"]]
            summary = {
                "variant": variant.name,
                "finished_p50_ms": percentile(finished, 0.5),
                "finished_p90_ms": percentile(finished, 0.9),
                "finished_max_ms": max(finished),
                "finished_early": sum(r["early"] for r in rows if r["finished"]),
                "finished": len(finished),
                "false_early_commits": sum(r["early"] for r in rows if not r["finished"]),
                "unfinished": len(rows) - len(finished),
                "score_p50_ms": statistics.median(r["score_ms"] for r in rows if r["score_ms"] is not None),
            }
            log.write("variant", **summary)
            for row in rows:
                log.write("turn", variant=variant.name, **row)
            summaries.append(summary)
        base = summaries[0]["finished_p50_ms"]
        print(f"{'variant':36} {'finished p50/p90/max ms':>24} {'early':>7} {'false early':>12} {'p50 vs before':>14}")
        for s in summaries:
            delays = f"{s['finished_p50_ms']:>8.0f} {s['finished_p90_ms']:>6.0f} {s['finished_max_ms']:>7.0f}"
            counts = f"{s['finished_early']:>4}/{s['finished']:<2} {s['false_early_commits']:>8}/{s['unfinished']:<3}"
            print(f"{s['variant']:36} {delays} {counts} {base / s['finished_p50_ms']:>13.2f}x")


if __name__ == "__main__":
    main()
