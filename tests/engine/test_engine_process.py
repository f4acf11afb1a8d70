"""The engine core in its own process: same streams as in-process, refusals, aborts, death and restart.

The cores run the fake engine of ``engine_fakes`` (a hashed 'model' over a real paged KV cache), so a
core starts in a couple of seconds; the real tiny checkpoint runs in ``test_replicas_e2e.py``.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator, Iterator
from typing import Any

import pytest
from omni_gateway.engine.config import EngineConfig
from omni_gateway.engine.errors import EngineDead, InvalidRequest, ModelLoadError
from omni_gateway.engine.frontend.core_client import EngineCoreClient
from omni_gateway.engine.frontend.core_process import ProcessLauncher
from omni_gateway.engine.frontend.launch import start_engine
from omni_gateway.engine.outputs import StreamDelta
from omni_gateway.engine.sampling_params import SamplingParams, StructuredOutputs

from tests.harness.engine_fakes import make_engine, oracle

pytest.importorskip("zmq")
pytestmark = pytest.mark.slow  # each core process imports the engine afresh: seconds on a busy CPU

GREEDY = SamplingParams(max_tokens=12, temperature=0.0, ignore_eos=True)


def fake_engine(config: EngineConfig) -> Any:
    """Module level: the core process imports it by name."""
    return make_engine()


def slow_fake_engine(config: EngineConfig) -> Any:
    """Each token takes 20 ms, so a test can act while a stream is in the middle."""

    def next_token(context: list[int], seq: Any) -> int:
        time.sleep(0.02)
        return 40 + len(context) % 50

    return make_engine(next_token=next_token)


def slow_grammar_engine(config: EngineConfig) -> Any:
    """Constraints whose regex starts with "slow" take 3 s to compile; the budget is 0.5 s."""
    engine = make_engine(structured_outputs_compile_timeout=0.5)
    grammars = engine.grammars
    prepare = grammars.prepare

    def work(spec: StructuredOutputs) -> Any:
        if (spec.regex or "").startswith("slow"):
            time.sleep(3.0)
        return prepare(spec)

    grammars._pool._work = work
    return engine


def broken_engine(config: EngineConfig) -> Any:
    raise RuntimeError("no weights under /nowhere")


def client(factory: Any = fake_engine, **kwargs: Any) -> EngineCoreClient:
    return EngineCoreClient(EngineConfig(device="cpu"), ProcessLauncher(), engine_factory=factory, **kwargs)


@pytest.fixture(scope="module")
def core() -> Iterator[EngineCoreClient]:
    engine = client()
    yield engine
    engine.shutdown()


async def collect(stream: AsyncIterator[StreamDelta]) -> list[StreamDelta]:
    return [delta async for delta in stream]


def test_streams_the_tokens_the_in_process_engine_streams(core: EngineCoreClient) -> None:
    reference = make_engine()
    prompt = "the quick brown fox"
    expected = oracle(reference, list(reference.tokenizer.encode(prompt)), GREEDY.max_tokens or 0)

    async def both() -> tuple[list[StreamDelta], list[StreamDelta]]:
        first = collect(core.generate(prompt, GREEDY, request_id="a"))
        second = collect(core.generate(prompt, GREEDY, request_id="b"))
        return await asyncio.gather(first, second)

    for deltas in asyncio.run(both()):
        assert [t for d in deltas for t in d.token_ids] == expected
        assert deltas[-1].finished and deltas[-1].finish_reason == "length"
        assert "".join(d.text for d in deltas) == reference.tokenizer.decode(expected)
    assert core.model_name == reference.model.name
    assert core.render_chat([{"role": "user", "content": "hi"}]) == reference.render_chat(
        [{"role": "user", "content": "hi"}]
    )


def test_a_refused_request_raises_before_any_delta(core: EngineCoreClient) -> None:
    too_long = list(range(5, 5 + core.max_model_len + 1))
    with pytest.raises(InvalidRequest):
        asyncio.run(collect(core.generate(too_long, GREEDY)))
    assert core.health()["alive"] and core.health()["open_streams"] == 0


def test_a_constraint_that_does_not_compile_is_refused_from_the_core(core: EngineCoreClient) -> None:
    bad = SamplingParams(max_tokens=4, structured_outputs=StructuredOutputs(regex="(unclosed"))
    with pytest.raises(InvalidRequest):
        asyncio.run(collect(core.generate("a b", bad)))
    assert asyncio.run(collect(core.generate("a b", GREEDY)))[-1].finish_reason == "length"  # the loop goes on


def test_a_compile_past_its_budget_is_refused_from_the_core_while_others_go_on() -> None:
    engine = client(slow_grammar_engine)

    async def both() -> tuple[BaseException | None, float, list[StreamDelta]]:
        slow = SamplingParams(max_tokens=4, structured_outputs=StructuredOutputs(regex="slow[a-z]+"))
        quick = SamplingParams(max_tokens=4, structured_outputs=StructuredOutputs(regex="[a-z]+"))
        started = time.monotonic()
        refused, answered = await asyncio.gather(
            collect(engine.generate("a b", slow)), collect(engine.generate("a b", quick)), return_exceptions=True
        )
        return (refused if isinstance(refused, BaseException) else None), time.monotonic() - started, answered

    try:
        refused, seconds, answered = asyncio.run(both())
    finally:
        engine.shutdown()
    assert isinstance(refused, InvalidRequest) and "did not compile within 0.5 s" in str(refused)
    assert seconds < 2.5  # refused at its budget, not when the compile ended
    assert isinstance(answered, list) and answered[-1].finished


def test_closing_a_stream_early_aborts_it_in_the_core(core: EngineCoreClient) -> None:
    async def first_delta_then_close() -> None:
        stream = core.generate("a b c", SamplingParams(max_tokens=400, ignore_eos=True), request_id="early")
        await anext(stream)
        await stream.aclose()

    asyncio.run(first_delta_then_close())
    deadline = time.monotonic() + 10
    while core.stats().get("requests", 1) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert core.stats()["requests"] == 0


def test_a_core_that_cannot_start_fails_the_start_with_its_reason() -> None:
    with pytest.raises(ModelLoadError, match="no weights under /nowhere"):
        client(broken_engine)


def test_a_killed_core_errors_its_open_streams_turns_health_red_and_restarts() -> None:
    engine = client(slow_fake_engine)
    try:
        first_pid = engine.pid

        async def killed_mid_stream() -> list[StreamDelta]:
            stream = engine.generate("x y", SamplingParams(max_tokens=500, ignore_eos=True))
            deltas = [await anext(stream)]
            engine.kill()
            deltas += [d async for d in stream]
            return deltas

        deltas = asyncio.run(killed_mid_stream())
        assert deltas[-1].finish_reason == "error" and "SIGKILL" in (deltas[-1].error or "")
        assert not engine.health()["alive"] and "SIGKILL" in engine.health()["error"]
        with pytest.raises(EngineDead):
            asyncio.run(collect(engine.generate("x y", GREEDY)))
        assert engine.wait_alive(120)
        assert engine.pid != first_pid
        again = asyncio.run(collect(engine.generate("x y", GREEDY)))
        assert again[-1].finish_reason == "length"
    finally:
        engine.shutdown()


def test_without_restarts_a_dead_core_stays_down_with_its_reason() -> None:
    engine = client(max_restarts=0)
    try:
        engine.kill()
        deadline = time.monotonic() + 10
        while engine.health()["alive"] and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not engine.wait_alive(2)
        assert "failed" in engine.health()["error"]
    finally:
        engine.shutdown()


def test_in_process_layout_serves_through_the_same_interface() -> None:
    engine = start_engine(EngineConfig(device="cpu", engine_in_process=True), engine_factory=fake_engine)
    try:
        deltas = asyncio.run(collect(engine.generate("hello", GREEDY, session_id="sess_1")))
        assert deltas[-1].finish_reason == "length"
    finally:
        engine.shutdown()


def test_behind_the_server_a_dead_core_turns_health_red_errors_sessions_then_recovers() -> None:
    import httpx
    from omni_gateway.gateway.config import GatewayConfig
    from omni_gateway.omni.config import OmniConfig
    from omni_gateway.omni.pipeline import OmniPipeline
    from websockets.asyncio.client import connect
    from websockets.exceptions import ConnectionClosed

    from tests.harness.live_server import serve

    engine = client(slow_fake_engine)
    config = OmniConfig(asr=None, tts=None, vad=False, vision=False)
    pipe = OmniPipeline(config, engine=engine, model_name="fake", max_context_tokens=engine.max_model_len)

    async def scenario(port: int) -> tuple[float, list[dict[str, Any]], int | None]:
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", timeout=30) as http:
            ws = await connect(f"ws://127.0.0.1:{port}/v1/realtime")
            await ws.recv()  # session.created
            assert (await http.get("/health")).status_code == 200
            t0 = time.monotonic()
            engine.kill()
            while (await http.get("/health")).status_code != 503:
                await asyncio.sleep(0.05)
            red_after = time.monotonic() - t0
            events: list[dict[str, Any]] = []
            try:
                while True:
                    events.append(json.loads(await ws.recv()))
            except ConnectionClosed as closed:
                code = closed.rcvd.code if closed.rcvd else None
            assert await asyncio.to_thread(engine.wait_alive, 120)
            assert (await http.get("/health")).status_code == 200
            return red_after, events, code

    try:
        with serve(pipe, GatewayConfig(health_poll_s=0.2)) as port:
            red_after, events, code = asyncio.run(asyncio.wait_for(scenario(port), 180))
    finally:
        pipe.shutdown()
    assert red_after < 5.0
    assert [e["type"] for e in events if e["type"] != "conversation.created"] == ["error"] and code == 1011
