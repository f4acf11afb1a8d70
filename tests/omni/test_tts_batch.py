"""Speech synthesis batched across streams: the fair schedule, and batched VITS audio equal to one at a time."""

from __future__ import annotations

import asyncio
import threading
import time
from pathlib import Path

import numpy as np
import pytest
from omni_gateway.omni.heads.tts.batch import BatchedSynthesizer, Clause, DeadlineQueue
from omni_gateway.omni.heads.tts.head import TtsHead
from omni_gateway.omni.heads.vits.synthesizer import HfVitsSynthesizer

from tests.omni.test_tts import collect, tiny_vits, words  # noqa: F401  (tiny_vits: a fixture)

# Batched rows against the same texts alone: the masks keep rows apart, so only float rounding of the
# padded matmuls differs.
ATOL = 1e-5


def clause(text: str, stream: str, first: bool = False, speed: float = 1.0, submitted: float = 0.0) -> Clause:
    return Clause(text, speed, None, stream, first, submitted=submitted)


def texts(batch: list[Clause]) -> list[str]:
    return [c.text for c in batch]


def test_first_clauses_go_first_then_later_ones_as_their_listeners_need_them() -> None:
    queue = DeadlineQueue(seconds_per_char=0.1)
    for i in range(3):  # a long answer, queued at once: its clauses come due one after another (1.1 s each)
        queue.push(clause(f"answer {i}, a", "a", submitted=0.0))
    queue.push(clause("b later", "b", submitted=0.5))
    queue.push(clause("c first", "c", first=True, submitted=1.0))
    queue.push(clause("d first", "d", first=True, submitted=0.8))
    assert texts(queue.take(2)) == ["c first", "d first"]  # in arrival order, whatever their stamps
    assert texts(queue.take(2)) == ["answer 0, a", "b later"]  # due at 0.0 and 0.5; a's next at 1.1
    queue.push(clause("b again", "b", submitted=0.6))  # due after "b later"'s 0.7 s in flight: 1.2
    assert texts(queue.take(1)) == ["answer 1, a"]  # 1.1, after "answer 0"'s 1.1 s in flight
    assert texts(queue.take(4)) == ["b again", "answer 2, a"] and len(queue) == 0  # 1.2, then 2.2
    assert queue.take(4) == []


def test_a_listener_with_seconds_in_hand_waits_for_one_about_to_run_dry() -> None:
    queue = DeadlineQueue(seconds_per_char=0.1)
    a, b = clause("a said", "a", first=True), clause("b said", "b", first=True)
    queue.push(a)
    queue.push(b)
    assert texts(queue.take(2)) == ["a said", "b said"]
    queue.heard(a, 1.0, 5.0)  # a's listener now has audio until 6.0
    queue.heard(b, 1.0, 0.5)  # b's until 1.5
    queue.done(a, 1.0, 5.0)
    queue.done(b, 1.0, 0.5)
    learnt = 0.1
    for measured in (5 / 6, 0.5 / 6):  # seconds a character of each clause done, averaged in
        learnt += 0.1 * (measured - learnt)
    assert queue.seconds_per_char == pytest.approx(learnt)
    queue.push(clause("a goes on", "a", submitted=1.1))
    queue.push(clause("b goes on", "b", submitted=1.2))
    assert texts(queue.take(1)) == ["b goes on"]  # due 1.5, against a's 6.0


def test_a_stream_whose_audio_has_played_out_starts_afresh() -> None:
    queue = DeadlineQueue()
    a, other = clause("a said", "a", first=True), clause("x said", "x", first=True)
    queue.push(a)
    queue.push(other)
    queue.take(2)
    queue.heard(a, 1.0, 2.0)  # a's listener has audio until 3.0
    queue.done(a, 1.0, 2.0)
    queue.done(other, 4.0, 1.0)  # by 4.0 a's audio has played out, and nothing of a is queued or rendering
    queue.push(clause("b later", "b", submitted=5.0))
    queue.push(clause("a again", "a", submitted=6.0))
    assert texts(queue.take(1)) == ["b later"]  # a is due from its new submit (6.0), not its old audio (3.0)


def test_a_first_clause_does_not_wait_for_a_longer_clause_or_another_speed() -> None:
    queue = DeadlineQueue()
    queue.push(clause("a very long sentence of a long answer that renders slowly", "a"))
    queue.push(clause("short one", "b"))
    queue.push(clause("hello there", "c", first=True))
    queue.push(clause("hi", "d", first=True, speed=1.5))
    assert texts(queue.take(8)) == ["hello there", "short one"]
    assert texts(queue.take(8)) == ["hi"]
    assert texts(queue.take(8)) == ["a very long sentence of a long answer that renders slowly"]


def test_a_batch_takes_many_first_clauses_but_few_later_ones() -> None:
    queue = DeadlineQueue()
    for stream in "abcd":
        queue.push(clause(f"{stream} ok", stream))
    for stream in "efg":
        queue.push(clause(f"{stream} first", stream, first=True))
    assert texts(queue.take(8, max_later=2)) == ["e first", "f first", "g first", "a ok", "b ok"]
    assert texts(queue.take(8, max_later=2)) == ["c ok", "d ok"] and len(queue) == 0


def test_a_batch_of_first_clauses_only() -> None:
    queue = DeadlineQueue()
    queue.push(clause("a ok", "a"))
    assert queue.take(8, max_later=0) == [] and len(queue) == 1
    queue.push(clause("b first", "b", first=True))
    assert texts(queue.take(8, max_later=0)) == ["b first"]
    assert texts(queue.take(8, max_later=0)) == [] and len(queue) == 1


@pytest.fixture
def quiet_vits(tiny_vits: Path) -> HfVitsSynthesizer:  # noqa: F811
    """The tiny VITS with its noise switched off: its duration and flow then depend on the text alone."""
    synthesizer = HfVitsSynthesizer(tiny_vits, device="cpu")
    synthesizer.model.noise_scale = synthesizer.model.noise_scale_duration = 0.0
    return synthesizer


SENTENCES = ["hi.", "hello there, friend.", "", "the quick brown fox jumps over the lazy dog, twice."]


def test_a_batch_is_padded_as_the_tokenizer_pads_it(quiet_vits: HfVitsSynthesizer) -> None:
    from omni_gateway.omni.heads.vits.synthesizer import _padded

    texts = ["hi.", "hello there, friend.", "the quick brown fox"]
    expected = quiet_vits.tokenizer(texts, return_tensors="pt", padding=True)
    ids, mask = _padded([quiet_vits.tokenizer(t)["input_ids"] for t in texts], quiet_vits.tokenizer.pad_token_id)
    assert ids.tolist() == expected["input_ids"].tolist() and mask.tolist() == expected["attention_mask"].tolist()
    assert ids.dtype == expected["input_ids"].dtype


@pytest.mark.slow
def test_a_batch_renders_each_text_as_alone(quiet_vits: HfVitsSynthesizer) -> None:
    batched = quiet_vits.synthesize_batch(SENTENCES, speed=1.2)
    alone = [quiet_vits.synthesize(t, speed=1.2) for t in SENTENCES]
    assert [len(a) for a in batched] == [len(a) for a in alone] and len(alone[2]) == 0
    assert len({len(a) for a in alone}) == 4
    for got, expected in zip(batched, alone):
        np.testing.assert_allclose(got, expected, atol=ATOL)


@pytest.mark.slow
def test_a_batch_in_windows_hands_out_its_audio_window_by_window(quiet_vits: HfVitsSynthesizer) -> None:
    whole = quiet_vits.synthesize_batch(SENTENCES)
    quiet_vits.window_row_frames = 48  # windows of 16 frames for three rows: several vocoder steps
    render = quiet_vits.start_batch(SENTENCES)
    window = 16 * quiet_vits.upsampling
    taken: list[list[np.ndarray]] = [[] for _ in SENTENCES]
    completed_at: list[int | None] = [None] * len(SENTENCES)
    steps, done = 0, False
    while not done:
        done = render.step()
        steps += 1
        for i, (samples, complete) in enumerate(render.take()):
            expected = whole[i][(steps - 1) * window : steps * window]
            np.testing.assert_allclose(samples, expected, atol=ATOL)  # this window's samples, as they come
            taken[i].append(samples)
            if complete and completed_at[i] is None:
                completed_at[i] = steps
    assert steps == -(-max(len(a) for a in whole) // window) > 2
    assert all(len(samples) == 0 and complete for samples, complete in render.take())  # nothing twice
    for got, expected in zip(taken, whole):
        np.testing.assert_allclose(np.concatenate(got), expected, atol=ATOL)
    # each text is complete at the step that decodes its last sample: the short one well before the batch ends
    assert completed_at == [max(1, -(-len(a) // window)) for a in whole]
    assert completed_at[0] < steps and completed_at[2] == 1


LONG = "the quick brown fox jumps over the lazy dog, twice, and then once more for good measure."


@pytest.fixture
def held_steps(quiet_vits: HfVitsSynthesizer) -> tuple[threading.Event, threading.Event, list[int]]:
    """Vocoder steps that set ``stepping``, then wait for ``go`` (set at first); ``rows`` lists each step's rows."""
    stepping, go, rows = threading.Event(), threading.Event(), []
    go.set()
    real = quiet_vits.decode

    def decode(spectrogram, *args):  # type: ignore[no-untyped-def]
        rows.append(spectrogram.shape[0])
        stepping.set()
        assert go.wait(10)
        return real(spectrogram, *args)

    quiet_vits.decode = decode  # type: ignore[method-assign]
    quiet_vits.window_row_frames = 8
    return stepping, go, rows


@pytest.mark.slow
def test_a_first_clause_renders_between_the_steps_of_a_long_batch(
    quiet_vits: HfVitsSynthesizer, held_steps: tuple[threading.Event, threading.Event, list[int]]
) -> None:
    stepping, go, rows = held_steps
    alone = [quiet_vits.synthesize_batch([LONG])[0], quiet_vits.synthesize_batch(["hi there"])[0]]
    rows.clear()
    go.clear()
    stepping.clear()
    batcher = BatchedSynthesizer(quiet_vits, window_s=0)
    done: list[str] = []
    later = batcher.submit(LONG, stream="a", first=False)
    later.add_done_callback(lambda _: done.append("later"))
    assert stepping.wait(10)  # the long batch's first step is under way
    first = batcher.submit("hi there", stream="b", first=True)
    first.add_done_callback(lambda _: done.append("first"))
    go.set()
    np.testing.assert_allclose(later.result(10), alone[0], atol=ATOL)
    np.testing.assert_allclose(first.result(10), alone[1], atol=ATOL)
    assert done == ["first", "later"]
    assert rows[0] == 1 and len(rows) > 2  # the long clause took several steps, the first clause ran among them
    assert list(batcher.batch_sizes) == [1, 1]
    batcher.close()


@pytest.mark.slow
def test_a_batch_whose_listeners_all_left_stops_rendering(
    quiet_vits: HfVitsSynthesizer, held_steps: tuple[threading.Event, threading.Event, list[int]]
) -> None:
    stepping, go, rows = held_steps
    go.clear()
    batcher = BatchedSynthesizer(quiet_vits, window_s=0)
    cancel = threading.Event()
    later = batcher.submit(LONG, stream="a", first=False, cancel=cancel)
    assert stepping.wait(10)
    cancel.set()
    go.set()
    assert len(later.result(10)) == 0
    assert len(rows) == 1  # the step under way when the listener left was the last
    batcher.close()


@pytest.mark.slow
def test_concurrent_callers_share_a_batch(quiet_vits: HfVitsSynthesizer) -> None:
    alone = [quiet_vits.synthesize(t) for t in SENTENCES]
    batcher = BatchedSynthesizer(quiet_vits, max_batch=4, window_s=60)  # closes on max_batch, not the clock
    results: list = [None] * 4
    threads = [
        threading.Thread(target=lambda i=i: results.__setitem__(i, batcher.synthesize(SENTENCES[i]))) for i in range(4)
    ]
    started = time.monotonic()
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert list(batcher.batch_sizes) == [4]
    assert 0 < batcher.busy_s <= time.monotonic() - started  # the one batch's time, for benchmarks
    assert list(batcher.batch_seconds) == [batcher.busy_s]
    assert 0 < batcher.pass_seconds[0] <= batcher.busy_s and len(batcher.pass_seconds) == 1
    # each caller's first clause, from its submit to its first audio: at least the batch's model pass
    assert len(batcher.first_clause_seconds) == 4
    assert all(batcher.pass_seconds[0] < s <= time.monotonic() - started for s in batcher.first_clause_seconds)
    for got, expected in zip(results, alone):
        np.testing.assert_allclose(got, expected, atol=ATOL)
    cancelled = threading.Event()
    cancelled.set()
    # a full batch of them, so that it closes on max_batch rather than the 60 s window
    assert [len(f.result()) for f in [batcher.submit("hello", cancel=cancelled) for _ in range(4)]] == [0] * 4
    batcher.close()
    with pytest.raises(RuntimeError, match="closed"):
        batcher.submit("hello")


def test_the_worker_prepares_the_model_in_its_own_thread_before_serving(quiet_vits: HfVitsSynthesizer) -> None:
    # cuDNN's plans are kept per thread: a warm-up anywhere else would not spare the worker's first batches
    # and the constructor waits for it: a CUDA graph capture needs the device to itself
    prepared_in: list[str] = []

    def prepare() -> None:
        time.sleep(0.2)
        prepared_in.append(threading.current_thread().name)

    quiet_vits.prepare = prepare  # type: ignore[method-assign]
    batcher = BatchedSynthesizer(quiet_vits, window_s=0)
    assert prepared_in == ["tts-batcher"]
    assert len(batcher.synthesize("hello")) > 0
    batcher.close()


def test_a_failed_preparation_is_logged_and_the_worker_serves(
    quiet_vits: HfVitsSynthesizer, caplog: pytest.LogCaptureFixture
) -> None:
    quiet_vits.prepare = lambda: 1 / 0  # type: ignore[method-assign]
    batcher = BatchedSynthesizer(quiet_vits, window_s=0)
    assert len(batcher.synthesize("hello")) > 0
    assert "preparing the TTS model for batches failed" in caplog.text
    batcher.close()


@pytest.mark.slow
def test_a_failed_batch_fails_its_callers_and_the_worker_serves_on(quiet_vits: HfVitsSynthesizer) -> None:
    batcher = BatchedSynthesizer(quiet_vits, window_s=0)
    real = quiet_vits.start_batch
    quiet_vits.start_batch = lambda *a, **k: 1 / 0  # type: ignore[method-assign]
    with pytest.raises(ZeroDivisionError):
        batcher.synthesize("hello")
    quiet_vits.start_batch = real  # type: ignore[method-assign]
    assert len(batcher.synthesize("hello")) > 0
    with pytest.raises(ValueError, match="max_batch and max_later must be at least 1"):
        BatchedSynthesizer(quiet_vits, max_batch=0)
    batcher.close()


@pytest.mark.slow
def test_two_streams_through_one_batched_head(quiet_vits: HfVitsSynthesizer) -> None:
    batcher = BatchedSynthesizer(quiet_vits, window_s=0.05)
    head = TtsHead(batcher)
    replies = ["one two three four, five six. seven eight nine.", "ten eleven, twelve thirteen fourteen."]

    async def both() -> list:
        return await asyncio.gather(*(collect(head.stream(words(r))) for r in replies))

    for reply, chunks in zip(replies, asyncio.run(both())):
        assert "".join(c.transcript for _, c in chunks) == reply
    alone = TtsHead(quiet_vits)
    solo = asyncio.run(collect(alone.stream(words(replies[0]))))
    together = asyncio.run(collect(head.stream(words(replies[0]))))
    assert [len(c.pcm16) for _, c in solo] == [len(c.pcm16) for _, c in together]
    assert max(batcher.batch_sizes) >= 1
    batcher.close()
