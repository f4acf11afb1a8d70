"""Speculative transcription: a server-VAD turn is transcribed from the start of its final pause, while the
detector still waits out the silence, and the commit reuses that transcript instead of asking again; the
reply to that transcript is prepared in the pause too, and the turn's response streams it."""
from __future__ import annotations

from session_driver import Driver, b64, only, started, transcribes, types

from fakes import silence, tone
from omni_gateway.gateway.realtime.commands import AdoptSpeculation, DropSpeculation, Output, Prepare, Speculate, StartResponse
from omni_gateway.omni.protocol import Transcription


def vad(d: Driver, **input_audio: object) -> None:
    d.send({"type": "session.update", "session": {"type": "realtime", "audio": {"input": {"turn_detection": {
        "type": "server_vad", "prefix_padding_ms": 100, "silence_duration_ms": 300}, **input_audio}}}})


def append(d: Driver, pcm: bytes) -> list[Output]:
    return d.send({"type": "input_audio_buffer.append", "audio": b64(pcm)})


def of(outputs: list[Output], kind: type) -> list:
    return [o for o in outputs if isinstance(o, kind)]


def test_a_pause_starts_a_speculative_transcription_of_the_turn_so_far() -> None:
    d = Driver()
    vad(d, transcription={"model": "whisper-1", "language": "en"})
    out = append(d, silence(500) + tone(400))
    item_id = only(out, "input_audio_buffer.speech_started")["item_id"]
    out = append(d, silence(100))
    assert types(out) == []  # the hint never reaches the client
    (spec,) = of(out, Speculate)
    # the same audio the commit takes (speech start minus 100 ms padding), up to the pause
    assert spec.job.item_id == item_id and spec.job.pcm16 == silence(100) + tone(400)
    assert spec.job.language == "en" and not transcribes(out)


def test_the_commit_adopts_the_speculation_of_its_own_pause() -> None:
    d = Driver()
    vad(d, transcription={"model": "whisper-1"})
    append(d, silence(500) + tone(400))
    (spec,) = of(append(d, silence(100)), Speculate)
    out = append(d, silence(300))
    assert types(out)[:2] == ["input_audio_buffer.speech_stopped", "input_audio_buffer.committed"]
    assert not transcribes(out) and not of(out, DropSpeculation)  # no second transcription
    (adopt,) = of(out, AdoptSpeculation)
    # the committed audio carries the silence waited out after the pause; that is the fallback's input
    assert adopt.job.item_id == spec.job.item_id and adopt.job.pcm16 == spec.job.pcm16 + silence(300)
    response_id = started(out)
    d.session.on_transcription(adopt.job.item_id, Transcription("turn on the lights", duration_s=0.5))
    request = d.session.build_request(response_id)
    assert request is not None and request.messages[-1].parts[0].transcript == "turn on the lights"


def test_resumed_speech_drops_the_speculation_and_the_next_pause_speculates_again() -> None:
    d = Driver()
    vad(d)
    append(d, silence(500) + tone(300))
    (first,) = of(append(d, silence(150)), Speculate)
    out = append(d, tone(200))
    assert of(out, DropSpeculation) == [DropSpeculation(first.job.item_id)] and types(out) == []
    (second,) = of(append(d, silence(100)), Speculate)
    assert second.job.item_id == first.job.item_id
    assert second.job.pcm16 == silence(100) + tone(300) + silence(150) + tone(200)
    (adopt,) = of(append(d, silence(300)), AdoptSpeculation)
    assert adopt.job.pcm16.startswith(second.job.pcm16)


def test_transcript_events_still_follow_the_commit() -> None:
    d = Driver()
    vad(d, transcription={"model": "whisper-1"})
    append(d, silence(500) + tone(400) + silence(100))
    out = append(d, silence(300))
    (adopt,) = of(out, AdoptSpeculation)
    done = only(d.session.on_transcription(adopt.job.item_id, Transcription("hi", duration_s=0.4)),
                "conversation.item.input_audio_transcription.completed")
    assert done["item_id"] == only(out, "input_audio_buffer.committed")["item_id"] and done["transcript"] == "hi"


def test_a_pause_after_under_100ms_does_not_speculate_and_the_commit_transcribes() -> None:
    d = Driver()
    d.send({"type": "session.update", "session": {"type": "realtime", "audio": {"input": {"turn_detection": {
        "type": "server_vad", "prefix_padding_ms": 0, "silence_duration_ms": 300}}}}})
    out = append(d, silence(500) + tone(30) + silence(400))
    assert "input_audio_buffer.committed" in types(out)
    assert not of(out, Speculate) and not of(out, AdoptSpeculation) and len(transcribes(out)) == 1


def test_a_manual_commit_during_a_pause_transcribes_as_before() -> None:
    d = Driver()
    vad(d)
    append(d, silence(500) + tone(400))
    (spec,) = of(append(d, silence(100)), Speculate)
    out = d.send({"type": "input_audio_buffer.commit"})
    assert of(out, DropSpeculation) == [DropSpeculation(spec.job.item_id)]
    (job,) = transcribes(out)
    assert job.item_id == spec.job.item_id and not of(out, AdoptSpeculation)


def test_clearing_or_retuning_the_detector_drops_the_speculation() -> None:
    d = Driver()
    vad(d)
    append(d, silence(500) + tone(400))
    (spec,) = of(append(d, silence(100)), Speculate)
    assert of(d.send({"type": "input_audio_buffer.clear"}), DropSpeculation) == [DropSpeculation(spec.job.item_id)]
    append(d, tone(400))
    (spec,) = of(append(d, silence(100)), Speculate)
    out = d.send({"type": "session.update", "session": {"type": "realtime", "audio": {"input": {
        "turn_detection": {"type": "server_vad", "silence_duration_ms": 800}}}}})
    assert of(out, DropSpeculation) == [DropSpeculation(spec.job.item_id)]


def test_a_transcription_setting_changed_during_the_pause_is_not_answered_by_the_old_speculation() -> None:
    d = Driver()
    vad(d, transcription={"model": "whisper-1", "language": "en"})
    append(d, silence(500) + tone(400))
    (spec,) = of(append(d, silence(100)), Speculate)
    d.send({"type": "session.update", "session": {"type": "realtime", "audio": {"input": {
        "transcription": {"model": "whisper-1", "language": "de"}}}}})
    out = append(d, silence(300))
    assert of(out, DropSpeculation) == [DropSpeculation(spec.job.item_id)] and not of(out, AdoptSpeculation)
    (job,) = transcribes(out)
    assert job.language == "de"


def test_manual_turns_never_speculate() -> None:
    d = Driver()
    d.send({"type": "session.update", "session": {"type": "realtime", "audio": {"input": {"turn_detection": None}}}})
    out = append(d, tone(300) + silence(600))
    assert not of(out, Speculate)
    assert len(transcribes(d.send({"type": "input_audio_buffer.commit"}))) == 1


# ---- the reply prepared from the speculative transcript -------------------------------------------
def paused_turn(d: Driver, heard: str = "turn on the lights") -> tuple[Speculate, Prepare | None]:
    """Speech, then a pause whose speculative transcript ``heard`` is known before the turn ends."""
    append(d, silence(500) + tone(400))
    (spec,) = of(append(d, silence(100)), Speculate)
    prepared = of(d.session.on_speculation(spec.job, Transcription(heard, duration_s=0.4)), Prepare)
    return spec, (prepared[0] if prepared else None)


def test_the_reply_to_the_speculative_transcript_is_prepared_and_taken_by_the_turns_response() -> None:
    d = Driver()
    vad(d, transcription={"model": "whisper-1"})
    spec, prepared = paused_turn(d)
    assert prepared is not None and prepared.item_id == spec.job.item_id
    assert prepared.request.messages[-1].parts[0].transcript == "turn on the lights"
    out = append(d, silence(300))
    (adopt,) = of(out, AdoptSpeculation)
    (start,) = [o for o in out if isinstance(o, StartResponse)]
    assert start.prepared and start.response_id == prepared.request.request_id and not of(out, DropSpeculation)
    assert only(out, "response.created")["response"]["id"] == prepared.request.request_id
    # once the transcript lands, the response's own request is the prepared one but for the audio kept
    d.session.on_transcription(adopt.job.item_id, Transcription("turn on the lights", duration_s=0.4))
    request = d.session.build_request(start.response_id)
    assert request is not None and request.messages[:-1] == prepared.request.messages[:-1]
    assert request.messages[-1].parts[0].transcript == "turn on the lights"
    assert (request.modalities, request.sampling, request.audio) == \
        (prepared.request.modalities, prepared.request.sampling, prepared.request.audio)


def test_resumed_speech_discards_the_prepared_reply() -> None:
    d = Driver()
    vad(d)
    spec, prepared = paused_turn(d)
    assert prepared is not None
    out = append(d, tone(200))
    assert of(out, DropSpeculation) == [DropSpeculation(spec.job.item_id)]
    out = append(d, silence(100) + silence(300))
    (start,) = [o for o in out if isinstance(o, StartResponse)]
    assert not start.prepared and start.response_id != prepared.request.request_id


def test_a_change_to_the_conversation_during_the_pause_discards_the_prepared_reply() -> None:
    d = Driver()
    vad(d)
    spec, prepared = paused_turn(d)
    assert prepared is not None
    d.send({"type": "session.update", "session": {"type": "realtime", "instructions": "Answer in French."}})
    out = append(d, silence(300))
    (start,) = [o for o in out if isinstance(o, StartResponse)]
    assert not start.prepared and DropSpeculation(spec.job.item_id) in of(out, DropSpeculation)
    request = d.session.build_request(start.response_id)
    assert request is not None and request.messages[0].parts[0].text == "Answer in French."


def test_nothing_is_prepared_when_the_turn_would_not_be_answered_or_the_pause_is_over() -> None:
    d = Driver()
    d.send({"type": "session.update", "session": {"type": "realtime", "audio": {"input": {"turn_detection": {
        "type": "server_vad", "silence_duration_ms": 300, "create_response": False}}}}})
    assert paused_turn(d)[1] is None
    d = Driver()
    vad(d)
    assert paused_turn(d, heard="  ")[1] is None  # nothing was heard: nothing to answer yet
    d = Driver()
    vad(d)
    append(d, silence(500) + tone(400))
    (spec,) = of(append(d, silence(100)), Speculate)
    out = append(d, silence(300))  # the turn ended before its transcript came back
    assert not [o for o in out if isinstance(o, StartResponse) and o.prepared]
    assert not of(d.session.on_speculation(spec.job, Transcription("late", duration_s=0.4)), Prepare)


def test_a_prepared_reply_no_response_takes_is_discarded_when_the_turn_ends() -> None:
    d = Driver()
    vad(d)
    spec, prepared = paused_turn(d)
    assert prepared is not None
    # a response the client creates during the pause is not the turn's: the speculation goes on
    out = d.send({"type": "response.create"})
    assert not of(out, DropSpeculation) and not [o for o in out if isinstance(o, StartResponse) and o.prepared]
    out = append(d, silence(300))  # that response is still active, so the turn gets none of its own
    assert of(out, AdoptSpeculation) and of(out, DropSpeculation) == [DropSpeculation(spec.job.item_id)]
    assert not [o for o in out if isinstance(o, StartResponse)]
