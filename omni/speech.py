"""Speech from a speaking model (Qwen2.5-Omni): thinker -> talker -> token2wav, streamed.

The thinker is whatever engine answers the turn (``omni.collaborators.Engine``): it runs with
``return_hidden_states`` and hands back, per computed position, its final hidden state and input
embedding. Their sums condition the talker (``engine.models.qwen2_5_omni_talker``), a second engine
with its own KV cache batching every session's talker: the prompt's rows go in as one span, and each
row of the reply reaches the running talker through an ``InputStream`` as soon as the thinker has it
(the talker waits when it catches up). The talker's codes feed a ``Token2WavStream`` in chunks; the
audio goes out in 100 ms ``AudioChunk``s whose ``transcript`` carries the thinker's text received
since the previous chunk, so the transcript never runs more than one chunk ahead of the audio.

Cancellation (barge-in, ``response.cancel``) closes this stream: the thinker's and the talker's
requests are aborted (their KV blocks freed) and no further token2wav chunk is started.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import dataclasses
import functools
import logging
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
from omni_gateway.engine.core.sequence import EmbedSpan
from omni_gateway.engine.runner.input_stream import InputStream
from omni_gateway.engine.sampling_params import SamplingParams
from omni_gateway.omni.heads.token2wav.head import OUTPUT_SAMPLE_RATE, Token2Wav, Token2WavConfig
from omni_gateway.omni.protocol import Error, OmniRequest, OutputChunk
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
    import torch
    from omni_gateway.engine.frontend.async_engine import AsyncEngine
    from omni_gateway.engine.outputs import StreamDelta
    from omni_gateway.omni.collaborators import Engine

log = logging.getLogger(__name__)

_Start = tuple[list[int], tuple[EmbedSpan, ...], InputStream]  # the talker's prompt ids and spans, its input


@dataclass(frozen=True, slots=True)
class SpeechConfig:
    """The talker's sampling (Qwen2.5-Omni's defaults) and token2wav's chunking."""

    token2wav: Token2WavConfig = Token2WavConfig()
    temperature: float = 0.9
    top_k: int = 40
    top_p: float = 0.8
    repetition_penalty: float = 1.05
    max_codes: int = 4096  # ~82 s of speech at 50 codes/s
    default_voice: str | None = None  # None: the checkpoint's first speaker


class SpokenModel:
    """The talker engine and token2wav of one speaking checkpoint, shared by every session."""

    def __init__(self, talker: AsyncEngine, token2wav: Token2Wav, config: SpeechConfig = SpeechConfig()) -> None:
        from omni_gateway.engine.models.qwen2_5_omni_talker import TalkerTokens

        self.talker = talker
        self.token2wav = token2wav
        self.config = config
        self.tokens = TalkerTokens.from_hf(talker.engine.model.hf_config)
        self.default_voice = config.default_voice or token2wav.voices[0]
        self.token2wav.speaker(self.default_voice)  # an unknown default fails at load, not at the first turn
        self._text_rows = ThinkerRows()  # of the talker's text tokens
        # token2wav chunks wait in these threads for their batch (omni.heads.token2wav.batcher): one per
        # session speaking at once, more than asyncio's default pool holds.
        self._chunk_threads = concurrent.futures.ThreadPoolExecutor(max_workers=256, thread_name_prefix="token2wav")

    @classmethod
    def load(cls, path: str | Path, *, device: str = "auto", config: SpeechConfig = SpeechConfig()) -> SpokenModel:
        from omni_gateway.engine.config import EngineConfig
        from omni_gateway.engine.core.llm_engine import LLMEngine
        from omni_gateway.engine.frontend.async_engine import AsyncEngine
        from omni_gateway.engine.models.qwen2_5_omni_talker import load_talker

        engine = LLMEngine(EngineConfig(model=str(path), device=device), model=load_talker(path))
        talker = AsyncEngine(engine=engine)
        try:
            t2w = Token2Wav.from_pretrained(path, config.token2wav, device=str(engine.runner.device))
            return cls(talker, t2w, config)
        except BaseException:
            talker.shutdown()
            raise

    @property
    def voices(self) -> tuple[str, ...]:
        return self.token2wav.voices

    def abort(self, request_id: str) -> None:
        """Stop the talker of a turn at once (its stream also stops when the turn's output is closed)."""
        self.talker.abort(talker_id(request_id))

    def stats(self) -> dict[str, float]:
        return self.talker.stats()

    def shutdown(self) -> None:
        self.talker.shutdown()
        self.token2wav.close()
        self._chunk_threads.shutdown(wait=False, cancel_futures=True)

    def warm_up(self, thinker: Engine, prompt_ids: list[int]) -> None:
        """One short spoken turn before serving: the first user pays no first-call costs (kernel choices,
        the voice's text rows asked of the thinker, token2wav's first chunks). Call it before any session
        speaks: it shortens the talker's answers while it runs."""
        t2w = self.token2wav.config
        config = self.config
        # Enough codes for the first chunk and one more, then the talker stops.
        self.config = dataclasses.replace(config, max_codes=t2w.first_chunk_codes + t2w.lookahead_codes + 2)
        try:
            warm_up_turn(self.speak, thinker, prompt_ids, self.default_voice)
        finally:
            self.config = config

    # ---- one turn -------------------------------------------------------------------------------

    def thinker_params(self, params: SamplingParams) -> SamplingParams:
        """The thinker's sampling of a spoken turn: it hands back the hidden states the talker reads."""
        return dataclasses.replace(params, n=1, return_hidden_states=True)

    async def speak(
        self, thinker: Engine, request: OmniRequest, prompt: Prompt, params: SamplingParams, cancel: asyncio.Event
    ) -> AsyncIterator[OutputChunk]:
        """The thinker's answer as speech (``AudioChunk``s carrying its text), then ``Done`` and ``Usage``."""
        voice = request.audio.voice or self.default_voice
        if voice not in self.voices:
            yield Error(
                "invalid_request",
                f"unknown voice {voice!r}; this model speaks as: {', '.join(self.voices)}",
                status=400,
                param="voice",
            )
            return
        # A thinker loop in this process shares the device stream and the interpreter lock with the talker:
        # the talker's prefills go first (engine.runner.step_priority).
        self.talker.prefer_over(thinker)
        rate = request.audio.sample_rate
        voice_bos = self.token2wav.text_bos_token(voice)
        try:
            bos, eos, pad = await self._text_rows.get(thinker, (voice_bos, *self._text_tail))
        except REFUSED as exc:
            yield refusal(exc)
            return
        turn: Turn[_Start] = Turn()
        thinking = asyncio.create_task(self._think(thinker, request, prompt, params, turn, (bos, eos, pad), voice_bos))
        spoken = spoken_turn(
            turn,
            thinking,
            lambda start: self._audio(request, start, voice, cancel),
            prompt,
            rate,
            OUTPUT_SAMPLE_RATE,
            cancel,
        )
        async with contextlib.aclosing(spoken) as chunks:
            async for chunk in chunks:
                yield chunk

    @property
    def _text_tail(self) -> tuple[int, int]:
        return self.tokens.text_eos, self.tokens.text_pad

    async def _think(
        self,
        thinker: Engine,
        request: OmniRequest,
        prompt: Prompt,
        params: SamplingParams,
        turn: Turn[_Start],
        text_rows: tuple[torch.Tensor, torch.Tensor, torch.Tensor],
        voice_bos: int,
    ) -> None:
        """Run the thinker: its text into ``turn.text``, its rows into the talker's prompt and input stream.
        ``text_rows`` are the rows of the voice's text start token ``voice_bos``, the text end and the pad."""
        import torch

        bos, eos, pad = text_rows
        n = len(prompt.token_ids)
        media = [(s.offset, s.offset + s.length) for s in prompt.embed_spans]
        rows: list[torch.Tensor] = []  # conditioning row of every position so far
        stream: InputStream | None = None

        def on_delta(delta: StreamDelta, reply: list[int]) -> None:
            nonlocal stream
            if delta.hidden_states is not None:
                embeds = delta.input_embeds
                for lo, hi in media:  # the talker hears media through the thinker's states only
                    a, b = max(lo - delta.hidden_start, 0), min(hi - delta.hidden_start, len(embeds))
                    if a < b:
                        embeds = embeds.clone() if embeds is delta.input_embeds else embeds
                        embeds[a:b] = 0
                new = list(delta.hidden_states + embeds)
                if stream is not None:
                    stream.append(new)
                rows.extend(new)
            if stream is None and len(rows) > n:
                # The prompt's rows, the voice's text start and the first reply token's row: the talker starts.
                cond = torch.cat((torch.stack(rows[:n]), bos[None], rows[n][None]))
                ids = [self.tokens.codec_mask] * n + [self.tokens.codec_pad, self.tokens.codec_bos]
                stream = InputStream(start=n + 2)
                stream.append(rows[n + 1 :])
                spans = talker_spans(cond, prompt.embed_spans, [*prompt.token_ids, voice_bos, reply[0]])
                turn.started.set_result((ids, spans, stream))

        try:
            await run_thinker(thinker, request, prompt, self.thinker_params(params), turn, on_delta)
        finally:
            if stream is not None and not stream.closed:
                stream.close([eos], pad)  # after the text: its end, then padding for as long as the talker speaks

    async def _audio(
        self,
        request: OmniRequest,
        start: _Start,
        voice: str,
        cancel: asyncio.Event,
    ) -> AsyncIterator[np.ndarray]:
        """float32 waveform pieces at 24 kHz from the talker's codes, chunk by chunk."""
        ids, spans, stream = start
        cfg, t2w = self.config, self.token2wav
        params = SamplingParams(
            temperature=cfg.temperature,
            top_k=cfg.top_k,
            top_p=cfg.top_p,
            repetition_penalty=cfg.repetition_penalty,
            max_tokens=min(cfg.max_codes, self.talker.max_model_len - len(ids)),
            seed=request.sampling.seed,
        )
        speech = t2w.stream(voice, seed=request.sampling.seed)
        playback = Playback()  # the chunks of the stream due soonest run first
        stop = self.tokens.stop_ids
        async with contextlib.aclosing(
            self.talker.generate(
                ids,
                params,
                request_id=talker_id(request.request_id),
                priority=request.priority,
                embed_spans=spans,
                input_stream=stream,
            )
        ) as deltas:
            async for delta in deltas:
                if cancel.is_set():
                    return
                # Stop codes end the utterance; other special codes have no sound (token2wav has no row for them).
                codes = [c for c in delta.token_ids if c not in stop and c < t2w.num_codes]
                loop = asyncio.get_running_loop()
                if codes and speech.completes_chunk(len(codes)):  # a token2wav call: off the event loop
                    push = functools.partial(speech.push, codes, deadline=playback.deadline())
                    waves = await loop.run_in_executor(self._chunk_threads, push)
                else:  # most codes only join the next chunk: no thread hop for them
                    waves = speech.push(codes) if codes else []
                if delta.finished and not cancel.is_set():
                    finish = functools.partial(speech.finish, deadline=playback.deadline())
                    waves += await loop.run_in_executor(self._chunk_threads, finish)
                for wave in waves:
                    playback.delivered(len(wave), OUTPUT_SAMPLE_RATE)
                    yield wave.cpu().numpy()


def talker_spans(cond: torch.Tensor, media: tuple[EmbedSpan, ...], ids: list[int]) -> tuple[EmbedSpan, ...]:
    """The talker prompt's conditioning rows ``cond`` as spans covering it: the thinker's media spans keep
    their multimodal rotary positions (the talker's positions are the thinker's) and content keys (audio's
    per token), the text
    between and after them goes in plain spans. ``ids`` name what each row is made of (the thinker's token
    there, then the voice's text start and the first reply token): a row is the thinker's state after the
    prompt up to it, so the KV blocks of a talker prompt are keyed by ``ids`` block by block, and a
    conversation's next spoken turn reuses the talker's blocks of the one before."""
    spans: list[EmbedSpan] = []
    at = 0
    for span in sorted(media, key=lambda s: s.offset):
        if span.offset > at:
            spans.append(_rows_span(cond, ids, at, span.offset))
        end = span.offset + span.length
        spans.append(
            EmbedSpan(span.offset, span.length, span.key, cond[span.offset : end], span.positions, span.position_keys)
        )
        at = end
    spans.append(_rows_span(cond, ids, at, len(cond)))
    return tuple(spans)


def _rows_span(cond: torch.Tensor, ids: list[int], start: int, end: int) -> EmbedSpan:
    return EmbedSpan(start, end - start, "thinker-rows", cond[start:end], position_keys=tuple(ids[start:end]))
