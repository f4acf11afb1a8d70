"""Voice-stage latencies on this machine: Piper time to first audio and real-time factor,
faster-whisper latency on a short utterance, and silero-vad cost per 20 ms chunk, each the median
over ``--runs``; appended to ``benchmarks/results/voice_stages.jsonl``.

    python -m benchmarks.voice_stages [--runs 5] [--out FILE]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import time

from omni_gateway.encoders.asr import load_recognizer
from omni_gateway.encoders.audio import float_to_pcm16
from omni_gateway.encoders.vad import SileroVad
from omni_gateway.omni.heads.tts.head import TtsHead

from benchmarks.lib.common import ResultLog, add_out_argument

REPLY = "The weather today is sunny and warm, with a light breeze from the west."
UTTERANCE = "Please turn on the kitchen lights now."


def median_ms(samples: list[float]) -> str:
    return f"{statistics.median(samples) * 1000:.1f} ms (min {min(samples) * 1000:.1f})"


async def first_audio_s(head: TtsHead, text: str) -> float:
    async def deltas():
        for i, word in enumerate(text.split(" ")):
            yield word if i == 0 else " " + word

    start = time.perf_counter()
    stream = head.stream(deltas())
    await stream.__anext__()
    elapsed = time.perf_counter() - start
    await stream.aclose()
    return elapsed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=5)
    add_out_argument(parser, "voice_stages")
    args = parser.parse_args()
    runs = args.runs
    print(f"cpus={os.cpu_count()} load={os.getloadavg()[0]:.2f}")

    head = TtsHead.load("default", device="cpu")
    head.synthesize("Warm up.")
    ttfa = [asyncio.run(first_audio_s(head, REPLY)) for _ in range(runs)]
    print(f"piper time to first audio, 1-sentence reply: {median_ms(ttfa)}")
    factors = []
    for _ in range(runs):
        start = time.perf_counter()
        audio = head.synthesize(REPLY)
        factors.append((time.perf_counter() - start) / (len(audio) / 24000))
    print(f"piper real-time factor: {statistics.median(factors):.3f} (audio {len(audio) / 24000:.2f} s)")

    speech = head.synthesize(UTTERANCE)
    asr = load_recognizer("default", device="cpu")
    asr.transcribe(speech, sample_rate=24000)
    latencies = []
    for _ in range(runs):
        start = time.perf_counter()
        result = asr.transcribe(speech, sample_rate=24000)
        latencies.append(time.perf_counter() - start)
    print(
        f"faster-whisper tiny.en int8, {len(speech) / 24000:.2f} s utterance: {median_ms(latencies)} -> {result.text!r}"
    )

    pcm = float_to_pcm16(speech)
    vad = SileroVad()
    chunk = 960  # 20 ms of 24 kHz pcm16
    costs = []
    for _ in range(runs):
        vad.reset()
        start = time.perf_counter()
        chunks = 0
        for at in range(0, len(pcm) - chunk + 1, chunk):
            vad.feed(pcm[at : at + chunk])
            chunks += 1
        costs.append((time.perf_counter() - start) / chunks)
    print(f"silero-vad per 20 ms chunk (24 kHz in, resample + model): {statistics.median(costs) * 1e6:.0f} us")
    with ResultLog(args.out, "voice_stages", runs=runs) as log:
        log.write(
            "stages",
            piper_first_audio_ms=statistics.median(ttfa) * 1e3,
            piper_real_time_factor=statistics.median(factors),
            whisper_ms=statistics.median(latencies) * 1e3,
            utterance_s=len(speech) / 24000,
            transcript=result.text,
            vad_us_per_chunk=statistics.median(costs) * 1e6,
        )


if __name__ == "__main__":
    main()
