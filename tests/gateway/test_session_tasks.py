"""The rules the session applies to its tasks and to the connection's conditions, without a socket: a
response's generation starts once its transcripts are in (or their deadline passed), the per-session
response cap, the prompt window, and the events and closes for expiry, a stopped backend, a failure
inside the session and a client that stopped reading."""

from __future__ import annotations

from typing import Any

from omni_gateway.gateway.errors import SERVER_ERROR
from omni_gateway.gateway.realtime.commands import AsrDeadline, Close, Output, SessionLimits, StartTask
from omni_gateway.gateway.realtime.truncation import Truncation
from omni_gateway.omni.protocol import Error, Message, TextDelta, TextPart, Transcription

from tests.harness.fake_backend import tone
from tests.harness.session_driver import (
    Driver,
    b64,
    cancelled,
    error,
    events,
    generations,
    only,
    started,
    transcribes,
    types,
)


def out_of_band(text: str = "hi") -> dict[str, Any]:
    return {
        "type": "response.create",
        "response": {
            "conversation": "none",
            "input": [{"type": "message", "role": "user", "content": [{"type": "input_text", "text": text}]}],
        },
    }


def deadlines(outputs: list[Output]) -> list[AsrDeadline]:
    return [o.work for o in outputs if isinstance(o, StartTask) and isinstance(o.work, AsrDeadline)]


def closes(outputs: list[Output]) -> list[Close]:
    return [o for o in outputs if isinstance(o, Close)]


def committed_turn(d: Driver) -> str:
    """A manual turn committed, its transcription under way: its item id."""
    d.send({"type": "session.update", "session": {"type": "realtime", "audio": {"input": {"turn_detection": None}}}})
    d.send({"type": "input_audio_buffer.append", "audio": b64(tone(200))})
    (job,) = transcribes(d.send({"type": "input_audio_buffer.commit"}))
    return job.item_id


# ---- inputs ready ------------------------------------------------------------------------------
def test_a_response_waits_for_its_transcripts_under_a_deadline_and_starts_when_they_land() -> None:
    d = Driver(limits=SessionLimits(asr_timeout_s=7.5))
    item_id = committed_turn(d)
    out = d.send({"type": "response.create"})
    rid = started(out)
    assert types(out) == ["response.created"] and not generations(out)
    assert deadlines(out) == [AsrDeadline(rid, 7.5)]
    out = d.session.on_transcription(item_id, Transcription("the question"))
    assert cancelled(out) == [rid + ":asr"]  # the deadline is no longer needed
    (generation,) = generations(out)
    assert generation.request.request_id == rid
    assert generation.request.messages[-1].parts[0].transcript == "the question"
    assert d.session.on_asr_timeout(rid) == []  # a deadline that fires late changes nothing


def test_a_failed_transcript_also_lets_the_waiting_response_start() -> None:
    d = Driver()
    item_id = committed_turn(d)
    rid = started(d.send({"type": "response.create"}))
    (generation,) = generations(d.session.on_transcription_failed(item_id, "Transcription failed."))
    assert generation.request.request_id == rid and generation.request.messages[-1].parts[0].transcript is None


def test_at_the_asr_deadline_the_response_goes_ahead_with_the_audio_as_it_is() -> None:
    d = Driver()
    item_id = committed_turn(d)
    rid = started(d.send({"type": "response.create"}))
    (generation,) = generations(d.session.on_asr_timeout(rid))
    part = generation.request.messages[-1].parts[0]
    assert part.transcript is None and part.pcm16 == tone(200)
    assert not generations(d.session.on_transcription(item_id, Transcription("late")))  # starts nothing again
    item = d.session.items.get(item_id)
    assert item is not None and item.content[0].transcript == "late"  # kept for the turns that follow


def test_a_response_cancelled_while_waiting_stops_its_deadline_and_never_generates() -> None:
    d = Driver()
    item_id = committed_turn(d)
    rid = started(d.send({"type": "response.create"}))
    out = d.send({"type": "response.cancel"})
    assert set(cancelled(out)) == {rid, rid + ":asr"}
    assert only(out, "response.done")["response"]["status"] == "cancelled"
    assert not generations(d.session.on_transcription(item_id, Transcription("hello")))


def test_responses_waiting_on_the_same_turn_all_start_when_it_is_transcribed() -> None:
    d = Driver()
    item_id = committed_turn(d)
    first = started(d.send({"type": "response.create"}))
    second = started(d.send({"type": "response.create", "response": {"conversation": "none"}}))
    out = d.session.on_transcription(item_id, Transcription("both"))
    assert [g.request.request_id for g in generations(out)] == [first, second]


# ---- the response cap -------------------------------------------------------------------------
def test_responses_over_the_cap_fail_at_once_with_rate_limit_exceeded() -> None:
    d = Driver(limits=SessionLimits(max_responses=2))
    running = [started(d.send(out_of_band())) for _ in range(2)]
    out = d.send(out_of_band())
    assert types(out) == ["response.created", "error", "response.done"] and not generations(out)
    assert error(out)["code"] == "rate_limit_exceeded" and "2 responses" in error(out)["message"]
    done = only(out, "response.done")["response"]
    assert done["status"] == "failed" and done["status_details"]["error"]["code"] == "rate_limit_exceeded"
    assert d.session.running_responses == tuple(running)
    d.run(running[0])
    assert generations(d.send(out_of_band()))  # room again once one finished


# ---- the prompt window ---------------------------------------------------------------------------
def test_the_session_owns_the_prompt_window_and_each_generation_starts_from_the_last_cut() -> None:
    d = Driver(count_tokens=True)
    d.text_mode()
    d.text_item("first")
    (generation,) = generations(d.send({"type": "response.create"}))
    fit = generation.fit
    assert fit is not None and fit.previous_cut == () and fit.truncation == Truncation()
    assert fit.context_tokens == d.backend.capabilities.max_context_tokens
    assert fit.count(generation.request.messages) == d.backend.count_tokens(generation.request.messages)
    cut = (Message("user", (TextPart("first"),)),)
    assert d.session.on_prompt_fitted(generation.request.request_id, cut) == []
    d.run(generation.request.request_id)
    (generation,) = generations(d.send({"type": "response.create"}))
    assert generation.fit is not None and generation.fit.previous_cut == cut


def test_prompts_go_out_uncut_without_a_counter_or_with_truncation_disabled() -> None:
    d = Driver()
    d.text_item()
    (generation,) = generations(d.send({"type": "response.create"}))
    assert generation.fit is None
    d = Driver(count_tokens=True)
    d.send({"type": "session.update", "session": {"type": "realtime", "truncation": "disabled"}})
    d.text_item()
    (generation,) = generations(d.send({"type": "response.create"}))
    assert generation.fit is None


# ---- backend output ------------------------------------------------------------------------------
def test_a_server_side_backend_error_reaches_the_client_sanitized() -> None:
    d = Driver()
    d.text_mode()
    d.text_item()
    rid = started(d.send({"type": "response.create"}))
    out = d.session.on_chunk(rid, Error("engine_crashed", "CUDA error at 0x7f3a in /opt/secret/model.py", 500))
    assert error(out) == {
        "type": "server_error",
        "code": "engine_crashed",
        "message": SERVER_ERROR,
        "param": None,
        "event_id": None,
    }
    d.session.on_chunk(rid, TextDelta("ignored"))
    assert d.session.running_responses == ()


# ---- the connection's conditions ---------------------------------------------------------------------
def test_expiry_says_why_and_closes_with_1001() -> None:
    d = Driver(limits=SessionLimits(session_seconds=1800))
    out = d.session.on_expired()
    err = error(out)
    assert err["code"] == "session_expired" and err["type"] == "invalid_request_error"
    assert err["message"] == "Your session hit the maximum duration of 30 minutes."
    assert closes(out) == [Close(1001, err["message"])] and out[-1] == closes(out)[0]


def test_a_stopped_backend_ends_the_session_with_server_unavailable_and_1011() -> None:
    d = Driver()
    out = d.session.on_backend_stopped()
    assert error(out)["code"] == "server_unavailable" and error(out)["type"] == "server_error"
    assert closes(out) == [Close(1011, "model backend stopped")]


def test_a_failure_inside_the_session_is_one_server_error_and_changes_nothing() -> None:
    d = Driver()
    d.backend.vad_enabled = False  # the detector factory now raises what no client input explains
    out = d.send(
        {
            "type": "session.update",
            "event_id": "e1",
            "session": {
                "type": "realtime",
                "audio": {"input": {"turn_detection": {"type": "server_vad", "silence_duration_ms": 900}}},
            },
        }
    )
    assert types(out) == ["error"] and error(out)["type"] == "server_error" and error(out)["message"] == SERVER_ERROR
    turn = d.session.settings.turn_detection
    assert turn is not None and turn.silence_duration_ms != 900
    assert types(d.send({"type": "input_audio_buffer.clear"})) == ["input_audio_buffer.cleared"]


def test_a_client_that_stopped_reading_gets_no_more_generation() -> None:
    d = Driver()
    d.text_mode()
    d.text_item()
    active = started(d.send({"type": "response.create"}))
    item_id = committed_turn(d)
    waiting = started(d.send({"type": "response.create", "response": {"conversation": "none"}}))
    d.session.on_chunk(active, TextDelta("partial"))
    out = d.session.on_client_stalled()
    assert set(cancelled(out)) == {active, waiting, waiting + ":asr"}
    done = [e["response"] for e in events(out) if e["type"] == "response.done"]
    assert [r["id"] for r in done] == [active, waiting]
    assert all(r["status"] == "failed" and r["status_details"]["error"]["code"] == "client_not_reading" for r in done)
    assert d.session.running_responses == ()
    assert not generations(d.session.on_transcription(item_id, Transcription("late")))
    out = d.send({"type": "response.create"})  # nothing is generated while it still does not read
    assert not generations(out)
    assert only(out, "response.done")["response"]["status_details"]["error"]["code"] == "client_not_reading"
    assert d.session.on_client_reading() == []
    assert generations(d.send({"type": "response.create"}))  # a client reading again is served again
