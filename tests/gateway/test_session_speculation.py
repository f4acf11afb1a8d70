"""Speculative transcription: a server-VAD turn is transcribed from the start of its final pause, while the
detector still waits out the silence, and the commit reuses that transcript instead of asking again; the
reply to that transcript is prepared in the pause too, and the turn's response takes it over.

The speculation is a transcription task under the turn's item id, so a commit that adopts it starts
nothing; the prepared reply is a generation task under the id of the response that will stream it."""

from __future__ import annotations

from omni_gateway.gateway.realtime.commands import Generate, Output, Transcribe
from omni_gateway.omni.protocol import Done, TextDelta, Transcription

from tests.harness.fake_backend import silence, tone
from tests.harness.session_driver import Driver, b64, cancelled, events, generations, only, started, transcribes, types


def vad(d: Driver, **input_audio: object) -> None:
    d.send(
        {
            "type": "session.update",
            "session": {
                "type": "realtime",
                "audio": {
                    "input": {
                        "turn_detection": {"type": "server_vad", "prefix_padding_ms": 100, "silence_duration_ms": 300},
                        **input_audio,
                    }
                },
            },
        }
    )


def append(d: Driver, pcm: bytes) -> list[Output]:
    return d.send({"type": "input_audio_buffer.append", "audio": b64(pcm)})


def speculates(outputs: list[Output]) -> Transcribe:
    (job,) = transcribes(outputs)
    return job


def test_a_pause_starts_a_speculative_transcription_of_the_turn_so_far() -> None:
    d = Driver()
    vad(d, transcription={"model": "whisper-1", "language": "en"})
    out = append(d, silence(500) + tone(400))
    item_id = only(out, "input_audio_buffer.speech_started")["item_id"]
    out = append(d, silence(100))
    assert types(out) == []  # the hint never reaches the client
    spec = speculates(out)
    # the same audio the commit takes (speech start minus 100 ms padding), up to the pause
    assert spec.item_id == item_id and spec.pcm16 == silence(100) + tone(400)
    assert spec.language == "en" and not generations(out)


def test_the_commit_adopts_the_speculation_of_its_own_pause() -> None:
    d = Driver()
    vad(d, transcription={"model": "whisper-1"})
    append(d, silence(500) + tone(400))
    spec = speculates(append(d, silence(100)))
    out = append(d, silence(300))
    assert types(out)[:2] == ["input_audio_buffer.speech_stopped", "input_audio_buffer.committed"]
    assert not transcribes(out) and not cancelled(out)  # the speculation's task runs on as the turn's
    response_id = started(out)
    assert not generations(out)  # the response waits for the turn's transcript
    (generation,) = generations(
        d.session.on_transcription(spec.item_id, Transcription("turn on the lights", duration_s=0.5))
    )
    request = generation.request
    assert request.request_id == response_id and request.messages[-1].parts[0].transcript == "turn on the lights"
    # the committed audio carries the silence waited out after the pause
    assert request.messages[-1].parts[0].pcm16 == spec.pcm16 + silence(300)


def test_resumed_speech_drops_the_speculation_and_the_next_pause_speculates_again() -> None:
    d = Driver()
    vad(d)
    append(d, silence(500) + tone(300))
    first = speculates(append(d, silence(150)))
    out = append(d, tone(200))
    assert cancelled(out) == [first.item_id] and types(out) == []
    second = speculates(append(d, silence(100)))
    assert second.item_id == first.item_id
    assert second.pcm16 == silence(100) + tone(300) + silence(150) + tone(200)
    out = append(d, silence(300))
    assert "input_audio_buffer.committed" in types(out) and not transcribes(out) and not cancelled(out)


def test_transcript_events_still_follow_the_commit() -> None:
    d = Driver()
    vad(d, transcription={"model": "whisper-1"})
    spec = speculates(append(d, silence(500) + tone(400) + silence(100)))
    out = append(d, silence(300))
    done = only(
        d.session.on_transcription(spec.item_id, Transcription("hi", duration_s=0.4)),
        "conversation.item.input_audio_transcription.completed",
    )
    assert done["item_id"] == only(out, "input_audio_buffer.committed")["item_id"] and done["transcript"] == "hi"


def test_a_pause_after_under_100ms_does_not_speculate_and_the_commit_transcribes() -> None:
    d = Driver()
    d.send(
        {
            "type": "session.update",
            "session": {
                "type": "realtime",
                "audio": {
                    "input": {
                        "turn_detection": {"type": "server_vad", "prefix_padding_ms": 0, "silence_duration_ms": 300}
                    }
                },
            },
        }
    )
    out = append(d, silence(500) + tone(30) + silence(400))
    assert "input_audio_buffer.committed" in types(out)
    assert len(transcribes(out)) == 1  # the committed turn's own transcription, nothing speculative


def test_a_manual_commit_during_a_pause_transcribes_as_before() -> None:
    d = Driver()
    vad(d)
    append(d, silence(500) + tone(400))
    spec = speculates(append(d, silence(100)))
    out = d.send({"type": "input_audio_buffer.commit"})
    assert cancelled(out) == [spec.item_id]
    (job,) = transcribes(out)
    assert job.item_id == spec.item_id


def test_clearing_or_retuning_the_detector_drops_the_speculation() -> None:
    d = Driver()
    vad(d)
    append(d, silence(500) + tone(400))
    spec = speculates(append(d, silence(100)))
    assert cancelled(d.send({"type": "input_audio_buffer.clear"})) == [spec.item_id]
    append(d, tone(400))
    spec = speculates(append(d, silence(100)))
    out = d.send(
        {
            "type": "session.update",
            "session": {
                "type": "realtime",
                "audio": {"input": {"turn_detection": {"type": "server_vad", "silence_duration_ms": 800}}},
            },
        }
    )
    assert cancelled(out) == [spec.item_id]


def test_a_transcription_setting_changed_during_the_pause_is_not_answered_by_the_old_speculation() -> None:
    d = Driver()
    vad(d, transcription={"model": "whisper-1", "language": "en"})
    append(d, silence(500) + tone(400))
    spec = speculates(append(d, silence(100)))
    d.send(
        {
            "type": "session.update",
            "session": {
                "type": "realtime",
                "audio": {"input": {"transcription": {"model": "whisper-1", "language": "de"}}},
            },
        }
    )
    out = append(d, silence(300))
    assert cancelled(out) == [spec.item_id]
    (job,) = transcribes(out)
    assert job.language == "de" and job.item_id == spec.item_id


def test_manual_turns_never_speculate() -> None:
    d = Driver()
    d.send({"type": "session.update", "session": {"type": "realtime", "audio": {"input": {"turn_detection": None}}}})
    out = append(d, tone(300) + silence(600))
    assert not transcribes(out)
    assert len(transcribes(d.send({"type": "input_audio_buffer.commit"}))) == 1


# ---- a speculation's outcome arriving after the commit ------------------------------------------------
def test_a_failed_speculation_of_an_adopted_turn_transcribes_the_committed_audio() -> None:
    d = Driver()
    vad(d, transcription={"model": "whisper-1"})
    append(d, silence(500) + tone(400))
    spec = speculates(append(d, silence(100)))
    rid = started(append(d, silence(300)))
    out = d.session.on_transcription_failed(spec.item_id, "ASR exploded")
    assert types(out) == []  # not the client's failure yet: the committed audio gets its own try
    (retry,) = transcribes(out)
    assert retry.item_id == spec.item_id and retry.pcm16 == spec.pcm16 + silence(300)
    out = d.session.on_transcription(retry.item_id, Transcription("second try"))
    assert only(out, "conversation.item.input_audio_transcription.completed")["transcript"] == "second try"
    (generation,) = generations(out)
    assert generation.request.request_id == rid


def test_a_speculation_failed_during_the_pause_is_redone_at_the_commit() -> None:
    d = Driver()
    vad(d)
    append(d, silence(500) + tone(400))
    spec = speculates(append(d, silence(100)))
    assert d.session.on_transcription_failed(spec.item_id, "ASR exploded") == []
    (job,) = transcribes(append(d, silence(300)))
    assert job.item_id == spec.item_id and job.pcm16 == spec.pcm16 + silence(300)


# ---- the reply prepared from the speculative transcript -------------------------------------------
def paused_turn(d: Driver, heard: str = "turn on the lights") -> tuple[Transcribe, Generate | None]:
    """Speech, then a pause whose speculative transcript ``heard`` is known before the turn ends."""
    append(d, silence(500) + tone(400))
    spec = speculates(append(d, silence(100)))
    out = d.session.on_transcription(spec.item_id, Transcription(heard, duration_s=0.4))
    assert types(out) == []  # a speculative transcript is never reported as such
    prepared = generations(out)
    return spec, (prepared[0] if prepared else None)


def test_the_reply_to_the_speculative_transcript_is_prepared_and_taken_by_the_turns_response() -> None:
    d = Driver()
    d.text_mode()
    vad(d, transcription={"model": "whisper-1"})
    spec, prepared = paused_turn(d)
    assert prepared is not None
    rid = prepared.request.request_id
    assert prepared.request.messages[-1].parts[0].transcript == "turn on the lights"
    # what the backend produces before the turn ends is held, not shown
    assert d.session.on_chunk(rid, TextDelta("Lights ")) == []
    out = append(d, silence(300))
    assert not transcribes(out) and not generations(out) and not cancelled(out)  # both tasks run on
    seen = types(out)
    assert (
        seen.index("response.created")
        < seen.index("conversation.item.input_audio_transcription.completed")
        < seen.index("response.output_text.delta")
    )
    assert only(out, "response.created")["response"]["id"] == rid
    assert only(out, "response.output_text.delta")["delta"] == "Lights "
    assert only(out, "conversation.item.input_audio_transcription.completed")["transcript"] == "turn on the lights"
    # the rest streams as it comes; the response's own request is the prepared one
    assert only(d.session.on_chunk(rid, TextDelta("on.")), "response.output_text.delta")["delta"] == "on."
    request = d.session.build_request(rid)
    assert request is not None and request.messages[:-1] == prepared.request.messages[:-1]
    assert request.messages[-1].parts[0].transcript == "turn on the lights"
    assert (request.modalities, request.sampling, request.audio) == (
        prepared.request.modalities,
        prepared.request.sampling,
        prepared.request.audio,
    )
    d.session.on_chunk(rid, Done("stop"))
    done = only(d.session.on_stream_end(rid), "response.done")["response"]
    assert done["status"] == "completed" and d.session.running_responses == ()


def test_a_prepared_reply_that_ended_before_the_turn_did_is_streamed_whole() -> None:
    d = Driver()
    d.text_mode()
    vad(d)
    spec, prepared = paused_turn(d)
    assert prepared is not None
    rid = prepared.request.request_id
    for chunk in (TextDelta("On "), TextDelta("it goes."), Done("stop")):
        assert d.session.on_chunk(rid, chunk) == []
    assert d.session.on_stream_end(rid) == []
    out = append(d, silence(300))
    assert "".join(e["delta"] for e in events(out) if e["type"] == "response.output_text.delta") == "On it goes."
    assert only(out, "response.done")["response"]["status"] == "completed"


def test_resumed_speech_discards_the_prepared_reply() -> None:
    d = Driver()
    vad(d)
    spec, prepared = paused_turn(d)
    assert prepared is not None
    out = append(d, tone(200))
    assert cancelled(out) == [prepared.request.request_id]  # the speculation itself had finished
    out = append(d, silence(100) + silence(300))
    rid = started(out)
    assert rid != prepared.request.request_id


def test_a_change_to_the_conversation_during_the_pause_discards_the_prepared_reply() -> None:
    d = Driver()
    vad(d)
    spec, prepared = paused_turn(d)
    assert prepared is not None
    d.send({"type": "session.update", "session": {"type": "realtime", "instructions": "Answer in French."}})
    out = append(d, silence(300))
    assert prepared.request.request_id in cancelled(out)
    (generation,) = generations(out)
    assert generation.request.request_id != prepared.request.request_id
    assert generation.request.messages[0].parts[0].text == "Answer in French."


def test_nothing_is_prepared_when_the_turn_would_not_be_answered_or_the_pause_is_over() -> None:
    d = Driver()
    d.send(
        {
            "type": "session.update",
            "session": {
                "type": "realtime",
                "audio": {
                    "input": {
                        "turn_detection": {"type": "server_vad", "silence_duration_ms": 300, "create_response": False}
                    }
                },
            },
        }
    )
    assert paused_turn(d)[1] is None
    d = Driver()
    vad(d)
    assert paused_turn(d, heard="  ")[1] is None  # nothing was heard: nothing to answer yet
    d = Driver()
    vad(d)
    append(d, silence(500) + tone(400))
    spec = speculates(append(d, silence(100)))
    rid = started(append(d, silence(300)))  # the turn ended before its transcript came back
    (generation,) = generations(d.session.on_transcription(spec.item_id, Transcription("late", duration_s=0.4)))
    assert generation.request.request_id == rid  # the response's own generation, nothing prepared


def test_a_prepared_reply_no_response_takes_is_discarded_when_the_turn_ends() -> None:
    d = Driver()
    d.send({"type": "session.update", "session": {"type": "realtime", "instructions": "Be brief."}})
    vad(d)
    spec, prepared = paused_turn(d)
    assert prepared is not None
    # a response the client creates during the pause is not the turn's: the speculation goes on
    out = d.send({"type": "response.create"})
    assert not cancelled(out) and started(out) != prepared.request.request_id
    out = append(d, silence(300))  # that response is still active, so the turn gets none of its own
    assert cancelled(out) == [prepared.request.request_id] and not transcribes(out) and not generations(out)


def test_the_detector_learns_the_words_of_the_pause_it_is_judging() -> None:
    """semantic_vad weighs the turn's words: the pause's speculative transcription is announced to the detector
    when it starts, and its text (or its failure) handed over when it ends."""
    d = Driver()
    vad(d, transcription={"model": "whisper-1"})
    detector = d.backend.vads[-1]
    append(d, silence(500) + tone(400))
    spec = speculates(append(d, silence(100)))
    assert detector.words == ["<expected>"]
    d.session.on_transcription(spec.item_id, Transcription("book a table for two and"))
    assert detector.words == ["<expected>", "book a table for two and"]
    append(d, tone(200))  # the speaker went on: a new pause, a new speculation
    spec = speculates(append(d, silence(100)))
    d.session.on_transcription_failed(spec.item_id, "asr down")
    assert detector.words[-2:] == ["<expected>", None]


def test_words_arriving_outside_a_pause_reach_no_detector() -> None:
    d = Driver()
    vad(d, transcription={"model": "whisper-1"})
    append(d, silence(500) + tone(400))
    spec = speculates(append(d, silence(100)))
    append(d, silence(400))  # the stop: the turn is committed, its speculation adopted
    d.session.on_transcription(spec.item_id, Transcription("hello"))
    assert d.backend.vads[-1].words == ["<expected>"]
