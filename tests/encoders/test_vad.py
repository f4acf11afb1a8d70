from __future__ import annotations

import time

import numpy as np
import pytest
from omni_gateway.encoders.audio import float_to_pcm16, resample
from omni_gateway.encoders.vad import CONTEXT, WINDOW, WINDOW_MS, SileroVad, SpeechEvent, VadBatcher, load_session

RATE = 24000


def silence(ms: int) -> np.ndarray:
    return np.zeros(RATE * ms // 1000, np.float32)


def speech_bounds_ms(x: np.ndarray) -> tuple[float, float]:
    loud = np.nonzero(np.abs(x) > 0.02)[0]
    return loud[0] * 1000 / RATE, loud[-1] * 1000 / RATE


def run_all(vad: SileroVad, x: np.ndarray, chunk_bytes: int = 960) -> list[SpeechEvent]:
    pcm = float_to_pcm16(x)
    events: list[SpeechEvent] = []
    for at in range(0, len(pcm), chunk_bytes):
        events += vad.feed(pcm[at : at + chunk_bytes])
    return events


def run(vad: SileroVad, x: np.ndarray, chunk_bytes: int = 960) -> list[SpeechEvent]:
    """The turn boundaries only (speech_started / speech_stopped), without the pause hints."""
    return [e for e in run_all(vad, x, chunk_bytes) if e.kind in ("speech_started", "speech_stopped")]


@pytest.fixture(scope="module")
def utterance(speak) -> np.ndarray:
    audio, rate = speak("Please turn on the kitchen lights and play some music.")
    return resample(audio, rate, RATE) * 0.6


def test_speech_start_and_stop_match_the_truth(utterance: np.ndarray) -> None:
    x = np.concatenate([silence(1000), utterance, silence(1500)])
    start, end = speech_bounds_ms(x)
    events = run(SileroVad(threshold=0.5, prefix_padding_ms=300, silence_duration_ms=500), x)
    assert [e.kind for e in events] == ["speech_started", "speech_stopped"]
    assert abs(events[0].audio_ms - (start - 300)) <= 2 * WINDOW_MS + 10
    assert end + 500 - WINDOW_MS <= events[1].audio_ms <= end + 500 + 250


def test_prefix_padding_is_floored_at_zero(utterance: np.ndarray) -> None:
    x = np.concatenate([silence(100), utterance, silence(800)])
    events = run(SileroVad(prefix_padding_ms=500), x)
    assert events[0] == SpeechEvent("speech_started", 0)


def test_silence_duration_decides_whether_a_pause_ends_the_turn(utterance: np.ndarray) -> None:
    x = np.concatenate([silence(500), utterance, silence(450), utterance, silence(1500)])
    short = run(SileroVad(silence_duration_ms=200), x)
    long = run(SileroVad(silence_duration_ms=900), x)
    assert [e.kind for e in short] == ["speech_started", "speech_stopped"] * 2
    assert [e.kind for e in long] == ["speech_started", "speech_stopped"]
    assert long[1].audio_ms - short[3].audio_ms >= 900 - 200 - WINDOW_MS


def test_a_pause_is_announced_then_resumed_or_stopped(utterance: np.ndarray) -> None:
    head = np.concatenate([silence(500), utterance])
    x = np.concatenate([head, silence(450), utterance, silence(1500)])
    first_end = speech_bounds_ms(head)[1]
    second_start = len(head) * 1000 / RATE + 450 + speech_bounds_ms(utterance)[0]
    second_end = speech_bounds_ms(x)[1]
    events = run_all(SileroVad(silence_duration_ms=900), x)
    assert [e.kind for e in events] == [
        "speech_started",
        "speech_paused",
        "speech_resumed",
        "speech_paused",
        "speech_stopped",
    ]
    _, pause, resume, last_pause, stop = events
    # a pause starts where the speech fades out (the voice's soft ending counts for a few windows)
    assert first_end - WINDOW_MS <= pause.audio_ms <= first_end + 250
    assert abs(resume.audio_ms - second_start) <= 2 * WINDOW_MS
    assert second_end - WINDOW_MS <= last_pause.audio_ms <= second_end + 250
    # the stop closes the last pause exactly silence_duration_ms later, rounded up to whole windows
    assert 900 <= stop.audio_ms - last_pause.audio_ms <= 900 + WINDOW_MS + 1


def test_a_short_gap_with_a_short_silence_duration_stops_at_its_pause(utterance: np.ndarray) -> None:
    x = np.concatenate([silence(500), utterance, silence(450), utterance, silence(1500)])
    events = run_all(SileroVad(silence_duration_ms=200), x)
    stops = [i for i, e in enumerate(events) if e.kind == "speech_stopped"]
    assert len(stops) == 2
    for i in stops:  # each stop closes the pause just before it, with no resume in between
        assert events[i - 1].kind == "speech_paused"
        assert 200 <= events[i].audio_ms - events[i - 1].audio_ms <= 200 + WINDOW_MS + 1


def test_pause_hints_do_not_depend_on_chunking(utterance: np.ndarray) -> None:
    x = np.concatenate([silence(300), utterance, silence(450), utterance, silence(1000)])
    reference = run_all(SileroVad(silence_duration_ms=900), x)
    assert "speech_paused" in [e.kind for e in reference]
    for chunk_bytes in (3, 48000):
        assert run_all(SileroVad(silence_duration_ms=900), x, chunk_bytes=chunk_bytes) == reference


def window_probabilities(x24: np.ndarray) -> np.ndarray:
    """silero's reference windowing over the whole signal, independent of the streaming detector."""
    x = resample(x24, RATE, 16000)
    session, state, context, probs = (
        load_session(),
        np.zeros((2, 1, 128), np.float32),
        np.zeros(CONTEXT, np.float32),
        [],
    )
    for at in range(0, len(x) - WINDOW + 1, WINDOW):
        window = x[at : at + WINDOW]
        p, state = session.run(
            None, {"input": np.concatenate([context, window])[None], "state": state, "sr": np.array(16000, np.int64)}
        )
        context = window[-CONTEXT:]
        probs.append(float(p[0, 0]))
    return np.array(probs)


def test_threshold_decides_which_window_starts_speech() -> None:
    # A low hum gets a small but non-zero speech probability: a good probe for the threshold.
    t = np.arange(RATE * 3) / RATE
    hum = (0.3 * np.sin(2 * np.pi * 200 * t)).astype(np.float32)
    probs = window_probabilities(hum)
    assert 0.02 < probs.max() < 0.5
    assert run(SileroVad(threshold=0.5, prefix_padding_ms=0), hum) == []
    threshold = float(probs.max()) * 0.9
    first = int(np.argmax(probs >= threshold))
    events = run(SileroVad(threshold=threshold, prefix_padding_ms=0), hum)
    assert events[0].kind == "speech_started"
    assert events[0].audio_ms == round(first * WINDOW_MS)


def test_events_do_not_depend_on_chunking(utterance: np.ndarray) -> None:
    x = np.concatenate([silence(700), utterance, silence(900)])
    reference = run(SileroVad(), x, chunk_bytes=960)
    assert len(reference) == 2
    for chunk_bytes in (3, 1001, 48000, 10**7):
        assert run(SileroVad(), x, chunk_bytes=chunk_bytes) == reference


def test_detectors_share_the_model_but_not_state(utterance: np.ndarray) -> None:
    x = np.concatenate([silence(700), utterance, silence(900)])
    a, b = SileroVad(), SileroVad()
    assert a._session is b._session
    pcm_speech, pcm_quiet = float_to_pcm16(x), bytes(len(x) * 2)
    events_a: list[SpeechEvent] = []
    for at in range(0, len(pcm_speech), 960):
        events_a += a.feed(pcm_speech[at : at + 960])
        assert b.feed(pcm_quiet[at : at + 960]) == []
    assert events_a == run_all(SileroVad(), x)


def test_reset_restarts_the_clock_and_state(utterance: np.ndarray) -> None:
    x = np.concatenate([silence(700), utterance, silence(900)])
    vad = SileroVad()
    first = run(vad, x)
    run(vad, utterance[: RATE // 2])  # leave it mid-speech
    vad.reset()
    assert run(vad, x) == first


def test_bad_settings_are_rejected() -> None:
    with pytest.raises(ValueError, match="threshold must lie in"):
        SileroVad(threshold=1.5)
    with pytest.raises(ValueError, match="must be >= 0"):
        SileroVad(silence_duration_ms=-1)


# ---- batched across detectors ------------------------------------------------------------------------------
def drain(vad: SileroVad, timeout_s: float = 30.0) -> list[SpeechEvent]:
    """The events a batched detector still owes, once its batcher judged every window fed."""
    deadline = time.monotonic() + timeout_s
    while vad.judging and time.monotonic() < deadline:
        time.sleep(0.01)
    return vad.feed(b"")


def test_batched_detectors_emit_the_same_events_as_one_by_one(utterance: np.ndarray) -> None:
    # four sessions with different audio and chunk sizes, fed interleaved as a server receives them
    streams = [
        float_to_pcm16(
            np.concatenate([silence(300 + 170 * k), utterance, silence(450 + 100 * k), utterance, silence(1200)])
        )
        for k in range(4)
    ]
    chunks = [960, 1920, 4800, 1234]
    settings = [dict(silence_duration_ms=500), dict(silence_duration_ms=900), dict(threshold=0.3), {}]
    alone = []
    for pcm, chunk, kw in zip(streams, chunks, settings):
        vad = SileroVad(**kw)
        alone.append([e for at in range(0, len(pcm), chunk) for e in vad.feed(pcm[at : at + chunk])])
    batcher = VadBatcher(window_s=0.002)
    notified = [0] * 4
    detectors = [SileroVad(batcher=batcher, **kw) for kw in settings]
    for i, d in enumerate(detectors):
        d.listen(lambda i=i: notified.__setitem__(i, notified[i] + 1))
    batched: list[list[SpeechEvent]] = [[] for _ in streams]
    for step in range(max(len(p) // c + 1 for p, c in zip(streams, chunks))):
        for i, (pcm, chunk) in enumerate(zip(streams, chunks)):
            batched[i] += detectors[i].feed(pcm[step * chunk : (step + 1) * chunk])
    for i in range(len(streams)):
        batched[i] += drain(detectors[i])
    batcher.close()
    assert all(alone), "every stream has turns"
    assert batched == alone
    assert all(notified), "each detector announced events it judged late"
    assert batcher.windows / batcher.batches > 1.5, "windows of several detectors shared calls"


def test_reset_drops_windows_judged_for_the_old_stream(utterance: np.ndarray) -> None:
    pcm = float_to_pcm16(np.concatenate([silence(700), utterance, silence(900)]))
    batcher = VadBatcher()
    vad = SileroVad(batcher=batcher)
    vad.feed(float_to_pcm16(utterance))  # speech, still being judged when the reset comes
    vad.reset()
    events = vad.feed(pcm)
    events += drain(vad)
    batcher.close()
    assert events == run_all(SileroVad(), float_to_pcm16_to_float(pcm))


def float_to_pcm16_to_float(pcm: bytes) -> np.ndarray:
    return np.frombuffer(pcm, dtype="<i2").astype(np.float32) / 32768.0


def test_a_closed_batcher_refuses_new_windows() -> None:
    batcher = VadBatcher()
    batcher.close()
    with pytest.raises(RuntimeError, match="closed"):
        SileroVad(batcher=batcher).feed(bytes(9600))
