"""What the engine spends on constraints: compile time (a budget, off the loop, withdrawn on abort), memory
(the compiled-grammar cache's byte bound), and what it refuses before or reports after generating."""

from __future__ import annotations

import asyncio
import random
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from omni_gateway.engine import InvalidRequest, SamplingParams, StructuredOutputs
from omni_gateway.engine.config import EngineConfig
from omni_gateway.engine.core.llm_engine import LLMEngine
from omni_gateway.engine.core.structured_output import GrammarCache, library_message
from omni_gateway.engine.frontend.async_engine import AsyncEngine

from tests.harness.checkpoints import VOCAB, byte_level_tokenizer, save_tiny_checkpoint

TIMEOUT = 30


def large_enum(seed: int, values: int = 300, chars: int = 60) -> StructuredOutputs:
    rng = random.Random(seed)
    return StructuredOutputs(json={"enum": ["".join(rng.choices("abcdefghij", k=chars)) for _ in range(values)]})


@pytest.fixture()
def grammars() -> GrammarCache:
    tok = byte_level_tokenizer()
    return GrammarCache(tok, VOCAB, {tok.eos_token_id})


def test_distinct_large_schemas_stay_within_the_cache_bound(grammars: GrammarCache) -> None:
    one = grammars.prepare(large_enum(0)).bytes
    bound = 3 * one + one // 2
    tok = byte_level_tokenizer()
    cache = GrammarCache(tok, VOCAB, {tok.eos_token_id}, cache_bytes=bound)
    for seed in range(40):
        cache.prepare(large_enum(seed))
        assert cache.cached_bytes <= bound
    assert cache.cached_bytes >= 3 * one * 0.8  # it keeps what fits: the most recent three
    assert cache.submit(large_enum(39)).done()  # the most recent: answered from the cache, no compile
    oldest = cache.submit(large_enum(0))  # evicted long ago: compiled again
    assert oldest.result(TIMEOUT).bytes == one


def test_a_grammar_larger_than_the_bound_is_used_but_not_kept() -> None:
    tok = byte_level_tokenizer()
    cache = GrammarCache(tok, VOCAB, {tok.eos_token_id}, cache_bytes=1000)
    prepared = cache.prepare(large_enum(1))
    assert prepared.bytes > 1000 and cache.cached_bytes == 0


@pytest.mark.parametrize(
    ("spec", "refusal"),
    [
        (StructuredOutputs(grammar="root ::= root"), "matches no output"),
        (StructuredOutputs(grammar="root ::= a\na ::= b\nb ::= a"), "matches no output"),
        (StructuredOutputs(json={"$defs": {"a": {"allOf": [{"$ref": "#/$defs/a"}]}}, "$ref": "#/$defs/a"}), "finite"),
        (StructuredOutputs(json={"type": "object", "properties": {"x": {"$ref": "#"}}, "required": ["x"]}), "finite"),
        (StructuredOutputs(regex="a{1000}{1000}"), "repeats 1,000,000 times"),
        (StructuredOutputs(regex="a{2}{2}"), "Two consecutive repetition modifiers are not allowed"),
    ],
)
def test_constraints_nothing_can_satisfy_are_refused_before_generating(
    grammars: GrammarCache, spec: StructuredOutputs, refusal: str
) -> None:
    with pytest.raises(InvalidRequest, match=refusal) as caught:
        grammars.prepare(spec)
    assert "/project/" not in str(caught.value) and ".cc:" not in str(caught.value)


def test_the_compilers_log_prefix_and_source_paths_are_cut() -> None:
    raw = RuntimeError(
        "[14:03:53] /project/cpp/regex_converter.cc:94: Regex parsing error at position 8: Two consecutive "
        "repetition modifiers are not allowed.\nStack trace:\n  /project/cpp/x.cc:1"
    )
    assert library_message(raw) == (
        "Regex parsing error at position 8: Two consecutive repetition modifiers are not allowed."
    )
    assert library_message(RuntimeError("see /usr/src/xgrammar/cpp/parser.cc:12: " + "x" * 500)).startswith("see x")
    assert len(library_message(RuntimeError("x" * 500))) == 160
    assert library_message(RuntimeError("")) == "the compiler refused it (RuntimeError)"


# ---- in the engine ----------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def engine(tmp_path_factory: pytest.TempPathFactory) -> LLMEngine:
    directory: Path = tmp_path_factory.mktemp("tiny-llama-budget")
    save_tiny_checkpoint("llama", directory)
    return LLMEngine(EngineConfig(model=str(directory), device="cpu", dtype="float32", max_model_len=256))


def test_a_shortest_answer_longer_than_max_tokens_is_refused(engine: LLMEngine) -> None:
    long = StructuredOutputs(json={"type": "string", "minLength": 500})
    with pytest.raises(InvalidRequest, match=r"at least \d+ tokens .* allows 16 \(max_tokens\)"):
        engine.add_request("long", "hi", SamplingParams(max_tokens=16, structured_outputs=long))
    with pytest.raises(InvalidRequest, match="allows 2"):
        engine.add_request(
            "choice", "hi", SamplingParams(max_tokens=2, structured_outputs=StructuredOutputs(choice=["a" * 40]))
        )
    assert not engine.has_unfinished()


def test_a_dead_end_mid_answer_ends_the_stream_with_an_error(
    engine: LLMEngine, monkeypatch: pytest.MonkeyPatch
) -> None:
    engine.add_request(
        "dead", "hi", SamplingParams(max_tokens=20, structured_outputs=StructuredOutputs(regex="[a-z]+"))
    )
    monkeypatch.setattr(
        GrammarCache, "accept", staticmethod(lambda seqs, ids: [s for s in seqs if s.grammar is not None])
    )
    deltas = []
    while engine.has_unfinished():
        deltas += engine.step()
    engine.pop_finished()
    (last,) = [d for d in deltas if d.finished]
    assert last.finish_reason == "error"
    assert last.error is not None and "allowed no next token" in last.error


class SlowPrepare:
    """``GrammarCache.prepare`` that takes ``seconds`` for constraints named in ``slow``."""

    def __init__(self, real: Any, slow: set[StructuredOutputs], seconds: float) -> None:
        self.real, self.slow, self.seconds = real, slow, seconds
        self.finished: list[StructuredOutputs] = []

    def __call__(self, spec: StructuredOutputs) -> Any:
        if spec in self.slow:
            time.sleep(self.seconds)
        self.finished.append(spec)
        return self.real(spec)


def test_a_compile_past_its_budget_is_refused_while_others_go_on(
    engine: LLMEngine, monkeypatch: pytest.MonkeyPatch
) -> None:
    grammars = engine.grammars
    hostile = {StructuredOutputs(regex=f"h{i}[a-z]+") for i in range(6)}
    slow = SlowPrepare(grammars.prepare, hostile, seconds=1.5)
    monkeypatch.setattr(grammars, "prepare", slow)
    monkeypatch.setattr(grammars, "timeout_s", 0.5)
    monkeypatch.setattr(grammars._pool, "_work", slow)
    async_engine = AsyncEngine(engine=engine)

    async def answer(spec: StructuredOutputs) -> tuple[str, float]:
        start = time.monotonic()
        params = SamplingParams(max_tokens=4, structured_outputs=spec)
        try:
            text = "".join([d.text async for d in async_engine.generate("hi", params)])
        except InvalidRequest as exc:
            return f"refused: {exc}", time.monotonic() - start
        return text, time.monotonic() - start

    async def go() -> list[tuple[str, float]]:
        hostile_runs = [asyncio.create_task(answer(spec)) for spec in hostile]
        await asyncio.sleep(0.05)
        normal = await answer(StructuredOutputs(regex="[0-9]+"))
        return [normal, *await asyncio.gather(*hostile_runs)]

    try:
        (normal, normal_s), *refused = asyncio.run(asyncio.wait_for(go(), TIMEOUT))
    finally:
        async_engine.shutdown()
    assert normal.isdigit() and normal_s < 0.5  # never queued behind the six slow compiles
    for message, seconds in refused:
        assert message.startswith("refused: the regex constraint did not compile within 0.5 s"), message
        assert seconds < 1.0


def test_an_aborted_request_withdraws_its_queued_compile(monkeypatch: pytest.MonkeyPatch) -> None:
    tok = byte_level_tokenizer()
    cache = GrammarCache(tok, VOCAB, {tok.eos_token_id}, workers=1)
    release = threading.Event()
    real, compiled = cache.prepare, []
    monkeypatch.setattr(
        cache._pool, "_work", lambda spec: release.wait(TIMEOUT) and compiled.append(spec) or real(spec)
    )
    first = cache.submit(StructuredOutputs(regex="a+"))
    second = cache.submit(StructuredOutputs(regex="b+"))
    assert second.cancel()
    release.set()
    assert first.result(TIMEOUT).kind == "regex"
    assert compiled == [StructuredOutputs(regex="a+")]
