"""A Qwen3-Omni checkpoint served by ``OmniPipeline.load`` speaks in its own voice: the thinker's states start
its talker on its own engine, the code predictor fills in each frame between talker steps, and code2wav turns the
frames into audio chunk by chunk. Greedy speech equals transformers' ``generate(return_audio=True)`` frame for
frame, and its audio equals code2wav's decode of those frames."""

from __future__ import annotations

import asyncio
import dataclasses
import time
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest
import torch
from omni_gateway.encoders.audio import float_to_pcm16_array
from omni_gateway.engine.models.qwen3_omni_code_predictor import FrameSampling
from omni_gateway.engine.models.qwen3_omni_talker_inputs import user_positions
from omni_gateway.omni import qwen3_speech
from omni_gateway.omni.loading import resolve_speech_model
from omni_gateway.omni.pipeline import OmniPipeline
from omni_gateway.omni.protocol import (
    AudioChunk,
    AudioOutputOptions,
    AudioPart,
    Done,
    Error,
    ImagePart,
    Message,
    OmniRequest,
    SamplingOptions,
    TextDelta,
    TextPart,
)
from omni_gateway.omni.qwen3_speech import Qwen3SpokenModel
from omni_gateway.omni.qwen3_talker import SpokenFrames

from tests.harness.checkpoints import picture, png_bytes
from tests.harness.playback_deadlines import ChunkCall, assert_playback_deadlines
from tests.harness.real_engine import checkpoint_config
from tests.harness.tiny_qwen3_omni import CODE_GROUPS, save_tiny_qwen3_omni
from tests.omni.test_pipeline_audio import RATE, clip_pcm16

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("one_torch_thread")]

MAX_TOKENS = 6
MAX_FRAMES = 40  # a first chunk of 4 frames, then chunks of 25: three code2wav calls for a whole reply


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[OmniPipeline, Any]]:
    directory: Path = tmp_path_factory.mktemp("qwen3omni-speaks")
    hf = save_tiny_qwen3_omni(directory, speech=True)
    config = checkpoint_config(directory, max_tokens=MAX_TOKENS)
    assert resolve_speech_model(config) == str(directory)
    pipe = OmniPipeline.load(config)
    assert isinstance(pipe.speech, Qwen3SpokenModel)
    pipe.speech.config = dataclasses.replace(pipe.speech.config, max_frames=MAX_FRAMES)
    yield pipe, hf
    pipe.shutdown()


def request(*parts: Any, voice: str = "ethan", rid: str = "speak") -> OmniRequest:
    return OmniRequest(
        rid,
        (Message("user", parts),),
        modalities=("text", "audio"),
        audio=AudioOutputOptions(voice=voice, sample_rate=RATE),
        sampling=SamplingOptions(max_tokens=MAX_TOKENS, temperature=0.0),
    )


def run(pipe: OmniPipeline, req: OmniRequest) -> list[Any]:
    async def go() -> list[Any]:
        return [c async for c in pipe.generate(req)]

    return asyncio.run(go())


class Chunks:
    """Every code2wav chunk the served pipeline decodes: its frames, in order."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.calls: list[list[list[int]]] = []
        decode = qwen3_speech.decode_chunks

        def keep(model: Any, work: list[tuple[Any, torch.Tensor]]) -> list[torch.Tensor]:
            self.calls += [codes.T.tolist() for _, codes in work]
            return decode(model, work)

        monkeypatch.setattr(qwen3_speech, "decode_chunks", keep)

    @property
    def frames(self) -> list[list[int]]:
        return [frame for call in self.calls for frame in call]


def reference_frames(hf: Any, ids: list[int], eos: frozenset[int], monkeypatch: pytest.MonkeyPatch) -> list[list[int]]:
    seen: dict[str, torch.Tensor] = {}
    decode = hf.code2wav.chunked_decode

    def keep_codes(codes: torch.Tensor, **kwargs: Any) -> torch.Tensor:
        seen["codes"] = codes
        return decode(codes, **kwargs)

    with monkeypatch.context() as patch:
        patch.setattr(hf.talker.code_predictor.generation_config, "do_sample", False)
        patch.setattr(hf.code2wav, "chunked_decode", keep_codes)
        hf.generate(
            input_ids=torch.tensor([ids]),
            speaker="ethan",
            thinker_max_new_tokens=MAX_TOKENS,
            thinker_eos_token_id=sorted(eos),
            thinker_do_sample=False,
            talker_do_sample=False,
            talker_repetition_penalty=1.0,
            talker_max_new_tokens=MAX_FRAMES + 1,
        )
    return seen["codes"][0].T.tolist()


def pcm(chunks: list[Any]) -> np.ndarray:
    return np.frombuffer(b"".join(c.pcm16 for c in chunks if isinstance(c, AudioChunk)), dtype=np.int16)


def test_greedy_speech_equals_transformers(served: tuple[OmniPipeline, Any], monkeypatch: pytest.MonkeyPatch) -> None:
    pipe, hf = served
    assert "audio" in pipe.capabilities.output_modalities and set(pipe.capabilities.voices) == {"ethan", "chelsie"}
    decoded = Chunks(monkeypatch)
    req = request(TextPart("say something"))
    chunks = run(pipe, req)
    assert not [c for c in chunks if isinstance(c, Error)], chunks
    assert isinstance([c for c in chunks if isinstance(c, Done)][0], Done)
    want = reference_frames(hf, pipe.prompt_ids(req), pipe.engine.engine.eos_token_ids, monkeypatch)
    frames = decoded.frames
    assert len(frames) >= 8 and len({tuple(f) for f in frames}) > 4, frames  # varied speech
    assert all(len(f) == CODE_GROUPS for f in frames)
    assert frames == want[: len(frames)]
    assert [len(c) for c in decoded.calls][0] == pipe.speech.config.chunking.first_chunk_frames
    # The streamed audio is code2wav's decode of the whole utterance (up to rounding before 16-bit PCM).
    whole = pipe.speech.code2wav.decode(torch.tensor(frames).T[None])[0].cpu().numpy()
    got, expected = pcm(chunks), float_to_pcm16_array(whole)
    assert len(got) == len(expected) and np.abs(got.astype(int) - expected.astype(int)).max() <= 1
    assert np.abs(got).max() > 0
    assert "".join(c.transcript for c in chunks if isinstance(c, AudioChunk))  # the reply's text rides along


def test_each_code2wav_chunk_is_due_when_its_listener_runs_out_of_audio(
    served: tuple[OmniPipeline, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    pipe, _ = served
    speech = pipe.speech
    assert isinstance(speech, Qwen3SpokenModel)
    batched, calls = speech._chunks, []

    def recorded(key: str, *args: Any, urgent: bool, deadline: float | None) -> np.ndarray:
        called_at = time.monotonic()
        wave = batched(key, *args, urgent=urgent, deadline=deadline)
        assert urgent == (not calls)  # the first chunk only
        calls.append(ChunkCall(deadline, called_at, len(wave)))
        return wave

    monkeypatch.setattr(speech, "_chunks", recorded)
    began = time.monotonic()
    chunks = run(pipe, request(TextPart("say something"), rid="due"))
    assert not [c for c in chunks if isinstance(c, Error)], chunks
    assert_playback_deadlines(calls, qwen3_speech.SAMPLE_RATE, began)


def test_an_audio_prompt_is_answered_in_speech(served: tuple[OmniPipeline, Any]) -> None:
    pipe, _ = served
    chunks = run(pipe, request(AudioPart(clip_pcm16(), RATE), TextPart("what is said"), rid="heard"))
    assert not [c for c in chunks if isinstance(c, Error)], chunks
    assert len(pcm(chunks)) > 0 and np.abs(pcm(chunks)).max() > 0


def test_an_unknown_voice_is_refused_with_the_known_ones(served: tuple[OmniPipeline, Any]) -> None:
    pipe, _ = served
    chunks = run(pipe, request(TextPart("hi"), voice="Nobody", rid="nobody"))
    (error,) = [c for c in chunks if isinstance(c, Error)]
    assert error.param == "voice" and error.status == 400
    assert "unknown voice 'Nobody'" in error.message and "chelsie, ethan" in error.message


def test_abort_mid_speech_stops_the_talker_and_code2wav(
    served: tuple[OmniPipeline, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    pipe, _ = served
    decoded = Chunks(monkeypatch)
    req = request(TextPart("say something long"), rid="barge")

    async def go() -> list[Any]:
        got = []
        async for chunk in pipe.generate(req):
            got.append(chunk)
            if isinstance(chunk, AudioChunk) and chunk.pcm16 and len(decoded.calls) == 1:
                await pipe.abort(req.request_id)
        return got

    chunks = asyncio.run(go())
    assert len(decoded.calls) == 1  # the first chunk only: none started after the abort
    assert [c.finish_reason for c in chunks if isinstance(c, Done)] == ["abort"]
    thinker, talker = pipe.engine.engine, pipe.speech.talker.engine
    deadline = time.monotonic() + 10
    while (thinker.has_unfinished() or talker.has_unfinished()) and time.monotonic() < deadline:
        time.sleep(0.01)
    for engine in (thinker, talker):
        assert not engine.has_unfinished()
        assert engine.scheduler.kv.usage().num_used_blocks == 0


def test_heard_audio_takes_rotary_positions_over_the_talkers_own_sequence(served: tuple[OmniPipeline, Any]) -> None:
    """The talker prompt's spans place the thinker's audio where transformers' ``get_rope_index`` over
    ``talker_input_ids`` (the user turns, then the assistant part) does: the system turn it leaves out shifts
    them."""
    from omni_gateway.engine.models.qwen3_omni_talker_inputs import user_positions
    from omni_gateway.engine.runner.mrope import mrope_positions
    from omni_gateway.omni.qwen3_speech import talker_spans

    pipe, hf = served
    assert pipe.speech is not None
    picture_part = ImagePart(png_bytes(picture(3, (64, 64))))
    req = request(AudioPart(clip_pcm16(), RATE), TextPart("what is said"), picture_part, rid="positions")
    req = dataclasses.replace(req, messages=(Message("system", (TextPart("be brief"),)), *req.messages))
    prompt = asyncio.run(pipe._prompt(req))
    thinker = pipe.speech.thinker_ids
    users = user_positions(prompt.token_ids, thinker)
    assert users[0] > 0  # a system turn the talker leaves out
    size = len(users) + 3 + 6  # the user turn, the assistant header, 4 pads, tts_bos and the first reply
    spans = talker_spans(torch.zeros(size, 1), prompt, thinker, first_reply=5)
    ids = torch.tensor([[prompt.token_ids[i] for i in users] + [0] * (size - len(users))])
    audio = hf.config.thinker_config.audio_token_id
    assert int((ids == audio).sum()) == 8  # 0.6 s of audio: 60 mel frames, 8 audio tokens
    (seen,) = [s for s in prompt.embed_spans if s.positions is not None]  # the image: 2-D positions
    merge = hf.config.thinker_config.vision_config.spatial_merge_size
    grid = torch.tensor([[1, (int(seen.positions[1].max()) + 1) * merge, (int(seen.positions[2].max()) + 1) * merge]])
    # The talker's get_rope_index is the thinker's function; with audio and an image the talker's own copy reads an
    # audio_config its config lacks, so it is called through the thinker (same media ids and rate).
    talker_cfg, thinker_cfg = hf.config.talker_config, hf.config.thinker_config
    assert (
        talker_cfg.audio_token_id == thinker_cfg.audio_token_id
        and talker_cfg.image_token_id == thinker_cfg.image_token_id
    )
    want, _ = hf.thinker.get_rope_index(ids, grid, None, torch.ones_like(ids), False, torch.tensor([60]), None)
    got = mrope_positions(spans, 0, size)
    assert not torch.equal(got[1], got[2]) and torch.equal(got, want[:, 0])
    assert sum(s.length for s in spans) == size
    heard = [s for s in spans if s.key.startswith("q3-heard:")]  # the media: keyed by their content
    assert [s.length for s in heard] == [8, seen.length] and ids[0, heard[0].offset] == audio


def test_the_talkers_spans_after_heard_audio_are_keyed_by_what_was_heard(served: tuple[OmniPipeline, Any]) -> None:
    """Audio heard window by window carries one prefix-cache key per position, not one per clip: the talker's
    spans after it (whose rows the thinker computed over the audio) differ with it."""
    from omni_gateway.omni.qwen3_speech import talker_spans

    pipe, _ = served
    assert pipe.speech is not None

    def keys(audio: bytes) -> list[tuple[str, tuple[int, ...]]]:
        req = request(AudioPart(audio, RATE), TextPart("what is said"), rid="keyed")
        prompt = asyncio.run(pipe._prompt(req))
        assert any(s.position_keys for s in prompt.embed_spans)  # the clip's windows' keys
        size = len(user_positions(prompt.token_ids, pipe.speech.thinker_ids)) + 9
        spans = talker_spans(torch.zeros(size, 1), prompt, pipe.speech.thinker_ids, first_reply=5)
        return [(s.key, s.position_keys) for s in spans]

    clip = clip_pcm16()
    other = np.frombuffer(clip, dtype=np.int16)[::-1].tobytes()  # as long, heard otherwise
    first, second = keys(clip), keys(other)
    assert len(first) == len(second) and first[0] == second[0]  # the turn's start, before the audio
    assert all(a != b for a, b in zip(first[1:], second[1:]))


def test_the_talkers_prompt_blocks_are_keyed_by_content(served: tuple[OmniPipeline, Any]) -> None:
    """The same spoken turn under another request id reuses the talker's prompt blocks; the same user turn after
    another system prompt (which the talker's rows depend on through the thinker) does not."""
    pipe, _ = served
    assert pipe.speech is not None and pipe.speech.talker is not None
    kv = pipe.speech.talker.engine.scheduler.kv
    turn = (TextPart("say it twice"),)

    def hits(*messages: Message, rid: str) -> int:
        before = kv.prefix_hit_tokens
        req = dataclasses.replace(request(rid=rid), messages=messages)
        assert not [c for c in run(pipe, req) if isinstance(c, Error)]
        return kv.prefix_hit_tokens - before

    hits(Message("user", turn), rid="first")
    assert hits(Message("user", turn), rid="second") >= kv.block_size
    assert hits(Message("system", (TextPart("be brief"),)), Message("user", turn), rid="third") == 0


def test_a_sampled_turn_takes_transformers_sampling(
    served: tuple[OmniPipeline, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Not greedy: the talker samples at temperature 0.9, top-k 50, top-p 1.0 with repetition penalty 1.05, the
    code predictor at top-k 50, top-p 0.8."""
    pipe, _ = served
    speech = pipe.speech
    assert isinstance(speech, Qwen3SpokenModel) and speech.talker is not None
    asked: list[Any] = []
    feeds: list[Any] = []
    generate, step = speech.talker.generate, speech.feeder.step

    def keep_params(prompt: Any, params: Any, **kwargs: Any) -> Any:
        asked.append(params)
        return generate(prompt, params, **kwargs)

    def keep_sampling(work: Any, sampling: Any) -> None:
        feeds.append(sampling)
        step(work, sampling)

    monkeypatch.setattr(speech.talker, "generate", keep_params)
    monkeypatch.setattr(speech, "feeder", SimpleNamespace(step=keep_sampling))
    req = dataclasses.replace(
        request(TextPart("say something"), rid="sampled"),
        sampling=SamplingOptions(max_tokens=MAX_TOKENS, temperature=0.8, seed=3),
    )
    chunks = run(pipe, req)
    assert not [c for c in chunks if isinstance(c, Error)] and len(pcm(chunks)) > 0
    (params,) = asked
    assert (params.temperature, params.top_k, params.top_p, params.repetition_penalty) == (0.9, 50, 1.0, 1.05)
    assert feeds and {(s.temperature, s.top_k, s.top_p) for s in feeds} == {(1.0, 50, 0.8)}


def test_a_seeded_turn_speaks_the_same_frames_beside_any_other(
    served: tuple[OmniPipeline, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A request's ``seed`` seeds the thinker's, the talker's and the code predictor's draws: the same sampled turn
    speaks the same frames alone, again, and in the batches of another turn spoken at the same time."""
    pipe, _ = served
    speech = pipe.speech
    assert isinstance(speech, Qwen3SpokenModel)
    # The tiny checkpoint's code predictor is peaked: spread out, its draws differ from seed to seed.
    spread = FrameSampling(temperature=4.0, top_k=0, top_p=1.0)
    monkeypatch.setattr(speech, "config", dataclasses.replace(speech.config, predictor=spread))
    utterances: list[SpokenFrames] = []
    widest, step = 0, speech.feeder.step

    def keep_frames(work: Any, sampling: Any) -> None:
        nonlocal widest
        widest = max(widest, len(work))
        utterances.extend(frames for frames, _, _ in work if frames not in utterances)
        step(work, sampling)

    monkeypatch.setattr(speech, "feeder", SimpleNamespace(step=keep_frames))

    def speak(*seeds: int | None) -> list[list[list[int]]]:
        """Each turn's frames, the turns spoken at the same time with these seeds."""
        utterances.clear()
        reqs = [
            dataclasses.replace(
                request(TextPart("say something"), rid=f"seeded{i}"),
                sampling=SamplingOptions(max_tokens=MAX_TOKENS, temperature=0.8, seed=seed),
            )
            for i, seed in enumerate(seeds)
        ]

        async def go() -> list[list[Any]]:
            async def one(req: OmniRequest) -> list[Any]:
                return [c async for c in pipe.generate(req)]

            return await asyncio.gather(*(one(req) for req in reqs))

        for chunks in asyncio.run(go()):
            assert not [c for c in chunks if isinstance(c, Error)] and len(pcm(chunks)) > 0
        assert len(utterances) == len(seeds) and len({u.seed for u in utterances}) == len(seeds)
        return [next(u.frames for u in utterances if u.seed == seed) for seed in seeds]

    (alone,) = speak(3)
    assert len(alone) >= 8 and len({tuple(f) for f in alone}) > 4, alone
    assert speak(3) == [alone]
    widest = 0
    assert speak(3, None)[0] == alone
    assert speak(4, 3)[1] == alone
    assert widest == 2  # the turns' frames went through the code predictor together
    assert speak(4) != [alone]


def test_warm_up_speaks_a_short_turn_and_leaves_nothing_running(served: tuple[OmniPipeline, Any]) -> None:
    pipe, _ = served
    assert pipe.speech is not None and pipe.speech.talker is not None
    ids = pipe.prompt_ids(OmniRequest("w", (Message("user", (TextPart("Hello."),)),)))
    pipe.speech.warm_up(pipe.engine, ids)
    assert pipe.speech.config.max_frames == MAX_FRAMES  # restored after the short turn
    for engine in (pipe.engine.engine, pipe.speech.talker.engine):
        assert not engine.has_unfinished() and engine.scheduler.kv.usage().num_used_blocks == 0


@pytest.fixture(scope="module")
def uncached(tmp_path_factory: pytest.TempPathFactory) -> Iterator[OmniPipeline]:
    """The same checkpoint served without prefix caching: every turn computed from scratch."""
    directory: Path = tmp_path_factory.mktemp("qwen3omni-uncached")
    save_tiny_qwen3_omni(directory, speech=True)
    config = checkpoint_config(directory, max_tokens=MAX_TOKENS, engine_args={"enable_prefix_caching": False})
    pipe = OmniPipeline.load(config)
    assert pipe.speech is not None
    pipe.speech.config = dataclasses.replace(pipe.speech.config, max_frames=MAX_FRAMES)
    yield pipe
    pipe.shutdown()


def test_a_later_spoken_turn_reuses_the_conversations_thinker_blocks(
    served: tuple[OmniPipeline, Any], uncached: OmniPipeline, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The thinker's blocks keep the rows of layer ``accept_hidden_layer`` a speaking turn asks of its prompt, so
    the conversation's next turn reuses them (heard audio included) and speaks exactly the greedy frames of a
    pipeline that computes every turn from scratch."""
    pipe, _ = served
    kv = pipe.engine.engine.scheduler.kv
    decoded = Chunks(monkeypatch)
    heard = (AudioPart(clip_pcm16(), RATE), TextPart("what is said"))
    messages = (Message("system", (TextPart("speak in turns"),)), Message("user", heard))  # no earlier test's
    prompts: list[int] = []
    for turn in range(3):
        req = dataclasses.replace(request(rid=f"talk{turn}"), messages=messages)
        before, asked = kv.prefix_hit_tokens, kv.prefix_query_tokens
        chunks = run(pipe, req)
        hits, query = kv.prefix_hit_tokens - before, kv.prefix_query_tokens - asked
        warm, decoded.calls = decoded.frames, []
        want = run(uncached, dataclasses.replace(req, request_id=f"cold{turn}"))
        unheard, decoded.calls = decoded.frames, []
        assert not [c for c in (*chunks, *want) if isinstance(c, Error)]
        assert len(warm) >= 8 and warm == unheard, turn
        assert np.array_equal(pcm(chunks), pcm(want))
        ids = asyncio.run(pipe._prompt(req)).token_ids
        if prompts:  # the last turn's prompt, its heard audio included, up to its last whole block
            assert hits >= (prompts[-1] - 1) // kv.block_size * kv.block_size > 0, (turn, hits)
        else:
            assert hits == 0
        prompts.append(len(ids))
        print(f"turn {turn}: prompt {len(ids)} tokens, {hits} of {query} looked up from the prefix cache")
        reply = "".join(c.transcript for c in chunks if isinstance(c, AudioChunk))
        messages = (*messages, Message("assistant", (TextPart(reply),)), Message("user", heard))


def test_a_prefill_of_a_spoken_turn_keeps_the_rows_its_reply_reads(
    served: tuple[OmniPipeline, Any], uncached: OmniPipeline, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A ``prefill_only`` request (a realtime turn prefilled while spoken) of a reply in speech answers one token
    of text and keeps the thinker rows the spoken reply asks: the reply reuses its prompt's blocks and speaks what
    it speaks without them. A text answer's blocks keep no rows, so a spoken reply cannot reuse them."""
    pipe, _ = served
    kv = pipe.engine.engine.scheduler.kv
    decoded = Chunks(monkeypatch)

    def turn(system: str, rid: str) -> OmniRequest:
        heard = (AudioPart(clip_pcm16(), RATE), TextPart("what is said"))
        return dataclasses.replace(
            request(rid=rid), messages=(Message("system", (TextPart(system),)), Message("user", heard))
        )

    def prefilled_then_spoken(prefill: OmniRequest, reply: OmniRequest) -> int:
        pre = run(pipe, prefill)
        assert not [c for c in pre if isinstance(c, (Error, AudioChunk))] and not decoded.calls
        assert len([c for c in pre if isinstance(c, TextDelta)]) <= 1
        before = kv.prefix_hit_tokens
        assert not [c for c in run(pipe, reply) if isinstance(c, Error)]
        return kv.prefix_hit_tokens - before

    req = turn("prefilled while spoken", "spoken")
    hits = prefilled_then_spoken(dataclasses.replace(req, request_id="pre", prefill_only=True), req)
    n = len(asyncio.run(pipe._prompt(req)).token_ids)
    assert hits >= (n - 1) // kv.block_size * kv.block_size > 0
    warm, decoded.calls = decoded.frames, []
    run(uncached, dataclasses.replace(req, request_id="spoken-cold"))
    assert len(warm) >= 8 and warm == decoded.frames
    decoded.calls = []
    other = turn("read while spoken", "spoken-after-text")
    text = dataclasses.replace(other, request_id="pre-text", modalities=("text",), prefill_only=True)
    assert prefilled_then_spoken(text, other) == 0
