"""The realtime outbox: events in order, bounded by count and by bytes, with the time each was queued."""

from __future__ import annotations

import asyncio
import base64
import json

import pytest
from omni_gateway.gateway.realtime.frames import Base64, serialize
from omni_gateway.gateway.realtime.outbox import Outbox


def run(coro: object) -> object:
    return asyncio.run(asyncio.wait_for(coro, 5))  # type: ignore[arg-type]


def test_serialize_counts_utf8_bytes_and_escapes_lone_surrogates() -> None:
    text, size = serialize({"t": "héllo"})
    assert json.loads(text) == {"t": "héllo"} and size == len(text.encode()) == len(text) + 1
    text, size = serialize({"t": "\ud800"})
    assert text == '{"t":"\\ud800"}' and size == len(text)


@pytest.mark.parametrize(
    "head",
    [{}, {"type": "response.output_audio.delta", "output_index": 0}, {"t": "héllo"}, {"t": "\ud800"}],
)
def test_a_base64_value_ending_an_event_is_framed_as_json_would_write_it(head: dict[str, object]) -> None:
    delta = Base64.of(bytes(range(256)) * 3)
    text, size = serialize({**head, "delta": delta})
    assert text == serialize({**head, "delta": str(delta)})[0] and size == len(text.encode("utf-8", "surrogatepass"))
    assert json.loads(text) == {**head, "delta": base64.b64encode(bytes(range(256)) * 3).decode()}


def test_a_base64_value_elsewhere_is_encoded_as_any_string() -> None:
    event = {"audio": Base64.of(b"\x00\xff"), "i": 1}
    assert serialize(event)[0] == '{"audio":"AP8=","i":1}'


def test_events_leave_in_order_with_their_queue_time_and_the_end_stops_the_writer() -> None:
    async def go() -> list[object]:
        box = Outbox(max_events=8, max_bytes=1 << 20)
        for i in range(3):
            box.put({"i": i})
        box.end()
        got = [await box.get() for _ in range(4)]
        assert box.bytes == 0 and len(box) == 0
        return got

    got = run(go())
    assert [json.loads(item[0])["i"] for item in got[:3]] == [0, 1, 2]  # type: ignore[index]
    assert got[0][1] <= got[1][1] <= got[2][1] and got[3] is None  # type: ignore[index]


def test_over_the_event_bound_producers_wait_until_half_has_drained() -> None:
    async def go() -> None:
        box = Outbox(max_events=4, max_bytes=1 << 20)
        for i in range(5):
            box.put({"i": i})
        assert box.over_bound
        space = asyncio.ensure_future(box.space())
        await box.get()
        await box.get()
        await asyncio.sleep(0)
        assert not space.done()  # 3 left: under the bound, not yet down to half
        await box.get()
        await asyncio.wait_for(space, 1)
        assert not box.over_bound

    run(go())


def test_over_the_byte_bound_producers_wait_too() -> None:
    async def go() -> None:
        box = Outbox(max_events=100, max_bytes=1000)
        box.put({"audio": "x" * 600})
        assert not box.over_bound
        box.put({"audio": "y" * 600})
        assert box.over_bound and box.bytes > 1000
        space = asyncio.ensure_future(box.space())
        await box.get()
        await asyncio.sleep(0)
        assert not space.done()  # 600-odd bytes left: more than half the bound
        await box.get()
        await asyncio.wait_for(space, 1)

    run(go())


def test_one_event_larger_than_the_byte_bound_is_not_a_slow_client() -> None:
    async def go() -> None:
        box = Outbox(max_events=100, max_bytes=1000)
        box.put({"audio": "x" * 5000})
        assert not box.over_bound
        await asyncio.wait_for(box.space(), 1)
        box.put({"type": "next"})
        assert box.over_bound  # something waits behind it now

    run(go())
