"""Routing across engine replicas: the router's pure logic, and ``ReplicatedEngine`` over fake replicas."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import pytest
from omni_gateway.engine.config import EngineConfig
from omni_gateway.engine.errors import EngineDead
from omni_gateway.engine.frontend.replicas import ReplicatedEngine
from omni_gateway.engine.frontend.router import NoLiveReplica, Router
from omni_gateway.engine.outputs import StreamDelta

UP2 = [True, True]


def test_new_sessions_spread_and_each_stays_on_its_replica() -> None:
    router = Router(2)
    first = router.route(alive=UP2, open_requests=[0, 0], session_id="s1")
    second = router.route(alive=UP2, open_requests=[0, 0], session_id="s2")
    assert {first, second} == {0, 1}
    for _ in range(5):  # the replica under a session gets busier: the session stays anyway
        busy = [9, 0] if first == 0 else [0, 9]
        assert router.route(alive=UP2, open_requests=busy, session_id="s1") == first


def test_a_new_session_goes_to_the_least_loaded_replica() -> None:
    router = Router(3)
    assert router.route(alive=[True] * 3, open_requests=[5, 1, 3], session_id="s") == 1


def test_pinned_sessions_count_as_load() -> None:
    router = Router(2)
    router.route(alive=UP2, open_requests=[0, 0], session_id="a")
    router.route(alive=UP2, open_requests=[0, 0], session_id="b")
    router.route(alive=UP2, open_requests=[0, 0], session_id="c")
    fourth = router.route(alive=UP2, open_requests=[0, 0], session_id="d")
    counts = [sum(1 for s in "abcd" if router.session_replica(s) == i) for i in range(2)]
    assert counts == [2, 2] and fourth in (0, 1)


def test_a_session_whose_replica_died_moves_to_a_survivor() -> None:
    router = Router(2)
    home = router.route(alive=UP2, open_requests=[0, 0], session_id="s")
    alive = [i != home for i in range(2)]
    moved = router.route(alive=alive, open_requests=[0, 0], session_id="s")
    assert moved != home
    assert router.route(alive=UP2, open_requests=[0, 0], session_id="s") == moved  # stays after the restart


def test_new_work_avoids_dead_replicas() -> None:
    router = Router(3)
    for k in range(6):
        assert router.route(alive=[True, False, True], open_requests=[0, 0, 0], session_id=f"s{k}") != 1
        assert router.route(alive=[True, False, True], open_requests=[0, 0, 0], prompt=[k] * 64) != 1


def test_no_live_replica_is_an_error() -> None:
    with pytest.raises(NoLiveReplica):
        Router(2).route(alive=[False, False], open_requests=[0, 0], session_id="s")


def test_requests_with_the_same_prefix_go_where_it_is_cached() -> None:
    router = Router(4, block_size=16, prefix_blocks=2)
    system = list(range(100, 132))  # two full blocks shared by every request
    home = router.route(alive=[True] * 4, open_requests=[0] * 4, prompt=[*system, 1, 2, 3])
    loads = [1, 1, 1, 1]
    for tail in range(10):
        assert router.route(alive=[True] * 4, open_requests=loads, prompt=[*system, tail]) == home


def test_prefix_affinity_yields_to_a_much_less_loaded_replica() -> None:
    router = Router(2, block_size=16, slack=2)
    prompt = list(range(64))
    home = router.route(alive=UP2, open_requests=[0, 0], prompt=prompt)
    overloaded = [10, 0] if home == 0 else [0, 10]
    moved = router.route(alive=UP2, open_requests=overloaded, prompt=prompt)
    assert moved != home
    assert router.route(alive=UP2, open_requests=[0, 0], prompt=prompt) == moved  # the prefix moved with it


def test_different_prefixes_spread() -> None:
    router = Router(2, block_size=16)
    picks = {router.route(alive=UP2, open_requests=[0, 0], prompt=[k] * 32) for k in range(4)}
    assert picks == {0, 1}


def test_short_prompts_have_no_prefix_and_go_to_the_least_loaded() -> None:
    router = Router(2, block_size=16)
    assert router.prefix_key([1, 2, 3]) is None
    assert router.route(alive=UP2, open_requests=[4, 1], prompt=[1, 2, 3]) == 1


def test_text_prompts_hash_their_leading_characters() -> None:
    router = Router(2, block_size=4, prefix_blocks=2)
    assert router.prefix_key("abcdefgh-one") == router.prefix_key("abcdefgh-two")
    assert router.prefix_key("abcdefgh") != router.prefix_key("abcdefgX")


def test_tables_are_bounded_and_forgetting_releases_the_load() -> None:
    router = Router(2, capacity=3)
    for k in range(10):
        router.route(alive=UP2, open_requests=[0, 0], session_id=f"s{k}")
    assert router.session_replica("s0") is None and router.session_replica("s9") is not None
    for k in (7, 8, 9):
        router.forget_session(f"s{k}")
    assert router.route(alive=UP2, open_requests=[0, 3], session_id="new") == 0


def test_states_of_the_wrong_length_are_refused() -> None:
    with pytest.raises(ValueError, match="expected 2 replica states"):
        Router(2).route(alive=[True], open_requests=[0, 0])


def test_process_layout_flags_are_checked() -> None:
    with pytest.raises(ValueError, match="data_parallel_size must be >= 1"):
        EngineConfig(data_parallel_size=0)
    with pytest.raises(ValueError, match="'mp' or 'ray'"):
        EngineConfig(distributed_executor_backend="slurm")
    with pytest.raises(ValueError, match="engine_in_process"):
        EngineConfig(engine_in_process=True, data_parallel_size=2)


class FakeReplica:
    """What ``ReplicatedEngine`` reads of an ``EngineCoreClient``."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.alive = True
        self.num_open_streams = 0
        self.aborted: list[str] = []

    async def generate(self, prompt: Any, params: Any = None, **kwargs: Any) -> AsyncIterator[StreamDelta]:
        self.num_open_streams += 1
        try:
            yield StreamDelta(kwargs["request_id"], self.name, (1,), finished=True, finish_reason="length")
        finally:
            self.num_open_streams -= 1

    def abort(self, request_id: str) -> None:
        self.aborted.append(request_id)

    def health(self) -> dict[str, Any]:
        return {"alive": self.alive, "error": None if self.alive else "killed", "open_streams": 0}

    def stats(self) -> dict[str, float]:
        return {"running": 1.0, "kv_waste_fraction": 0.2 if self.name == "a" else 0.4}


async def answer(engine: ReplicatedEngine, session_id: str | None, prompt: Any = (1, 2)) -> str:
    deltas = [d async for d in engine.generate(list(prompt), request_id="r", session_id=session_id)]
    return deltas[0].text


def test_replicated_engine_keeps_sessions_and_skips_dead_replicas() -> None:
    a, b = FakeReplica("a"), FakeReplica("b")
    engine = ReplicatedEngine([a, b])  # type: ignore[list-item]
    first = asyncio.run(answer(engine, "s1"))
    assert {asyncio.run(answer(engine, "s1")) for _ in range(3)} == {first}
    (a if first == "a" else b).alive = False
    assert asyncio.run(answer(engine, "s1")) != first  # its replica died: the next turn goes to the survivor
    health = engine.health()
    assert health["alive"] and health["replicas_alive"] == 1 and "killed" in health["error"]
    assert engine.stats()["running"] == 2.0 and abs(engine.stats()["kv_waste_fraction"] - 0.3) < 1e-9
    a.alive = b.alive = False
    with pytest.raises(EngineDead, match="no engine replica is running"):
        asyncio.run(answer(engine, "s2"))
    assert not engine.health()["alive"]


def test_an_abort_reaches_the_replica_that_streams_the_request() -> None:
    a, b = FakeReplica("a"), FakeReplica("b")
    engine = ReplicatedEngine([a, b])  # type: ignore[list-item]

    async def abort_mid_stream() -> str:
        stream = engine.generate([1], request_id="r9", session_id="s")
        delta = await anext(stream)
        engine.abort("r9")
        await stream.aclose()
        return delta.text

    home = asyncio.run(abort_mid_stream())
    assert (a if home == "a" else b).aborted == ["r9"] and (b if home == "a" else a).aborted == []


def test_an_idle_session_keeps_its_replica_but_stops_weighing_on_it() -> None:
    now = [0.0]
    router = Router(2, active_s=60, clock=lambda: now[0])
    home = router.route(alive=UP2, open_requests=[0, 0], session_id="idle")
    other = 1 - home
    now[0] = 30.0  # still active: the next session goes to the other replica
    assert router.route(alive=UP2, open_requests=[0, 0], session_id="second") == other
    now[0] = 200.0  # both idle: neither weighs, ties rotate
    busy = [0, 0]
    busy[other] = 1
    assert router.route(alive=UP2, open_requests=busy, session_id="third") == home
    assert router.route(alive=UP2, open_requests=[0, 0], session_id="idle") == home  # it comes back home
