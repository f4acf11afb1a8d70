from __future__ import annotations

import importlib.util
from concurrent.futures import Future

import numpy as np
import pytest
from omni_gateway.encoders import turn
from omni_gateway.encoders.audio import float_to_pcm16, resample
from omni_gateway.encoders.turn import (
    EAGERNESS,
    MODEL_RATE,
    WORDS_WAIT_MS,
    SemanticTurn,
    TurnPolicy,
    default_model_path,
    load_smart_turn,
    sounds_unfinished,
)
from omni_gateway.encoders.vad import SileroVad, SpeechEvent

RATE = 24000
SCORED_MS = 100


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


def detector(score, max_silence_ms: int = 4000, executor=None, clock=None) -> SemanticTurn:  # type: ignore[no-untyped-def]
    vad = SileroVad(silence_duration_ms=max_silence_ms)
    policy = TurnPolicy(SCORED_MS, rescored_silence_ms=SCORED_MS, complete=0.5, max_silence_ms=max_silence_ms)
    timing = {"clock": (lambda: clock[0])} if clock is not None else {}
    return SemanticTurn(vad, policy, score=score, executor=executor or Inline(), **timing)  # type: ignore[arg-type]


@pytest.fixture(scope="module")
def sentence(speak) -> np.ndarray:
    audio, rate = speak("Please turn on the kitchen lights.")
    return resample(audio, rate, RATE) * 0.6


def voiced(x: np.ndarray) -> np.ndarray:
    """``x`` up to its last loud sample: the pause starts with whatever is fed next."""
    return x[: np.nonzero(np.abs(x) > 0.02)[0][-1] + 1]


def stop_after_speech_ms(events: list[SpeechEvent], x: np.ndarray) -> float:
    loud = np.nonzero(np.abs(x) > 0.02)[0]
    stops = [e.audio_ms for e in events if e.kind == "speech_stopped"]
    assert len(stops) == 1, events
    return stops[0] - loud[-1] * 1000 / RATE


def test_a_finished_turn_ends_as_soon_as_the_verdict_is_in(sentence: np.ndarray) -> None:
    x = np.concatenate([silence(500), sentence, silence(5000)])
    events = run(detector(lambda samples: 0.9), x)
    assert [e.kind for e in events][0] == "speech_started" and events[-1].kind == "speech_stopped"
    paused = [e for e in events if e.kind == "speech_paused"]
    # the scored silence, then the 40 ms chunk that carried the verdict: no further fixed wait
    assert SCORED_MS <= events[-1].audio_ms - paused[-1].audio_ms <= SCORED_MS + 40
    assert stop_after_speech_ms(events, x) < SCORED_MS + 200
    assert [e.kind for e in events].count("speech_stopped") == 1  # silero's own stop at the cap never follows


@pytest.fixture
def clock() -> list[float]:
    """The detector's clock (seconds), advanced by the test as audio comes at real-time pace."""
    return [0.0]


def pause_with_words(
    d: SemanticTurn, sentence: np.ndarray, words: str | None, words_after_ms: int | None, clock: list[float]
) -> int:
    """Feeds ``sentence`` and then silence at real-time pace; at the pause's start the session would start
    transcribing (``expect_words``), and the words come ``words_after_ms`` later (never, if None). Returns how
    long after the pause's start the turn ended."""
    pcm, step = float_to_pcm16(np.concatenate([silence(500), voiced(sentence), silence(5000)])), RATE * 2 * 40 // 1000
    paused_at: int | None = None
    fed_since_pause = 0
    for at in range(0, len(pcm), step):
        clock[0] += 0.04
        for event in d.feed(pcm[at : at + step]):
            if event.kind == "speech_paused":
                paused_at, fed_since_pause = event.audio_ms, 0
                d.expect_words()
            elif event.kind == "speech_stopped":
                assert paused_at is not None
                return event.audio_ms - paused_at
        if paused_at is not None:
            fed_since_pause += 40
            if words_after_ms is not None and fed_since_pause == words_after_ms:
                d.hear(words)
    raise AssertionError("the turn never ended")


def test_words_that_leave_the_sentence_open_hold_a_turn_that_sounds_finished(
    sentence: np.ndarray, clock: list[float]
) -> None:
    d = detector(lambda samples: 0.9, max_silence_ms=2000, clock=clock)
    words = "I would like to book a table for two people and"
    assert 2000 <= pause_with_words(d, sentence, words, 80, clock) < 2000 + 32


def test_a_finished_turn_waits_for_the_words_it_expects_then_ends(sentence: np.ndarray, clock: list[float]) -> None:
    d = detector(lambda samples: 0.9, clock=clock)
    waited = pause_with_words(d, sentence, "Please turn on the kitchen lights.", 320, clock)
    assert 320 - 40 <= waited <= 400, waited  # the words came with the chunk 320 ms after the pause began


def test_words_that_come_before_the_verdict_cost_no_wait(sentence: np.ndarray, clock: list[float]) -> None:
    d = detector(lambda samples: 0.9, clock=clock)
    waited = pause_with_words(d, sentence, "Please turn on the kitchen lights.", 40, clock)
    assert SCORED_MS <= waited <= SCORED_MS + 40, waited


def test_the_first_hearing_waits_for_the_words_under_way(sentence: np.ndarray, clock: list[float]) -> None:
    """Whisper and the model share the cores, and the turn ends on both: the words go first."""
    order: list[str] = []
    d = detector(lambda samples: order.append("scored") or 0.9, clock=clock)
    hear = d.hear
    d.hear = lambda words: (order.append("heard"), hear(words))[1]  # type: ignore[method-assign]
    waited = pause_with_words(d, sentence, "Please turn on the kitchen lights.", 200, clock)
    assert order == ["heard", "scored"] and 200 - 40 <= waited <= 240, (order, waited)


def test_a_pause_is_heard_once_its_listener_could_say_words_will_follow(sentence: np.ndarray) -> None:
    """The feed that declares a pause asks its listener to poll again rather than score there: the listener
    learns of the pause from that feed's events and only then can say a transcript is under way."""
    polls: list[int] = []
    scores: list[int] = []
    at_once = TurnPolicy(scored_silence_ms=1, rescored_silence_ms=1, complete=0.5, max_silence_ms=4000)
    score = lambda samples: scores.append(len(polls)) or 0.9  # noqa: E731
    d = SemanticTurn(SileroVad(silence_duration_ms=4000), at_once, score=score, executor=Inline())  # type: ignore[arg-type]
    d.listen(lambda: polls.append(1))
    pcm = float_to_pcm16(np.concatenate([silence(500), voiced(sentence), silence(400)]))
    step = RATE * 2 * 40 // 1000
    for at in range(0, len(pcm), step):
        if any(e.kind == "speech_paused" for e in d.feed(pcm[at : at + step])):
            assert polls and not scores
            assert any(e.kind == "speech_stopped" for e in d.feed(b""))  # the poll: judged, and ended
            break
    else:
        raise AssertionError("no pause")


def test_words_that_never_come_leave_the_sound_to_decide(sentence: np.ndarray, clock: list[float]) -> None:
    waited = pause_with_words(detector(lambda samples: 0.9, clock=clock), sentence, None, None, clock)
    assert SCORED_MS + WORDS_WAIT_MS <= waited <= SCORED_MS + WORDS_WAIT_MS + 80, waited


def test_a_client_ahead_of_real_time_gets_the_decisions_a_live_speaker_would(sentence: np.ndarray) -> None:
    """Audio sent faster than it plays (no clock advances): the turn ends where a live speaker's would, at the
    scored pause, not where the client's audio had got to when the verdict was read."""
    d = detector(lambda samples: 0.9)
    x = np.concatenate([silence(500), sentence, silence(3000)])
    events = run(d, x)
    paused = [e for e in events if e.kind == "speech_paused"]
    assert (
        events[-1].kind == "speech_stopped" and SCORED_MS <= events[-1].audio_ms - paused[-1].audio_ms <= SCORED_MS + 40
    )


@pytest.mark.parametrize(
    ("words", "unfinished"),
    [
        ("I would like to book a table for two people and", True),
        ("Tell me a story about a...", True),
        ("My name is John and I", True),
        ("So what I really want to know is", True),
        ("What is the capital of France?", False),
        ("Turn the lights on.", False),
        ("Where are you from?", False),
        ("", False),
    ],
)
def test_sounds_unfinished_reads_the_last_word(words: str, unfinished: bool) -> None:
    assert sounds_unfinished(words) is unfinished


def test_eagerness_orders_the_waits() -> None:
    low, medium, high = EAGERNESS["low"], EAGERNESS["medium"], EAGERNESS["high"]
    assert EAGERNESS["auto"] == medium
    assert (low.max_silence_ms, medium.max_silence_ms, high.max_silence_ms) == (8000, 4000, 2000)
    assert low.scored_silence_ms >= medium.scored_silence_ms >= high.scored_silence_ms
    assert low.complete >= medium.complete >= high.complete


@pytest.mark.parametrize("cap_ms", [2000, 4000])
def test_an_unfinished_turn_waits_for_the_eagerness_cap(sentence: np.ndarray, cap_ms: int) -> None:
    x = np.concatenate([silence(500), sentence, silence(cap_ms + 1000)])
    events = run(detector(lambda samples: 0.1, max_silence_ms=cap_ms), x)
    assert cap_ms - 300 < stop_after_speech_ms(events, x) < cap_ms + 300
    paused = [e for e in events if e.kind == "speech_paused"]
    assert cap_ms <= events[-1].audio_ms - paused[-1].audio_ms < cap_ms + 32


def test_speech_within_the_wait_resumes_the_same_turn(sentence: np.ndarray) -> None:
    x = np.concatenate([silence(500), sentence, silence(1200), sentence, silence(5000)])
    once = len(sentence) / RATE + 1.0  # seconds: the first sentence, its padding and pause, sounds unfinished
    events = run(detector(lambda samples: 0.9 if len(samples) / MODEL_RATE > once else 0.1), x)
    kinds = [e.kind for e in events]
    assert kinds.count("speech_started") == 1 and kinds.count("speech_stopped") == 1
    assert "speech_resumed" in kinds and kinds.index("speech_resumed") < kinds.index("speech_stopped")


def test_a_pause_that_sounds_unfinished_is_heard_once_more_and_can_end_then(sentence: np.ndarray) -> None:
    seen: list[int] = []
    policy = TurnPolicy(scored_silence_ms=100, rescored_silence_ms=300, complete=0.5, max_silence_ms=4000)
    d = SemanticTurn(
        SileroVad(silence_duration_ms=4000),
        policy,
        score=lambda samples: 0.1 if not seen.append(len(samples)) and len(seen) == 1 else 0.9,
        executor=Inline(),  # type: ignore[arg-type]
    )
    events = run(d, np.concatenate([silence(500), voiced(sentence), silence(3000)]))
    paused = [e for e in events if e.kind == "speech_paused"]
    assert len(seen) == 2 and (seen[1] - seen[0]) * 1000 // MODEL_RATE == 200  # 200 ms more of the pause
    assert events[-1].kind == "speech_stopped" and 300 <= events[-1].audio_ms - paused[-1].audio_ms <= 340


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
    # the prefix padding and the pause the model hears
    assert len(sentence) / RATE + SCORED_MS / 1000 < duration_s < len(sentence) / RATE + SCORED_MS / 1000 + 0.5


def test_a_failing_model_ends_the_turn_at_the_pause(sentence: np.ndarray) -> None:
    def broken(samples: np.ndarray) -> float:
        raise RuntimeError("no model")

    x = np.concatenate([silence(500), sentence, silence(3000)])
    assert stop_after_speech_ms(run(detector(broken), x), x) < SCORED_MS + 200


def test_a_vad_whose_stop_is_not_the_cap_is_refused() -> None:
    with pytest.raises(ValueError, match="max_silence_ms"):
        SemanticTurn(SileroVad(silence_duration_ms=500), EAGERNESS["auto"])
    with pytest.raises(ValueError, match="scored_silence_ms"):
        TurnPolicy(scored_silence_ms=500, rescored_silence_ms=500, complete=0.5, max_silence_ms=400)


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
        vad = SileroVad(silence_duration_ms=4000)
        events = run(SemanticTurn(vad, EAGERNESS["auto"], executor=Inline()), x)  # type: ignore[arg-type]
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

    d = detector(lambda samples: 1.0, max_silence_ms=2000, executor=Never(), clock=clock)
    x = np.concatenate([silence(500), sentence, silence(3000)])
    events = real_time_feed(d, x)
    paused = [e for e in events if e.kind == "speech_paused"]
    assert events[-1].kind == "speech_stopped" and 2000 <= events[-1].audio_ms - paused[-1].audio_ms < 2000 + 32
