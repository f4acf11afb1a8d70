"""Qwen2.5-Omni's talker on the paged engine against transformers' talker, given the same thinker outputs."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from omni_gateway.engine.config import EngineConfig
from omni_gateway.engine.core.llm_engine import LLMEngine
from omni_gateway.engine.core.sequence import EmbedSpan
from omni_gateway.engine.errors import InvalidRequest
from omni_gateway.engine.models.qwen2_5_omni_talker import TalkerTokens, load_talker
from omni_gateway.engine.runner.input_stream import InputStream
from omni_gateway.engine.sampling_params import SamplingParams

from tests.harness.tiny_omni import save_tiny_omni

pytestmark = pytest.mark.usefixtures("one_torch_thread")

PROMPT = [100, 5, 17, 42, 9, 11]  # thinker prompt ids
MAX_CODES = 40


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return save_tiny_omni(tmp_path_factory.mktemp("omni"))


@pytest.fixture(scope="module")
def hf(tiny_dir: Path) -> Any:
    from transformers import Qwen2_5OmniForConditionalGeneration

    return Qwen2_5OmniForConditionalGeneration.from_pretrained(tiny_dir, dtype=torch.float32).eval()


def thinker_outputs(num_reply: int, seed: int = 0) -> dict[str, torch.Tensor]:
    """Stand-ins for the thinker's outputs (last hidden state + input embedding, summed, per position)."""
    g = torch.Generator().manual_seed(seed)
    d = 32
    return {
        "prompt": torch.randn(len(PROMPT), d, generator=g),
        "reply": torch.randn(num_reply, d, generator=g),  # one row per fed-back generated token
        "text_bos": torch.randn(d, generator=g),
        "text_eos": torch.randn(d, generator=g),
        "text_pad": torch.randn(d, generator=g),
    }


def hf_codes(hf: Any, rows: dict[str, torch.Tensor]) -> list[int]:
    talker = hf.talker
    p = len(PROMPT)
    embeds = torch.cat((rows["prompt"], rows["text_bos"][None], rows["reply"][:1]))[None]
    reply = torch.cat((rows["reply"][1:], rows["text_eos"][None], rows["text_pad"][None]))[None]
    ids = torch.tensor([[talker.codec_mask_token] * p + [talker.codec_pad_token, talker.codec_bos_token]])
    text_ids = torch.tensor([PROMPT + [157, 7]])
    with torch.no_grad():
        out = talker.generate(
            input_ids=ids,
            input_text_ids=text_ids,
            thinker_reply_part=reply,
            inputs_embeds=embeds.clone(),
            attention_mask=torch.ones_like(ids),
            suppress_tokens=[talker.codec_bos_token],
            eos_token_id=[talker.codec_pad_token, talker.codec_eos_token],
            pad_token_id=talker.codec_pad_token,
            do_sample=False,
            max_new_tokens=MAX_CODES,
            repetition_penalty=1.0,
        )
    return out[0, ids.shape[1] :].tolist()


def engine_codes(engine: LLMEngine, rows: dict[str, torch.Tensor], rid: str, *, trickle: bool) -> list[int]:
    tokens = TalkerTokens.from_hf(engine.model.hf_config)
    p = len(PROMPT)
    prompt = [tokens.codec_mask] * p + [tokens.codec_pad, tokens.codec_bos]
    cond = torch.cat((rows["prompt"], rows["text_bos"][None], rows["reply"][:1]))
    stream = InputStream(start=len(prompt))
    later = list(rows["reply"][1:])
    if not trickle:
        stream.close(later + [rows["text_eos"]], rows["text_pad"])
    engine.add_request(
        rid,
        prompt,
        SamplingParams(temperature=0.0, max_tokens=MAX_CODES),
        embed_spans=[EmbedSpan(offset=0, length=p + 2, key=rid, embeds=cond)],
        input_stream=stream,
    )
    codes: list[int] = []
    idle = 0
    while engine.has_unfinished():
        deltas = engine.step()
        if trickle and not deltas and engine.waits_for_input():
            idle += 1  # the talker caught up with the thinker: hand it the next row
            if later:
                stream.append([later.pop(0)])
            else:
                stream.close([rows["text_eos"]], rows["text_pad"])
        codes += [t for d in deltas for t in d.token_ids]
    if trickle:
        assert idle >= len(rows["reply"]) - 1  # it did wait for the rows
    return codes


@pytest.mark.slow
def test_talker_codes_match_hf(tiny_dir: Path, hf: Any) -> None:
    engine = LLMEngine(
        EngineConfig(device="cpu", attention_backend="torch", dtype="float32"), model=load_talker(tiny_dir)
    )
    for seed in range(3):
        rows = thinker_outputs(num_reply=4, seed=seed)
        want = hf_codes(hf, rows)
        assert len(set(want)) > 2, want  # a talker stuck on one code would prove little
        assert engine_codes(engine, rows, f"whole-{seed}", trickle=False) == want
        # Rows that arrive one step at a time make the talker wait, not guess.
        assert engine_codes(engine, rows, f"trickle-{seed}", trickle=True) == want
    assert engine.scheduler.kv.usage().num_used_blocks == 0


@pytest.mark.slow
def test_input_stream_rules(tiny_dir: Path) -> None:
    engine = LLMEngine(
        EngineConfig(device="cpu", attention_backend="torch", dtype="float32"), model=load_talker(tiny_dir)
    )
    with pytest.raises(InvalidRequest, match="input stream"):
        engine.add_request("early", [1, 2, 3], SamplingParams(), input_stream=InputStream(start=1))
    stream = InputStream(start=2)
    stream.close([], torch.zeros(32))
    with pytest.raises(RuntimeError, match="closed"):
        stream.append([torch.zeros(32)])
