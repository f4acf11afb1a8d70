"""Thinker -> talker -> token2wav through the pipeline, with neither an ASR nor a TTS model loaded.

The thinker is the tiny Omni checkpoint's text model served by the engine; the talker and token2wav
come from the same checkpoint."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Iterator
from typing import Any

import pytest
import torch
from omni_gateway.engine.config import EngineConfig
from omni_gateway.engine.core.llm_engine import LLMEngine
from omni_gateway.engine.frontend.async_engine import AsyncEngine
from omni_gateway.omni.heads.token2wav.head import OUTPUT_SAMPLE_RATE, Token2WavConfig
from omni_gateway.omni.pipeline import OmniPipeline
from omni_gateway.omni.protocol import (
    AudioChunk,
    AudioOutputOptions,
    Done,
    Error,
    Message,
    OmniRequest,
    SamplingOptions,
    TextDelta,
    TextPart,
    Usage,
)
from omni_gateway.omni.speech import SpeechConfig, SpokenModel

from tests.harness.playback_deadlines import ChunkCall, assert_playback_deadlines
from tests.harness.real_engine import checkpoint_config
from tests.harness.tiny_omni import SPEAKERS, save_tiny_omni, save_tiny_thinker_text

pytestmark = pytest.mark.slow

CHUNKS = Token2WavConfig(first_chunk_codes=4, chunk_codes=8, past_codes=4, lookahead_codes=2, num_steps=4)


@pytest.fixture(scope="module")
def pipeline(tmp_path_factory: pytest.TempPathFactory) -> Iterator[OmniPipeline]:
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    root = tmp_path_factory.mktemp("speaking")
    omni = save_tiny_omni(root / "omni")
    thinker_dir = save_tiny_thinker_text(omni, root / "thinker")
    cpu = dict(device="cpu", attention_backend="torch", max_model_len=512)
    thinker = AsyncEngine(engine=LLMEngine(EngineConfig(model=str(thinker_dir), **cpu)))
    speech = SpokenModel.load(omni, device="cpu", config=SpeechConfig(token2wav=CHUNKS, temperature=0.0, max_codes=48))
    config = checkpoint_config(thinker_dir, max_tokens=10, engine_args={**cpu, "num_kv_blocks": None}, warm_up=True)
    pipe = OmniPipeline(config, engine=thinker, model_name="tiny", max_context_tokens=512, speech=speech)
    yield pipe
    pipe.shutdown()
    torch.set_num_threads(threads)


def _request(rid: str, modalities: tuple[str, ...], voice: str | None = None) -> OmniRequest:
    return OmniRequest(
        request_id=rid,
        messages=(Message("user", (TextPart("the cat sat on the mat"),)),),
        modalities=modalities,  # type: ignore[arg-type]
        sampling=SamplingOptions(temperature=0.0, max_tokens=10, seed=1),
        audio=AudioOutputOptions(voice=voice),
    )


async def _collect(pipe: OmniPipeline, request: OmniRequest) -> list[Any]:
    return [chunk async for chunk in pipe.generate(request)]


def test_spoken_answer_comes_from_talker_and_token2wav(pipeline: OmniPipeline) -> None:
    assert "audio" in pipeline.capabilities.output_modalities
    assert pipeline.capabilities.voices == SPEAKERS
    written = asyncio.run(_collect(pipeline, _request("text-1", ("text",))))
    text = "".join(c.text for c in written if isinstance(c, TextDelta))
    spoken = asyncio.run(_collect(pipeline, _request("audio-1", ("text", "audio"), voice="Ethan")))
    audio = [c for c in spoken if isinstance(c, AudioChunk)]
    pcm = b"".join(c.pcm16 for c in audio)
    assert len(pcm) > 0 and all(len(c.pcm16) <= 2 * 2400 for c in audio)  # 100 ms pieces at 24 kHz
    # The transcript is the thinker's text, carried by the audio chunks.
    assert "".join(c.transcript for c in audio) == text
    done = [c for c in spoken if isinstance(c, Done)]
    assert len(done) == 1 and isinstance(spoken[-1], Usage) and spoken[-1].output_audio_tokens > 0
    # Another voice: same words, another speaker.
    other = asyncio.run(_collect(pipeline, _request("audio-2", ("text", "audio"), voice="Chelsie")))
    assert b"".join(c.pcm16 for c in other if isinstance(c, AudioChunk)) != pcm


def test_each_token2wav_chunk_is_due_when_its_listener_runs_out_of_audio(
    pipeline: OmniPipeline, monkeypatch: pytest.MonkeyPatch
) -> None:
    speech = pipeline.speech
    assert isinstance(speech, SpokenModel)
    chunk_batched, calls = speech.token2wav.chunk_batched, []

    def recorded(*args: Any) -> tuple[torch.Tensor, torch.Tensor]:
        called_at = time.monotonic()
        mel, wave = chunk_batched(*args)
        calls.append(ChunkCall(args[5], called_at, len(wave)))
        return mel, wave

    monkeypatch.setattr(speech.token2wav, "chunk_batched", recorded)
    began = time.monotonic()
    spoken = asyncio.run(_collect(pipeline, _request("due", ("text", "audio"))))
    assert any(isinstance(c, AudioChunk) and c.pcm16 for c in spoken)
    assert_playback_deadlines(calls, OUTPUT_SAMPLE_RATE, began)


def test_unknown_voice_is_refused_with_the_voices(pipeline: OmniPipeline) -> None:
    chunks = asyncio.run(_collect(pipeline, _request("bad-voice", ("text", "audio"), voice="Nobody")))
    assert isinstance(chunks[0], Error) and chunks[0].status == 400
    assert all(name in chunks[0].message for name in SPEAKERS)


def test_a_spoken_turn_reuses_the_conversation_before_it(pipeline: OmniPipeline) -> None:
    """The thinker of a spoken turn asks for hidden states; the conversation's earlier turn still comes from
    the prefix cache (with the hidden states kept there), and the talker is conditioned on all of it."""
    first = (Message("user", (TextPart("a dog ran along the beach by the sea"),)),)

    def spoken(rid: str, messages: tuple[Message, ...]) -> list[Any]:
        request = OmniRequest(
            request_id=rid,
            messages=messages,
            modalities=("text", "audio"),
            sampling=SamplingOptions(temperature=0.0, max_tokens=10, seed=1),
        )
        return asyncio.run(_collect(pipeline, request))

    speech = pipeline.speech
    assert speech is not None
    talker_kv = speech.talker.engine.scheduler.kv
    turn1 = spoken("turn-1", first)
    reply = "".join(c.transcript for c in turn1 if isinstance(c, AudioChunk))
    talker_hits = talker_kv.prefix_hit_tokens
    turn2 = spoken("turn-2", (*first, Message("assistant", (TextPart(reply),)), Message("user", (TextPart("why"),))))
    usage1, usage2 = turn1[-1], turn2[-1]
    assert isinstance(usage1, Usage) and isinstance(usage2, Usage)
    assert usage1.cached_tokens == 0 and usage2.cached_tokens >= 8
    # The talker's prompt is keyed by what its rows are made of: its blocks of turn 1's prompt are reused too.
    assert talker_kv.prefix_hit_tokens - talker_hits >= 8
    assert any(isinstance(c, AudioChunk) and c.pcm16 for c in turn2)


def test_concurrent_spoken_turns_share_the_talkers_steps(pipeline: OmniPipeline) -> None:
    """One talker engine serves every session: two spoken turns at once run in the same talker steps and say
    what each says alone."""
    speech = pipeline.speech
    assert speech is not None
    runner = speech.talker.engine.runner
    execute, batches = runner.execute, []

    def counted(batch: Any, *args: Any) -> Any:
        batches.append(len(batch.seqs))
        return execute(batch, *args)

    def spoken(rid: str, words: str) -> OmniRequest:
        return OmniRequest(
            request_id=rid,
            messages=(Message("user", (TextPart(words),)),),
            modalities=("text", "audio"),
            sampling=SamplingOptions(temperature=0.0, max_tokens=10, seed=1),
        )

    def heard(chunks: list[Any]) -> tuple[bytes, str]:
        audio = [c for c in chunks if isinstance(c, AudioChunk)]
        return b"".join(c.pcm16 for c in audio), "".join(c.transcript for c in audio)

    words = ("one fish two fish", "red fish blue fish")
    alone = [heard(asyncio.run(_collect(pipeline, spoken(f"alone-{i}", w)))) for i, w in enumerate(words)]

    async def together() -> list[list[Any]]:
        return list(await asyncio.gather(*(_collect(pipeline, spoken(f"both-{i}", w)) for i, w in enumerate(words))))

    runner.execute = counted
    try:
        both = [heard(chunks) for chunks in asyncio.run(together())]
    finally:
        runner.execute = execute
    assert max(batches) == 2
    assert all(pcm for pcm, _ in both) and both == alone  # greedy codes, seeded token2wav noise


def _kv_used(engine: AsyncEngine) -> int:
    return engine.engine.scheduler.kv.usage().num_used_blocks


def test_cancel_mid_talker_frees_every_kv_block(pipeline: OmniPipeline) -> None:
    short = pipeline.speech
    assert short is not None
    talker = short.talker
    # A talker allowed to speak for long: the first audio comes while it still runs.
    pipeline.speech = SpokenModel(talker, short.token2wav, SpeechConfig(token2wav=CHUNKS, temperature=0.0))

    async def cancel_after_first_audio() -> int:
        request = _request("cancel-1", ("text", "audio"))
        got = 0
        async with contextlib.aclosing(pipeline.generate(request)) as chunks:
            async for chunk in chunks:
                if isinstance(chunk, AudioChunk) and chunk.pcm16:
                    got += 1
                    # The talker is still speaking: its request holds KV blocks right now.
                    assert talker.engine.has_unfinished()
                    await pipeline.abort(request.request_id)
                    break
        # Aborts reach the engine loops as commands: wait until both have applied them.
        for _ in range(500):
            if not talker.engine.has_unfinished() and not pipeline.engine.engine.has_unfinished():
                break
            await asyncio.sleep(0.01)
        return got

    try:
        assert asyncio.run(cancel_after_first_audio()) == 1
    finally:
        pipeline.speech = short
    assert _kv_used(talker) == 0
    assert _kv_used(pipeline.engine) == 0


def test_realtime_turn_returns_the_models_own_audio(pipeline: OmniPipeline) -> None:
    """A text turn over /v1/realtime asking for audio: the deltas come from the talker (no Whisper, no Piper)."""
    import base64
    import json

    from websockets.asyncio.client import connect

    from tests.harness.live_server import serve

    assert pipeline.asr is None and pipeline.tts is None

    async def turn(port: int) -> list[dict[str, Any]]:
        events: list[dict[str, Any]] = []
        async with connect(f"ws://127.0.0.1:{port}/v1/realtime") as ws:
            await ws.send(
                json.dumps(
                    {
                        "type": "session.update",
                        "session": {
                            "type": "realtime",
                            "output_modalities": ["audio"],
                            "audio": {"output": {"voice": "Ethan"}},
                        },
                    }
                )
            )
            await ws.send(
                json.dumps(
                    {
                        "type": "conversation.item.create",
                        "item": {
                            "type": "message",
                            "role": "user",
                            "content": [{"type": "input_text", "text": "the cat"}],
                        },
                    }
                )
            )
            await ws.send(json.dumps({"type": "response.create"}))
            while True:
                event = json.loads(await asyncio.wait_for(ws.recv(), 120))
                events.append(event)
                assert event["type"] != "error", event
                if event["type"] == "response.done":
                    return events

    with serve(pipeline) as port:
        events = asyncio.run(turn(port))
    audio = b"".join(base64.b64decode(e["delta"]) for e in events if e["type"] == "response.output_audio.delta")
    assert len(audio) > 0
    transcript = "".join(e["delta"] for e in events if e["type"] == "response.output_audio_transcript.delta")
    assert transcript  # the thinker's words, streamed with the audio
    # The tiny thinker never says its end token: the answer stops at the server's max_tokens.
    assert events[-1]["response"]["status_details"]["reason"] == "max_output_tokens"


def test_talker_spans_keep_the_thinkers_media_positions() -> None:
    from omni_gateway.engine.core.sequence import EmbedSpan
    from omni_gateway.engine.runner.mrope import mrope_positions
    from omni_gateway.omni.speech import talker_spans

    # Thinker prompt of 10 tokens with a 4-token image at 3 (2x2 grid); the talker prompt adds two tokens.
    grid = torch.tensor([[0, 0, 0, 0], [0, 0, 1, 1], [0, 1, 0, 1]])
    image = EmbedSpan(offset=3, length=4, key="img", embeds=torch.zeros(4, 32), positions=grid)
    cond = torch.randn(12, 32)
    spans = talker_spans(cond, (image,), list(range(100, 112)))
    assert [(s.offset, s.length) for s in spans] == [(0, 3), (3, 4), (7, 5)]
    # The media span keeps the thinker's content key; the rows around it are keyed position by position.
    assert spans[1].key == "img" and spans[0].position_keys == (100, 101, 102)
    assert spans[2].position_keys == (107, 108, 109, 110, 111)
    torch.testing.assert_close(torch.cat([s.embeds for s in spans]), cond)
    # The talker's positions are the thinker's, continued over its two extra tokens.
    thinker = mrope_positions((image,), 0, 10)
    talker = mrope_positions(spans, 0, 12)
    assert torch.equal(talker[:, :10], thinker)
    assert talker[:, 10:].tolist() == [[thinker[0, -1] + 1, thinker[0, -1] + 2]] * 3


def test_talker_spans_keep_the_per_token_keys_of_heard_audio() -> None:
    """Audio encoded group by group is keyed per token; a talker span that dropped those keys would key every
    clip alike and share one clip's conditioning KV with another."""
    from omni_gateway.engine.core.sequence import EmbedSpan
    from omni_gateway.omni.speech import talker_spans

    heard = EmbedSpan(offset=2, length=3, key="audio-groups", embeds=torch.zeros(3, 32), position_keys=(7, 7, 9))
    spans = talker_spans(torch.randn(8, 32), (heard,), list(range(100, 108)))
    assert spans[1].key == "audio-groups" and spans[1].position_keys == (7, 7, 9)
