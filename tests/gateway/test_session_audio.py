"""Input audio: buffer, commit, G.711, server VAD turns, barge-in, truncation, transcription events."""

from __future__ import annotations

import base64

import numpy as np
import pytest
from omni_gateway.gateway.realtime import g711
from omni_gateway.omni.protocol import AudioChunk, Done, Transcription

from tests.harness.fake_backend import silence, tone
from tests.harness.session_driver import (
    Driver,
    b64,
    cancelled,
    error,
    events,
    generations,
    only,
    responses_started,
    started,
    transcribes,
    types,
)


def manual(d: Driver, **audio_input: object) -> None:
    d.send(
        {
            "type": "session.update",
            "session": {"type": "realtime", "audio": {"input": {"turn_detection": None, **audio_input}}},
        }
    )


def test_commit_creates_a_user_audio_item_and_asks_for_asr() -> None:
    d = Driver()
    manual(d)
    d.text_item(id="before")
    assert d.send({"type": "input_audio_buffer.append", "audio": b64(tone(150))}) == []  # no ack, as OpenAI
    out = d.send({"type": "input_audio_buffer.commit"})
    assert types(out) == ["input_audio_buffer.committed", "conversation.item.added", "conversation.item.done"]
    committed = events(out)[0]
    assert committed["previous_item_id"] == "before"
    item = events(out)[1]["item"]
    assert item["id"] == committed["item_id"] and item["role"] == "user"
    assert item["content"] == [{"type": "input_audio", "transcript": None}]
    (job,) = transcribes(out)
    assert job.item_id == committed["item_id"] and job.pcm16 == tone(150) and job.sample_rate == 24000
    assert "response.created" not in types(out)  # commit alone never starts a response


def test_commit_under_100ms_is_refused_with_openais_message() -> None:
    d = Driver()
    manual(d)
    err = error(d.send({"type": "input_audio_buffer.commit", "event_id": "c"}))
    assert err["code"] == "input_audio_buffer_commit_empty" and err["event_id"] == "c"
    assert "Expected at least 100ms of audio, but buffer only has 0.00ms of audio." in err["message"]
    d.send({"type": "input_audio_buffer.append", "audio": b64(tone(50))})
    assert "only has 50.00ms" in error(d.send({"type": "input_audio_buffer.commit"}))["message"]


def test_clear_empties_the_buffer() -> None:
    d = Driver()
    manual(d)
    d.send({"type": "input_audio_buffer.append", "audio": b64(tone(300))})
    assert types(d.send({"type": "input_audio_buffer.clear"})) == ["input_audio_buffer.cleared"]
    assert error(d.send({"type": "input_audio_buffer.commit"}))["code"] == "input_audio_buffer_commit_empty"


def test_odd_pcm16_byte_count_is_rejected() -> None:
    d = Driver()
    assert error(d.send({"type": "input_audio_buffer.append", "audio": b64(b"\x00\x01\x02")}))["param"] == "audio"


def test_g711_input_is_decoded_to_24k_pcm() -> None:
    for fmt, encode in (("audio/pcmu", g711.pcm_to_ulaw), ("audio/pcma", g711.pcm_to_alaw)):
        d = Driver()
        manual(d, format={"type": fmt})
        samples_8k = np.frombuffer(tone(200, freq=200), dtype="<i2")[::3]  # every 3rd sample: 8 kHz
        d.send({"type": "input_audio_buffer.append", "audio": b64(encode(samples_8k))})
        (job,) = transcribes(d.send({"type": "input_audio_buffer.commit"}))
        decoded = np.frombuffer(job.pcm16, dtype="<i2").astype(np.float64)
        assert len(decoded) == 3 * len(samples_8k)  # 200 ms at 24 kHz
        reference = np.frombuffer(tone(200, freq=200), dtype="<i2").astype(np.float64)
        assert np.corrcoef(decoded[:-3], reference[:-3])[0, 1] > 0.99


def test_server_vad_turn_commits_and_responds() -> None:
    d = Driver()
    d.send(
        {
            "type": "session.update",
            "session": {
                "type": "realtime",
                "audio": {
                    "input": {
                        "turn_detection": {"type": "server_vad", "prefix_padding_ms": 100, "silence_duration_ms": 200}
                    }
                },
            },
        }
    )
    out = d.send({"type": "input_audio_buffer.append", "audio": b64(silence(500) + tone(400))})
    speech = only(out, "input_audio_buffer.speech_started")
    assert speech["audio_start_ms"] == 400  # 500 ms onset minus 100 ms prefix padding
    out = d.send({"type": "input_audio_buffer.append", "audio": b64(silence(300))})
    assert types(out) == [
        "input_audio_buffer.speech_stopped",
        "input_audio_buffer.committed",
        "conversation.item.added",
        "conversation.item.done",
        "response.created",
    ]
    stopped = events(out)[0]
    assert stopped["audio_end_ms"] == 1100 and stopped["item_id"] == speech["item_id"]
    assert events(out)[1]["item_id"] == speech["item_id"]
    # the turn was transcribed from its pause on (tests/gateway/test_session_speculation.py); the commit adopts it
    (job,) = transcribes(out)  # one transcription, from the pause on: the commit adopts it
    assert job.item_id == speech["item_id"] and job.pcm16 == silence(100) + tone(400)
    committed = d.session.items.get(speech["item_id"])
    assert committed is not None and committed.content[0].audio is not None
    assert len(committed.content[0].audio) == (1100 - 400) * 48  # prefix padding + speech + the silence that ended it
    assert started(out)


def test_vad_threshold_is_honoured() -> None:
    d = Driver()
    d.send(
        {
            "type": "session.update",
            "session": {
                "type": "realtime",
                "audio": {"input": {"turn_detection": {"type": "server_vad", "threshold": 0.9}}},
            },
        }
    )
    assert d.send({"type": "input_audio_buffer.append", "audio": b64(tone(300))}) == []
    d.send(
        {
            "type": "session.update",
            "session": {
                "type": "realtime",
                "audio": {"input": {"turn_detection": {"type": "server_vad", "threshold": 0.5}}},
            },
        }
    )
    assert types(d.send({"type": "input_audio_buffer.append", "audio": b64(tone(300))})) == [
        "input_audio_buffer.speech_started"
    ]


def test_create_response_false_commits_without_responding() -> None:
    d = Driver()
    d.send(
        {
            "type": "session.update",
            "session": {
                "type": "realtime",
                "audio": {
                    "input": {
                        "turn_detection": {"type": "server_vad", "silence_duration_ms": 100, "create_response": False}
                    }
                },
            },
        }
    )
    out = d.send({"type": "input_audio_buffer.append", "audio": b64(tone(300) + silence(200))})
    assert "input_audio_buffer.committed" in types(out) and "response.created" not in types(out)


def test_barge_in_cancels_the_active_response_with_turn_detected() -> None:
    d = Driver()
    d.text_item()
    rid = started(d.send({"type": "response.create"}))
    d.session.build_request(rid)
    d.session.on_chunk(rid, AudioChunk(tone(100), 24000, "Hello"))
    out = d.send({"type": "input_audio_buffer.append", "audio": b64(tone(200))})
    assert types(out)[0] == "input_audio_buffer.speech_started"
    assert cancelled(out) == [rid]
    done = only(out, "response.done")["response"]
    assert done["status"] == "cancelled" and done["status_details"] == {
        "type": "cancelled",
        "reason": "turn_detected",
        "error": None,
    }
    assert types(out)[-1] == "response.done"


def test_no_barge_in_when_interrupt_response_is_false() -> None:
    d = Driver()
    d.send(
        {
            "type": "session.update",
            "session": {
                "type": "realtime",
                "audio": {"input": {"turn_detection": {"type": "server_vad", "interrupt_response": False}}},
            },
        }
    )
    d.text_item()
    started(d.send({"type": "response.create"}))
    out = d.send({"type": "input_audio_buffer.append", "audio": b64(tone(200))})
    assert types(out) == ["input_audio_buffer.speech_started"] and cancelled(out) == []


def spoken_reply(d: Driver) -> str:
    d.text_item()
    rid = started(d.send({"type": "response.create"}))
    out = d.run(
        rid,
        [
            AudioChunk(tone(100), 24000, "One "),
            AudioChunk(tone(100), 24000, "two "),
            AudioChunk(tone(100), 24000, "three."),
            Done("stop"),
        ],
    )
    return only(out, "response.output_item.done")["item"]["id"]


def test_truncate_drops_the_unheard_transcript_and_audio() -> None:
    d = Driver()
    item_id = spoken_reply(d)
    out = d.send({"type": "conversation.item.truncate", "item_id": item_id, "content_index": 0, "audio_end_ms": 150})
    assert only(out, "conversation.item.truncated") | {"event_id": None} == {
        "event_id": None,
        "type": "conversation.item.truncated",
        "item_id": item_id,
        "content_index": 0,
        "audio_end_ms": 150,
    }
    retrieved = only(d.send({"type": "conversation.item.retrieve", "item_id": item_id}), "conversation.item.retrieved")
    content = retrieved["item"]["content"][0]
    assert content["transcript"] == "One two "
    assert len(base64.b64decode(content["audio"])) == 150 * 48
    request = d.session.build_request(started(d.send({"type": "response.create"})))
    assert request is not None and request.messages[-1].text == "One two "


def test_truncate_errors() -> None:
    d = Driver()
    item_id = spoken_reply(d)
    too_long = error(
        d.send({"type": "conversation.item.truncate", "item_id": item_id, "content_index": 0, "audio_end_ms": 301})
    )
    assert too_long["message"] == "Audio content of 300ms is already shorter than 301ms"
    fractional = error(
        d.send({"type": "conversation.item.truncate", "item_id": item_id, "content_index": 0, "audio_end_ms": 12.5})
    )
    assert fractional["code"] == "invalid_type" and fractional["param"] == "audio_end_ms"
    unknown = error(
        d.send({"type": "conversation.item.truncate", "item_id": "nope", "content_index": 0, "audio_end_ms": 1})
    )
    assert unknown["param"] == "item_id"
    user_item = only(d.text_item(), "conversation.item.added")["item"]["id"]
    assert (
        error(
            d.send({"type": "conversation.item.truncate", "item_id": user_item, "content_index": 0, "audio_end_ms": 0})
        )["param"]
        == "content_index"
    )
    whole = d.send({"type": "conversation.item.truncate", "item_id": item_id, "content_index": 0, "audio_end_ms": 300})
    assert types(whole) == ["conversation.item.truncated"]
    assert d.session.items.get(item_id).content[0].transcript == "One two three."  # type: ignore[union-attr]


def test_transcription_events_only_when_configured() -> None:
    d = Driver()
    manual(d)
    d.send({"type": "input_audio_buffer.append", "audio": b64(tone(200))})
    (job,) = transcribes(d.send({"type": "input_audio_buffer.commit"}))
    assert d.session.on_transcription(job.item_id, Transcription("hi", duration_s=0.2)) == []
    assert d.session.items.get(job.item_id).content[0].transcript == "hi"  # type: ignore[union-attr]

    manual(d, transcription={"model": "whisper-1", "language": "en"})
    d.send({"type": "input_audio_buffer.append", "audio": b64(tone(200))})
    (job,) = transcribes(d.send({"type": "input_audio_buffer.commit"}))
    assert job.language == "en"
    done = only(
        d.session.on_transcription(job.item_id, Transcription("hello", duration_s=0.2)),
        "conversation.item.input_audio_transcription.completed",
    )
    assert (done["item_id"], done["content_index"], done["transcript"]) == (job.item_id, 0, "hello")
    assert done["usage"] == {"type": "duration", "seconds": 0.2}
    failed = only(
        d.session.on_transcription_failed("item_x", "no"), "conversation.item.input_audio_transcription.failed"
    )
    assert failed["error"]["type"] == "transcription_error"


def test_a_response_waits_for_pending_transcripts() -> None:
    d = Driver()
    manual(d)
    d.send({"type": "input_audio_buffer.append", "audio": b64(tone(200))})
    (job,) = transcribes(d.send({"type": "input_audio_buffer.commit"}))
    out = d.send({"type": "response.create"})
    rid = started(out)
    assert generations(out) == []  # the request is built once the transcript is in
    (generation,) = generations(d.session.on_transcription(job.item_id, Transcription("the question")))
    request = generation.request
    assert request.request_id == rid
    (part,) = request.messages[-1].parts
    assert part.transcript == "the question" and part.pcm16 == tone(200)  # type: ignore[union-attr]


def test_g711_output_format_encodes_deltas() -> None:
    d = Driver()
    d.send(
        {
            "type": "session.update",
            "session": {"type": "realtime", "audio": {"output": {"format": {"type": "audio/pcmu"}}}},
        }
    )
    d.text_item()
    rid = started(d.send({"type": "response.create"}))
    delta = only(d.run(rid, [AudioChunk(tone(100), 24000, "x"), Done("stop")]), "response.output_audio.delta")
    ulaw = base64.b64decode(delta["delta"])
    assert len(ulaw) == 800  # 100 ms at 8 kHz, one byte a sample
    back = g711.ulaw_to_pcm(ulaw).astype(np.float64)
    reference = np.frombuffer(tone(100), dtype="<i2")[::3].astype(np.float64)
    assert np.corrcoef(back, reference)[0, 1] > 0.99


def test_old_audio_is_dropped_past_the_budget_but_transcripts_and_lengths_stay() -> None:
    from omni_gateway.gateway.realtime.commands import SessionLimits
    from omni_gateway.gateway.realtime.session import RealtimeSession

    from tests.harness.fake_backend import FakeBackend

    backend = FakeBackend()
    d = Driver(backend=backend)
    d.session = RealtimeSession(
        dialect="ga",
        capabilities=backend.capabilities,
        vad_factory=None,  # type: ignore[arg-type]
        limits=SessionLimits(max_conversation_audio_bytes=250 * 48),
    )
    d.send({"type": "input_audio_buffer.append", "audio": b64(tone(200))})
    (first,) = transcribes(d.send({"type": "input_audio_buffer.commit"}))
    d.session.on_transcription(first.item_id, Transcription("first turn"))
    item_id = spoken_reply(d)  # 300 ms of reply audio: over budget, so the user's 200 ms go first
    old = d.session.items.get(first.item_id)
    assert old is not None and old.content[0].audio is None and old.content[0].transcript == "first turn"
    retrieved = only(d.send({"type": "conversation.item.retrieve", "item_id": item_id}), "conversation.item.retrieved")
    assert "audio" not in retrieved["item"]["content"][0]  # the reply itself (300 ms) is over the budget too
    truncated = d.send(
        {"type": "conversation.item.truncate", "item_id": item_id, "content_index": 0, "audio_end_ms": 150}
    )
    assert types(truncated) == ["conversation.item.truncated"]
    request = d.session.build_request(started(d.send({"type": "response.create"})))
    assert request is not None
    assert [m.text for m in request.messages] == ["first turn", "hello", "One two "]


def test_idle_timeout_prompts_a_reply_after_the_previous_one_played_out() -> None:
    from omni_gateway.gateway.realtime.session import RealtimeSession
    from openai.types.realtime import InputAudioBufferTimeoutTriggered

    from tests.harness.fake_backend import FakeBackend

    clock = [1000.0]
    backend = FakeBackend()
    d = Driver(backend=backend)
    d.session = RealtimeSession(
        dialect="ga", capabilities=backend.capabilities, vad_factory=backend.new_vad, now=lambda: clock[0]
    )  # type: ignore[arg-type]
    d.send(
        {
            "type": "session.update",
            "session": {
                "type": "realtime",
                "audio": {"input": {"turn_detection": {"type": "server_vad", "idle_timeout_ms": 5000}}},
            },
        }
    )
    assert d.session.idle_deadline is None
    spoken_reply(d)  # 300 ms of reply audio
    assert d.session.idle_deadline == pytest.approx(1000.0 + 0.3 + 5.0)
    for _ in range(11):  # the client streams silence in real time while the reply plays and after
        d.send({"type": "input_audio_buffer.append", "audio": b64(silence(500))})
    clock[0] += 5.0
    assert d.session.on_idle() == []  # the reply is still within its playback + timeout
    clock[0] += 0.5
    out = d.session.on_idle()
    assert types(out) == [
        "input_audio_buffer.timeout_triggered",
        "input_audio_buffer.committed",
        "conversation.item.added",
        "conversation.item.done",
        "response.created",
    ]
    fired = events(out)[0]
    # OpenAI's fields exactly: the silence from the reply's playback end (300 ms) to the audio written so far
    InputAudioBufferTimeoutTriggered.model_validate(fired)
    assert set(fired) == set(InputAudioBufferTimeoutTriggered.model_fields)
    assert (fired["audio_start_ms"], fired["audio_end_ms"]) == (300, 5500)
    assert fired["item_id"] == events(out)[1]["item_id"]
    committed = d.session.items.get(fired["item_id"])
    assert committed is not None and committed.content[0].audio
    assert 100 <= len(committed.content[0].audio) // 48 <= 5500 - 300
    assert d.session.idle_deadline is None and started(out)


def test_speech_disarms_the_idle_timeout() -> None:
    d = Driver()
    d.send(
        {
            "type": "session.update",
            "session": {
                "type": "realtime",
                "audio": {"input": {"turn_detection": {"type": "server_vad", "idle_timeout_ms": 5000}}},
            },
        }
    )
    spoken_reply(d)
    assert d.session.idle_deadline is not None
    d.send({"type": "input_audio_buffer.append", "audio": b64(tone(100))})
    assert d.session.idle_deadline is None


@pytest.mark.parametrize("value", [0, 1, -5, 4999, 30001, 5000.5, "5000", True])
@pytest.mark.parametrize("dialect", ["ga", "beta"])
def test_idle_timeout_outside_openais_bounds_is_refused(dialect: str, value: object) -> None:
    d = Driver(dialect=dialect)
    turn = {"type": "server_vad", "idle_timeout_ms": value}
    session = (
        {"type": "realtime", "audio": {"input": {"turn_detection": turn}}}
        if dialect == "ga"
        else {"turn_detection": turn}
    )
    err = error(d.send({"type": "session.update", "session": session}))
    prefix = "session.audio.input" if dialect == "ga" else "session"
    assert err["code"] == "invalid_value" and err["param"] == f"{prefix}.turn_detection.idle_timeout_ms"
    assert "5000" in err["message"] and "30000" in err["message"]
    assert d.session.settings.turn_detection is not None and d.session.settings.turn_detection.idle_timeout_ms is None


@pytest.mark.parametrize("value", [5000, 30000])
def test_idle_timeout_within_bounds_is_taken_and_null_clears_it(value: int) -> None:
    d = Driver(dialect="beta")
    out = d.send(
        {"type": "session.update", "session": {"turn_detection": {"type": "server_vad", "idle_timeout_ms": value}}}
    )
    assert only(out, "session.updated")["session"]["turn_detection"]["idle_timeout_ms"] == value
    out = d.send({"type": "session.update", "session": {"turn_detection": {"idle_timeout_ms": None}}})
    assert only(out, "session.updated")["session"]["turn_detection"]["idle_timeout_ms"] is None


def test_idle_timeout_fires_once_until_the_client_sends_audio_again() -> None:
    from omni_gateway.gateway.realtime.session import RealtimeSession

    from tests.harness.fake_backend import FakeBackend

    clock = [1000.0]
    backend = FakeBackend()
    d = Driver(backend=backend)
    d.session = RealtimeSession(
        dialect="ga", capabilities=backend.capabilities, vad_factory=backend.new_vad, now=lambda: clock[0]
    )  # type: ignore[arg-type]
    d.send(
        {
            "type": "session.update",
            "session": {
                "type": "realtime",
                "output_modalities": ["text"],
                "audio": {"input": {"turn_detection": {"type": "server_vad", "idle_timeout_ms": 5000}}},
            },
        }
    )
    d.text_item()
    d.run(started(d.send({"type": "response.create"})))
    clock[0] += 6
    d.run(started(d.session.on_idle()))  # the silence prompts one reply
    assert d.session.idle_deadline is None  # ... and no other, however long the silence lasts
    clock[0] += 60
    assert responses_started(d.session.on_idle()) == []
    d.send({"type": "input_audio_buffer.append", "audio": ""})  # no audio: the timeout stays spent
    d.run(started(d.send({"type": "response.create"})))
    assert d.session.idle_deadline is None
    d.send({"type": "input_audio_buffer.append", "audio": b64(silence(200))})
    d.run(started(d.send({"type": "response.create"})))
    assert d.session.idle_deadline is not None  # client audio re-arms it


def test_a_response_to_an_empty_conversation_fails_as_the_clients_error() -> None:
    d = Driver(count_tokens=True)
    out = d.send({"type": "response.create"})
    assert error(out)["type"] == "invalid_request_error" and error(out)["code"] == "empty_conversation"
    done = only(out, "response.done")["response"]
    assert done["status"] == "failed" and done["status_details"]["error"]["code"] == "empty_conversation"
    assert generations(out) == [] and d.session.running_responses == ()
