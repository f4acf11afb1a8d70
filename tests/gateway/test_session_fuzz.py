"""Random client event sequences: never an exception, one error per bad event, responses well paired."""

from __future__ import annotations

from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.harness.fake_backend import silence, tone
from tests.harness.session_driver import Driver, b64, events, responses_started

ITEM_IDS = st.sampled_from(["a", "b", "root", "missing"])
JSONISH = st.recursive(
    st.none() | st.booleans() | st.integers(-5, 5000) | st.text(max_size=5),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner, max_size=3),
    max_leaves=6,
)

CLIENT_EVENTS = st.one_of(
    st.builds(
        lambda audio: {"type": "input_audio_buffer.append", "audio": b64(audio)},
        st.sampled_from([tone(120), silence(200), tone(40), b"\x01"]),
    ),
    st.just({"type": "input_audio_buffer.commit"}),
    st.just({"type": "input_audio_buffer.clear"}),
    st.builds(
        lambda i, p: {
            "type": "conversation.item.create",
            "previous_item_id": p,
            "item": {"id": i, "type": "message", "role": "user", "content": [{"type": "input_text", "text": "x"}]},
        },
        st.sampled_from(["a", "b", None]),
        st.sampled_from([None, "a", "root", "missing"]),
    ),
    st.builds(lambda i: {"type": "conversation.item.retrieve", "item_id": i}, ITEM_IDS),
    st.builds(lambda i: {"type": "conversation.item.delete", "item_id": i}, ITEM_IDS),
    st.builds(
        lambda i, ms: {"type": "conversation.item.truncate", "item_id": i, "content_index": 0, "audio_end_ms": ms},
        ITEM_IDS,
        st.integers(-10, 500) | st.floats(0, 10),
    ),
    st.builds(
        lambda conv: {"type": "response.create", "response": {"conversation": conv}},
        st.sampled_from(["auto", "none", "bogus"]),
    ),
    st.just({"type": "response.cancel"}),
    st.builds(
        lambda td: {
            "type": "session.update",
            "session": {"type": "realtime", "audio": {"input": {"turn_detection": td}}},
        },
        st.sampled_from(
            [None, {"type": "server_vad", "silence_duration_ms": 100}, {"type": "semantic_vad"}, {"type": "nope"}]
        ),
    ),
    st.builds(
        lambda t: {"type": "session.update", "session": {"type": "realtime", "truncation": t}},
        st.sampled_from(
            [
                "auto",
                "disabled",
                {"type": "retention_ratio", "retention_ratio": 0.5},
                {"type": "retention_ratio", "retention_ratio": 2},
                "off",
                None,
            ]
        ),
    ),
    st.builds(
        lambda kind, payload: {"type": kind, "session": payload, "item": payload, "response": payload},
        st.sampled_from(["session.update", "conversation.item.create", "response.create", "x.y"]),
        JSONISH,
    ),
    st.builds(lambda rid: {"type": "backend.finish", "which": rid}, st.integers(0, 3)),
)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(CLIENT_EVENTS, max_size=25))
def test_any_event_sequence_keeps_the_session_consistent(sequence: list[dict[str, Any]]) -> None:
    d = Driver()
    running: list[str] = []
    out_events: list[dict[str, Any]] = []
    for event in sequence:
        if event["type"] == "backend.finish":
            if running:
                rid = running.pop(event["which"] % len(running))
                if d.session.build_request(rid) is not None:
                    out_events += events(d.run(rid))
            continue
        outputs = d.send(event)
        running += responses_started(outputs)
        evs = events(outputs)
        out_events += evs
        assert sum(e["type"] == "error" for e in evs) <= 1
    created = [e["response"]["id"] for e in out_events if e["type"] == "response.created"]
    done = [e["response"]["id"] for e in out_events if e["type"] == "response.done"]
    assert len(done) == len(set(done)) and set(done) <= set(created)
    assert set(created) - set(done) == set(d.session.running_responses)
    assert len({it.id for it in d.session.items}) == len(d.session.items)
    done_at = {e["response"]["id"]: i for i, e in enumerate(out_events) if e["type"] == "response.done"}
    for i, e in enumerate(out_events):
        rid = e.get("response_id")
        if rid is not None:  # every delta/part/item event belongs to a created response and precedes its done
            assert rid in created and i < done_at.get(rid, len(out_events))
