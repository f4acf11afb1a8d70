"""On a GPU the talker steps on a CUDA stream of its own, beside the thinker's, and what the thinker's rows
become on their way to it is made on a hand-off stream. The codes it speaks must be the codes a talker on
one stream speaks from the same rows, however the thinker's steps and the hand-off overlap with its own."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest
import torch
from omni_gateway.engine.async_engine import AsyncEngine
from omni_gateway.engine.config import EngineConfig
from omni_gateway.engine.input_stream import InputStream
from omni_gateway.engine.llm_engine import LLMEngine
from omni_gateway.engine.models.qwen2_5_omni_talker import load_talker
from omni_gateway.engine.sampling_params import SamplingParams
from omni_gateway.omni.heads.token2wav import Token2WavConfig
from omni_gateway.omni.protocol import AudioChunk, AudioOutputOptions, OmniRequest, SamplingOptions
from omni_gateway.omni.speech import SpeechConfig, SpokenModel
from omni_gateway.omni.streams import Prompt

from benchmarks.tiny_omni import save_tiny_omni, save_tiny_thinker_text

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]

CHUNKS = Token2WavConfig(first_chunk_codes=4, chunk_codes=8, past_codes=4, lookahead_codes=2, num_steps=4)


def test_talker_on_its_own_stream_speaks_what_one_stream_speaks(tmp_path: Path) -> None:
    omni = save_tiny_omni(tmp_path / "omni")
    thinker_dir = save_tiny_thinker_text(omni, tmp_path / "thinker")
    gpu = dict(device="cuda", dtype="float32", attention_backend="triton", max_model_len=512)
    thinker = AsyncEngine(engine=LLMEngine(EngineConfig(model=str(thinker_dir), **gpu)))
    speech = SpokenModel.load(omni, device="cuda", config=SpeechConfig(token2wav=CHUNKS, temperature=0.0, max_codes=40))
    assert speech.talker.engine.runner.stream is not None  # type: ignore[attr-defined]
    asked: dict[str, dict[str, Any]] = {}
    generate = speech.talker.generate

    async def recorded(prompt: list[int], params: SamplingParams, **kwargs: Any) -> Any:
        seen = asked[kwargs["request_id"]] = {"prompt": prompt, "params": params, "codes": [], **kwargs}
        async for delta in generate(prompt, params, **kwargs):
            seen["codes"] += delta.token_ids
            yield delta

    speech.talker.generate = recorded  # type: ignore[method-assign]
    g = torch.Generator().manual_seed(0)
    prompts = [torch.randint(20, 200, (12 + 5 * i,), generator=g).tolist() for i in range(3)]

    async def speak(i: int, prompt: list[int]) -> int:
        request = OmniRequest(
            request_id=f"turn-{i}",
            messages=(),
            modalities=("text", "audio"),
            sampling=SamplingOptions(temperature=0.0, seed=i),
            audio=AudioOutputOptions(voice="Chelsie"),
        )
        params = SamplingParams(max_tokens=10, temperature=0.0, ignore_eos=True)
        chunks = [c async for c in speech.speak(thinker, request, Prompt(prompt), params, asyncio.Event())]
        return sum(len(c.pcm16) for c in chunks if isinstance(c, AudioChunk))

    try:
        # One turn at a time: the reference below then runs the talker at the batch size it ran at (a GPU's
        # kernels at another batch size may round differently, and greedy codes from random weights part
        # on a rounding). The thinker's steps, the hand-off and the talker's still overlap.
        assert all(asyncio.run(speak(i, p)) for i, p in enumerate(prompts))
        # The same rows, through a talker on the default stream, one request at a time, every row there.
        plain = LLMEngine(EngineConfig(**gpu, enforce_eager=True), model=load_talker(omni))
        for rid, seen in asked.items():
            stream: InputStream = seen["input_stream"]
            assert stream.closed
            rows = InputStream(start=stream.start)
            end = stream.start + len(seen["codes"]) + 1
            rows.close(stream.rows(stream.start, end), stream.rows(end, end + 1)[0])
            plain.add_request(rid, seen["prompt"], seen["params"], embed_spans=seen["embed_spans"], input_stream=rows)
            codes: list[int] = []
            while plain.has_unfinished():
                codes += [t for d in plain.step() for t in d.token_ids]
            assert codes == seen["codes"], rid
    finally:
        thinker.shutdown()
        speech.shutdown()
