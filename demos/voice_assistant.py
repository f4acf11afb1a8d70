"""Talk to the gateway from the terminal: stream a WAV file (or the microphone) and hear or save the answer.

    python demos/voice_assistant.py question.wav --out answer.wav
    python demos/voice_assistant.py --mic            # needs `pip install sounddevice`

The audio is sent in real-time-sized chunks with server-side VAD deciding when the turn ends, exactly
as a voice assistant would; the progress line shows what is happening.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import json
import sys
import time
from pathlib import Path

import numpy as np
import soundfile as sf
import websockets

RATE = 24000
CHUNK_MS = 40


def load_wav(path: Path) -> np.ndarray:
    """Mono pcm16 at 24 kHz."""
    data, rate = sf.read(str(path), dtype="float32", always_2d=True)
    mono = data.mean(axis=1)
    if rate != RATE:
        import soxr

        mono = soxr.resample(mono, rate, RATE)
    return (np.clip(mono, -1, 1) * 32767).astype("<i2")


class Progress:
    def __init__(self, enabled: bool) -> None:
        self.enabled = enabled
        self.t0 = time.monotonic()

    def show(self, text: str) -> None:
        if self.enabled:
            sys.stderr.write(f"\r[{time.monotonic() - self.t0:6.2f}s] {text:<70}")
            sys.stderr.flush()

    def line(self, text: str) -> None:
        if self.enabled:
            sys.stderr.write(f"\r[{time.monotonic() - self.t0:6.2f}s] {text:<70}\n")


async def converse(
    url: str,
    audio: np.ndarray | None,
    *,
    api_key: str | None,
    mic: bool,
    out: Path | None,
    play: bool,
    timeout: float,
    progress: Progress,
) -> dict:
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    answer = bytearray()
    # timeline: time.monotonic() of the first speech_stopped, transcript and audio delta (for benchmarks)
    result: dict = {"transcript_in": "", "transcript_out": "", "latency_ms": None, "timeline": {}}
    timeline = result["timeline"]
    async with websockets.connect(url, additional_headers=headers, max_size=32 * 2**20) as ws:
        await ws.send(
            json.dumps(
                {
                    "type": "session.update",
                    "session": {
                        "type": "realtime",
                        "output_modalities": ["audio"],
                        "audio": {
                            "input": {
                                "format": {"type": "audio/pcm", "rate": RATE},
                                "transcription": {"model": "whisper-1"},
                                "turn_detection": {"type": "server_vad", "silence_duration_ms": 500},
                            },
                            "output": {"format": {"type": "audio/pcm", "rate": RATE}},
                        },
                    },
                }
            )
        )
        sender = asyncio.create_task(_send_audio(ws, audio, mic, progress))
        stopped_at: float | None = None
        try:
            async with asyncio.timeout(timeout):
                async for raw in ws:
                    event = json.loads(raw)
                    kind = event["type"]
                    if kind == "input_audio_buffer.speech_started":
                        progress.show("speech detected")
                    elif kind == "input_audio_buffer.speech_stopped":
                        stopped_at = time.monotonic()
                        timeline.setdefault("speech_stopped", stopped_at)
                        progress.show("end of turn, thinking")
                    elif kind == "conversation.item.input_audio_transcription.completed":
                        result["transcript_in"] = event["transcript"]
                        timeline.setdefault("transcription_completed", time.monotonic())
                        progress.line(f"you: {event['transcript']}")
                    elif kind == "response.output_audio.delta":
                        timeline.setdefault("first_audio_delta", time.monotonic())
                        if result["latency_ms"] is None and stopped_at is not None:
                            result["latency_ms"] = (time.monotonic() - stopped_at) * 1000
                        answer += base64.b64decode(event["delta"])
                        progress.show(f"receiving answer: {len(answer) / 2 / RATE:5.2f}s of audio")
                    elif kind == "response.output_audio_transcript.delta":
                        result["transcript_out"] += event["delta"]
                    elif kind == "error":
                        progress.line(f"error: {event['error'].get('code')}: {event['error']['message']}")
                    elif kind == "response.done":
                        progress.line(f"assistant: {result['transcript_out'].strip()}")
                        if not mic:
                            break
        finally:
            sender.cancel()
    pcm = np.frombuffer(bytes(answer), dtype="<i2")
    if out is not None:
        sf.write(str(out), pcm, RATE, subtype="PCM_16")
        progress.line(f"saved {len(pcm) / RATE:.2f}s of audio to {out}")
    if play and len(pcm):
        import sounddevice as sd

        sd.play(pcm, RATE, blocking=True)
    return result


async def _send_audio(ws, audio: np.ndarray | None, mic: bool, progress: Progress) -> None:
    step = RATE * CHUNK_MS // 1000
    if audio is not None:
        # Trailing silence lets the server's VAD see the end of the turn.
        padded = np.concatenate([audio, np.zeros(RATE, dtype="<i2")])
        for start in range(0, len(padded), step):
            chunk = padded[start : start + step].tobytes()
            await ws.send(json.dumps({"type": "input_audio_buffer.append", "audio": base64.b64encode(chunk).decode()}))
            progress.show(f"streaming question: {min(start + step, len(padded)) / RATE:5.2f}s")
            await asyncio.sleep(CHUNK_MS / 1000)
    if mic:
        import sounddevice as sd

        queue: asyncio.Queue[bytes] = asyncio.Queue(maxsize=50)
        loop = asyncio.get_running_loop()

        def enqueue(chunk: bytes) -> None:
            if not queue.full():  # a stalled socket drops microphone audio rather than piling it up
                queue.put_nowait(chunk)

        def callback(indata, frames, time_info, status) -> None:  # runs on the audio thread
            loop.call_soon_threadsafe(enqueue, bytes(indata))

        with sd.RawInputStream(samplerate=RATE, channels=1, dtype="int16", blocksize=step, callback=callback):
            while True:
                chunk = await queue.get()
                await ws.send(
                    json.dumps({"type": "input_audio_buffer.append", "audio": base64.b64encode(chunk).decode()})
                )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("wav", nargs="?", type=Path, help="question to send (any rate, mono or stereo)")
    parser.add_argument("--mic", action="store_true", help="stream the microphone instead (needs sounddevice)")
    parser.add_argument("--url", default="ws://127.0.0.1:8000/v1/realtime")
    parser.add_argument("--api-key", default=None)
    parser.add_argument("--out", type=Path, default=None, help="save the spoken answer as a WAV file")
    parser.add_argument("--play", action="store_true", help="play the answer (needs sounddevice)")
    parser.add_argument("--timeout", type=float, default=120.0)
    parser.add_argument("--quiet", action="store_true")
    args = parser.parse_args(argv)
    if args.wav is None and not args.mic:
        parser.error("give a WAV file or --mic")
    audio = load_wav(args.wav) if args.wav is not None else None
    try:
        result = asyncio.run(
            converse(
                args.url,
                audio,
                api_key=args.api_key,
                mic=args.mic,
                out=args.out,
                play=args.play,
                timeout=args.timeout,
                progress=Progress(not args.quiet),
            )
        )
    except websockets.exceptions.InvalidStatus as exc:
        code = exc.response.status_code
        hint = " (wrong or missing --api-key)" if code == 401 else ""
        sys.stderr.write(f"\n{args.url} refused the connection with HTTP {code}{hint}\n")
        return 1
    except TimeoutError:  # before OSError, of which it is a subclass
        sys.stderr.write(f"\nno complete answer within {args.timeout:g} s (--timeout)\n")
        return 1
    except OSError as exc:
        sys.stderr.write(f"\ncannot reach {args.url} ({exc}); is `omni serve` running?\n")
        return 1
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
