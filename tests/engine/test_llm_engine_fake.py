"""LLMEngine, LLM and AsyncEngine over the cache-simulating fake runner and a tiny real tokenizer."""

from __future__ import annotations

import asyncio
import contextlib
import copy
import threading
import time
from typing import Any

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from omni_gateway.engine.config import EngineConfig
from omni_gateway.engine.core.llm_engine import LLMEngine
from omni_gateway.engine.core.sequence import Sequence
from omni_gateway.engine.errors import EngineDead, EngineOverloaded, InvalidRequest
from omni_gateway.engine.frontend.async_engine import AsyncEngine
from omni_gateway.engine.frontend.llm import LLM
from omni_gateway.engine.outputs import RequestOutput, StreamDelta
from omni_gateway.engine.sampling_params import SamplingParams

from tests.harness.engine_fakes import (
    FakeRunner,
    byte_level_tokenizer,
    fake_model,
    hashed_next_token,
    make_engine,
    oracle,
)

GREEDY = SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True)


def prompt_ids(n: int, start: int = 10) -> list[int]:
    """n ordinary token ids; different starts give different first tokens (13 is a unit mod 320)."""
    return [3 + (start * 13 + i * 7) % 320 for i in range(n)]


def run_all(engine: LLMEngine) -> tuple[dict[str, RequestOutput], list[StreamDelta]]:
    deltas: list[StreamDelta] = []
    outputs: dict[str, RequestOutput] = {}
    for _ in range(10_000):
        if not engine.has_unfinished():
            break
        deltas += engine.step()
        outputs.update((o.request_id, o) for o in engine.pop_finished())
    assert not engine.has_unfinished()
    return outputs, deltas


def assert_no_leak(engine: LLMEngine) -> None:
    stats = engine.stats()
    assert stats["kv_blocks_used"] == 0 and stats["running"] == 0 and stats["waiting"] == 0
    assert engine.scheduler.kv.pool.num_free_blocks == engine.scheduler.kv.num_blocks


def test_generation_matches_an_uncached_oracle_and_streams_coherently() -> None:
    engine = make_engine()
    prompts = {"a": prompt_ids(21), "b": prompt_ids(5, 40), "c": prompt_ids(40, 3)}
    for rid, p in prompts.items():
        engine.add_request(rid, p, GREEDY)
    outputs, deltas = run_all(engine)
    for rid, p in prompts.items():
        out = outputs[rid]
        assert out.finished and out.prompt_token_ids == p
        completion = out.outputs[0]
        assert completion.token_ids == oracle(engine, p, 12)
        assert completion.finish_reason == "length"
        mine = [d for d in deltas if d.request_id == rid]
        assert [t for d in mine for t in d.token_ids] == completion.token_ids
        assert "".join(d.text for d in mine) == completion.text
        assert completion.text == engine.tokenizer.decode(completion.token_ids)
        assert [d.finished for d in mine] == [False] * 11 + [True]
    assert_no_leak(engine)


def test_prefix_cache_hits_across_requests_and_turns() -> None:
    engine = make_engine()
    system = prompt_ids(40)
    engine.add_request("t1", system + [5, 6, 7], GREEDY)
    first, _ = run_all(engine)
    assert first["t1"].num_cached_tokens == 0

    engine.add_request("other", system + [9, 9], GREEDY)
    out, _ = run_all(engine)
    assert out["other"].num_cached_tokens == 32  # two full blocks of the shared system prompt
    assert out["other"].outputs[0].token_ids == oracle(engine, system + [9, 9], 12)

    # Turn 2 resends turn 1 with the reply and a new message: only the tail is prefilled.
    turn2 = system + [5, 6, 7] + first["t1"].outputs[0].token_ids + [8, 8, 8, 8]
    engine.add_request("t2", turn2, GREEDY)
    out, _ = run_all(engine)
    assert out["t2"].num_cached_tokens == 48 and len(turn2) == 59  # all full blocks of turn 1's 55 tokens
    assert out["t2"].outputs[0].token_ids == oracle(engine, turn2, 12)
    stats = engine.stats()
    assert stats["prefix_cache_hit_tokens"] == 32 + 48
    assert stats["prefix_cache_query_tokens"] == 43 + 42 + 59
    assert_no_leak(engine)


def test_lru_eviction_keeps_the_recently_used_prefix() -> None:
    engine = make_engine(num_kv_blocks=8)
    old, fresh = prompt_ids(33, 1), prompt_ids(33, 100)
    params = SamplingParams(max_tokens=1, ignore_eos=True)
    engine.add_request("old", old, params)
    run_all(engine)
    engine.add_request("fresh", fresh, params)
    run_all(engine)
    # 6 of 8 blocks hold cached prefixes; a 5-block request evicts the oldest first.
    engine.add_request("filler", prompt_ids(70, 200), params)
    run_all(engine)
    engine.add_request("fresh2", fresh + [1], params)
    engine.add_request("old2", old + [1], params)
    out, _ = run_all(engine)
    assert out["fresh2"].num_cached_tokens == 32
    assert out["old2"].num_cached_tokens == 0


def test_preemption_under_block_pressure_gives_identical_output() -> None:
    prompts = {f"r{i}": prompt_ids(20 + 3 * i, 5 + 11 * i) for i in range(6)}
    params = SamplingParams(temperature=0.0, max_tokens=40, ignore_eos=True)

    def run(num_blocks: int) -> tuple[dict[str, RequestOutput], LLMEngine]:
        engine = make_engine(num_kv_blocks=num_blocks)
        for rid, p in prompts.items():
            engine.add_request(rid, p, params)
        return run_all(engine)[0], engine

    roomy, roomy_engine = run(256)
    tight, tight_engine = run(12)
    assert roomy_engine.stats()["num_preemptions"] == 0
    assert tight_engine.stats()["num_preemptions"] > 0
    for rid in prompts:
        assert tight[rid].outputs[0].token_ids == roomy[rid].outputs[0].token_ids
        assert tight[rid].outputs[0].text == roomy[rid].outputs[0].text
    assert_no_leak(tight_engine)


def test_chunked_prefill_respects_the_token_budget() -> None:
    engine = make_engine(max_num_batched_tokens=8)
    long, short = prompt_ids(50), prompt_ids(3, 77)
    engine.add_request("long", long, GREEDY)
    engine.add_request("short", short, GREEDY)
    out, _ = run_all(engine)
    runner: FakeRunner = engine.runner  # type: ignore[assignment]
    assert all(sum(n for _, _, n in step) <= 8 for step in runner.batches)
    assert len([s for s in runner.batches if any(start < 50 and n > 1 for _, start, n in s)]) >= 6
    assert out["long"].outputs[0].token_ids == oracle(engine, long, 12)
    assert out["short"].outputs[0].token_ids == oracle(engine, short, 12)


def test_bounded_queue_rejects_and_queues_nothing() -> None:
    engine = make_engine(max_waiting_requests=2)
    engine.add_request("a", [5, 6], GREEDY)
    engine.add_request("b", [5, 7], GREEDY)
    with pytest.raises(EngineOverloaded, match="max_waiting_requests=2"):
        engine.add_request("c", [5, 8], GREEDY)
    engine.step()  # admission empties the waiting queue
    engine.add_request("c", [5, 8], GREEDY)
    out, _ = run_all(engine)
    assert set(out) == {"a", "b", "c"}


def test_abort_waiting_and_running_leaves_no_blocks() -> None:
    engine = make_engine(max_num_seqs=1)
    engine.add_request("run", prompt_ids(30), GREEDY)
    engine.add_request("wait", prompt_ids(30, 50), GREEDY)
    engine.step()
    assert engine.stats()["running"] == 1 and engine.stats()["waiting"] == 1
    [d] = engine.abort("wait")
    assert d.finished and d.finish_reason == "abort"
    [d] = engine.abort("run")
    assert d.finish_reason == "abort" and d.num_output_tokens == 1
    assert engine.abort("run") == []
    assert not engine.has_unfinished()
    finished = {o.request_id: o for o in engine.pop_finished()}
    assert finished["run"].outputs[0].finish_reason == "abort"
    assert len(set(engine.runner.released)) == 2  # type: ignore[attr-defined]  # per-sequence runner state dropped
    assert_no_leak(engine)


def spelled(text: str) -> list[int]:
    tok = byte_level_tokenizer()
    return [t for ch in text for t in tok.encode(ch, add_special_tokens=False)]


def scripted(text: str) -> Any:
    """A 'model' that spells ``text`` one character per token, then repeats '.'."""
    ids = spelled(text)

    def next_token(context: list[int], seq: Sequence) -> int:
        i = len(context) - seq.num_prompt_tokens
        return ids[i] if i < len(ids) else spelled(".")[0]

    return next_token


def test_stop_string_split_across_tokens_ends_the_request() -> None:
    engine = make_engine(next_token=scripted("Sure. ###END### more"))
    engine.add_request("s", [5, 6, 7], SamplingParams(max_tokens=50, stop=["###END###"]))
    out, deltas = run_all(engine)
    completion = out["s"].outputs[0]
    assert completion.text == "Sure. " and completion.finish_reason == "stop"
    assert completion.stop_reason == "###END###"
    assert not any("#" in d.text for d in deltas)
    assert len(completion.token_ids) == len(spelled("Sure. ###END###"))
    assert_no_leak(engine)


def test_eos_stop_token_min_tokens_and_ignore_eos() -> None:
    eos = byte_level_tokenizer().eos_token_id
    script = spelled("ab") + [eos] + spelled("cd")

    def next_token(context: list[int], seq: Sequence) -> int:
        i = len(context) - seq.num_prompt_tokens
        return script[i] if i < len(script) else script[-1]

    engine = make_engine(next_token=next_token)
    engine.add_request("eos", [5], SamplingParams(max_tokens=20))
    engine.add_request("ignore", [5], SamplingParams(max_tokens=6, ignore_eos=True))
    engine.add_request("min", [5], SamplingParams(max_tokens=4, min_tokens=4))
    engine.add_request("stop_id", [5], SamplingParams(max_tokens=20, stop_token_ids=[script[1]]))
    out, _ = run_all(engine)
    assert (out["eos"].outputs[0].text, out["eos"].outputs[0].finish_reason) == ("ab", "stop")
    assert out["eos"].outputs[0].stop_reason is None and out["eos"].outputs[0].token_ids[-1] == eos
    assert (out["ignore"].outputs[0].text, out["ignore"].outputs[0].finish_reason) == ("abcdd", "length")
    assert (out["min"].outputs[0].text, out["min"].outputs[0].finish_reason) == ("abc", "length")
    assert out["stop_id"].outputs[0].stop_reason == script[1]


def test_context_length_ends_generation() -> None:
    engine = make_engine(model=fake_model(max_model_len=20))
    engine.add_request("x", prompt_ids(15), SamplingParams(max_tokens=None, ignore_eos=True))
    out, _ = run_all(engine)
    assert len(out["x"].outputs[0].token_ids) == 5 and out["x"].outputs[0].finish_reason == "length"


def test_n_completions_share_the_prompt_prefix() -> None:
    engine = make_engine()
    p = prompt_ids(37)
    engine.add_request("n", p, SamplingParams(n=3, seed=11, max_tokens=6, ignore_eos=True))
    out, deltas = run_all(engine)
    completions = out["n"].outputs
    assert [c.index for c in completions] == [0, 1, 2]
    assert [c.token_ids for c in completions] == [oracle(engine, p, 6, seed=11 + i) for i in range(3)]
    assert len({tuple(c.token_ids) for c in completions}) == 3
    cached = {d.index: d.num_cached_tokens for d in deltas}
    assert cached == {0: 0, 1: 32, 2: 32}
    assert sum(d.finished for d in deltas) == 3
    assert_no_leak(engine)


def test_invalid_requests_say_what_was_wrong() -> None:
    engine = make_engine(model=fake_model(max_model_len=32))
    with pytest.raises(InvalidRequest, match="empty"):
        engine.add_request("a", [], GREEDY)
    with pytest.raises(InvalidRequest, match="empty"):
        engine.add_request("a", "", GREEDY)
    with pytest.raises(InvalidRequest, match=r"32 tokens.*33.*max_model_len=32"):
        engine.add_request("a", prompt_ids(32), GREEDY)
    with pytest.raises(InvalidRequest, match=r"\[0, 330\).*\[330, -1\]"):
        engine.add_request("a", [5, 330, -1], GREEDY)
    engine.add_request("a", [5], GREEDY)
    with pytest.raises(InvalidRequest, match="'a' is already in use"):
        engine.add_request("a", [6], GREEDY)


def test_max_model_len_is_capped_by_kv_capacity() -> None:
    engine = make_engine(num_kv_blocks=4, block_size=16)
    assert engine.max_model_len == 64


def test_default_block_size_follows_the_device() -> None:
    cpu, cuda = EngineConfig(device="cpu").block_size, EngineConfig(device="cuda:1").block_size
    assert cpu is not None and cuda is not None and cpu < cuda
    assert EngineConfig(device="cpu", block_size=32).block_size == 32
    assert EngineConfig().block_size is None  # "auto": the engine decides once it knows the device
    engine = make_engine(block_size=None)
    picked = EngineConfig(device="cuda" if torch.cuda.is_available() else "cpu").block_size
    assert engine.config.block_size == picked == engine.runner.block_size == engine.scheduler.kv.block_size


def peak_kv_waste(engine: LLMEngine, prompts: list[list[int]], max_tokens: int) -> float:
    """Idle fraction of the allocated KV slots at the step that allocates the most."""
    for i, prompt in enumerate(prompts):
        engine.add_request(f"r{i}", prompt, SamplingParams(max_tokens=max_tokens, ignore_eos=True))
    peak = (0, 0.0)
    while engine.has_unfinished():
        engine.step()
        stats = engine.stats()
        peak = max(peak, (int(stats["kv_slots_allocated"]), stats["kv_waste_fraction"]))
    return peak[1]


def test_default_cpu_block_size_keeps_kv_waste_under_4_percent() -> None:
    """16 streams of 36-46 prompt tokens growing by 128 (the CPU benchmark's shape): a sequence's
    unfilled last block is all the waste there is, and the CPU's default blocks keep it under 4%."""
    prompts = [prompt_ids(36 + (7 * i) % 11, start=i) for i in range(16)]
    waste = {
        bs: peak_kv_waste(make_engine(device="cpu", block_size=bs, num_kv_blocks=1024, max_num_seqs=16), prompts, 128)
        for bs in (None, 16)
    }
    assert waste[None] < 0.04 < waste[16]


# ---- LLM ----------------------------------------------------------------------------------------


def test_llm_generate_keeps_input_order_and_accepts_every_prompt_form() -> None:
    llm = LLM.from_engine(make_engine())
    texts = ["Hello world", "The quick brown fox", "def f(x):"]
    outs = llm.generate(texts, GREEDY)
    assert [o.prompt for o in outs] == texts
    tok = llm.get_tokenizer()
    for o, t in zip(outs, texts):
        assert o.outputs[0].token_ids == oracle(llm.engine, tok.encode(t), 12)
    [single] = llm.generate(tok.encode("Hello world"), GREEDY)
    assert single.outputs[0].token_ids == outs[0].outputs[0].token_ids
    per_prompt = llm.generate([[5, 6], [7]], [SamplingParams(max_tokens=2), SamplingParams(max_tokens=3)])
    assert [len(o.outputs[0].token_ids) for o in per_prompt] == [2, 3]
    with pytest.raises(InvalidRequest, match="2 sampling params for 1 prompts"):
        llm.generate(["x"], [GREEDY, GREEDY])
    assert_no_leak(llm.engine)


def test_llm_chat_renders_the_template_once_per_conversation() -> None:
    llm = LLM.from_engine(make_engine())
    conv = [{"role": "user", "content": "hi"}]
    [one] = llm.chat(conv, GREEDY)
    tok = llm.get_tokenizer()
    assert one.prompt_token_ids == tok.encode("user: hi\nassistant:", add_special_tokens=False)
    two = llm.chat([conv, [{"role": "user", "content": [{"type": "text", "text": "yo"}]}]], GREEDY)
    assert two[0].outputs[0].token_ids == one.outputs[0].token_ids
    assert two[1].prompt_token_ids == tok.encode("user: yo\nassistant:", add_special_tokens=False)


def test_chat_without_template_is_an_error_unless_chatml_is_chosen() -> None:
    bare = copy.deepcopy(byte_level_tokenizer())
    bare.chat_template = None
    llm = LLM.from_engine(make_engine(model=fake_model(bare)))
    with pytest.raises(InvalidRequest, match="no chat template.*chatml"):
        llm.chat([{"role": "user", "content": "hi"}])
    [out] = llm.chat([{"role": "user", "content": "hi"}], GREEDY, chat_template="chatml")
    assert bare.decode(out.prompt_token_ids).endswith("<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n")

    tools = [{"type": "function", "function": {"name": "get_time", "parameters": {}}}]
    [out] = llm.chat(
        [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "time?"}],
        GREEDY,
        tools=tools,
        chat_template="chatml",
    )
    rendered = bare.decode(out.prompt_token_ids)
    assert rendered.startswith("<|im_start|>system\nBe brief.\n\nYou may call these tools")
    assert '"name": "get_time"' in rendered and rendered.count("<|im_start|>system") == 1


# ---- AsyncEngine --------------------------------------------------------------------------------


async def collect(agen: Any) -> list[StreamDelta]:
    return [d async for d in agen]


@pytest.fixture
def async_engine() -> Any:
    engine = AsyncEngine(engine=make_engine())
    yield engine
    engine.shutdown()


def test_async_stream_matches_offline_generation(async_engine: AsyncEngine) -> None:
    p = prompt_ids(25)

    async def main() -> tuple[list[StreamDelta], list[StreamDelta]]:
        return await asyncio.gather(
            collect(async_engine.generate(p, GREEDY, request_id="x")), collect(async_engine.generate(p[:10], GREEDY))
        )

    first, second = asyncio.run(main())
    assert [t for d in first for t in d.token_ids] == oracle(async_engine.engine, p, 12)
    assert first[-1].finished and first[-1].finish_reason == "length"
    assert [t for d in second for t in d.token_ids] == oracle(async_engine.engine, p[:10], 12)
    assert async_engine.health() == {"alive": True, "error": None, "open_streams": 0}
    assert async_engine.stats()["kv_blocks_used"] == 0


def test_async_early_close_and_abort_leak_nothing() -> None:
    params = SamplingParams(max_tokens=10_000, ignore_eos=True)
    abort_sent = threading.Event()
    model = fake_model()

    def next_token(context: list[int], seq: Sequence) -> int:
        # The aborted request cannot run to its length limit before the abort is sent, however slow the
        # consumer's event loop is on a loaded machine.
        if seq.request_id == "aborted" and seq.num_output_tokens >= 3:
            abort_sent.wait(10)
        return hashed_next_token(context, seq.params.seed, model.vocab_size, model.first_free_id)

    async_engine = AsyncEngine(engine=make_engine(model=model, next_token=next_token))
    try:
        _abort_after_three_deltas(async_engine, params, abort_sent)
    finally:
        async_engine.shutdown()


def _abort_after_three_deltas(async_engine: AsyncEngine, params: SamplingParams, abort_sent: threading.Event) -> None:

    async def main() -> list[StreamDelta]:
        agen = async_engine.generate(prompt_ids(20), params, request_id="closed")
        async with contextlib.aclosing(agen):
            async for _ in agen:
                break
        seen = []
        async for d in async_engine.generate(prompt_ids(20, 90), params, request_id="aborted"):
            seen.append(d)
            if len(seen) == 3:
                async_engine.abort("aborted")
                abort_sent.set()
        return seen

    seen = asyncio.run(main())
    assert seen[-1].finished and seen[-1].finish_reason == "abort"
    for _ in range(200):
        if async_engine.stats()["kv_blocks_used"] == 0 and not async_engine.engine.has_unfinished():
            break
        asyncio.run(asyncio.sleep(0.01))
    assert async_engine.stats()["kv_blocks_used"] == 0 and not async_engine.engine.has_unfinished()


def test_async_rejections_reach_the_caller() -> None:
    def slow_token(ctx: list[int], seq: Sequence) -> int:
        # A few ms per token keeps the hog running for seconds, far past the test body, however
        # loaded the machine is: only its abort ends it.
        time.sleep(0.005)
        return 7

    engine = AsyncEngine(engine=make_engine(max_waiting_requests=1, max_num_seqs=1, next_token=slow_token))
    params = SamplingParams(max_tokens=10_000, ignore_eos=True)

    async def main() -> None:
        with pytest.raises(InvalidRequest, match="empty"):
            await collect(engine.generate([], GREEDY))
        hog = engine.generate([5, 6], params, request_id="hog")
        await hog.__anext__()  # running; the waiting queue is empty again
        queued = engine.generate([5, 7], params, request_id="queued")
        first = asyncio.ensure_future(queued.__anext__())
        await asyncio.sleep(0.05)
        with pytest.raises(EngineOverloaded):
            await collect(engine.generate([5, 8], params))
        await hog.aclose()
        await first
        await queued.aclose()

    try:
        asyncio.run(main())
    finally:
        engine.shutdown()


def test_engine_death_errors_open_streams_and_refuses_new_ones() -> None:
    llm_engine = make_engine()
    engine = AsyncEngine(engine=llm_engine)
    llm_engine.runner.fail_after = 3  # type: ignore[attr-defined]

    async def main() -> list[StreamDelta]:
        return await collect(engine.generate([5, 6], SamplingParams(max_tokens=100, ignore_eos=True)))

    deltas = asyncio.run(main())
    assert len(deltas) == 4 and deltas[-1].finish_reason == "error"
    assert "simulated device failure" in (deltas[-1].error or "")
    health = engine.health()
    assert not health["alive"] and "simulated device failure" in health["error"]
    with pytest.raises(EngineDead):
        asyncio.run(main())
    engine.shutdown()


def test_async_chat_uses_the_template() -> None:
    engine = AsyncEngine(engine=make_engine())
    try:
        deltas = asyncio.run(collect(engine.chat([{"role": "user", "content": "hi"}], GREEDY)))
    finally:
        engine.shutdown()
    tok = engine.tokenizer
    expected = oracle(engine.engine, tok.encode("user: hi\nassistant:", add_special_tokens=False), 12)
    assert [t for d in deltas for t in d.token_ids] == expected


# ---- randomized workload ------------------------------------------------------------------------

_request = st.tuples(
    st.integers(0, 2),  # which shared prefix
    st.integers(1, 30),  # own suffix length
    st.integers(1, 25),  # max_tokens
    st.integers(0, 1),  # priority
    st.one_of(st.none(), st.integers(0, 6)),  # abort after this many steps, or never
)


@settings(max_examples=20, deadline=None)
@given(
    requests=st.lists(_request, min_size=1, max_size=10),
    num_blocks=st.integers(6, 40),
    budget=st.sampled_from([5, 16, 64]),
)
def test_random_workloads_match_the_oracle_and_leak_nothing(
    requests: list[tuple[int, int, int, int, int | None]], num_blocks: int, budget: int
) -> None:
    engine = make_engine(num_kv_blocks=num_blocks, max_num_batched_tokens=budget, max_num_seqs=4)
    prefixes = [prompt_ids(20, 1), prompt_ids(33, 2), prompt_ids(5, 3)]
    prompts = {}
    aborts: dict[int, list[str]] = {}
    for i, (which, suffix, max_tokens, priority, abort_at) in enumerate(requests):
        rid = f"r{i}"
        prompt = (prefixes[which] + prompt_ids(suffix, 10 + i))[: engine.max_model_len - max_tokens]
        prompts[rid] = (prompt, max_tokens)
        engine.add_request(rid, prompt, SamplingParams(max_tokens=max_tokens, ignore_eos=True), priority=priority)
        if abort_at is not None:
            aborts.setdefault(abort_at, []).append(rid)
    outputs: dict[str, RequestOutput] = {}
    for step in range(10_000):
        for rid in aborts.pop(step, []):
            engine.abort(rid)
        if not engine.has_unfinished():
            break
        engine.step()
        outputs.update((o.request_id, o) for o in engine.pop_finished())
    outputs.update((o.request_id, o) for o in engine.pop_finished())
    assert set(outputs) == set(prompts)
    for rid, (prompt, max_tokens) in prompts.items():
        completion = outputs[rid].outputs[0]
        expected = oracle(engine, prompt, max_tokens)
        if completion.finish_reason == "abort":
            assert completion.token_ids == expected[: len(completion.token_ids)]
        else:
            assert completion.token_ids == expected and completion.finish_reason == "length"
    assert all(b.ref_count == 0 for b in engine.scheduler.kv.pool.blocks)
    assert_no_leak(engine)
