"""The host-step benchmark drives the real engine loop around its instant runner."""

from __future__ import annotations

import pytest

from benchmarks.host_step import overriding_decode, pack_ms, us_per_step


def test_steps_are_timed_through_the_engine_loop(monkeypatch: pytest.MonkeyPatch) -> None:
    from omni_gateway.engine.core.llm_engine import LLMEngine

    steps: list[int] = []
    step = LLMEngine.step

    def counted(self: LLMEngine) -> list:
        deltas = step(self)
        steps.append(sum(len(d.token_ids) for d in deltas))
        return deltas

    monkeypatch.setattr(LLMEngine, "step", counted)
    assert us_per_step(batch=3, tokens=5) > 0
    # Two runs (warm-up and timed), each three requests of five tokens, one token per request per step.
    assert sum(steps) == 2 * 3 * 5
    assert max(steps) == 3


def test_block_tables_pack_from_cached_rows_and_from_lists() -> None:
    assert pack_ms(4, 8, steps=8, cached=True) > 0
    assert pack_ms(4, 8, steps=8, cached=False) > 0


def test_the_baseline_tokenizer_decodes_through_the_wrapper() -> None:
    """The baseline's tokenizer overrides decoding, so the engine finds no direct decode for it; it decodes
    the same text."""
    from omni_gateway.engine.core.detokenizer import direct_decoder

    from tests.harness.checkpoints import byte_level_tokenizer

    tok = byte_level_tokenizer()
    wrapped = overriding_decode(tok)
    assert direct_decoder(tok) is not None and direct_decoder(wrapped) is None
    ids = tok.encode("Grüße aus München! The end of the story is near.")
    assert wrapped.encode("Grüße aus München! The end of the story is near.") == ids
    assert wrapped.decode(ids) == tok.decode(ids)
    assert us_per_step(batch=2, tokens=4, through_wrapper=True) > 0
