"""A served Qwen3-Omni checkpoint speaks through the gateway as Qwen2.5-Omni does: over ``/v1/realtime`` an
audio turn is answered in the model's own voice (audio deltas in the protocol's order, with the thinker's words
as their transcript), the session's voice picks the speaker, a cancel mid-answer stops the audio and the reply is
truncated to what was played; over ``/v1/chat/completions`` the reply comes back as a WAV (or streamed pcm16)
and its text. After every turn neither the thinker's nor the talker's engine runs a request or holds a KV block.

The tiny random checkpoint (tests/harness/tiny_qwen3_omni.py, ``speech=True``) is loaded by ``OmniPipeline.load``
as ``omni serve --model DIR`` loads it."""

from __future__ import annotations

import asyncio
import base64
import dataclasses
import io
import json
import threading
import time
import wave
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from omni_gateway.encoders.audio import float_to_pcm16, resample
from omni_gateway.omni import qwen3_speech
from omni_gateway.omni.config import OmniConfig
from omni_gateway.omni.pipeline import OmniPipeline
from omni_gateway.omni.qwen3_speech import Qwen3SpokenModel
from websockets.asyncio.client import connect

from tests.harness.audio_checkpoints import tone
from tests.harness.live_server import audio_turn, recv, serve, served, until
from tests.harness.real_engine import checkpoint_config
from tests.harness.tiny_qwen3_omni import save_tiny_qwen3_omni

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("one_torch_thread")]
RATE = 24000  # the realtime API's pcm16 rate, and code2wav's
MAX_FRAMES = 40  # a first chunk of 4 frames, then chunks of 25
TIMEOUT_S = 60


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Path:
    directory = tmp_path_factory.mktemp("qwen3omni-gateway")
    save_tiny_qwen3_omni(directory, speech=True)
    return directory


def omni_config(directory: Path, **speech: Any) -> OmniConfig:
    # tts at its default: a speaking model loads none
    return checkpoint_config(directory, max_tokens=6, tts="default", warm_up=True, **speech)


@pytest.fixture(scope="module")
def pipeline(checkpoint: Path) -> Iterator[OmniPipeline]:
    pipe = OmniPipeline.load(omni_config(checkpoint))  # warmed up: one short spoken turn ran before serving
    assert isinstance(pipe.speech, Qwen3SpokenModel)
    # A random talker may never say its stop code: a short utterance keeps the test fast.
    pipe.speech.config = dataclasses.replace(pipe.speech.config, max_frames=MAX_FRAMES)
    yield pipe
    pipe.shutdown()


class Decoded:
    """The frames of every code2wav chunk the served pipeline decodes; ``gate`` (when set up) holds every chunk
    after the first until it is opened."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, *, hold_later_chunks: bool = False) -> None:
        self.frames = 0
        self.calls = 0
        self.returned = 0
        self.gate = threading.Event()
        if not hold_later_chunks:
            self.gate.set()
        decode = qwen3_speech.decode_chunks

        def keep(model: Any, work: list[tuple[Any, torch.Tensor]]) -> list[torch.Tensor]:
            self.calls += 1
            if self.calls > 1:
                self.gate.wait(TIMEOUT_S)
            self.frames += sum(int(codes.shape[1]) for _, codes in work)
            waves = decode(model, work)
            self.returned += 1
            return waves

        monkeypatch.setattr(qwen3_speech, "decode_chunks", keep)


def idle(pipeline: OmniPipeline) -> None:
    """Neither engine runs a request or holds a KV block (the talker's abort may land a step later)."""
    assert pipeline.speech is not None and pipeline.speech.talker is not None
    engines = (pipeline.engine.engine, pipeline.speech.talker.engine)
    deadline = time.monotonic() + 10
    while any(e.has_unfinished() for e in engines) and time.monotonic() < deadline:
        time.sleep(0.01)
    for engine in engines:
        assert not engine.has_unfinished()
        assert engine.scheduler.kv.usage().num_used_blocks == 0


def heard_pcm() -> bytes:
    return float_to_pcm16(resample(tone(3, 0.6), 16000, RATE))


def wav_bytes(pcm16: bytes, rate: int = RATE) -> bytes:
    out = io.BytesIO()
    with wave.open(out, "wb") as w:
        w.setnchannels(1)
        w.setsampwidth(2)
        w.setframerate(rate)
        w.writeframes(pcm16)
    return out.getvalue()


def session(voice: str) -> dict[str, Any]:
    return {
        "type": "realtime",
        "output_modalities": ["audio"],
        "audio": {"input": {"turn_detection": None}, "output": {"voice": voice}},
    }


def audio_of(events: list[dict[str, Any]]) -> bytes:
    return b"".join(base64.b64decode(e["delta"]) for e in events if e["type"] == "response.output_audio.delta")


def test_realtime_audio_turn_is_answered_in_the_models_own_voice(
    pipeline: OmniPipeline, monkeypatch: pytest.MonkeyPatch
) -> None:
    decoded = Decoded(monkeypatch)
    with serve(pipeline) as port:
        events = asyncio.run(asyncio.wait_for(audio_turn(port, session("ethan"), heard_pcm()), TIMEOUT_S))
    assert not [e for e in events if e["type"] == "error"], events
    done = events[-1]["response"]
    # Six thinker tokens end the reply early: "incomplete" for max_output_tokens, with no error.
    assert done["status"] in ("completed", "incomplete") and (done["status_details"] or {}).get("error") is None
    kinds = [e["type"] for e in events]
    first, last = (
        kinds.index("response.output_audio.delta"),
        len(kinds) - 1 - kinds[::-1].index("response.output_audio.delta"),
    )
    # The protocol's order: the item and its audio part open, the deltas, then the part, the item, the response.
    assert kinds.index("response.created") < kinds.index("response.output_item.added") < first
    assert kinds.index("response.content_part.added") < first
    assert last < kinds.index("response.output_audio.done") < kinds.index("response.output_audio_transcript.done")
    assert (
        kinds.index("response.output_audio_transcript.done")
        < kinds.index("response.content_part.done")
        < kinds.index("response.output_item.done")
        < kinds.index("response.done")
    )
    audio = audio_of(events)
    assert kinds.count("response.output_audio.delta") >= 2  # chunk by chunk as code2wav decodes
    # Every sample code2wav made for the frames spoken, none more: the whole utterance's length.
    assert decoded.frames > 4 and len(audio) == 2 * pipeline.speech.code2wav.samples(decoded.frames)
    assert np.abs(np.frombuffer(audio, dtype=np.int16)).max() > 0
    deltas = "".join(e["delta"] for e in events if e["type"] == "response.output_audio_transcript.delta")
    (said,) = [e["transcript"] for e in events if e["type"] == "response.output_audio_transcript.done"]
    assert deltas and deltas == said  # the thinker's words ride with its voice
    assert done["output"][0]["content"][0]["transcript"] == said
    assert not any("transcription" in e["type"] for e in events)  # no ASR asked for, none ran
    assert done["usage"]["input_token_details"]["audio_tokens"] > 0  # the model heard the audio itself
    assert done["usage"]["output_token_details"]["audio_tokens"] > 0
    idle(pipeline)


def test_the_sessions_voice_picks_the_speaker(pipeline: OmniPipeline) -> None:
    async def turns(port: int) -> dict[str, bytes]:
        return {voice: audio_of(await audio_turn(port, session(voice), heard_pcm())) for voice in ("ethan", "chelsie")}

    with serve(pipeline) as port:
        spoken = asyncio.run(asyncio.wait_for(turns(port), TIMEOUT_S))
    assert spoken["ethan"] and spoken["chelsie"]
    assert spoken["ethan"] != spoken["chelsie"]  # greedy both times: only the speaker differs
    idle(pipeline)


def test_an_unknown_voice_is_refused_by_session_update_with_the_known_ones(pipeline: OmniPipeline) -> None:
    async def turns(port: int) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
        async with connect(f"ws://127.0.0.1:{port}/v1/realtime?model=m") as ws:
            await recv(ws)  # session.created
            await ws.send(json.dumps({"type": "session.update", "session": session("Nobody")}))
            refused = await until(ws, "error")
        return refused, await audio_turn(port, session("chelsie"), heard_pcm())

    with serve(pipeline) as port:
        refused, spoken = asyncio.run(asyncio.wait_for(turns(port), TIMEOUT_S))
    assert "session.updated" not in [e["type"] for e in refused]  # the session keeps its voice
    error = refused[-1]["error"]
    assert error["type"] == "invalid_request_error" and error["param"] == "session.audio.output.voice"
    assert "one of 'chelsie', 'ethan', got 'Nobody'" in error["message"]  # what is served, what was asked
    assert audio_of(spoken)  # the next session speaks
    idle(pipeline)


def test_cancel_mid_answer_stops_the_audio_and_truncate_keeps_what_was_played(
    pipeline: OmniPipeline, monkeypatch: pytest.MonkeyPatch
) -> None:
    decoded = Decoded(monkeypatch, hold_later_chunks=True)

    async def barge_in(port: int) -> dict[str, Any]:
        async with connect(f"ws://127.0.0.1:{port}/v1/realtime?model=m") as ws:
            await recv(ws)  # session.created
            await ws.send(json.dumps({"type": "session.update", "session": session("ethan")}))
            await until(ws, "session.updated")
            pcm = base64.b64encode(heard_pcm()).decode()
            await ws.send(json.dumps({"type": "input_audio_buffer.append", "audio": pcm}))
            await ws.send(json.dumps({"type": "input_audio_buffer.commit"}))
            await ws.send(json.dumps({"type": "response.create"}))
            before = await until(ws, "response.output_audio.delta")  # the first chunk plays; the second waits
            await ws.send(json.dumps({"type": "response.cancel"}))
            cancelled = await until(ws, "response.done")
            decoded.gate.set()  # the held chunk finishes now: none of it may go out
            while decoded.returned < decoded.calls:
                await asyncio.sleep(0.01)
            item = cancelled[-1]["response"]["output"][0]
            played_ms = len(audio_of(before + cancelled)) // 2 * 1000 // RATE
            truncate = {"type": "conversation.item.truncate", "item_id": item["id"], "content_index": 0}
            await ws.send(json.dumps(truncate | {"audio_end_ms": played_ms}))
            after = await until(ws, "conversation.item.truncated")
            await ws.send(json.dumps({"type": "conversation.item.retrieve", "item_id": item["id"]}))
            retrieved = await until(ws, "conversation.item.retrieved")
            return {"before": before, "cancelled": cancelled, "after": after + retrieved, "played_ms": played_ms}

    with serve(pipeline) as port:
        seen = asyncio.run(asyncio.wait_for(barge_in(port), TIMEOUT_S))
    done = seen["cancelled"][-1]["response"]
    assert done["status"] == "cancelled", done
    assert seen["played_ms"] > 0
    assert not [e for e in seen["after"] if e["type"] in ("response.output_audio.delta", "error")], seen["after"]
    assert decoded.calls <= 2  # the first chunk and the held one: none started after the cancel
    content = seen["after"][-1]["item"]["content"][0]
    assert len(base64.b64decode(content["audio"])) == seen["played_ms"] * RATE * 2 // 1000
    said = "".join(
        e["delta"] for e in seen["before"] + seen["cancelled"] if e["type"] == "response.output_audio_transcript.delta"
    )
    assert said.startswith(content["transcript"])  # the words up to what was played
    idle(pipeline)


def test_chat_completion_answers_heard_audio_with_a_wav_and_its_text(
    pipeline: OmniPipeline, monkeypatch: pytest.MonkeyPatch
) -> None:
    decoded = Decoded(monkeypatch)
    heard = {"type": "input_audio", "input_audio": {"data": base64.b64encode(wav_bytes(heard_pcm())).decode()}}
    heard["input_audio"]["format"] = "wav"
    with served(pipeline) as (_, client):
        reply = client.chat.completions.create(
            model=pipeline.capabilities.model,
            messages=[{"role": "user", "content": [heard, {"type": "text", "text": "what is said"}]}],
            modalities=["text", "audio"],
            audio={"voice": "ethan", "format": "wav"},
        )
    audio = reply.choices[0].message.audio
    assert audio is not None and audio.transcript  # the thinker's words
    with wave.open(io.BytesIO(base64.b64decode(audio.data))) as w:
        assert (w.getnchannels(), w.getsampwidth(), w.getframerate()) == (1, 2, RATE)
        samples = w.getnframes()
        pcm = np.frombuffer(w.readframes(samples), dtype=np.int16)
    # As long as the frames spoken: code2wav's samples for them, at its 24 kHz.
    assert decoded.frames > 4 and samples == pipeline.speech.code2wav.samples(decoded.frames)
    assert np.abs(pcm).max() > 0
    assert reply.usage is not None and reply.usage.prompt_tokens_details.audio_tokens > 0
    idle(pipeline)


def test_chat_completion_streams_pcm16_audio_with_its_transcript(
    pipeline: OmniPipeline, monkeypatch: pytest.MonkeyPatch
) -> None:
    decoded = Decoded(monkeypatch)
    with served(pipeline) as (_, client):
        chunks = list(
            client.chat.completions.create(
                model=pipeline.capabilities.model,
                messages=[{"role": "user", "content": "say something"}],
                modalities=["text", "audio"],
                audio={"voice": "chelsie", "format": "pcm16"},
                stream=True,
            )
        )
    audio = [c.choices[0].delta.audio for c in chunks if c.choices and c.choices[0].delta.audio]
    pcm = b"".join(base64.b64decode(a.data) for a in audio if a.data)
    transcript = "".join(a.transcript or "" for a in audio)
    assert transcript and decoded.frames > 4
    assert len([a for a in audio if a.data]) >= 2  # streamed chunk by chunk, not sent whole at the end
    assert len(pcm) == 2 * pipeline.speech.code2wav.samples(decoded.frames)
    idle(pipeline)


def test_the_speech_flags_size_code2wavs_chunks_in_frames_of_as_much_audio(
    checkpoint: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``--speech-first-chunk-codes 1 --speech-chunk-codes 2 --speech-max-codes 3``: 20, 40 and 60 ms of audio;
    the tiny code2wav's frames are 32 samples (4/3 ms), so 15, 30 and 45 frames."""
    config = omni_config(checkpoint, speech_first_chunk_codes=1, speech_chunk_codes=2, speech_max_codes=3)
    pipe = OmniPipeline.load(dataclasses.replace(config, warm_up=False))
    try:
        assert isinstance(pipe.speech, Qwen3SpokenModel) and pipe.speech.code2wav.config.upsample == 32
        cfg = pipe.speech.config
        assert (cfg.chunking.first_chunk_frames, cfg.chunking.chunk_frames, cfg.max_frames) == (15, 30, 45)
        sizes: list[int] = []
        decode = qwen3_speech.decode_chunks

        def keep(model: Any, work: list[tuple[Any, torch.Tensor]]) -> list[torch.Tensor]:
            sizes.extend(int(codes.shape[1]) for _, codes in work)
            return decode(model, work)

        monkeypatch.setattr(qwen3_speech, "decode_chunks", keep)
        with served(pipe) as (_, client):
            reply = client.chat.completions.create(
                model=pipe.capabilities.model,
                messages=[{"role": "user", "content": "say something"}],
                modalities=["text", "audio"],
                audio={"voice": "ethan", "format": "wav"},
            )
        assert reply.choices[0].message.audio is not None
        # The random talker never says its stop code: 45 frames, cut 15 then 30.
        assert sizes == [15, 30]
    finally:
        pipe.shutdown()
