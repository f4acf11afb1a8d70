"""Routing across engine replicas: pure logic, no processes."""

from __future__ import annotations

import pytest
from omni_gateway.engine.router import NoLiveReplica, Router

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
