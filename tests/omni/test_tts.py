from __future__ import annotations

import asyncio
import json
import threading
import time
from collections.abc import AsyncIterator
from pathlib import Path

import numpy as np
import pytest
from omni_gateway.omni.heads.tts.backends import PiperSynthesizer, default_piper_voice, load_synthesizer
from omni_gateway.omni.heads.tts.batch import BatchedSynthesizer
from omni_gateway.omni.heads.tts.head import BATCHED_LOOKAHEAD, TtsHead
from omni_gateway.omni.heads.vits.synthesizer import HfVitsSynthesizer
from omni_gateway.omni.protocol import AudioChunk, AudioOutputOptions

from tests.harness.shape_checkpoints import TINY_VITS

REPLY = (
    "Sure, I can help with that. The weather today is sunny with a high of twenty degrees. "
    "Tomorrow brings some rain in the afternoon, so take an umbrella."
)


async def words(text: str, delay_s: float = 0.0, stamps: list[float] | None = None) -> AsyncIterator[str]:
    for i, word in enumerate(text.split(" ")):
        if delay_s:
            await asyncio.sleep(delay_s)
        yield word if i == 0 else " " + word
    if stamps is not None:
        stamps.append(time.perf_counter())


async def collect(stream: AsyncIterator[AudioChunk]) -> list[tuple[float, AudioChunk]]:
    return [(time.perf_counter(), chunk) async for chunk in stream]


class SlowTone:
    """A stand-in synthesizer: 50 ms of tone per character, taking ``seconds`` of compute per call. Batched
    (``start_batch``, for ``BatchedSynthesizer``), each step renders ``step_chars`` characters of every text
    and takes ``seconds``."""

    sample_rate = 16000
    voices = ("tone",)

    def __init__(self, seconds: float = 0.0, step_chars: int = 1000) -> None:
        self.seconds = seconds
        self.step_chars = step_chars
        self.calls: list[str] = []
        self.cancels: list[threading.Event] = []

    def synthesize(
        self, text: str, *, speed: float = 1.0, voice: str | None = None, cancel: threading.Event | None = None
    ) -> np.ndarray:
        self.calls.append(text)
        if cancel is not None:
            self.cancels.append(cancel)
        time.sleep(self.seconds)
        return self.tone(text, speed)

    def tone(self, text: str, speed: float = 1.0) -> np.ndarray:
        n = int(len(text) * 0.05 * self.sample_rate / speed)
        return (0.5 * np.sin(np.arange(n) * 0.1)).astype(np.float32)

    def prepare(self) -> None:
        pass

    def start_batch(self, texts: list[str], *, speed: float = 1.0, voice: str | None = None) -> ToneRender:
        self.calls.extend(texts)
        return ToneRender([self.tone(t, speed) for t in texts], int(self.step_chars * 0.05 * self.sample_rate), self)


class ToneRender:
    def __init__(self, audio: list[np.ndarray], step: int, synth: SlowTone) -> None:
        self.audio, self.step_samples, self.synth = audio, step, synth
        self.given = self.rendered = 0

    def step(self) -> bool:
        time.sleep(self.synth.seconds)
        self.rendered += self.step_samples
        return self.rendered >= max(len(a) for a in self.audio)

    def take(self) -> list[tuple[np.ndarray, bool]]:
        taken = [(a[self.given : self.rendered], self.rendered >= len(a)) for a in self.audio]
        self.given = self.rendered
        return taken


@pytest.fixture(scope="module")
def piper_head() -> TtsHead:
    return TtsHead(PiperSynthesizer(default_piper_voice()))


# ---- streaming with the packaged Piper voice -----------------------------------------------------
def test_piper_stream_chunks_are_100ms_pcm16_with_transcript_in_step(piper_head: TtsHead) -> None:
    chunks = [c for _, c in asyncio.run(collect(piper_head.stream(words(REPLY))))]
    assert all(c.sample_rate == 24000 for c in chunks)
    assert all(0 < len(c.pcm16) <= 2 * 2400 and len(c.pcm16) % 2 == 0 for c in chunks)
    assert "".join(c.transcript for c in chunks) == REPLY
    assert chunks[0].transcript == "Sure, I"  # "Sure," alone is too short; two words start the speech
    assert [c.transcript for c in chunks if c.transcript][1:] == [
        " can help with that.",
        " The weather today is sunny with a high of twenty degrees.",
        " Tomorrow brings some rain in the afternoon,",
        " so take an umbrella.",
    ]
    audio = np.frombuffer(b"".join(c.pcm16 for c in chunks), "<i2")
    seconds = len(audio) / 24000
    assert 6.0 < seconds < 16.0  # ~25 words at a speaking pace
    assert np.abs(audio).max() > 10000  # speech, not silence


def test_piper_first_audio_arrives_before_the_text_ends(piper_head: TtsHead) -> None:
    """The rest of the text is held back until audio arrives: a head that waited for the end would stall."""
    first_audio = asyncio.Event()

    async def held_back() -> AsyncIterator[str]:
        yield "Sure, I can help with that. "
        await asyncio.wait_for(first_audio.wait(), timeout=60)
        yield "The weather today is sunny."

    async def scenario() -> list[AudioChunk]:
        chunks = []
        async for chunk in piper_head.stream(held_back()):
            first_audio.set()
            chunks.append(chunk)
        return chunks

    chunks = asyncio.run(scenario())
    assert "".join(c.transcript for c in chunks) == "Sure, I can help with that. The weather today is sunny."


def test_piper_speed_changes_duration(piper_head: TtsHead) -> None:
    normal = piper_head.synthesize("The quick brown fox jumps over the lazy dog.")
    fast = piper_head.synthesize("The quick brown fox jumps over the lazy dog.", AudioOutputOptions(speed=2.0))
    assert normal.dtype == np.float32 and 0.35 < len(fast) / len(normal) < 0.75  # durations are sampled


# ---- stream mechanics with a stand-in synthesizer ------------------------------------------------
def test_output_rate_follows_the_options() -> None:
    head = TtsHead(SlowTone())
    chunks = [c for _, c in asyncio.run(collect(head.stream(words(REPLY), AudioOutputOptions(sample_rate=8000))))]
    assert all(c.sample_rate == 8000 and len(c.pcm16) <= 1600 for c in chunks)
    total = sum(len(c.pcm16) for c in chunks) // 2
    spoken = [c.transcript.strip() for c in chunks if c.transcript]  # each segment is rendered stripped
    assert abs(total - sum(len(t) for t in spoken) * 0.05 * 8000) < len(spoken)  # rounding per segment only


def test_a_clause_of_many_chunks_lets_other_tasks_run_between_them() -> None:
    async def scenario() -> list[tuple[int, AudioChunk]]:
        turns = 0

        async def other_task() -> None:
            nonlocal turns
            while True:
                turns += 1
                await asyncio.sleep(0)

        other = asyncio.create_task(other_task())
        try:  # each clause is seconds of audio rendered at once
            return [(turns, c) async for c in TtsHead(SlowTone()).stream(words("Well, a long clause that speaks."))]
        finally:
            other.cancel()

    got = asyncio.run(scenario())
    within = [(earlier, later) for (earlier, _), (later, c) in zip(got, got[1:], strict=False) if not c.transcript]
    assert len(within) > 10 and all(later > earlier for earlier, later in within)


def test_a_batched_stream_queues_its_next_clauses_while_the_first_plays() -> None:
    synth = SlowTone(seconds=0.01)
    batcher = BatchedSynthesizer(synth, window_s=0)
    head = TtsHead(batcher)
    assert head.lookahead == BATCHED_LOOKAHEAD and TtsHead(synth).lookahead == 0

    async def scenario() -> list[AudioChunk]:
        stream = head.stream(words(REPLY, delay_s=0.01))  # all of it within the sleep below
        chunks = [await stream.__anext__()]
        await asyncio.sleep(0.5)  # the listener plays the first chunk; the reply's text has all arrived
        ahead = len(synth.calls)
        assert 2 <= ahead <= BATCHED_LOOKAHEAD + 1  # queued ahead of the listener, but no further
        chunks += [chunk async for chunk in stream]
        return chunks

    chunks = asyncio.run(scenario())
    batcher.close()
    assert "".join(c.transcript for c in chunks) == REPLY
    # for benchmarks: the text's share of first audio (the first clause's words came 10 ms apart) and the
    # first clause's wait for its batch, within its submit -> audio
    first_words = len(REPLY.split(",")[0].split(" "))
    assert len(head.first_segment_seconds) == 1 and head.first_segment_seconds[0] >= 0.01 * first_words
    assert len(head.first_text_seconds) == 1  # the first word came one delay in: the rest is the segment's wait
    assert 0.01 <= head.first_text_seconds[0] <= head.first_segment_seconds[0] - 0.01 * (first_words - 1)
    assert len(batcher.first_wait_seconds) == 1 and 0 <= batcher.first_wait_seconds[0] < batcher.first_clause_seconds[0]
    segments = [c.transcript.strip() for c in chunks if c.transcript]
    assert synth.calls == segments  # each segment once, in order
    pcm = np.frombuffer(b"".join(c.pcm16 for c in chunks), "<i2")
    assert abs(len(pcm) - sum(len(t) for t in segments) * 0.05 * 24000) < len(segments)


def test_a_long_batched_clause_streams_out_before_it_is_rendered_whole() -> None:
    synth = SlowTone(seconds=0.2, step_chars=10)  # a 60-character clause renders in 6 steps
    batcher = BatchedSynthesizer(synth, window_s=0)
    clause = "a clause of sixty characters that renders in several steps."

    got = asyncio.run(collect(TtsHead(batcher).stream(words(clause))))
    batcher.close()
    assert "".join(c.transcript for _, c in got) == clause
    starts = [i for i, (_, c) in enumerate(got) if c.transcript]
    assert len(starts) == 2  # "a clause", then the rest
    second = [t for t, _ in got[starts[1] :]]
    assert second[-1] - second[0] > 0.5  # its chunks went out over its steps (0.2 s each), not all at the end
    assert len(b"".join(c.pcm16 for _, c in got)) // 2 == pytest.approx((len(clause) - 1) * 0.05 * 24000, abs=4)


def test_closing_a_batched_stream_drops_the_clauses_queued_ahead() -> None:
    synth = SlowTone(seconds=0.1, step_chars=10)
    batcher = BatchedSynthesizer(synth, window_s=0)
    text = " ".join(f"This is sentence number {i} of many." for i in range(30))

    async def scenario() -> None:
        stream = TtsHead(batcher).stream(words(text))
        await stream.__anext__()
        await asyncio.sleep(0.3)  # the next clauses are queued ahead by now, and rendering
        await stream.aclose()
        await asyncio.sleep(0.5)

    asyncio.run(scenario())
    batcher.close()
    # the first clause, then the three queued ahead of the listener in one batch; nothing after the close
    assert synth.calls == [
        "This is",
        "sentence number 0 of many.",
        *(f"This is sentence number {i} of many." for i in (1, 2)),
    ]
    assert list(batcher.batch_sizes) == [1, 3] and len(batcher._queue) == 0


def test_a_closed_batcher_fails_the_stream_instead_of_leaving_it_waiting() -> None:
    batcher = BatchedSynthesizer(SlowTone(), window_s=0)
    batcher.close()
    with pytest.raises(RuntimeError, match="the TTS batcher was closed"):
        asyncio.run(asyncio.wait_for(collect(TtsHead(batcher).stream(words("Hello there."))), timeout=10))


def test_text_that_makes_no_audio_still_reaches_the_transcript() -> None:
    synth = SlowTone()
    synth.tone = lambda text, speed=1.0: (  # type: ignore[method-assign]
        SlowTone.tone(synth, text, speed) if any(c.isalnum() for c in text) else np.zeros(0, np.float32)
    )
    for text in ("Hello there ...", "... ...", "Hello there ... friend."):
        chunks = [c for _, c in asyncio.run(collect(TtsHead(synth).stream(words(text))))]
        assert "".join(c.transcript for c in chunks) == text
        assert all(c.pcm16 for c in chunks[:-1])  # the silent text rides on the next audio, or comes last alone


def test_closing_the_stream_stops_synthesis() -> None:
    synth = SlowTone(seconds=0.15)
    head = TtsHead(synth)
    text = " ".join(f"This is sentence number {i} of many." for i in range(30))

    async def scenario() -> None:
        stream = head.stream(words(text))
        first = await stream.__anext__()
        assert first.transcript == "This is"
        await stream.aclose()
        await asyncio.sleep(0.5)

    asyncio.run(scenario())
    assert len(synth.calls) == 1  # renders run only while the consumer pulls; none after the close
    assert all(event.is_set() for event in synth.cancels)


def test_cancelling_the_consumer_mid_render_stops_further_segments() -> None:
    synth = SlowTone(seconds=0.3)
    head = TtsHead(synth)
    text = " ".join(f"Sentence {i} is here now." for i in range(20))

    calls_at_cancel: list[int] = []

    async def scenario() -> None:
        task = asyncio.create_task(collect(head.stream(words(text))))
        await asyncio.sleep(0.45)  # inside the second render
        task.cancel()
        calls_at_cancel.append(len(synth.calls))
        with pytest.raises(asyncio.CancelledError):
            await task
        await asyncio.sleep(0.7)

    asyncio.run(scenario())
    assert 1 <= calls_at_cancel[0] <= 3
    assert len(synth.calls) == calls_at_cancel[0]  # the render in flight finished; no other began
    assert synth.cancels[-1].is_set()


def test_text_stream_errors_reach_the_consumer() -> None:
    async def failing() -> AsyncIterator[str]:
        yield "Hello there, how are you doing today? "
        raise RuntimeError("engine died")

    async def scenario() -> list[AudioChunk]:
        got: list[AudioChunk] = []
        with pytest.raises(RuntimeError, match="engine died"):
            async for chunk in TtsHead(SlowTone()).stream(failing()):
                got.append(chunk)
        return got

    assert asyncio.run(scenario())  # audio for the text before the failure still came out


def test_bad_options_are_rejected() -> None:
    head = TtsHead(SlowTone())
    with pytest.raises(ValueError, match=r"speed must lie in \[0.25, 4.0\]; got 5"):
        head.synthesize("hi", AudioOutputOptions(speed=5))
    with pytest.raises(ValueError, match="got 22222"):
        asyncio.run(collect(head.stream(words("hi"), AudioOutputOptions(sample_rate=22222))))


# ---- Hugging Face VITS on a tiny random checkpoint -----------------------------------------------
@pytest.fixture(scope="module")
def tiny_vits(tmp_path_factory: pytest.TempPathFactory) -> Path:
    import torch
    from transformers import VitsConfig, VitsModel, VitsTokenizer

    path = tmp_path_factory.mktemp("vits")
    symbols = list(" abcdefghijklmnopqrstuvwxyz',.?!-")
    vocab = {"<pad>": 0, "<unk>": 1} | {c: i + 2 for i, c in enumerate(symbols)}
    (path / "vocab.json").write_text(json.dumps(vocab))
    VitsTokenizer(str(path / "vocab.json"), phonemize=False).save_pretrained(path)
    config = VitsConfig(vocab_size=len(vocab), sampling_rate=16000, **TINY_VITS)
    torch.manual_seed(0)
    VitsModel(config).eval().save_pretrained(path)
    return path


def test_hf_vits_matches_the_reference_model_given_a_seed(tiny_vits: Path) -> None:
    import torch
    from transformers import AutoTokenizer, VitsModel

    text = "hello there, friend."
    synth = load_synthesizer(str(tiny_vits), device="cpu", seed=7)
    assert isinstance(synth, HfVitsSynthesizer) and synth.sample_rate == 16000
    model, tokenizer = VitsModel.from_pretrained(tiny_vits).eval(), AutoTokenizer.from_pretrained(tiny_vits)
    torch.manual_seed(7)
    with torch.no_grad():
        expected = model(**tokenizer(text, return_tensors="pt")).waveform[0].numpy()
    torch.manual_seed(123)
    after_reference = torch.rand(3)
    torch.manual_seed(123)
    got = synth.synthesize(text)
    assert torch.equal(torch.rand(3), after_reference)  # the caller's random stream is left alone
    assert got.shape == expected.shape and got.dtype == np.float32
    np.testing.assert_allclose(got, expected, atol=1e-6)
    np.testing.assert_array_equal(synth.synthesize(text), got)
    other = HfVitsSynthesizer(tiny_vits, device="cpu", seed=8).synthesize(text)
    assert other.shape != got.shape or not np.allclose(other, got)


def test_hf_vits_streams_through_the_head(tiny_vits: Path) -> None:
    head = TtsHead.load(str(tiny_vits), device="cpu", seed=1)
    chunks = [c for _, c in asyncio.run(collect(head.stream(words("one two three four, five six. seven eight nine."))))]
    assert "".join(c.transcript for c in chunks) == "one two three four, five six. seven eight nine."
    assert all(c.sample_rate == 24000 and len(c.pcm16) <= 4800 for c in chunks)
    whole = head.synthesize("one two three four,")
    assert (
        abs(
            len(whole) - 1.5 * len(HfVitsSynthesizer(tiny_vits, device="cpu", seed=1).synthesize("one two three four,"))
        )
        <= 2
    )


def test_loader_errors_say_what_was_expected(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match="expected 'default', a Piper .onnx voice or a directory"):
        load_synthesizer(str(tmp_path))
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "whisper"}))
    with pytest.raises(ValueError, match="model_type 'whisper'; expected 'vits'"):
        load_synthesizer(str(tmp_path))
    with pytest.raises(FileNotFoundError, match="missing.onnx does not exist"):
        load_synthesizer(str(tmp_path / "missing.onnx"))


@pytest.mark.gpu
def test_hf_vits_on_gpu_is_reproducible(tiny_vits: Path) -> None:
    import torch

    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    synth = load_synthesizer(str(tiny_vits), device="auto", seed=5)
    assert isinstance(synth, HfVitsSynthesizer) and synth.device.type == "cuda"
    first = synth.synthesize("hello there, friend.")
    np.testing.assert_array_equal(synth.synthesize("hello there, friend."), first)
    assert first.dtype == np.float32 and len(first) > 0 and np.isfinite(first).all()


@pytest.mark.gpu
def test_hf_vits_graphs_replay_what_runs_eagerly(tiny_vits: Path) -> None:
    """After ``prepare`` the model pass (text stage, flow) and the vocoder windows replay from CUDA graphs,
    with the audio of the eager run for the same seed; without it nothing is captured."""
    import torch

    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    texts = ["hello there, friend.", "hi.", "one two three four five six seven eight nine ten."]
    graphed = HfVitsSynthesizer(tiny_vits, device="cuda", seed=5)
    assert graphed._graphs is not None
    graphed.synthesize_batch(texts)
    assert [len(g) for g in graphed._graphs] == [0, 0, 0]  # not prepared: eager, nothing captured
    graphed.prepare(max_rows=4)
    captured = [len(g) for g in graphed._graphs]
    assert all(n > 0 for n in captured), captured
    got = graphed.synthesize_batch(texts)
    assert all(g.replayed > 0 for g in graphed._graphs), [g.replayed for g in graphed._graphs]
    assert [len(g) for g in graphed._graphs] == captured  # frozen: serving captures nothing
    expected = HfVitsSynthesizer(tiny_vits, device="cuda", seed=5, cuda_graphs=False).synthesize_batch(texts)
    for g, e in zip(got, expected):
        assert g.shape == e.shape and len(g) > 0
        np.testing.assert_allclose(g, e, atol=1e-4)


@pytest.mark.gpu
def test_hf_vits_batch_waits_on_the_gpu_only_for_its_lengths(tiny_vits: Path) -> None:
    """The model pass of a batch synchronizes with the GPU a handful of times (the upload of its tokens, the
    size of its output; 6 for 16 rows on an H200): with transformers' duration spline, whose range checks
    and boolean indexing synchronize in every flow, it took 2,070. Each sync waits for every kernel queued
    before it, by this thread or, on a shared GPU, another process."""
    import warnings

    import torch

    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    synth = HfVitsSynthesizer(tiny_vits, device="cuda")
    synth.prepare(max_rows=2)  # as served: from CUDA graphs
    texts = ["hello there, friend.", "hi."]
    synth.start_batch(texts)
    torch.cuda.set_sync_debug_mode("warn")
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            synth.start_batch(texts)
    finally:
        torch.cuda.set_sync_debug_mode(0)
    syncs = [str(w.message) for w in caught if "synchroniz" in str(w.message)]
    assert len(syncs) <= 8, syncs


def test_piper_session_keeps_to_its_threads_and_sleeps_between_renders() -> None:
    synth = PiperSynthesizer(default_piper_voice(), threads=1)
    options = synth._voice.session.get_session_options()
    assert options.intra_op_num_threads == 1
    assert options.get_session_config_entry("session.intra_op.allow_spinning") == "0"
    assert len(synth.synthesize("Hello there.")) > synth.sample_rate // 4
