"""token2wav against transformers' own Qwen2_5OmniToken2WavModel, and streamed against whole-utterance."""

from __future__ import annotations

import dataclasses
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
from omni_gateway.engine.runner.step_gate import wait_for_urgent
from omni_gateway.omni.heads.call_graphs import CallGraphs
from omni_gateway.omni.heads.token2wav import batcher as batcher_module
from omni_gateway.omni.heads.token2wav.batcher import BatchedCalls
from omni_gateway.omni.heads.token2wav.dit import FastDiT
from omni_gateway.omni.heads.token2wav.head import ChunkShape, Token2Wav, Token2WavConfig, UnknownVoice
from omni_gateway.omni.heads.token2wav.loader import Token2WavLoadError
from omni_gateway.omni.heads.token2wav.vocoder import FastVocoder

from tests.harness.tiny_omni import CODEC_VOCAB, SPEAKERS, save_tiny_omni

pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return save_tiny_omni(tmp_path_factory.mktemp("omni"))


@pytest.fixture(scope="module")
def t2w(tiny_dir: Path) -> Token2Wav:
    return Token2Wav.from_pretrained(tiny_dir, device="cpu")


def _codes(n: int, seed: int = 1) -> list[int]:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, CODEC_VOCAB - 4, (n,), generator=g).tolist()


@pytest.mark.parametrize("guided", [True, False])
def test_fast_dit_evaluation_matches_the_dits_forward(t2w: Token2Wav, guided: bool) -> None:
    """The DiT with its per-chunk and per-time parts computed apart, against transformers' forward; weights
    drawn large, so that head 0's rotary positions, the block masks and the speaker encoder all move the
    output (at the checkpoint's small initial weights they hardly do)."""
    import copy

    dit = copy.deepcopy(t2w.models.dit)
    g = torch.Generator().manual_seed(5)
    with torch.no_grad():
        for param in dit.parameters():
            param.copy_(torch.randn(param.shape, generator=g) * 0.3)
    fast = FastDiT(dit, [0.25])
    rows, n = 2, 9
    frames = n * dit.repeats
    code = torch.randint(0, CODEC_VOCAB - 4, (rows, n), generator=g)
    x = torch.randn(rows, frames, dit.mel_dim, generator=g)
    speaker = torch.randn(rows, 1, dit.config.enc_emb_dim, generator=g).expand(rows, frames, -1)
    ref_mel = torch.randn(rows, 30, dit.mel_dim, generator=g)
    with torch.inference_mode():
        chunk = fast.prepare(code, speaker, ref_mel, guided)
        for t in (0.25, 0.6):  # a time computed when built, and one computed on the spot
            want = dit(
                hidden_states=x,
                speaker_embedding=speaker,
                condition_vector=ref_mel,
                quantized_code=code,
                time_step=torch.tensor(t),
                apply_cfg=guided,
            )
            assert want.shape == (rows * (2 if guided else 1), frames, dit.mel_dim)
            torch.testing.assert_close(fast.velocity(chunk, x, t), want, rtol=1e-4, atol=1e-4)


def test_fast_vocoder_matches_the_vocoders_forward(t2w: Token2Wav) -> None:
    """The vocoder with its activations' constants computed once, against transformers' forward; snake
    parameters drawn away from their zero initialisation, so exp(alpha) and 1 / exp(beta) matter."""
    import copy

    vocoder = copy.deepcopy(t2w.models.vocoder)
    g = torch.Generator().manual_seed(7)
    with torch.no_grad():
        for name, param in vocoder.named_parameters():
            if name.endswith(("alpha", "beta")):
                param.copy_(torch.randn(param.shape, generator=g) * 0.5)
    mel = torch.randn(2, vocoder.config.mel_dim, 24, generator=g)
    with torch.inference_mode():
        got = FastVocoder(vocoder)(mel)
        want = vocoder(mel)
    assert got.shape == want.shape == (2, 24 * t2w.hop)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)


def test_a_bfloat16_dit_computes_in_bfloat16_close_to_float32(tiny_dir: Path, t2w: Token2Wav) -> None:
    """``dit_dtype="bfloat16"``: loaded so, the DiT is held once in bfloat16 (the vocoder stays float32); over
    models loaded in float32 the head takes a converted copy and leaves them as they were. The ODE's state and
    the waveform stay float32, within bfloat16's rounding of the float32 head's but not equal to it."""
    config = Token2WavConfig(dit_dtype="bfloat16")
    loaded = Token2Wav.from_pretrained(tiny_dir, config, device="cpu")
    assert loaded.models.dit.dtype == torch.bfloat16 and loaded.models.vocoder.dtype == torch.float32
    assert loaded._dit.dit is loaded.models.dit
    shared = Token2Wav(t2w.models, config)
    assert t2w.models.dit.dtype == torch.float32 and shared._dit.dtype == torch.bfloat16
    codes = _codes(29)
    want = t2w.synthesize(codes, "Ethan", seed=4)
    for head in (loaded, shared):
        got = head.synthesize(codes, "Ethan", seed=4)
        assert got.dtype == torch.float32 and got.shape == want.shape
        error = float((got - want).norm() / want.norm())
        assert 0 < error < 1e-2, error
    # The float32 head over the same models still computes as before.
    torch.testing.assert_close(t2w.synthesize(codes, "Ethan", seed=4), want, rtol=0, atol=0)


@pytest.mark.slow
def test_whole_utterance_matches_hf(tiny_dir: Path, t2w: Token2Wav) -> None:
    from transformers import Qwen2_5OmniForConditionalGeneration

    hf = Qwen2_5OmniForConditionalGeneration.from_pretrained(tiny_dir).eval()
    codes = _codes(37)
    spk = hf.speaker_map["Ethan"]
    torch.manual_seed(7)
    with torch.no_grad():
        want = hf.token2wav(
            torch.tensor([codes]), conditioning=spk["cond"].float().reshape(1, -1), reference_mel=spk["ref_mel"].float()
        ).reshape(-1)
    got = t2w.synthesize(codes, "Ethan", seed=7)
    assert got.shape == want.shape == (37 * t2w.repeats * t2w.hop,)
    assert want.abs().max() > 0.01
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5)
    # Another voice is another speaker embedding and reference mel: different audio.
    assert not torch.allclose(t2w.synthesize(codes, "Chelsie", seed=7), want, atol=1e-3)


@pytest.mark.slow
def test_one_chunk_stream_is_the_whole_utterance(t2w: Token2Wav) -> None:
    codes = _codes(30)
    whole = Token2Wav(t2w.models, Token2WavConfig(first_chunk_codes=64))
    stream = whole.stream("Chelsie", seed=3)
    assert stream.push(codes) == []  # 30 codes are less than the first chunk plus its lookahead
    (only,) = stream.finish()
    torch.testing.assert_close(only, t2w.synthesize(codes, "Chelsie", seed=3))


@pytest.mark.slow
def test_chunked_stream_against_whole_utterance(t2w: Token2Wav) -> None:
    codes = _codes(60, seed=2)
    cfg = Token2WavConfig(
        first_chunk_codes=6, chunk_codes=12, past_codes=8, lookahead_codes=3, vocoder_context_frames=8
    )
    chunked = Token2Wav(t2w.models, cfg)
    stream = chunked.stream("Ethan", seed=5)
    pieces: list[torch.Tensor] = []
    first_ready = None
    for i in range(0, len(codes), 3):  # codes arrive three at a time, as a talker makes them
        due = stream.completes_chunk(3)
        got = stream.push(codes[i : i + 3])
        assert due == bool(got)  # the pipeline hands only these pushes to a worker thread
        if got and first_ready is None:
            first_ready = i + 3
        pieces += got
    pieces += stream.finish()
    # Audio starts once the first chunk and its lookahead are in, long before the utterance ends.
    assert first_ready == cfg.first_chunk_codes + cfg.lookahead_codes
    assert [p.shape[0] for p in pieces] == [n * 2 * t2w.hop for n in (6, 12, 12, 12, 12, 6)]
    streamed = torch.cat(pieces)
    whole = t2w.synthesize(codes, "Ethan", seed=5)
    assert streamed.shape == whole.shape
    # Not identical: each window's ODE sees only its own context, and the vocoder's receptive field
    # straddles chunk edges. The differences sit at the chunk edges; between them the audio agrees.
    err = (streamed - whole).abs()
    assert 0 < err.mean() < 0.01 * whole.abs().mean()
    frame = 2 * t2w.hop  # samples per code
    edges = [6, 18, 30, 42, 54]
    at_edges = max(err[(c - 1) * frame : (c + 1) * frame].max() for c in edges)
    between = max(err[(c - 4) * frame : (c - 2) * frame].max() for c in edges)
    assert at_edges > 100 * between


@pytest.mark.slow
def test_unknown_voice_lists_the_voices(t2w: Token2Wav) -> None:
    with pytest.raises(UnknownVoice) as info:
        t2w.stream("Nobody")
    for name in SPEAKERS:
        assert name in str(info.value)
    assert t2w.voices == SPEAKERS


@pytest.mark.slow
def test_bad_codes_and_configs(t2w: Token2Wav, tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="codec codes must be in"):
        t2w.synthesize([1, CODEC_VOCAB + 100], "Ethan")
    with pytest.raises(ValueError, match="at least one"):
        t2w.synthesize([], "Ethan")
    with pytest.raises(ValueError, match="first_chunk_codes"):
        Token2WavConfig(first_chunk_codes=0)
    with pytest.raises(ValueError, match="first_chunk_steps"):
        Token2WavConfig(first_chunk_steps=1)
    with pytest.raises(ValueError, match="dit_dtype must be one of float32, bfloat16, got 'float16'"):
        Token2WavConfig(dit_dtype="float16")
    with pytest.raises(ValueError, match="lanes must be a positive integer, got 0"):
        Token2WavConfig(lanes=0)
    with pytest.raises(Token2WavLoadError):
        Token2Wav.from_pretrained(tmp_path, device="cpu")


@pytest.mark.slow
@pytest.mark.parametrize("lanes", [1, 2])
def test_concurrent_streams_batch_and_match_solo_streams(t2w: Token2Wav, lanes: int) -> None:
    import threading

    cfg = Token2WavConfig(first_chunk_codes=4, chunk_codes=8, past_codes=4, lookahead_codes=2, lanes=lanes)
    chunked = Token2Wav(t2w.models, cfg)
    jobs = [(_codes(20, seed=s), voice, s) for s, voice in ((11, "Ethan"), (12, "Chelsie"), (13, "Ethan"))]

    def run(codes: list[int], voice: str, seed: int) -> torch.Tensor:
        stream = chunked.stream(voice, seed=seed)
        return torch.cat(stream.push(codes) + stream.finish())

    solo = [run(*job) for job in jobs]
    together: list[torch.Tensor | None] = [None] * len(jobs)

    def worker(i: int) -> None:
        together[i] = run(*jobs[i])

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(len(jobs))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    for alone, batched in zip(solo, together):
        assert batched is not None
        torch.testing.assert_close(batched, alone, rtol=1e-4, atol=1e-5)
    chunked.close()


@pytest.mark.slow
def test_first_chunk_takes_its_own_ode_steps(t2w: Token2Wav) -> None:
    """``first_chunk_steps`` changes the first chunk alone: it is what a stream of that many steps makes."""
    chunks = dict(first_chunk_codes=4, chunk_codes=8, past_codes=4, lookahead_codes=2)
    codes = _codes(20, seed=5)

    def first_and_rest(**steps: int | None) -> list[torch.Tensor]:
        head = Token2Wav(t2w.models, Token2WavConfig(**chunks, **steps))
        stream = head.stream("Ethan", seed=3)
        out = stream.push(codes) + stream.finish()
        head.close()
        return out

    fast = first_and_rest(num_steps=6, first_chunk_steps=3)
    torch.testing.assert_close(fast[0], first_and_rest(num_steps=3)[0])
    slow = first_and_rest(num_steps=6)
    assert not torch.equal(fast[0], slow[0])  # (the tiny DiT's flow is nearly straight: close, not equal)
    assert [len(c) for c in fast] == [len(c) for c in slow]


def _held_batcher(
    answer: Callable[[Any], Any], **options: Any
) -> tuple[BatchedCalls, threading.Event, threading.Event, list[list[Any]]]:
    """A batcher whose every call waits for ``gate`` (``busy`` is set once the first runs), recording each
    batch's jobs in ``batches`` and answering each job with ``answer(job)``."""
    gate, busy = threading.Event(), threading.Event()
    batches: list[list[Any]] = []

    def fn(calls: list[tuple[Any]], lane: int) -> list[Any]:
        busy.set()
        gate.wait(5)
        batches.append([x for (x,) in calls])
        return [answer(x) for (x,) in calls]

    return BatchedCalls(fn, "test-batcher", **options), gate, busy, batches


def test_batched_calls_group_what_queued_while_busy() -> None:
    calls, gate, busy, batches = _held_batcher(lambda x: x * 10)
    results: dict[int, int] = {}

    def call(x: int, key: str) -> None:
        results[x] = calls(key, x)

    first = threading.Thread(target=call, args=(0, "a"))
    first.start()
    assert busy.wait(5)  # the worker runs the first job
    rest = [threading.Thread(target=call, args=(x, "a" if x < 3 else "b")) for x in (1, 2, 3)]
    for thread in rest:
        thread.start()
    while calls.queued < 3:  # all three queued behind it
        time.sleep(0.001)
    gate.set()
    for thread in [first, *rest]:
        thread.join()
    calls.close()
    assert results == {0: 0, 1: 10, 2: 20, 3: 30}
    assert batches == [[0], [1, 2], [3]]  # queued while the first ran: one batch per key


def test_first_chunks_go_before_later_chunks_queued_earlier() -> None:
    calls, gate, busy, batches = _held_batcher(str.upper, max_batch=2)
    results: dict[str, str] = {}

    def call(x: str, key: str, urgent: bool) -> None:
        results[x] = calls(key, x, urgent=urgent)

    threads = [threading.Thread(target=call, args=("busy", "later", False))]
    threads[0].start()
    assert busy.wait(5)
    queued = (("l1", "later", False), ("l2", "later", False), ("l3", "later", False), ("f1", "first", True))
    for n, args in enumerate(queued, start=1):
        threads.append(threading.Thread(target=call, args=args))
        threads[-1].start()
        while calls.queued < n:  # queued in this order
            time.sleep(0.001)
    gate.set()
    for thread in threads:
        thread.join()
    calls.close()
    assert results == {x: x.upper() for x in ("busy", "l1", "l2", "l3", "f1")}
    assert batches == [["busy"], ["f1"], ["l1", "l2"], ["l3"]]  # urgent first; at most max_batch a call


def test_jobs_that_arrive_one_at_a_time_gather_into_one_call(monkeypatch: pytest.MonkeyPatch) -> None:
    """Sessions reach their chunks in the same talker step, but each hands its job over from its own thread:
    the lane waits while a key's jobs keep arriving, and runs them as one call."""
    monkeypatch.setattr(batcher_module, "QUIET_S", 1.0)
    monkeypatch.setattr(batcher_module, "GATHER_S", 5.0)
    batches: list[list[str]] = []

    def fn(calls: list[tuple[Any]], lane: int) -> list[Any]:
        batches.append([x for (x,) in calls])
        return [x.upper() for (x,) in calls]

    calls = BatchedCalls(fn, "test-gather")
    threads = []
    for x in ("a", "b", "c"):
        threads.append(threading.Thread(target=calls, args=("first", x), kwargs={"urgent": True}))
        threads[-1].start()
        time.sleep(0.05)  # far apart for a thread, well within the quiet spell
    for thread in threads:
        thread.join()
    calls.close()
    assert batches == [["a", "b", "c"]]


def test_a_lone_job_waits_for_the_quiet_spell_not_the_cap(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(batcher_module, "QUIET_S", 0.2)
    monkeypatch.setattr(batcher_module, "GATHER_S", 30.0)
    calls = BatchedCalls(lambda jobs, lane: [x for (x,) in jobs], "test-gather")
    start = time.monotonic()
    assert calls("key", "alone") == "alone"
    assert 0.2 <= time.monotonic() - start < 5
    calls.close()


def _wait_until(condition: Callable[[], bool]) -> None:
    deadline = time.monotonic() + 5
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.001)


def test_a_first_chunk_lane_runs_first_chunks_while_the_other_lane_is_busy() -> None:
    """Two lanes: lane 0 takes urgent groups only, so a first chunk that arrives while a later chunk's call
    holds lane 1 runs at once, and a later chunk that arrives while lane 1 is busy waits for lane 1."""
    gate = threading.Event()
    ran: list[tuple[str, int]] = []

    def fn(calls: list[tuple[Any]], lane: int) -> list[Any]:
        ran.append((calls[0][0], lane))
        if calls[0][0] == "busy":
            gate.wait(5)
        return [x.upper() for (x,) in calls]

    calls = BatchedCalls(fn, "test-lanes", lanes=2)
    results: dict[str, str] = {}

    def call(x: str, urgent: bool) -> None:
        results[x] = calls(x, x, urgent=urgent)

    busy = threading.Thread(target=call, args=("busy", False))
    busy.start()
    _wait_until(lambda: bool(ran))
    later = threading.Thread(target=call, args=("later", False))
    later.start()
    _wait_until(lambda: calls.queued == 1)  # queued, not taken by the idle lane 0
    assert call("first", True) is None and results["first"] == "FIRST"  # returned while "busy" still runs
    assert calls.queued == 1 and "later" not in results  # lane 0 never takes it
    gate.set()
    for thread in (busy, later):
        thread.join()
    calls.close()
    assert ran == [("busy", 1), ("first", 0), ("later", 1)]
    assert results == {"busy": "BUSY", "first": "FIRST", "later": "LATER"}
    with pytest.raises(RuntimeError, match="stopped"):
        calls("late", "late")
    with pytest.raises(ValueError, match="lanes must be at least 1"):
        BatchedCalls(fn, "test-lanes", lanes=0)


def test_batched_vocoder_rows_match_single_calls(t2w: Token2Wav) -> None:
    """The graph-capturable vocoder is transformers' BigVGAN, row by row, whatever the batch."""
    mel = torch.randn(3, t2w.mel_dim, 12, generator=torch.Generator().manual_seed(4)) - 3
    with torch.inference_mode():
        batched = t2w._wave(mel)
        for row in range(3):
            torch.testing.assert_close(batched[row], t2w.models.vocoder(mel[row : row + 1]), rtol=1e-4, atol=1e-5)


def test_regular_windows_take_few_shapes_and_the_last_is_not_graphed(t2w: Token2Wav) -> None:
    """The graphs assume every chunk but a stream's last has one of a few shapes; check it with the default
    chunking over a long answer (the chunk's call is replaced: only its shapes are looked at)."""
    head = Token2Wav(t2w.models, Token2WavConfig())
    seen: list[tuple[int, int, ChunkShape]] = []

    def shapes_only(
        code: torch.Tensor,
        noise: torch.Tensor,
        speaker: object,
        left: torch.Tensor,
        shape: ChunkShape,
        deadline: float | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        seen.append((code.shape[1], left.shape[2], shape))
        assert noise.shape[1] == code.shape[1] * head.repeats
        frames = shape.hi - shape.lo
        tail = torch.cat((left, torch.zeros(1, head.mel_dim, frames)), 2)[:, :, -head.config.vocoder_context_frames :]
        return tail, torch.zeros(frames * head.hop)

    head.chunk_batched = shapes_only  # type: ignore[method-assign]
    stream = head.stream("Ethan", seed=0)
    codes = _codes(1000, seed=2)
    for i in range(0, len(codes), 7):
        stream.push(codes[i : i + 7])
    stream.finish()
    assert [s.first for _, _, s in seen] == [True] + [False] * (len(seen) - 1)
    assert not seen[-1][2].regular  # 1000 codes leave a short last chunk
    regular = {entry for entry in seen if entry[2].regular}
    assert len(seen) > 15 and len(regular) <= 3
    # the shapes the head captures graphs for, when it is built, are exactly the ones a stream meets
    assert set(head.regular_shapes()) == regular
    assert head.regular_shapes() == list(dict.fromkeys(e for e in seen if e[2].regular))


def test_frozen_graphs_run_an_unseen_shape_eagerly_and_capture_nothing() -> None:
    """Once the head is built its graphs are frozen: a call whose shape has no graph gets None (the caller
    runs it eagerly) and no capture starts, since a capture while serving breaks other threads' device work."""
    graphs = CallGraphs("ODE")
    graphs.frozen = True
    calls: list[int] = []

    def fn(x: torch.Tensor) -> torch.Tensor:
        calls.append(1)
        return x

    assert graphs(fn, 10, torch.zeros(3, 4)) is None
    # no capture was tried (on this CPU one would fail and switch the graphs off)
    assert graphs.enabled and calls == [] and len(graphs) == 0 and graphs.replayed == 0


class _EagerGraphs:
    """Stands for a lane's CallGraphs on the CPU: serves calls of up to ``rows`` rows (eagerly), else None."""

    def __init__(self, rows: int) -> None:
        self.rows = rows
        self.served: list[int] = []
        self.windows: list[int] = []  # each served call's second dimension (codes, or mel channels)

    def __call__(self, fn: Callable[..., Any], key: object, *inputs: torch.Tensor) -> Any:
        if inputs[0].shape[0] > self.rows:
            return None
        self.served.append(inputs[0].shape[0])
        self.windows.append(inputs[0].shape[1])
        return fn(*inputs)


def test_a_group_larger_than_a_graph_runs_as_graphed_slices(t2w: Token2Wav, monkeypatch: pytest.MonkeyPatch) -> None:
    """Five rows of a regular later chunk, where a graph holds two: slices of 2, 2 and 1 rows, each served by
    the graphs, and the same audio as one eager call of five rows."""
    from omni_gateway.omni.heads.token2wav import head as token2wav_module

    cfg = Token2WavConfig(first_chunk_codes=4, chunk_codes=8, past_codes=4, lookahead_codes=2, num_steps=2)
    head = Token2Wav(t2w.models, cfg)
    window, left, shape = next(entry for entry in head.regular_shapes() if not entry[2].first)
    monkeypatch.setattr(token2wav_module, "GRAPH_CODES", 2 * window + 1)
    assert head.graph_rows(window) == 2 and head.graph_rows(300) == 0
    g = torch.Generator().manual_seed(5)
    calls = [
        (
            torch.tensor([_codes(window, seed=20 + i)]),
            torch.randn(1, window * head.repeats, head.mel_dim, generator=g),
            head.speaker(voice),
            torch.randn(1, head.mel_dim, left, generator=g) - 3,
            shape,
        )
        for i, voice in enumerate(("Ethan", "Chelsie", "Ethan", "Ethan", "Chelsie"))
    ]
    eager = head._run_group(calls, 0)
    ode, vocoder = _EagerGraphs(2), _EagerGraphs(2)
    head._graphs = [(ode, vocoder)]  # type: ignore[list-item]
    sliced = head._run_group(calls, 0)
    assert ode.served == vocoder.served == [2, 2, 1]
    for (tail, wav), (tail_eager, wav_eager) in zip(sliced, eager, strict=True):
        torch.testing.assert_close(wav, wav_eager, rtol=1e-4, atol=1e-5)
        torch.testing.assert_close(tail, tail_eager, rtol=1e-4, atol=1e-5)


def test_a_last_chunk_runs_its_ode_in_the_next_regular_windows_graphs(t2w: Token2Wav) -> None:
    """A stream's last window, shorter than the regular ones, is padded to the next regular window for its
    ODE's graph (its padding masked away), and gives what its unpadded eager call gives; its vocoder call,
    whose convolutions would see the padding, is never a graph's."""
    cfg = Token2WavConfig(first_chunk_codes=4, chunk_codes=8, past_codes=4, lookahead_codes=2, num_steps=2)
    head = Token2Wav(t2w.models, cfg)
    windows = sorted({window for window, _, _ in head.regular_shapes()})
    window = windows[-1] - 3  # a last window: no lookahead, fewer codes
    frames = window * head.repeats
    shape = ChunkShape(lo=4 * head.repeats, hi=frames, steps=2, first=False, regular=False)
    g = torch.Generator().manual_seed(9)
    calls = [
        (
            torch.tensor([_codes(window, seed=40 + i)]),
            torch.randn(1, frames, head.mel_dim, generator=g),
            head.speaker(voice),
            torch.randn(1, head.mel_dim, 3, generator=g) - 3,
            shape,
        )
        for i, voice in enumerate(("Ethan", "Chelsie"))
    ]
    eager = head._run_group(calls, 0)
    ode, vocoder = _EagerGraphs(8), _EagerGraphs(8)
    head._graphs = [(ode, vocoder)]  # type: ignore[list-item]
    padded = head._run_group(calls, 0)
    want_window = min(w for w in windows if w >= window)
    assert ode.windows == [want_window] and want_window > window and vocoder.served == []
    for (tail, wav), (tail_eager, wav_eager) in zip(padded, eager, strict=True):
        assert torch.isfinite(wav).all()
        torch.testing.assert_close(wav, wav_eager, rtol=1e-4, atol=1e-5)
        torch.testing.assert_close(tail, tail_eager, rtol=1e-4, atol=1e-5)
    # a window longer than every regular one has no graph: eager, unpadded
    long_window = windows[-1] + 1
    code = torch.tensor([_codes(long_window, seed=50)])
    noise = torch.randn(1, long_window * head.repeats, head.mel_dim, generator=g)
    long_shape = dataclasses.replace(shape, hi=long_window * head.repeats)
    head._run_group([(code, noise, head.speaker("Ethan"), calls[0][3], long_shape)], 0)
    assert ode.windows == [want_window]


@pytest.mark.parametrize("alone", [True, False])
def test_first_chunk_calls_hold_engine_steps(t2w: Token2Wav, alone: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    """A first chunk's call holds the process's engine steps back (``first_chunks_alone``); later chunks'
    calls do not, and with the setting off none does."""
    head = Token2Wav(t2w.models, Token2WavConfig(first_chunk_codes=4, chunk_codes=8, first_chunks_alone=alone))
    seen: list[tuple[bool, bool]] = []  # (first chunk, engines held) of each call
    run = head._run_group

    def recorded(calls: list[tuple[Any, ...]], lane: int) -> Any:
        seen.append((calls[0][4].first, not wait_for_urgent(0.0)))
        return run(calls, lane)

    monkeypatch.setattr(head, "_run_group", recorded)
    stream = head.stream("Chelsie", seed=1)
    waves = stream.push(_codes(30, seed=2)) + stream.finish()
    head.close()
    assert len(waves) >= 3 and all(len(w) > 0 for w in waves)
    assert seen[0] == (True, alone)
    assert len(seen) > 1 and all(not first and not held for first, held in seen[1:])
    assert wait_for_urgent(0.0)  # released once the calls are done
