"""What a session tells its voice observer: a detector's turn, the response answering it, each audio delta as it
is emitted and the response's end, on the session's own clock; and what ``VoiceTiming`` makes of it."""

from __future__ import annotations

from typing import Any

import pytest
from omni_gateway.gateway.realtime.voice_timing import VoiceTiming
from omni_gateway.omni.protocol import AudioChunk, Done, Transcription

from tests.gateway.test_voice_timing import Sink
from tests.harness.fake_backend import silence, tone
from tests.harness.session_driver import Driver, b64, events, started, transcribes, types


class Recorder:
    """A voice observer that keeps its calls."""

    def __init__(self) -> None:
        self.calls: list[tuple[Any, ...]] = []

    def turn_committed(self, item_id: str, detection: str, pause_ms: float | None, stop_ms: float, now: float) -> None:
        self.calls.append(("turn", item_id, detection, pause_ms, stop_ms, now))

    def response_created(self, response_id: str, item_id: str) -> None:
        self.calls.append(("created", response_id, item_id))

    def audio_delta(self, response_id: str, duration_s: float, now: float) -> None:
        self.calls.append(("audio", response_id, pytest.approx(duration_s), now))

    def response_done(self, response_id: str, heard: bool = True) -> None:
        self.calls.append(("done", response_id) if heard else ("unheard", response_id))


class Both:
    """Records the calls and passes them on to a ``VoiceTiming``."""

    def __init__(self, recorder: Recorder, timing: VoiceTiming) -> None:
        self._parts = (recorder, timing)

    def __getattr__(self, name: str) -> Any:
        return lambda *args, **kwargs: [getattr(part, name)(*args, **kwargs) for part in self._parts]


def voice_turn(output_format: str = "audio/pcm") -> tuple[Driver, Recorder, Sink, list[float], str, str]:
    """A server_vad turn (speech until 900 ms, stopped 200 ms of silence later) committed at t=100.3, its
    transcript in; returns the driver, the observer's record, the sink, the clock, the turn and its response."""
    clock = [100.0]
    recorder, sink = Recorder(), Sink()
    d = Driver(now=lambda: clock[0], voice=Both(recorder, VoiceTiming(sink)))  # type: ignore[arg-type]
    turn_detection = {"type": "server_vad", "prefix_padding_ms": 100, "silence_duration_ms": 200}
    d.send(
        {
            "type": "session.update",
            "session": {
                "type": "realtime",
                "audio": {"input": {"turn_detection": turn_detection}, "output": {"format": {"type": output_format}}},
            },
        }
    )
    d.send({"type": "input_audio_buffer.append", "audio": b64(silence(500) + tone(400))})
    clock[0] = 100.3
    out = d.send({"type": "input_audio_buffer.append", "audio": b64(silence(300))})
    item_id = events(out)[0]["item_id"]
    response_id = started(out)
    (job,) = transcribes(out)
    d.session.on_transcription(job.item_id, Transcription("the question"))
    return d, recorder, sink, clock, item_id, response_id


def test_a_server_vad_turn_with_a_spoken_reply_reaches_the_observer() -> None:
    d, recorder, sink, clock, item_id, rid = voice_turn()
    assert recorder.calls == [("turn", item_id, "server_vad", 900.0, 1100, 100.3), ("created", rid, item_id)]
    for at in (100.5, 100.55, 100.8):
        clock[0] = at
        d.session.on_chunk(rid, AudioChunk(tone(100), 24000, "word"))
    clock[0] = 100.9
    d.session.on_chunk(rid, Done("stop"))
    out = d.session.on_stream_end(rid)
    assert types(out)[-1] == "response.done"
    assert recorder.calls[2:] == [
        ("audio", rid, 0.1, 100.5),
        ("audio", rid, 0.1, 100.55),
        ("audio", rid, 0.1, 100.8),
        ("done", rid),
    ]
    # the speech ended at 100.3 - 0.2 s of silence the detector waited out
    assert sink.decisions == [("server_vad", pytest.approx(0.2))]
    assert sink.first_audio_s == [pytest.approx(0.4)]
    # played from 100.5: dry from 100.7 to 100.8
    [played] = sink.playbacks
    assert played.underruns == 1
    assert played.longest_gap_s == pytest.approx(0.1)
    assert played.rtf == pytest.approx(0.3 / 0.3)


def test_g711_deltas_are_timed_by_their_own_rate() -> None:
    d, recorder, _, clock, _, rid = voice_turn("audio/pcmu")
    d.session.on_chunk(rid, AudioChunk(tone(250), 24000, "word"))
    assert recorder.calls[-1] == ("audio", rid, 0.25, 100.3)


def test_a_barged_in_response_is_done_for_the_observer_too() -> None:
    d, recorder, sink, clock, _, rid = voice_turn()
    clock[0] = 100.5
    d.session.on_chunk(rid, AudioChunk(tone(100), 24000, "word"))
    clock[0] = 101.0
    out = d.send({"type": "input_audio_buffer.append", "audio": b64(tone(200))})  # the user speaks again
    assert "cancelled" in [e["response"]["status"] for e in events(out) if e["type"] == "response.done"]
    assert recorder.calls[-1] == ("done", rid)
    assert [p.audio_s for p in sink.playbacks] == [pytest.approx(0.1)]


def test_a_reply_to_a_client_that_stopped_reading_is_not_counted_as_the_servers_pace() -> None:
    """Its audio went out at the client's pace: it reaches neither the playback series nor admission's window."""
    d, recorder, sink, clock, item_id, rid = voice_turn()
    for at in (100.5, 103.0):  # the second delta waited for a client that did not read
        clock[0] = at
        d.session.on_chunk(rid, AudioChunk(tone(100), 24000, "word"))
    d.session.on_client_stalled()
    assert ("unheard", rid) in recorder.calls and sink.playbacks == []
