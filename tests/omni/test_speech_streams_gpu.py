"""On a GPU the talker steps on a CUDA stream of its own, beside the thinker's, and what the thinker's rows
become on their way to it is made on a hand-off stream. The codes and audio must be those of a talker that
shares the thinker's stream, however the thinker's steps and the hand-off overlap with the talker's own."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest
import torch
from omni_gateway.engine.async_engine import AsyncEngine
from omni_gateway.engine.config import EngineConfig
from omni_gateway.engine.llm_engine import LLMEngine
from omni_gateway.engine.model_runner import ModelRunner
from omni_gateway.engine.sampling_params import SamplingParams
from omni_gateway.omni import speech as speech_module
from omni_gateway.omni.heads.token2wav import Token2WavConfig
from omni_gateway.omni.protocol import AudioChunk, AudioOutputOptions, OmniRequest, SamplingOptions
from omni_gateway.omni.speech import SpeechConfig, SpokenModel
from omni_gateway.omni.streams import Prompt

from benchmarks.tiny_omni import save_tiny_omni, save_tiny_thinker_text

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]

CHUNKS = Token2WavConfig(first_chunk_codes=4, chunk_codes=8, past_codes=4, lookahead_codes=2, num_steps=4)


def _speak(omni: Path, thinker_dir: Path, prompts: list[list[int]], own_stream: bool) -> list[tuple[list[int], bytes]]:
    """Each prompt's talker codes and audio, one turn after another: each runs at the batch sizes the other
    design runs it at, so kernels round alike and any difference is the streams'."""
    gpu = dict(device="cuda", dtype="float32", attention_backend="triton", max_model_len=512)
    thinker = AsyncEngine(engine=LLMEngine(EngineConfig(model=str(thinker_dir), **gpu)))
    speech = SpokenModel.load(omni, device="cuda", config=SpeechConfig(token2wav=CHUNKS, temperature=0.0, max_codes=40))
    assert (speech.talker.engine.runner.stream is not None) == own_stream  # type: ignore[attr-defined]
    codes: dict[str, list[int]] = {}
    generate = speech.talker.generate

    async def recorded(prompt: list[int], params: SamplingParams, **kwargs: Any) -> Any:
        seen = codes[kwargs["request_id"]] = []
        async for delta in generate(prompt, params, **kwargs):
            seen += delta.token_ids
            yield delta

    speech.talker.generate = recorded  # type: ignore[method-assign]

    async def turn(i: int, prompt: list[int]) -> bytes:
        request = OmniRequest(
            request_id=f"turn-{i}",
            messages=(),
            modalities=("text", "audio"),
            sampling=SamplingOptions(temperature=0.0, seed=i),
            audio=AudioOutputOptions(voice="Chelsie"),
        )
        params = SamplingParams(max_tokens=10, temperature=0.0, ignore_eos=True)
        chunks = [c async for c in speech.speak(thinker, request, Prompt(prompt), params, asyncio.Event())]
        return b"".join(c.pcm16 for c in chunks if isinstance(c, AudioChunk))

    try:
        audio = [asyncio.run(turn(i, p)) for i, p in enumerate(prompts)]
        assert len(codes) == len(prompts), codes.keys()
        return [(codes[f"turn-{i}-talker"], pcm) for i, pcm in enumerate(audio)]
    finally:
        thinker.shutdown()
        speech.shutdown()


def test_talker_on_its_own_stream_speaks_what_one_stream_speaks(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    omni = save_tiny_omni(tmp_path / "omni")
    thinker_dir = save_tiny_thinker_text(omni, tmp_path / "thinker")
    g = torch.Generator().manual_seed(0)
    prompts = [torch.randint(20, 200, (12 + 5 * i,), generator=g).tolist() for i in range(3)]
    own = _speak(omni, thinker_dir, prompts, own_stream=True)
    with monkeypatch.context() as m:
        m.setattr(speech_module, "_handoff_stream", lambda device: None)
        m.setattr(ModelRunner, "run_on_own_stream", lambda self, inputs_from=None: None)
        shared = _speak(omni, thinker_dir, prompts, own_stream=False)
    for i, ((own_codes, own_pcm), (codes, pcm)) in enumerate(zip(own, shared)):
        assert len(codes) >= 8 and pcm, f"turn {i} spoke {len(codes)} codes, {len(pcm)} bytes"
        assert own_codes == codes, f"turn {i}"
        assert own_pcm == pcm, f"turn {i}"
