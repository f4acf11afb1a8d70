from __future__ import annotations

import importlib.util
from concurrent.futures import Future

import numpy as np
import pytest
from omni_gateway.encoders import turn
from omni_gateway.encoders.audio import float_to_pcm16, resample
from omni_gateway.encoders.turn import MODEL_RATE, SemanticTurn, default_model_path, load_smart_turn
from omni_gateway.encoders.vad import SileroVad, SpeechEvent

RATE = 24000
PAUSE_MS = 300


class Inline:
    """An executor that scores at once, so a test sees the verdict on the feed that asked for it."""

    def submit(self, fn, *args):  # type: ignore[no-untyped-def]
        future: Future[float] = Future()
        future.set_result(fn(*args))
        return future


def silence(ms: int) -> np.ndarray:
    return np.zeros(RATE * ms // 1000, np.float32)


def run(detector: SemanticTurn, x: np.ndarray, chunk_ms: int = 40) -> list[SpeechEvent]:
    pcm = float_to_pcm16(x)
    step = RATE * 2 * chunk_ms // 1000
    events: list[SpeechEvent] = []
    for at in range(0, len(pcm), step):
        events += detector.feed(pcm[at : at + step])
    return events


def detector(score, max_silence_ms: int = 4000) -> SemanticTurn:  # type: ignore[no-untyped-def]
    vad = SileroVad(silence_duration_ms=PAUSE_MS)
    return SemanticTurn(vad, max_silence_ms=max_silence_ms, score=score, executor=Inline())  # type: ignore[arg-type]


@pytest.fixture(scope="module")
def sentence(speak) -> np.ndarray:
    audio, rate = speak("Please turn on the kitchen lights.")
    return resample(audio, rate, RATE) * 0.6


def stop_after_speech_ms(events: list[SpeechEvent], x: np.ndarray) -> float:
    loud = np.nonzero(np.abs(x) > 0.02)[0]
    stops = [e.audio_ms for e in events if e.kind == "speech_stopped"]
    assert len(stops) == 1, events
    return stops[0] - loud[-1] * 1000 / RATE


def test_a_finished_turn_ends_at_the_short_pause(sentence: np.ndarray) -> None:
    x = np.concatenate([silence(500), sentence, silence(5000)])
    events = run(detector(lambda samples: 0.9), x)
    assert [e.kind for e in events][0] == "speech_started" and events[-1].kind == "speech_stopped"
    assert stop_after_speech_ms(events, x) < PAUSE_MS + 300


@pytest.mark.parametrize("cap_ms", [2000, 4000])
def test_an_unfinished_turn_waits_for_the_eagerness_cap(sentence: np.ndarray, cap_ms: int) -> None:
    x = np.concatenate([silence(500), sentence, silence(cap_ms + 1000)])
    events = run(detector(lambda samples: 0.1, max_silence_ms=cap_ms), x)
    assert cap_ms - 300 < stop_after_speech_ms(events, x) < cap_ms + 300
    paused = [e for e in events if e.kind == "speech_paused"]
    assert events[-1].audio_ms - paused[-1].audio_ms == cap_ms


def test_speech_within_the_wait_resumes_the_same_turn(sentence: np.ndarray) -> None:
    x = np.concatenate([silence(500), sentence, silence(1200), sentence, silence(5000)])
    once = len(sentence) / RATE + 1.0  # seconds: the first sentence, its padding and pause, sounds unfinished
    events = run(detector(lambda samples: 0.9 if len(samples) / MODEL_RATE > once else 0.1), x)
    kinds = [e.kind for e in events]
    assert kinds.count("speech_started") == 1 and kinds.count("speech_stopped") == 1
    assert "speech_resumed" in kinds and kinds.index("speech_resumed") < kinds.index("speech_stopped")


def test_each_pause_is_scored_once(sentence: np.ndarray) -> None:
    seen: list[int] = []
    x = np.concatenate([silence(500), sentence, silence(3000)])
    run(detector(lambda samples: seen.append(len(samples)) or 0.1, max_silence_ms=2000), x)
    assert len(seen) == 1


def test_the_scored_audio_is_the_turn_at_16_khz(sentence: np.ndarray) -> None:
    seen: list[np.ndarray] = []
    x = np.concatenate([silence(500), sentence, silence(1000)])
    run(detector(lambda samples: seen.append(samples) or 1.0), x)
    assert len(seen) == 1
    duration_s = len(seen[0]) / MODEL_RATE
    # the prefix padding and the 200 ms of the pause the model hears
    assert len(sentence) / RATE + 0.2 < duration_s < len(sentence) / RATE + 0.2 + 0.5


def test_a_failing_model_ends_the_turn_at_the_pause(sentence: np.ndarray) -> None:
    def broken(samples: np.ndarray) -> float:
        raise RuntimeError("no model")

    x = np.concatenate([silence(500), sentence, silence(3000)])
    assert stop_after_speech_ms(run(detector(broken), x), x) < PAUSE_MS + 300


def test_cap_below_the_pause_is_refused() -> None:
    with pytest.raises(ValueError, match="max_silence_ms"):
        SemanticTurn(SileroVad(silence_duration_ms=500), max_silence_ms=400)


def test_missing_package_names_it(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(importlib.util, "find_spec", lambda name: None)
    with pytest.raises(FileNotFoundError, match="pip install --no-deps pipecat-ai"):
        default_model_path()


@pytest.mark.slow
def test_features_match_pipecats_own_extractor() -> None:
    """The model is fed exactly what pipecat's analyzer feeds it (its vendored numpy extractor)."""
    path = default_model_path().parents[1] / "_whisper_features.py"
    spec = importlib.util.spec_from_file_location("pipecat_whisper_features", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    x = np.random.default_rng(0).normal(0, 0.1, 3 * MODEL_RATE).astype(np.float32)
    padded = np.pad(x, (turn.WINDOW_S * MODEL_RATE - len(x), 0))
    expected = module.compute_whisper_log_mel_features(padded, do_normalize=True)
    np.testing.assert_allclose(load_smart_turn().features(x)[0], expected, atol=1e-4)


@pytest.mark.slow
def test_an_unfinished_sentence_waits_longer_than_a_finished_one(speak) -> None:
    def stop_delay(text: str) -> float:
        audio, rate = speak(text)
        speech = resample(audio, rate, RATE) * 0.6
        x = np.concatenate([silence(500), speech, silence(5000)])
        vad = SileroVad(silence_duration_ms=PAUSE_MS)
        events = run(SemanticTurn(vad, max_silence_ms=4000, executor=Inline()), x)  # type: ignore[arg-type]
        return stop_after_speech_ms(events, x)

    finished = stop_delay("I would like to book a table for two people tonight.")
    unfinished = stop_delay("I would like to book a table for two people and")
    assert finished < 1000 and unfinished > 3000, (finished, unfinished)


class Never:
    """An executor whose scores never finish: a model stuck behind other sessions' pauses."""

    def submit(self, fn, *args):  # type: ignore[no-untyped-def]
        return Future()


def test_a_real_time_client_never_waits_for_a_late_verdict(
    sentence: np.ndarray, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Audio arriving at real-time pace: ``feed`` never blocks on the model; without a verdict the turn ends at
    the cap, as an unfinished one would."""
    clock = [0.0]

    def real_time_feed(d: SemanticTurn, x: np.ndarray) -> list[SpeechEvent]:
        pcm, step, events = float_to_pcm16(x), RATE * 2 * 40 // 1000, []
        for at in range(0, len(pcm), step):
            clock[0] += 0.04
            events += d.feed(pcm[at : at + step])
        return events

    monkeypatch.setattr(turn, "time", type("Clock", (), {"monotonic": staticmethod(lambda: clock[0])}))
    d = SemanticTurn(SileroVad(silence_duration_ms=PAUSE_MS), max_silence_ms=2000, executor=Never())  # type: ignore[arg-type]
    x = np.concatenate([silence(500), sentence, silence(3000)])
    events = real_time_feed(d, x)
    paused = [e for e in events if e.kind == "speech_paused"]
    assert events[-1].kind == "speech_stopped" and events[-1].audio_ms - paused[-1].audio_ms == 2000
