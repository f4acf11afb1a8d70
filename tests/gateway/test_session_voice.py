"""A voice the backend does not offer is refused where the client asks for it (session.update, a response's own
voice), with one ``error`` naming the field, the voices served and the one asked for, and nothing changes."""

from __future__ import annotations

from typing import Any

import pytest
from omni_gateway.omni.protocol import Capabilities

from tests.harness.fake_backend import FakeBackend
from tests.harness.session_driver import Driver, events, only, responses_started, started, types

SERVED = "'joe', 'verse'"  # the fake backend's voices, as the error lists them


def rendered_voice(d: Driver) -> str:
    """The session's voice as an empty ``session.update`` echoes it."""
    update = {"type": "realtime"} if d.session.dialect == "ga" else {}
    session = only(d.send({"type": "session.update", "session": update}), "session.updated")["session"]
    voice: str = session["audio"]["output"]["voice"] if d.session.dialect == "ga" else session["voice"]
    return voice


@pytest.mark.parametrize(
    "dialect, session, param",
    [
        ("beta", {"voice": "alloy", "instructions": "Be brief."}, "session.voice"),
        (
            "ga",
            {"type": "realtime", "instructions": "Be brief.", "audio": {"output": {"voice": "alloy"}}},
            "session.audio.output.voice",
        ),
        ("ga", {"type": "realtime", "audio": {"output": {"voice": {"id": "alloy"}}}}, "session.audio.output.voice"),
    ],
)
def test_session_update_with_an_unknown_voice_is_refused_and_changes_nothing(
    dialect: str, session: dict[str, Any], param: str
) -> None:
    d = Driver(dialect)
    before = d.session.settings
    out = d.send({"type": "session.update", "event_id": "evt_voice", "session": session})
    assert types(out) == ["error"]  # no session.updated
    err = events(out)[0]["error"]
    assert (err["type"], err["code"], err["param"], err["event_id"]) == (
        "invalid_request_error",
        "invalid_value",
        param,
        "evt_voice",
    )
    assert f"expected one of {SERVED}, got 'alloy'" in err["message"]
    assert d.session.settings == before  # the update's other fields did not apply either
    assert rendered_voice(d) == "joe"


@pytest.mark.parametrize(
    "dialect, response, param",
    [
        ("beta", {"voice": "alloy"}, "response.voice"),
        ("ga", {"audio": {"output": {"voice": "alloy"}}}, "response.audio.output.voice"),
    ],
)
def test_a_response_asking_for_an_unknown_voice_is_refused_before_it_starts(
    dialect: str, response: dict[str, Any], param: str
) -> None:
    d = Driver(dialect)
    d.text_item()
    out = d.send({"type": "response.create", "event_id": "evt_rc", "response": response})
    assert types(out) == ["error"] and not responses_started(out)  # no response.created, nothing generated
    err = events(out)[0]["error"]
    assert (err["code"], err["param"], err["event_id"]) == ("invalid_value", param, "evt_rc")
    assert f"expected one of {SERVED}, got 'alloy'" in err["message"]
    request = d.session.build_request(started(d.send({"type": "response.create"})))
    assert request is not None and request.audio.voice == "joe"  # the session's voice, unchanged


def test_a_served_voice_is_taken_by_either_dialect() -> None:
    ga, beta = Driver("ga"), Driver("beta")
    ga.send({"type": "session.update", "session": {"type": "realtime", "audio": {"output": {"voice": "verse"}}}})
    beta.send({"type": "session.update", "session": {"voice": "verse"}})
    assert rendered_voice(ga) == rendered_voice(beta) == "verse"


def test_a_backend_that_names_no_voices_takes_any() -> None:
    caps = Capabilities(model="m", input_modalities=frozenset({"text"}), output_modalities=frozenset({"text"}))
    d = Driver("beta", backend=FakeBackend(capabilities=caps))
    assert types(d.send({"type": "session.update", "session": {"voice": "alloy"}})) == ["session.updated"]
    assert rendered_voice(d) == "alloy"
