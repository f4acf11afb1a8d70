"""Speech from Qwen3-Omni: thinker -> talker (+ code predictor) -> code2wav, streamed.

The thinker is whatever engine answers the turn (``omni.collaborators.Engine``): it runs with
``return_hidden_states`` and ``hidden_layer=accept_hidden_layer``, so it hands back, per prompt position, its
state after that layer and its input embedding, and per reply token fed back its input embedding. Once the first
reply token's row is in, the talker's prompt is built from them (``engine.models.qwen3_omni_talker_inputs``) and
the talker starts on its own engine, which batches every session's talker. Each later reply row reaches it
through ``SpokenFrames`` as the thinker writes; when the thinker ends, ``tts_eos`` then ``tts_pad`` follow.

After every talker step, on the talker's loop thread, one code predictor call fills in the frames of every
utterance that stepped (``FrameFeeder``) and hands each talker its next input row. The frames go to code2wav in
chunks (a small first one), one batched call for the chunks of every session that has one ready
(``BatchedCalls``). The audio goes out in 100 ms ``AudioChunk``s whose ``transcript`` carries the thinker's text
received since the previous chunk.

A request's ``seed`` seeds the thinker's, the talker's and the code predictor's draws alike, each a function of it
and the step alone, so a seeded turn speaks the same frames whatever else is spoken beside it.

Cancellation (barge-in, ``response.cancel``) closes this stream: the thinker's and the talker's requests are
aborted (their KV blocks freed) and no further code2wav chunk is started.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import dataclasses
import functools
import hashlib
import threading
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
from omni_gateway.engine.core.sequence import EmbedSpan
from omni_gateway.engine.models.qwen3_omni_code_predictor import FrameSampling
from omni_gateway.engine.models.qwen3_omni_talker_inputs import assistant_start, user_positions
from omni_gateway.engine.runner.input_stream import InputStream
from omni_gateway.engine.sampling_params import SamplingParams
from omni_gateway.omni.heads.code2wav.stream import Chunking, Code2WavStream, decode_chunks
from omni_gateway.omni.heads.token2wav.batcher import BatchedCalls
from omni_gateway.omni.protocol import Error, OmniRequest, OutputChunk
from omni_gateway.omni.qwen3_talker import Qwen3Talker, SpokenFrames
from omni_gateway.omni.speech_common import (
    REFUSED,
    Playback,
    ThinkerRows,
    Turn,
    run_thinker,
    spoken_turn,
    talker_id,
    warm_up_turn,
)
from omni_gateway.omni.streams import Prompt, refusal

if TYPE_CHECKING:
    from omni_gateway.engine.frontend.async_engine import AsyncEngine
    from omni_gateway.engine.outputs import StreamDelta
    from omni_gateway.omni.collaborators import Engine
    from omni_gateway.omni.heads.code2wav.model import Code2Wav

SAMPLE_RATE = 24000  # code2wav's output

_Start = tuple[list[int], tuple[EmbedSpan, ...], SpokenFrames]  # the talker's prompt ids and spans, its input


@dataclass(frozen=True, slots=True)
class Qwen3SpeechConfig:
    """The talker's and the code predictor's sampling (transformers' defaults) and code2wav's chunking."""

    temperature: float = 0.9
    top_k: int = 50
    top_p: float = 1.0
    repetition_penalty: float = 1.05
    predictor: FrameSampling = FrameSampling(temperature=1.0, top_k=50, top_p=0.8)
    chunking: Chunking = Chunking()
    max_frames: int = 1024  # ~82 s of speech at 12.5 frames/s
    default_voice: str | None = None  # None: the checkpoint's first speaker


@dataclass(frozen=True, slots=True)
class _Utterance:
    frames: SpokenFrames
    sampling: FrameSampling


class Qwen3SpokenModel:
    """The talker engine, code predictor and code2wav of one Qwen3-Omni checkpoint, shared by every session."""

    def __init__(
        self, talker: Qwen3Talker, code2wav: Code2Wav, accept_hidden_layer: int, config: Qwen3SpeechConfig
    ) -> None:
        self.parts = talker
        self.code2wav = code2wav
        self.accept_hidden_layer = accept_hidden_layer
        self.config = config
        self.tokens = talker.inputs.tokens
        self.thinker_ids = talker.inputs.thinker
        self.default_voice = config.default_voice or self.voices[0]
        self.tokens.speaker(self.default_voice)  # an unknown default fails at load, not at the first turn
        self.feeder = talker.feeder()
        self._utterances: dict[str, _Utterance] = {}  # talker request id -> its frames (read on the loop thread)
        self._utterances_lock = threading.Lock()
        self._text_rows = ThinkerRows()  # of tts_bos, tts_eos, tts_pad
        self.talker: AsyncEngine | None = None
        self._chunks = BatchedCalls(self._decode, "code2wav")
        # code2wav chunks wait in these threads for their batch: one per session speaking at once.
        self._chunk_threads = concurrent.futures.ThreadPoolExecutor(max_workers=256, thread_name_prefix="code2wav")

    @classmethod
    def load(
        cls,
        path: str | Path,
        *,
        device: str = "auto",
        config: Qwen3SpeechConfig = Qwen3SpeechConfig(),
        load_format: str = "auto",
        seed: int = 0,
        engine_options: Mapping[str, Any] | None = None,
    ) -> Qwen3SpokenModel:
        """``load_format="dummy"``: random weights made on the device from the config (``omni.qwen3_dummy``).
        ``engine_options``: ``EngineConfig`` fields of the talker's engine (KV blocks, batch size, graphs)."""
        from omni_gateway.engine.config import EngineConfig
        from omni_gateway.engine.core.llm_engine import LLMEngine
        from omni_gateway.engine.frontend.async_engine import AsyncEngine
        from omni_gateway.engine.models.qwen3_omni_talker import read_config
        from omni_gateway.omni.heads.code2wav.loader import load_code2wav

        if device == "auto":
            device = "cuda" if torch.cuda.is_available() else "cpu"
        dtype = torch.float32 if device == "cpu" else torch.bfloat16
        parts = Qwen3Talker.load(path, device=device, dtype=dtype, load_format=load_format, seed=seed)
        hf = read_config(Path(path))
        code2wav_tensors = None
        if load_format == "dummy":
            from omni_gateway.omni.qwen3_dummy import code2wav_tensors as random_code2wav

            code2wav_tensors = random_code2wav(hf, seed, device, dtype)
        code2wav = load_code2wav(path, device=device, dtype=dtype, tensors=code2wav_tensors)
        model = cls(parts, code2wav, int(hf.talker_config.accept_hidden_layer), config)
        dtype_name = "float32" if dtype == torch.float32 else "bfloat16"
        engine_config = EngineConfig(model=str(path), device=device, dtype=dtype_name, **dict(engine_options or {}))
        engine = LLMEngine(engine_config, model=parts.loaded)
        model.talker = AsyncEngine(engine=engine, after_step=model._after_step)
        return model

    @property
    def voices(self) -> tuple[str, ...]:
        return self.tokens.voices

    def abort(self, request_id: str) -> None:
        """Stop the talker of a turn at once (its stream also stops when the turn's output is closed)."""
        if self.talker is not None:
            self.talker.abort(talker_id(request_id))

    def stats(self) -> dict[str, float]:
        return self.talker.stats() if self.talker is not None else {}

    def shutdown(self) -> None:
        if self.talker is not None:
            self.talker.shutdown()
        self._chunks.close()
        self._chunk_threads.shutdown(wait=False, cancel_futures=True)

    def warm_up(self, thinker: Engine, prompt_ids: list[int]) -> None:
        """One short spoken turn before serving (first-call costs of the talker, predictor and code2wav)."""
        config = self.config
        self.config = dataclasses.replace(config, max_frames=config.chunking.first_chunk_frames + 2)
        try:
            warm_up_turn(self.speak, thinker, prompt_ids, self.default_voice)
        finally:
            self.config = config

    # ---- the talker's loop thread ---------------------------------------------------------------

    def _after_step(self, deltas: list[StreamDelta]) -> None:
        """Fill in the frame of every utterance that stepped: one code predictor call per sampling setting."""
        work: dict[FrameSampling, list[tuple[SpokenFrames, torch.Tensor, int]]] = {}
        with self._utterances_lock:
            for delta in deltas:
                utterance = self._utterances.get(delta.request_id)
                if utterance is None or not delta.token_ids or delta.hidden_states is None:
                    continue
                item = (utterance.frames, delta.hidden_states[-1], delta.token_ids[-1])
                work.setdefault(utterance.sampling, []).append(item)
        for sampling, items in work.items():
            self.feeder.step(items, sampling)

    def _decode(self, jobs: list[tuple[Any, ...]], lane: int) -> list[np.ndarray]:
        waves = decode_chunks(self.code2wav, [(stream, codes) for stream, codes in jobs])
        return [wave.cpu().numpy() for wave in waves]

    # ---- one turn -------------------------------------------------------------------------------

    def thinker_params(self, params: SamplingParams) -> SamplingParams:
        """The thinker's sampling of a spoken turn: it hands back the output of layer ``accept_hidden_layer`` at
        the prompt's positions, which the talker reads."""
        return dataclasses.replace(params, n=1, return_hidden_states=True, hidden_layer=self.accept_hidden_layer)

    async def speak(
        self, thinker: Engine, request: OmniRequest, prompt: Prompt, params: SamplingParams, cancel: asyncio.Event
    ) -> AsyncIterator[OutputChunk]:
        """The thinker's answer as speech (``AudioChunk``s carrying its text), then ``Done`` and ``Usage``."""
        voice = request.audio.voice or self.default_voice
        try:
            self.tokens.speaker(voice)
        except ValueError as exc:
            yield Error("invalid_request", str(exc), status=400, param="voice")
            return
        assert self.talker is not None, "Qwen3SpokenModel.load starts the talker"
        self.talker.prefer_over(thinker)
        rate = request.audio.sample_rate
        ids = self.thinker_ids
        try:
            tts = torch.stack(await self._text_rows.get(thinker, (ids.tts_bos, ids.tts_eos, ids.tts_pad)))
        except REFUSED as exc:
            yield refusal(exc)
            return
        turn: Turn[_Start] = Turn()
        thinking = asyncio.create_task(self._think(thinker, request, prompt, params, turn, tts, voice))
        greedy = params.temperature == 0
        spoken = spoken_turn(
            turn,
            thinking,
            lambda start: self._audio(request, start, greedy, cancel),
            prompt,
            rate,
            SAMPLE_RATE,
            cancel,
        )
        async with contextlib.aclosing(spoken) as chunks:
            async for chunk in chunks:
                yield chunk

    async def _think(
        self,
        thinker: Engine,
        request: OmniRequest,
        prompt: Prompt,
        params: SamplingParams,
        turn: Turn[_Start],
        tts: torch.Tensor,
        voice: str,
    ) -> None:
        """Run the thinker: its text into ``turn.text``; its prompt's rows start the talker, its reply's rows
        follow as they come. ``tts``: the thinker's input embeddings of tts_bos, tts_eos and tts_pad."""
        inputs = self.parts.inputs
        n = len(prompt.token_ids)
        hidden: list[torch.Tensor] = []  # prompt positions: the state after layer accept_hidden_layer
        embeds: list[torch.Tensor] = []  # every computed position's input embedding
        frames: SpokenFrames | None = None

        def on_delta(delta: StreamDelta, reply: list[int]) -> None:
            nonlocal frames
            if delta.hidden_states is not None:
                new = list(delta.input_embeds)
                if frames is not None:
                    frames.add_text(inputs.text_rows(torch.stack(new)))
                hidden.extend(delta.hidden_states[: max(0, n - delta.hidden_start)])
                embeds.extend(new)
            if frames is None and len(embeds) > n:
                # The prompt's rows and the first reply token's: the talker starts.
                talker_ids, rows = inputs.prompt(
                    prompt.token_ids, torch.stack(embeds[:n]), torch.stack(hidden[:n]), embeds[n], tts, voice
                )
                text = inputs.text_rows(tts)
                frames = SpokenFrames(
                    InputStream(start=len(talker_ids)), tts_eos=text[1], tts_pad=text[2], seed=request.sampling.seed
                )
                if len(embeds) > n + 1:
                    frames.add_text(inputs.text_rows(torch.stack(embeds[n + 1 :])))
                spans = talker_spans(rows, prompt, self.thinker_ids, reply[0])
                turn.started.set_result((talker_ids, spans, frames))

        try:
            await run_thinker(thinker, request, prompt, self.thinker_params(params), turn, on_delta)
        except ValueError as exc:  # a prompt the talker cannot speak after (no assistant turn)
            turn.failure = Error("invalid_request", str(exc), status=400)
        finally:
            if frames is not None:
                frames.end_text()  # after the text: its end, then padding for as long as the talker speaks

    async def _audio(
        self,
        request: OmniRequest,
        start: _Start,
        greedy: bool,
        cancel: asyncio.Event,
    ) -> AsyncIterator[np.ndarray]:
        """float32 waveform pieces at 24 kHz from the talker's frames, chunk by chunk."""
        assert self.talker is not None
        ids, spans, frames = start
        cfg = self.config
        params = SamplingParams(
            temperature=0.0 if greedy else cfg.temperature,
            top_k=cfg.top_k,
            top_p=cfg.top_p,
            repetition_penalty=1.0 if greedy else cfg.repetition_penalty,
            max_tokens=min(cfg.max_frames, self.talker.max_model_len - len(ids)),
            seed=request.sampling.seed,
            return_hidden_states=True,
        )
        rid = talker_id(request.request_id)
        sampling = FrameSampling(temperature=0.0) if greedy else cfg.predictor
        stream = Code2WavStream(self.code2wav, cfg.chunking)
        loop = asyncio.get_running_loop()
        playback = Playback()  # the chunks of the stream due soonest run first
        sent = 0
        with self._utterances_lock:
            self._utterances[rid] = _Utterance(frames, sampling)
        try:
            async with contextlib.aclosing(
                self.talker.generate(
                    ids,
                    params,
                    request_id=rid,
                    priority=request.priority,
                    embed_spans=spans,
                    input_stream=frames.stream,
                )
            ) as deltas:
                async for delta in deltas:
                    if cancel.is_set():
                        return
                    new = frames.frames[sent:]  # the code predictor filled them in before the delta came
                    sent += len(new)
                    if new:
                        stream.pending.extend(torch.tensor(new, dtype=torch.long, device=self.code2wav.device))
                    ends = delta.finished
                    while stream.pending and (len(stream.pending) >= stream.next_chunk or ends):
                        if cancel.is_set():
                            return
                        first = stream.frames == 0
                        codes = stream.take(min(stream.next_chunk, len(stream.pending)))
                        call = functools.partial(
                            self._chunks, "code2wav", stream, codes, urgent=first, deadline=playback.deadline()
                        )
                        wave = await loop.run_in_executor(self._chunk_threads, call)
                        playback.delivered(len(wave), SAMPLE_RATE)
                        yield wave
                    if ends:
                        return
        finally:
            with self._utterances_lock:
                self._utterances.pop(rid, None)


def talker_spans(rows: torch.Tensor, prompt: Prompt, thinker: Any, first_reply: int) -> tuple[EmbedSpan, ...]:
    """The talker prompt's rows ``rows`` (``TalkerInputs.prompt``'s) as spans covering it.

    Its media spans keep the thinker's multimodal rotary offsets, so the engine places them over the talker's own
    sequence as transformers' ``get_rope_index`` over ``talker_input_ids`` does (the left-out system and earlier
    assistant turns are text: leaving them out shifts every later position alike). Every span is keyed by content:
    a digest of the thinker's prompt before the span (ids and media keys: the talker's rows depend on all of it,
    also on the turns it leaves out), the thinker's ids of its rows (position keys) and, for media, the media's
    own keys; the last row also by the first reply token (``first_reply``) it is made of."""
    ids = prompt.token_ids
    users = user_positions(ids, thinker)
    start = assistant_start(ids, thinker)
    source = [*users, start, start + 1, start + 2]  # thinker position of each talker row that has one
    tail = len(rows) - len(source)  # tts_pad x4, tts_bos, first reply
    where = {p: i for i, p in enumerate(users)}
    media: dict[int, EmbedSpan] = {}  # talker offset -> the thinker span heard there
    for span in prompt.embed_spans:
        at = where.get(span.offset)
        last = where.get(span.offset + span.length - 1)
        if at is not None and last is not None and last - at == span.length - 1:
            media[at] = span

    def digest(before: int) -> str:
        h = hashlib.sha256(repr(ids[:before]).encode())
        for span in sorted(prompt.embed_spans, key=lambda s: s.offset):
            if span.offset < before:  # audio heard group by group is keyed per position, not by its span key
                h.update(f"|{span.offset}:{span.key}:{','.join(map(str, span.position_keys))}".encode())
        return h.hexdigest()[:32]

    spans: list[EmbedSpan] = []
    at = 0
    while at < len(source):
        if at in media:
            span = media[at]
            keys = span.position_keys or ()
            spans.append(
                EmbedSpan(
                    at,
                    span.length,
                    f"q3-heard:{digest(span.offset)}:{span.key}",
                    rows[at : at + span.length],
                    span.positions,
                    keys,
                )
            )
            at += span.length
            continue
        end = at + 1
        while end < len(source) and end not in media and source[end] == source[end - 1] + 1:
            end += 1
        last_run = end == len(source)
        stop = end + tail if last_run else end
        keys = tuple(ids[p] for p in source[at:end]) + ((-1,) * (tail - 1) + (first_reply,) if last_run else ())
        spans.append(EmbedSpan(at, stop - at, f"q3-rows:{digest(source[at])}", rows[at:stop], None, keys))
        at = stop
    return tuple(spans)
