"""What the WebRTC transport costs: end of speech -> first audio over a WebRTC call against a WebSocket session on
the same server, and how many concurrent calls the CPU carries before that latency grows by half.

    python -m benchmarks.webrtc_latency [--turns 8] [--calls 1 4 8 16] [--model default] [--spoken NPZ] [--out FILE]

Both transports speak the same questions at real-time pace to one server and let its server VAD (500 ms of
silence) end each turn. The WebSocket client is the voice benchmarks' (``benchmarks/lib/voice_client``:
40 ms chunks of pcm16, first audio = the turn's first ``response.output_audio.delta``). The WebRTC caller is an
aiortc peer as a browser places a call: an Opus microphone track sending the packet length the answer's
``a=ptime`` asks for, as Chromium does (``--ignore-ptime``: 20 ms, as a browser that does not), and the
``oai-events`` channel for the events. End of speech is when its microphone handed aiortc the frame holding
the question's last voiced sample (``voice_client.speech_end``); first audio is when the first audible RTP
packet of the reply (a peak above -60 dBFS once decoded; the track carries digital silence between replies)
reached the caller. That packet is timed as it arrives, before aiortc's receive jitter buffer, which holds
every packet for four more: a browser plays through its own adaptive buffer instead, whose depth depends on
the network's jitter, not the server. ``heard`` is when aiortc's track released the same audio, for reference.

The difference of the p50s is the transport's cost. Each transport's latency splits in two (from
``voice_client.summarize``): end of speech -> ``speech_stopped`` (the caller's audio reaching the VAD: the
receive path; the event itself comes back on the data channel) and ``speech_stopped`` -> first audio (the
reply reaching the caller: the send path). Then N calls at once (``--calls``; ``--turns`` each), their p50
against one call's, until it grows past 1.5x (``--growth``).

By default the server runs the test suite's scripted backend: the transport's own cost, without models; its
questions are tones (its VAD hears only loud frames). ``--model default`` serves the embedded models
(faster-whisper tiny.en, SmolLM2, Piper) on the CPU, with Piper-spoken questions (``--spoken`` keeps them).
Clients run in a child process, as in ``voice_sessions``, so the server's interpreter is not also pacing the
callers.
Results go to ``benchmarks/results/webrtc_latency.jsonl``.
"""

from __future__ import annotations

import argparse
import asyncio
import concurrent.futures
import fractions
import json
import multiprocessing
import os
import re
import time
from typing import Any

import av
import httpx
import numpy as np
import soxr
from aiortc import RTCConfiguration, RTCPeerConnection, RTCSessionDescription
from aiortc.mediastreams import MediaStreamError, MediaStreamTrack

from benchmarks.lib import voice_client
from benchmarks.lib.common import ResultLog, add_out_argument, ratio
from benchmarks.lib.voice_client import record, summarize, table, turn_row

RATE = 48000  # Opus's clock: the caller's frames, in and out
_TIME_BASE = fractions.Fraction(1, RATE)
AUDIBLE = 32  # a decoded sample this loud (-60 dBFS) is reply audio; between replies the track is digital zero
SILENCE_S = 0.4  # before each question and after each reply, as voice_client streams


class Microphone(MediaStreamTrack):  # type: ignore[misc]
    """Plays queued 24 kHz pcm16 at real time, silence in between, and notes when the frame holding a marked sample
    was handed to aiortc's sender (which sends it at once). It sends packets of the length the answer's
    ``a=ptime`` names, as browsers do (20 ms without one): at 20 ms aiortc's encoder makes them, at another
    length the track encodes them itself, aiortc's encoder knowing 20 ms only."""

    kind = "audio"

    def __init__(self) -> None:
        super().__init__()
        self.frame = RATE // 50
        self._encoder: Any = None
        self.queued = np.zeros(0, np.int16)
        self.sent = 0  # samples handed out so far
        self.marks: dict[int, float] = {}  # stream position -> when the frame holding it was handed out
        self._start: float | None = None

    def use_ptime(self, ptime_ms: int) -> None:
        """Send ``ptime_ms`` packets, as the answer's ``a=ptime`` asks (before the call connects)."""
        self.frame = RATE * ptime_ms // 1000
        if ptime_ms != 20:
            self._encoder = av.CodecContext.create("libopus", "w")
            self._encoder.sample_rate, self._encoder.format, self._encoder.layout = RATE, "s16", "mono"
            self._encoder.bit_rate, self._encoder.time_base = 96000, _TIME_BASE
            self._encoder.options = {"application": "voip", "frame_duration": str(ptime_ms)}

    def say(self, pcm24: bytes, mark: int | None = None) -> int | None:
        """Queue ``pcm24``; the stream position of its sample ``mark`` (a 24 kHz index), to look up in ``marks``."""
        at = self.sent + self.queued.size
        samples = soxr.resample(np.frombuffer(pcm24, "<i2"), 24000, RATE).astype(np.int16)
        self.queued = np.concatenate([self.queued, samples])
        if mark is None:
            return None
        self.marks[at + 2 * mark] = 0.0
        return at + 2 * mark

    async def recv(self) -> av.AudioFrame | av.Packet:
        if self.readyState != "live":
            raise MediaStreamError
        if self._start is None:
            self._start = time.monotonic()
        else:
            await asyncio.sleep(max(0.0, self._start + self.sent / RATE - time.monotonic()))
        out = np.zeros(self.frame, np.int16)
        take = min(self.frame, self.queued.size)
        out[:take], self.queued = self.queued[:take], self.queued[take:]
        now = time.monotonic()
        for position, at in self.marks.items():
            if not at and self.sent <= position < self.sent + self.frame:
                self.marks[position] = now
        frame = av.AudioFrame.from_ndarray(out.reshape(1, -1), format="s16", layout="mono")
        frame.sample_rate, frame.pts, frame.time_base = RATE, self.sent, _TIME_BASE
        self.sent += self.frame
        if self._encoder is None:
            return frame
        (packet,) = self._encoder.encode(frame)  # libopus returns each frame's packet at once
        packet.pts, packet.time_base = frame.pts, _TIME_BASE
        return packet


async def call_session(
    base_url: str,
    questions: list[str],
    spoken: dict[str, bytes],
    turn_timeout: float,
    delay_s: float = 0.0,
    follow_ptime: bool = True,
) -> list[dict[str, Any]]:
    """One WebRTC call, placed after ``delay_s``: each turn's timeline, as ``voice_client.session`` returns it."""
    ends = {q: voice_client.speech_end(spoken[q]) for q in set(questions)}
    await asyncio.sleep(delay_s)
    peer = RTCPeerConnection(RTCConfiguration(iceServers=[]))
    mic = Microphone()
    peer.addTrack(mic)
    channel = peer.createDataChannel("oai-events")
    events: asyncio.Queue[dict[str, Any]] = asyncio.Queue()
    channel.on("message", lambda text: events.put_nowait(json.loads(text)))
    audible: list[float] = []  # arrival of each audible RTP packet
    heard: list[float] = []  # when aiortc's track released each audible frame
    tasks: list[asyncio.Task[None]] = []

    def on_track(track: Any) -> None:
        receiver = next(r for r in peer.getReceivers() if r.track is track)
        decoder = av.CodecContext.create("libopus", "r")
        handle = receiver._handle_rtp_packet

        # Time each packet as it arrives, before aiortc's fixed jitter buffer (a browser's replaces it).
        async def arrived(packet: Any, arrival_time_ms: int) -> None:
            if packet.payload:
                frames = decoder.decode(av.Packet(packet.payload))
                if any(np.abs(f.to_ndarray().astype(np.int32)).max() >= AUDIBLE for f in frames):
                    audible.append(time.monotonic())
            await handle(packet, arrival_time_ms)

        receiver._handle_rtp_packet = arrived

        async def listen() -> None:
            while True:
                frame = await track.recv()
                if np.abs(frame.to_ndarray().astype(np.int32)).max() >= AUDIBLE:
                    heard.append(time.monotonic())

        tasks.append(asyncio.create_task(listen()))

    peer.on("track", on_track)
    await peer.setLocalDescription(await peer.createOffer())
    async with httpx.AsyncClient(base_url=base_url, timeout=30) as http:
        response = await http.post(
            "/v1/realtime/calls", content=peer.localDescription.sdp, headers={"Content-Type": "application/sdp"}
        )
        if response.status_code != 201:
            raise RuntimeError(f"the call was refused: {response.status_code} {response.text[:200]}")
        call_path = response.headers["location"]
        if follow_ptime and (
            ptime := re.search(r"^a=ptime:(\d+)", response.text.split("m=audio", 1)[-1].split("m=", 1)[0], re.M)
        ):
            mic.use_ptime(int(ptime.group(1)))
        await peer.setRemoteDescription(RTCSessionDescription(sdp=response.text, type="answer"))
        turns: list[dict[str, Any]] = []
        done = asyncio.Event()
        played = asyncio.Event()  # the track finished playing a reply

        async def listen_events() -> None:
            while True:
                event = await events.get()
                if event["type"] == "session.created":
                    channel.send(json.dumps(voice_client.session_update("server_vad")))
                elif event["type"] == "output_audio_buffer.stopped":
                    played.set()
                elif record(turns[-1] if turns else {}, event, time.monotonic()):
                    done.set()

        tasks.append(asyncio.create_task(listen_events()))
        try:
            silence = bytes(int(24000 * SILENCE_S) * 2)
            await asyncio.sleep(1.0)  # ICE, DTLS and the session.update before the first question
            for question in questions:
                turns.append({"question": question, "transcript": "", "answer": "", "arrivals": []})
                done.clear()
                played.clear()
                started = time.monotonic()
                mark = mic.say(silence + spoken[question], len(silence) // 2 + ends[question] - 1)
                # The reply is done once generated, and heard once the track has played it (real time, past
                # response.done): the next question waits for that, or its first audio would be this reply's tail.
                try:
                    await asyncio.wait_for(done.wait(), turn_timeout + len(spoken[question]) / 48000)
                    await asyncio.wait_for(played.wait(), turn_timeout)
                except TimeoutError:
                    pass
                mic.say(silence)
                await asyncio.sleep(SILENCE_S + 0.1)
                turn = turns[-1]
                turn["speech_end_sent"] = mic.marks.get(mark) or time.monotonic()
                turn["speech_s"] = ends[question] / 24000
                after = started + SILENCE_S  # the reply comes after the question starts, never before
                if first := next((t for t in audible if t > after), None):
                    turn["first_audio"] = first
                    turn["heard_s"] = next((t for t in heard if t > after), first) - first
        finally:
            await http.post(f"{call_path}/hangup")
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            await peer.close()
    return turns


def webrtc_row(turn: dict[str, Any]) -> dict[str, Any]:
    row = turn_row(turn)
    if "heard_s" in turn:
        row["heard_after_arrival_s"] = turn["heard_s"]
    return row


def _client_group(
    base_url: str, plans: list[list[str]], spoken: dict[str, bytes], timeout: float, follow_ptime: bool
) -> list[list[dict]]:
    async def group() -> list[list[dict]]:
        return await asyncio.gather(
            *(call_session(base_url, plan, spoken, timeout, i * 0.05, follow_ptime) for i, plan in enumerate(plans))
        )

    return asyncio.run(group())


def run_calls(
    base_url: str, n: int, turns: int, spoken: dict[str, bytes], timeout: float, follow_ptime: bool = True
) -> list[dict[str, Any]]:
    """``n`` concurrent calls of ``turns`` turns each, placed from one child process."""
    questions = list(spoken)
    plans = [[questions[(c * turns + t) % len(questions)] for t in range(turns)] for c in range(n)]
    context = multiprocessing.get_context("spawn")
    with concurrent.futures.ProcessPoolExecutor(1, mp_context=context) as pool:
        results = pool.submit(_client_group, base_url, plans, spoken, timeout, follow_ptime).result()
    return [dict(webrtc_row(t), call=c, turn=i) for c, call in enumerate(results) for i, t in enumerate(call)]


def report(label: str, rows: list[dict[str, Any]]) -> dict[str, Any]:
    out = summarize(rows)
    heard = [r["heard_after_arrival_s"] for r in rows if "heard_after_arrival_s" in r]
    if heard:
        out["heard_after_arrival_p50_s"] = float(np.median(heard))
    print(table(label, out), flush=True)
    if heard:
        print(
            f"  aiortc's track released the first audio {out['heard_after_arrival_p50_s'] * 1000:.0f} ms "
            "after it arrived (p50)",
            flush=True,
        )
    return out


def scripted_questions() -> dict[str, bytes]:
    """Tones of a spoken question's length: the scripted backend's VAD hears only frames whose peak reaches half
    of full scale, so it ends the turn where the tone ends, not at a Piper question's last loud syllable (before
    its speech ends). Near full scale: Opus at 96 kb/s returns a 220 Hz tone at about 70% of its peak."""
    from tests.harness.fake_backend import tone

    return {f"tone of {ms} ms": tone(ms, amplitude=30000) for ms in (900, 1100, 1300, 1500)}


def load_backend(args: argparse.Namespace) -> Any:
    if args.model is None:
        from tests.harness.fake_backend import FakeBackend

        return FakeBackend()
    from benchmarks.voice_sessions import load_stages

    stages = argparse.Namespace(
        fake=False,
        model=args.model,
        asr="default",
        tts="default",
        random_stages=None,
        device="cpu",
        sessions=args.calls,
        engine_in_process=False,
        gpu_memory_utilization=None,
        asr_batches_alone=True,
        asr_max_batch=None,
    )
    return load_stages(stages)


def _ms(seconds: float) -> str:
    return f"{seconds * 1000:.0f} ms"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--turns", type=int, default=8, help="turns per transport, and per call at each N")
    parser.add_argument("--calls", type=int, nargs="+", default=[1, 4, 8, 16], help="concurrent calls to try")
    parser.add_argument("--growth", type=float, default=1.5, help="stop once the p50 grows past this x one call's")
    parser.add_argument("--model", help="serve the embedded models ('default') instead of the scripted backend")
    parser.add_argument("--turn-timeout", type=float, default=30.0, help="seconds a turn may wait for its reply")
    parser.add_argument("--spoken", metavar="NPZ", help="the spoken questions: read from, or saved to, this file")
    parser.add_argument(
        "--ignore-ptime",
        action="store_true",
        help="callers send 20 ms packets whatever the answer asks (a browser that does not honour a=ptime)",
    )
    add_out_argument(parser, "webrtc_latency")
    args = parser.parse_args()
    from omni_gateway.gateway.config import GatewayConfig
    from omni_gateway.gateway.realtime.webrtc_calls import RECEIVE_PTIME_MS

    from benchmarks.voice_sessions import run_sessions, spoken_questions
    from tests.harness.live_server import serve

    print(f"cpus={os.cpu_count()} load={os.getloadavg()[0]:.2f} model={args.model or 'scripted'}", flush=True)
    spoken = spoken_questions(args.spoken) if args.model else scripted_questions()
    backend = load_backend(args)
    config = GatewayConfig(voice_admission_rtf=0, max_sessions=max(256, 2 * max(args.calls)))
    with (
        ResultLog(
            args.out,
            "webrtc_latency",
            turns=args.turns,
            model=args.model or "scripted",
            answer_ptime_ms=RECEIVE_PTIME_MS,  # the packet length the server's answer asks callers for
            callers_follow_ptime=not args.ignore_ptime,
        ) as log,
        serve(backend, config) as port,
    ):
        base = f"http://127.0.0.1:{port}"
        run_sessions(f"ws://127.0.0.1:{port}/v1/realtime", 1, 1, spoken, args.turn_timeout)  # warm-up
        run_calls(base, 1, 1, spoken, args.turn_timeout)
        summaries = {}
        for transport in ("websocket", "webrtc"):
            if transport == "websocket":
                rows = run_sessions(f"ws://127.0.0.1:{port}/v1/realtime", 1, args.turns, spoken, args.turn_timeout)
            else:
                rows = run_calls(base, 1, args.turns, spoken, args.turn_timeout, not args.ignore_ptime)
            for row in rows:
                log.write("turn", transport=transport, calls=1, **row)
            summaries[transport] = report(transport, rows)
            log.write("summary", transport=transport, calls=1, **summaries[transport])
        ws, rtc = summaries["websocket"], summaries["webrtc"]
        if "latency_p50_s" in ws and "latency_p50_s" in rtc:
            cost = {q: rtc[f"latency_{q}_s"] - ws[f"latency_{q}_s"] for q in ("p50", "p90")}
            split = {
                "receive_p50_s": rtc["decision_p50_s"] - ws["decision_p50_s"],
                "send_p50_s": rtc["stopped_to_audio_p50_s"] - ws["stopped_to_audio_p50_s"],
            }
            print(
                f"WebRTC over WebSocket: p50 {_ms(rtc['latency_p50_s'])} vs {_ms(ws['latency_p50_s'])} "
                f"({ratio(rtc['latency_p50_s'], ws['latency_p50_s'])}, +{_ms(cost['p50'])}), p90 +{_ms(cost['p90'])}; "
                f"end of speech -> speech_stopped +{_ms(split['receive_p50_s'])}, speech_stopped -> first audio "
                f"+{_ms(split['send_p50_s'])}",
                flush=True,
            )
            log.write(
                "transport_cost",
                **{f"{k}_p50_s": v for k, v in (("cost", cost["p50"]),)},
                cost_p90_s=cost["p90"],
                ratio_p50=rtc["latency_p50_s"] / ws["latency_p50_s"],
                **split,
            )
        one = rtc.get("latency_p50_s")
        for n in args.calls:
            if n == 1:
                continue
            rows = run_calls(base, n, args.turns, spoken, args.turn_timeout, not args.ignore_ptime)
            for row in rows:
                log.write("turn", transport="webrtc", calls=n, **row)
            summary = report(f"webrtc N={n}", rows)
            log.write("summary", transport="webrtc", calls=n, **summary)
            p50 = summary.get("latency_p50_s")
            if one and p50:
                print(f"  N={n}: p50 {ratio(p50, one)} one call's", flush=True)
            if summary["lost"] or (one and p50 and p50 > args.growth * one):
                print(f"  latency grew past {args.growth}x (or turns were lost) at N={n}: stopping", flush=True)
                break
    if args.model is not None:
        backend.shutdown()


if __name__ == "__main__":
    main()
