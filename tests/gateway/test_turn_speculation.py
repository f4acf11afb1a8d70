"""TurnSpeculation on its own: which commands each step of a speculated turn yields."""
from __future__ import annotations

from omni_gateway.gateway.realtime.commands import AdoptSpeculation, DropSpeculation, Prepare, Speculate, Transcribe
from omni_gateway.gateway.realtime.items import Content, Item
from omni_gateway.gateway.realtime.speculation import TurnSpeculation
from omni_gateway.omni.protocol import Message, OmniRequest, TextPart


def job(item_id: str = "item_1", pcm: bytes = b"\x01\x00" * 800) -> Transcribe:
    return Transcribe(item_id, pcm, 16000)


def request(text: str) -> OmniRequest:
    return OmniRequest("resp_1", (Message("user", (TextPart(text),)),))


def heard(item_id: str = "item_1") -> Item:
    return Item(item_id, "message", role="user", content=[Content("input_audio", audio=b"", transcript="hi")])


def test_the_commit_of_the_pause_adopts_its_speculation_and_keeps_the_prepared_reply() -> None:
    spec = TurnSpeculation()
    assert spec.begin(4800, job()) == [Speculate(job())]
    assert spec.is_current(job())
    assert spec.prepare("resp_1", heard(), request("hi")) == [Prepare("item_1", request("hi"))]
    # The committed audio may run past the pause; the speculation is adopted by its pause offset.
    longer = job(pcm=b"\x01\x00" * 1200)
    assert spec.commit(longer, pause_at=4800) == [AdoptSpeculation(longer)]
    assert not spec.is_current(job())
    prepared, dropped = spec.take(lambda p: request("hi"))
    assert prepared is not None and prepared.response_id == "resp_1" and dropped == []
    assert spec.take(lambda p: request("hi")) == (None, [])  # taken once


def test_a_commit_at_another_pause_drops_the_speculation_and_its_reply_and_transcribes_afresh() -> None:
    spec = TurnSpeculation()
    spec.begin(4800, job())
    spec.prepare("resp_1", heard(), request("hi"))
    assert spec.commit(job(), pause_at=9600) == [DropSpeculation("item_1"), job()]
    assert spec.take(lambda p: request("hi")) == (None, [])
    assert TurnSpeculation().commit(job(), pause_at=None) == [job()]  # a manual commit, nothing speculated


def test_a_new_pause_replaces_the_old_speculation_and_drop_clears_everything() -> None:
    spec = TurnSpeculation()
    spec.begin(4800, job())
    assert spec.begin(9600, job("item_1", b"\x02\x00" * 900)) == [DropSpeculation("item_1"),
                                                                   Speculate(job("item_1", b"\x02\x00" * 900))]
    assert not spec.is_current(job())
    assert spec.drop() == [DropSpeculation("item_1")]
    assert spec.drop() == []


def test_a_response_whose_request_differs_from_the_prepared_one_discards_it() -> None:
    spec = TurnSpeculation()
    spec.begin(4800, job())
    spec.prepare("resp_1", heard(), request("hi"))
    # Still pausing: a response created now is not the turn's, and the reply stays prepared.
    assert spec.take(lambda p: request("hi")) == (None, [])
    spec.commit(job(), pause_at=4800)
    assert spec.take(lambda p: request("something else")) == (None, [DropSpeculation("item_1")])
