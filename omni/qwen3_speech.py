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
from omni_gateway.engine.errors import EngineDead, EngineOverloaded, InvalidRequest
from omni_gateway.engine.models.qwen3_omni_code_predictor import FrameSampling
from omni_gateway.engine.models.qwen3_omni_talker_inputs import assistant_start, user_positions
from omni_gateway.engine.runner.input_stream import InputStream
from omni_gateway.engine.sampling_params import SamplingParams
from omni_gateway.omni.heads.code2wav.stream import Chunking, Code2WavStream, decode_chunks
from omni_gateway.omni.heads.token2wav.batcher import BatchedCalls
from omni_gateway.omni.protocol import AudioChunk, Done, Error, OmniRequest, OutputChunk
from omni_gateway.omni.qwen3_talker import Qwen3Talker, SpokenFrames
from omni_gateway.omni.speech import pcm16_slices
from omni_gateway.omni.streams import Prompt, refusal, usage

if TYPE_CHECKING:
    from omni_gateway.engine.frontend.async_engine import AsyncEngine
    from omni_gateway.engine.outputs import StreamDelta
    from omni_gateway.omni.collaborators import Engine
    from omni_gateway.omni.heads.code2wav.model import Code2Wav

SAMPLE_RATE = 24000  # code2wav's output


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


class _Turn:
    """What the thinker side of one turn has produced, shared with the talker side."""

    def __init__(self) -> None:
        self.text = ""  # transcript not yet sent with audio
        self.finals: list[StreamDelta] = []
        self.failure: Error | None = None
        self.started: asyncio.Future[tuple[list[int], tuple[EmbedSpan, ...], SpokenFrames] | None] = (
            asyncio.get_running_loop().create_future()
        )

    def take_text(self) -> str:
        text, self.text = self.text, ""
        return text


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
        self._text_rows: dict[int, torch.Tensor] = {}  # thinker embedding rows of tts_bos, tts_eos, tts_pad
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
            self.talker.abort(_talker_id(request_id))

    def stats(self) -> dict[str, float]:
        return self.talker.stats() if self.talker is not None else {}

    def shutdown(self) -> None:
        if self.talker is not None:
            self.talker.shutdown()
        self._chunks.close()
        self._chunk_threads.shutdown(wait=False, cancel_futures=True)

    def warm_up(self, thinker: Engine, prompt_ids: list[int]) -> None:
        """One short spoken turn before serving (first-call costs of the talker, predictor and code2wav)."""
        from concurrent.futures import ThreadPoolExecutor

        from omni_gateway.omni.protocol import AudioOutputOptions, Message, TextPart

        request = OmniRequest(
            "warm-up-speech",
            (Message("user", (TextPart("Hello."),)),),
            modalities=("text", "audio"),
            audio=AudioOutputOptions(voice=self.default_voice),
        )
        params = SamplingParams(max_tokens=4, temperature=0.0, ignore_eos=True)

        async def speak() -> None:
            async for _ in self.speak(thinker, request, Prompt(prompt_ids), params, asyncio.Event()):
                pass

        config = self.config
        self.config = dataclasses.replace(config, max_frames=config.chunking.first_chunk_frames + 2)
        try:
            with ThreadPoolExecutor(1) as pool:  # its own event loop: load() may run inside one
                pool.submit(asyncio.run, speak()).result()
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
            tts = torch.stack(await self._rows(thinker, (ids.tts_bos, ids.tts_eos, ids.tts_pad)))
        except (InvalidRequest, EngineOverloaded, EngineDead) as exc:
            yield refusal(exc)
            return
        turn = _Turn()
        thinking = asyncio.create_task(self._think(thinker, request, prompt, params, turn, tts, voice))
        samples = 0
        try:
            start = await turn.started
            if start is not None and not cancel.is_set():
                greedy = params.temperature == 0
                async with contextlib.aclosing(self._audio(request, start, greedy, cancel)) as waves:
                    async for wave in waves:
                        for index, piece in enumerate(pcm16_slices(wave, rate, SAMPLE_RATE)):
                            samples += len(piece) // 2
                            yield AudioChunk(piece, rate, turn.take_text() if index == 0 else "")
            await thinking
        finally:
            thinking.cancel()
            await asyncio.gather(thinking, return_exceptions=True)
        if turn.failure is not None:
            yield turn.failure
            return
        if turn.text:  # text the audio did not carry (a reply too short to speak)
            yield AudioChunk(b"", rate, turn.take_text())
        reason = "abort" if cancel.is_set() else (turn.finals[0].finish_reason if turn.finals else "abort")
        yield Done(reason or "stop")
        counted = usage(turn.finals, prompt)
        yield dataclasses.replace(counted, output_audio_tokens=round(samples / rate * 20))

    async def _rows(self, thinker: Engine, token_ids: tuple[int, ...]) -> list[torch.Tensor]:
        """The thinker's input-embedding rows of ``token_ids``, asked of the thinker engine once."""
        missing = [t for t in token_ids if t not in self._text_rows]
        if missing:
            params = SamplingParams(max_tokens=1, temperature=0.0, return_hidden_states=True)
            async for delta in thinker.generate(missing, params):
                if delta.input_embeds is not None:
                    for i, row in enumerate(delta.input_embeds):
                        self._text_rows[missing[delta.hidden_start + i]] = row
        return [self._text_rows[t] for t in token_ids]

    async def _think(
        self,
        thinker: Engine,
        request: OmniRequest,
        prompt: Prompt,
        params: SamplingParams,
        turn: _Turn,
        tts: torch.Tensor,
        voice: str,
    ) -> None:
        """Run the thinker: its text into ``turn.text``; its prompt's rows start the talker, its reply's rows
        follow as they come. ``tts``: the thinker's input embeddings of tts_bos, tts_eos and tts_pad."""
        inputs = self.parts.inputs
        n = len(prompt.token_ids)
        hidden: list[torch.Tensor] = []  # prompt positions: the state after layer accept_hidden_layer
        embeds: list[torch.Tensor] = []  # every computed position's input embedding
        reply: list[int] = []  # the thinker's tokens so far
        frames: SpokenFrames | None = None
        kwargs = {"embed_spans": prompt.embed_spans} if prompt.embed_spans else {}
        thinker_params = self.thinker_params(params)
        try:
            async for delta in thinker.generate(
                prompt.token_ids, thinker_params, request_id=request.request_id, priority=request.priority, **kwargs
            ):
                if delta.error is not None:
                    turn.failure = Error("engine_error", delta.error, status=500)
                    break
                turn.text += delta.text
                reply += delta.token_ids
                if delta.hidden_states is not None:
                    new = list(delta.input_embeds)
                    if frames is not None:
                        frames.add_text(inputs.text_rows(torch.stack(new)))
                    hidden += list(delta.hidden_states[: max(0, n - delta.hidden_start)])
                    embeds += new
                if frames is None and len(embeds) > n:
                    # The prompt's rows and the first reply token's: the talker starts.
                    talker_ids, rows = inputs.prompt(
                        prompt.token_ids, torch.stack(embeds[:n]), torch.stack(hidden[:n]), embeds[n], tts, voice
                    )
                    text = inputs.text_rows(tts)
                    frames = SpokenFrames(InputStream(start=len(talker_ids)), tts_eos=text[1], tts_pad=text[2])
                    if len(embeds) > n + 1:
                        frames.add_text(inputs.text_rows(torch.stack(embeds[n + 1 :])))
                    spans = talker_spans(rows, prompt, self.thinker_ids, reply[0])
                    turn.started.set_result((talker_ids, spans, frames))
                if delta.finished:
                    turn.finals.append(delta)
                    break
        except (InvalidRequest, EngineOverloaded, EngineDead) as exc:
            turn.failure = refusal(exc)
        except ValueError as exc:  # a prompt the talker cannot speak after (no assistant turn)
            turn.failure = Error("invalid_request", str(exc), status=400)
        finally:
            if frames is not None:
                frames.end_text()  # after the text: its end, then padding for as long as the talker speaks
            if not turn.started.done():
                turn.started.set_result(None)

    async def _audio(
        self,
        request: OmniRequest,
        start: tuple[list[int], tuple[EmbedSpan, ...], SpokenFrames],
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
        rid = _talker_id(request.request_id)
        sampling = FrameSampling(temperature=0.0) if greedy else cfg.predictor
        stream = Code2WavStream(self.code2wav, cfg.chunking)
        loop = asyncio.get_running_loop()
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
                        call = functools.partial(self._chunks, "code2wav", stream, codes, urgent=first)
                        yield await loop.run_in_executor(self._chunk_threads, call)
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


def _talker_id(request_id: str) -> str:
    return f"{request_id}-talker"
