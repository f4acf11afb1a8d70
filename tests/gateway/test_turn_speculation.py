"""TurnSpeculation on its own: which tasks each step of a speculated turn starts or cancels."""

from __future__ import annotations

from omni_gateway.gateway.realtime.commands import CancelTask, Generate, StartTask, Transcribe
from omni_gateway.gateway.realtime.items import Content, Item
from omni_gateway.gateway.realtime.speculation import TurnSpeculation
from omni_gateway.omni.protocol import Message, OmniRequest, TextDelta, TextPart, Transcription


def job(item_id: str = "item_1", pcm: bytes = b"\x01\x00" * 800) -> Transcribe:
    return Transcribe(item_id, pcm, 16000)


def request(text: str) -> OmniRequest:
    return OmniRequest("resp_1", (Message("user", (TextPart(text),)),))


def heard(item_id: str = "item_1") -> Item:
    return Item(item_id, "message", role="user", content=[Content("input_audio", audio=b"", transcript="hi")])


def test_the_commit_of_the_pause_adopts_its_speculation_and_keeps_the_prepared_reply() -> None:
    spec = TurnSpeculation()
    assert spec.begin(4800, job()) == [StartTask("item_1", job())]
    assert spec.hold("item_1", Transcription("hi")) == job()
    assert spec.prepare(heard(), Generate(request("hi"))) == [StartTask("resp_1", Generate(request("hi")))]
    assert spec.prepared("resp_1") is not None and spec.prepared("resp_2") is None
    # The committed audio may run past the pause; the speculation is adopted by its pause offset.
    assert spec.commit(job(pcm=b"\x01\x00" * 1200), pause_at=4800) == ([], Transcription("hi"))
    prepared, dropped = spec.take(lambda p: request("hi"))
    assert prepared is not None and prepared.response_id == "resp_1" and dropped == []
    assert spec.take(lambda p: request("hi")) == (None, [])  # taken once
    assert spec.prepared("resp_1") is None


def test_a_commit_before_the_transcript_is_in_lets_the_task_run_on_as_the_turns() -> None:
    spec = TurnSpeculation()
    spec.begin(4800, job())
    longer = job(pcm=b"\x01\x00" * 1200)
    assert spec.commit(longer, pause_at=4800) == ([], None)
    assert spec.hold("item_1", Transcription("hi")) is None  # the turn's transcript: reported, not held
    spec.begin(9600, job("item_2"))
    assert spec.commit(job("item_2", b"\x03\x00" * 1200), pause_at=9600) == ([], None)
    # Failing, the adopted speculation gives way to a transcription of the committed audio.
    assert spec.failed("item_2") == [StartTask("item_2", job("item_2", b"\x03\x00" * 1200))]
    assert spec.failed("item_2") is None  # a committed turn's own failure: the session reports it


def test_a_speculation_that_failed_in_the_pause_is_redone_by_the_commit() -> None:
    spec = TurnSpeculation()
    spec.begin(4800, job())
    assert spec.failed("item_1") == []
    assert spec.drop() == []  # nothing runs any more
    spec.begin(4800, job())
    spec.failed("item_1")
    assert spec.commit(job(), pause_at=4800) == ([StartTask("item_1", job())], None)


def test_a_commit_at_another_pause_drops_the_speculation_and_its_reply_and_transcribes_afresh() -> None:
    spec = TurnSpeculation()
    spec.begin(4800, job())
    spec.hold("item_1", Transcription("hi"))
    spec.prepare(heard(), Generate(request("hi")))
    assert spec.commit(job(), pause_at=9600) == ([CancelTask("resp_1"), StartTask("item_1", job())], None)
    assert spec.take(lambda p: request("hi")) == (None, [])
    assert TurnSpeculation().commit(job(), pause_at=None) == ([StartTask("item_1", job())], None)  # manual commit
    spec.begin(4800, job())
    assert spec.commit(job(), pause_at=None) == ([CancelTask("item_1"), StartTask("item_1", job())], None)


def test_a_new_pause_replaces_the_old_speculation_and_drop_clears_everything() -> None:
    spec = TurnSpeculation()
    spec.begin(4800, job())
    other = job("item_1", b"\x02\x00" * 900)
    assert spec.begin(9600, other) == [CancelTask("item_1"), StartTask("item_1", other)]
    assert spec.drop() == [CancelTask("item_1")]
    assert spec.drop() == []


def test_the_prepared_reply_holds_until_taken_and_an_ended_one_needs_no_cancel() -> None:
    spec = TurnSpeculation()
    spec.begin(4800, job())
    spec.hold("item_1", Transcription("hi"))
    spec.prepare(heard(), Generate(request("hi")))
    held = spec.prepared("resp_1")
    assert held is not None
    held.held.append(TextDelta("Hello"))
    held.ended = True
    assert spec.drop() == []  # its generation is over: nothing to cancel
    assert spec.prepared("resp_1") is None


def test_a_response_whose_request_differs_from_the_prepared_one_discards_it() -> None:
    spec = TurnSpeculation()
    spec.begin(4800, job())
    spec.hold("item_1", Transcription("hi"))
    spec.prepare(heard(), Generate(request("hi")))
    # Still pausing: a response created now is not the turn's, and the reply stays prepared.
    assert spec.take(lambda p: request("hi")) == (None, [])
    spec.commit(job(), pause_at=4800)
    assert spec.take(lambda p: request("something else")) == (None, [CancelTask("resp_1")])
