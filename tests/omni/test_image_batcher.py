"""ImageBatcher and option resolution without a model: grouping by key and window, limits, failures."""

from __future__ import annotations

import threading
import time
from collections.abc import Hashable

import pytest
from omni_gateway.omni.heads.dit.batcher import BatcherClosed, ImageBatcher
from omni_gateway.omni.heads.dit.errors import ImageRequestError
from omni_gateway.omni.heads.dit.options import ImageLimits, resolve_job
from omni_gateway.omni.protocol import ImageOutputOptions


class Item:
    def __init__(self, name: str, key: Hashable = "k", images: int = 1, cancelled: bool = False) -> None:
        self.name, self.batch_key, self.num_images = name, key, images
        self.cancelled = cancelled
        self.finished = threading.Event()
        self.error: BaseException | None = None

    def is_cancelled(self) -> bool:
        return self.cancelled

    def finish(self) -> None:
        self.finished.set()

    def fail(self, error: BaseException) -> None:
        self.error = error
        self.finished.set()


class Recorder:
    """A run_batch that blocks on a gate, so tests decide what is queued while a batch runs."""

    def __init__(self) -> None:
        self.batches: list[list[str]] = []
        self.gate = threading.Event()
        self.started = threading.Event()

    def __call__(self, items: list[Item]) -> None:
        self.started.set()
        self.gate.wait(5)
        self.batches.append([i.name for i in items])
        for i in items:
            i.finish()


def wait_all(*items: Item) -> None:
    for i in items:
        assert i.finished.wait(5), f"{i.name} never finished"


def test_requests_within_the_window_share_a_batch_and_others_keep_their_order() -> None:
    run = Recorder()
    run.gate.set()
    batcher = ImageBatcher(run, window_s=0.5, max_images=8)
    a, b, c, d = Item("a"), Item("b", key="other"), Item("c"), Item("d", key="other")
    for item in (a, b, c, d):
        batcher.submit(item)
    wait_all(a, b, c, d)
    batcher.close()
    assert run.batches == [["a", "c"], ["b", "d"]]


def test_a_batch_never_exceeds_max_images() -> None:
    run = Recorder()
    batcher = ImageBatcher(run, window_s=0.2, max_images=4)
    blocker = Item("blocker", key="x")
    batcher.submit(blocker)
    assert run.started.wait(5)
    items = [Item("two", images=2), Item("three", images=3), Item("one", images=1), Item("one-more", images=1)]
    for item in items:
        batcher.submit(item)
    run.gate.set()
    wait_all(blocker, *items)
    batcher.close()
    assert run.batches == [["blocker"], ["two", "one", "one-more"], ["three"]]


def test_zero_window_runs_a_lone_request_at_once() -> None:
    run = Recorder()
    run.gate.set()
    batcher = ImageBatcher(run, window_s=0.0)
    item = Item("solo")
    t0 = time.monotonic()
    batcher.submit(item)
    wait_all(item)
    batcher.close()
    assert time.monotonic() - t0 < 2.0 and run.batches == [["solo"]]


def test_cancelled_requests_are_finished_without_running() -> None:
    run = Recorder()
    run.gate.set()
    batcher = ImageBatcher(run, window_s=0.0)
    gone = Item("gone", cancelled=True)
    batcher.submit(gone)
    wait_all(gone)
    batcher.close()
    assert run.batches == []


def test_a_failing_batch_fails_its_requests_and_the_worker_carries_on() -> None:
    calls: list[str] = []

    def run(items: list[Item]) -> None:
        calls.append(items[0].name)
        if items[0].name == "bad":
            raise RuntimeError("out of memory")
        for i in items:
            i.finish()

    batcher = ImageBatcher(run, window_s=0.0)
    bad, good = Item("bad"), Item("good", key="other")
    batcher.submit(bad)
    wait_all(bad)
    batcher.submit(good)
    wait_all(good)
    batcher.close()
    assert isinstance(bad.error, RuntimeError) and good.error is None and calls == ["bad", "good"]


def test_closed_batcher_refuses_work_and_finishes_waiting_requests() -> None:
    run = Recorder()
    batcher = ImageBatcher(run, window_s=0.0)
    first, waiting = Item("first"), Item("waiting", key="other")
    batcher.submit(first)
    assert run.started.wait(5)
    batcher.submit(waiting)
    threading.Timer(0.2, run.gate.set).start()
    batcher.close(timeout=5)
    assert waiting.finished.is_set() and run.batches == [["first"]]
    with pytest.raises(BatcherClosed):
        batcher.submit(Item("late"))


LIMITS = ImageLimits(
    granularity=16,
    min_side=64,
    max_side=1024,
    min_steps=1,
    max_steps=50,
    max_images=4,
    max_guidance=20.0,
    default_steps=20,
    default_guidance=4.5,
)


def test_defaults_and_seeds_are_filled_in() -> None:
    spec = resolve_job(
        "a cat", ImageOutputOptions(size=(512, 256), n=3, preview_every=5), LIMITS, draw_seed=lambda: 100
    )
    assert (spec.width, spec.height, spec.steps, spec.guidance) == (512, 256, 20, 4.5)
    assert spec.seeds == (100, 101, 102) and spec.num_previews == 4
    assert spec.batch_key == (512, 256, 20, 4.5)


@pytest.mark.parametrize(
    ("options", "message"),
    [
        (ImageOutputOptions(size=(520, 512)), "multiple of 16 from 64 to 1024 for this model; got 520x512"),
        (ImageOutputOptions(size=(512,)), r"\(width, height\) pair"),  # type: ignore[arg-type]
        (ImageOutputOptions(num_inference_steps=2.5), "got 2.5"),  # type: ignore[arg-type]
        (ImageOutputOptions(guidance_scale=21.0), "from 0 to 20; got 21.0"),
        (ImageOutputOptions(seed=-1), "seed must be"),
        (ImageOutputOptions(n=0), "n must be an integer from 1 to 4; got 0"),
    ],
)
def test_invalid_options_name_what_was_expected(options: ImageOutputOptions, message: str) -> None:
    with pytest.raises(ImageRequestError, match=message):
        resolve_job("a cat", options, LIMITS)
