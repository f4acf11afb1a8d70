"""When each engine step and token2wav call of a speaking run started and ended, and what it carried.

``omni_speech --timeline FILE`` wraps the thinker's and the talker's ``LLMEngine.step`` (with the batch
their runner was handed) and token2wav's batched call, and writes one JSON line per event of the timed
runs: ``{"c", "what", "t0", "t1", ...}`` in seconds since the run began. Each engine step's batches carry
``launch_ms`` (the host's time in ``runner.execute``: preparing inputs, launching kernels) and, on a GPU,
``device_s``: when the stream reached the step and when it had run what the step launched, on the device's
clock from an event recorded at the run's start. It answers what stage medians cannot: whether the talker
stepped once per thinker step or in pieces, what ran beside a first chunk, and whether a long launch waited
for the host (its device work ends with it) or ran ahead of a busy device.

``watch_stalls`` also samples, every few ms, the Python stack of each engine thread that has been inside
``runner.execute`` for longer than a threshold, and writes one ``"what": "stall"`` line per distinct stack
with its number of samples: where a long launch spends its time (a wait for the interpreter lock shows as
the line that gave it up, a blocking CUDA call as the torch call that made it).

    python -m benchmarks.analysis.step_timeline FILE      # per concurrency: steps, rows per step, busy time, stalls
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import threading
import time
from collections import Counter, defaultdict
from collections.abc import Callable
from pathlib import Path
from types import FrameType
from typing import Any

from benchmarks.lib.common import summary

# Innermost Python frames kept of a stalled engine thread's stack.
_STACK_DEPTH = 6


def chunk_kind(shape: Any) -> str:
    """A token2wav call's ``ChunkShape`` as a word: a stream's first chunk, a later regular one, or its last."""
    return "first" if shape.first else "later" if shape.regular else "last"


class Timeline:
    def __init__(self) -> None:
        self.events: list[dict[str, Any]] = []
        self.concurrency = 0
        self.t0 = time.perf_counter()
        self._lock = threading.Lock()
        self._device_ref: Any = None  # a CUDA event recorded on an idle device when the timed run began
        self._inside: dict[int, tuple[str, float]] = {}  # thread id -> (engine, when its execute began)
        self._stalls: Counter[tuple[int, str, tuple[str, ...]]] = Counter()
        self._sampling = False
        # (seconds since the run began, concurrency, an engine stalled, wake-up lateness ms, driver ms)
        self._probes: list[tuple[float, int, bool, float, float | None]] = []
        self._allocator = False  # watch_allocator turned the allocator's history on
        self._segments_from = 0  # allocator trace entries before the timed run

    def begin(self, concurrency: int) -> None:
        """A timed run starts: events count from now. On a GPU, device marks count from a reference event
        recorded while the device is idle, so they share the host clock's zero (to within a launch)."""
        import torch

        if torch.cuda.is_available() and torch.cuda.is_initialized():
            torch.cuda.synchronize()
            self._device_ref = torch.cuda.Event(enable_timing=True)
            self._device_ref.record()
        self.concurrency, self.t0, self.wall0 = concurrency, time.perf_counter(), time.time()
        self._segments_from = len(self._segments())

    def _device_mark(self) -> Any:
        """A timing event on the calling thread's current stream, or None off the GPU and in warm-ups."""
        if self._device_ref is None or not self.concurrency:
            return None
        import torch

        event = torch.cuda.Event(enable_timing=True)
        event.record()
        return event

    def end(self) -> None:
        """The timed run is over: the next warm-up records nothing."""
        if self.concurrency:
            for entry in self._segments()[self._segments_from :]:
                if "time_us" not in entry:  # a torch whose trace entries carry no time
                    continue
                t = entry["time_us"] / 1e6 - self.wall0
                fields = {"action": entry["action"], "mb": entry["size"] / 2**20, "stream": entry["stream"]}
                self.events.append({"c": self.concurrency, "what": "segment", "t0": t, "t1": t, **fields})
        self.concurrency = 0

    def watch_allocator(self) -> None:
        """Record when the CUDA caching allocator maps or frees device memory (cudaMalloc / cudaFree calls),
        and for which stream: ``"what": "segment"`` lines of the timed runs."""
        import torch

        if torch.cuda.is_available():
            skip = ["alloc", "free_requested", "free_completed"]
            torch.cuda.memory._record_memory_history("all", context=None, max_entries=200_000, skip_actions=skip)
            self._allocator = True

    def _segments(self) -> list[dict[str, Any]]:
        if not self._allocator:
            return []
        import torch

        traces = torch.cuda.memory._snapshot()["device_traces"]
        return [e for trace in traces for e in trace if e["action"].startswith("segment")]

    def record(self, what: str, t0: float, t1: float, **fields: Any) -> None:
        if not self.concurrency:
            return  # warm-up
        with self._lock:
            self.events.append({"c": self.concurrency, "what": what, "t0": t0 - self.t0, "t1": t1 - self.t0, **fields})

    def watch_engine(self, name: str, engine: Any) -> None:
        """Time ``engine.step`` (an ``LLMEngine``), with the batch its runner was handed in that step."""
        runner, step = engine.runner, engine.step
        execute = runner.execute
        launched: list[dict[str, Any]] = []

        def traced_execute(batch: Any, after: Any = None) -> Any:
            counts = list(batch.num_new_tokens)
            t0 = time.perf_counter()
            before = self._device_mark()
            me = threading.get_ident()
            self._inside[me] = (name, t0)
            try:
                pending = execute(batch, after)
            finally:
                del self._inside[me]
            # The host's share of the step: preparing inputs and launching kernels (or replaying a graph).
            launch_ms = (time.perf_counter() - t0) * 1e3
            prefills = sum(n > 1 for n in counts)
            entry = {"seqs": len(counts), "tokens": sum(counts), "prefills": prefills, "launch_ms": launch_ms}
            if before is not None:
                # When the stream reached the step, and when it had run what the step launched (on the
                # device clock): a launch that ends long before its device work was ahead of the device.
                entry["_marks"] = (self._device_ref, before, self._device_mark())
            launched.append(entry)
            return pending

        def traced_step() -> Any:
            launched.clear()
            t0 = time.perf_counter()
            deltas = step()
            t1 = time.perf_counter()
            if launched:
                self.record(name, t0, t1, batches=list(launched), deltas=len(deltas))
            return deltas

        runner.execute = traced_execute
        engine.step = traced_step

    def watch_stalls(self, after_ms: float = 20.0, every_ms: float = 2.0) -> None:
        """Sample, every ``every_ms``, the stack of each engine thread inside ``runner.execute`` for more than
        ``after_ms`` of a timed run (``watch_engine`` first); ``stop_stalls`` ends it."""
        self._sampling = True

        record_event = _driver_probe()

        def sample() -> None:
            while self._sampling:
                asleep = time.perf_counter()
                time.sleep(every_ms / 1e3)
                now, concurrency = time.perf_counter(), self.concurrency
                if not concurrency:
                    continue
                # How late this thread woke (the wait for the interpreter lock, mostly), and how long one
                # command takes the driver to queue while this thread holds the lock (a driver-side wait).
                late_ms = (now - asleep) * 1e3 - every_ms
                driver_ms = record_event() if record_event is not None else None
                inside = list(self._inside.items())
                stalled = [(tid, name) for tid, (name, began) in inside if (now - began) * 1e3 > after_ms]
                self._probes.append((now - self.t0, concurrency, bool(stalled), late_ms, driver_ms))
                frames = sys._current_frames()
                for tid, name in stalled:
                    frame = frames.get(tid)
                    if frame is not None:
                        self._stalls[(concurrency, name, _stack(frame))] += 1

        threading.Thread(target=sample, name="stall-sampler", daemon=True).start()

    def stop_stalls(self) -> None:
        self._sampling = False

    def watch_token2wav(self, t2w: Any) -> None:
        """Time token2wav's batched calls (before its worker starts: it binds ``_chunk_group`` then)."""
        group = t2w._chunk_group

        def traced(calls: list[tuple[Any, ...]], lane: int = 0) -> Any:
            shape = calls[0][4]
            t0 = time.perf_counter()
            out = group(calls, lane)
            self.record("token2wav", t0, time.perf_counter(), rows=len(calls), kind=chunk_kind(shape), lane=lane)
            return out

        t2w._chunk_group = traced

    def write(self, path: Path) -> None:
        if self._device_ref is not None:
            import torch

            torch.cuda.synchronize()  # every mark has completed
        with path.open("a") as f:
            for event in self.events:
                for batch in event.get("batches", ()):
                    marks = batch.pop("_marks", None)
                    if marks is not None:  # the run's reference event, then the step's two marks
                        ref, *pair = marks
                        batch["device_s"] = [ref.elapsed_time(m) / 1e3 for m in pair]
                f.write(json.dumps(event) + "\n")
            for t, concurrency, stalled, late_ms, driver_ms in self._probes:
                line = {"c": concurrency, "what": "probe", "t": t, "stalled": stalled, "late_ms": late_ms}
                f.write(json.dumps(line | {"driver_ms": driver_ms}) + "\n")
            for (concurrency, name, stack), samples in self._stalls.most_common():
                line = {"c": concurrency, "what": "stall", "engine": name, "stack": list(stack), "samples": samples}
                f.write(json.dumps(line) + "\n")


def _driver_probe() -> Callable[[], float] | None:
    """A function timing one ``cuEventRecord`` on a stream of its own, called with the interpreter lock
    held (``ctypes.PyDLL``), so its time is the driver's alone; None off the GPU."""
    import ctypes

    import torch

    if not (torch.cuda.is_available() and torch.cuda.is_initialized()):
        return None
    driver = ctypes.PyDLL("libcuda.so.1")
    stream, event = torch.cuda.Stream(), torch.cuda.Event()
    event.record(stream)  # creates the event
    handles = ctypes.c_void_p(event.cuda_event), ctypes.c_void_p(stream.cuda_stream)

    def record() -> float:
        t0 = time.perf_counter()
        driver.cuEventRecord(*handles)
        return (time.perf_counter() - t0) * 1e3

    return record


def _stack(frame: FrameType | None) -> tuple[str, ...]:
    """The innermost frames of a stack as ``file:line function``, innermost first."""
    out = []
    while frame is not None and len(out) < _STACK_DEPTH:
        code = frame.f_code
        out.append(f"{Path(code.co_filename).name}:{frame.f_lineno} {code.co_name}")
        frame = frame.f_back
    return tuple(out)


def summarize(path: Path, window_ms: float = 300.0) -> None:
    by_c: dict[int, list[dict[str, Any]]] = defaultdict(list)
    for line in path.read_text().splitlines():
        event = json.loads(line)
        by_c[event["c"]].append(event)
    for c, events in sorted(by_c.items()):
        print(f"c={c}")
        segments = [e for e in events if e["what"] == "segment"]
        if segments:
            print(f"  allocator: {Counter(e['action'] for e in segments)}")
        for what in ("thinker", "talker", "token2wav"):
            mine = [e for e in events if e["what"] == what]
            if not mine:
                continue
            ms = [(e["t1"] - e["t0"]) * 1e3 for e in mine]
            first = min(e["t0"] for e in mine) * 1e3
            if what == "token2wav":
                rows = [e["rows"] for e in mine]
            else:
                rows = [sum(b["seqs"] for b in e["batches"]) for e in mine]
            print(
                f"  {what}: {len(mine)} calls from {first:.0f} ms, median {statistics.median(ms):.1f} ms "
                f"(max {max(ms):.1f}), rows median {statistics.median(rows)} (min {min(rows)}, max {max(rows)})"
            )
        probes = [e for e in events if e["what"] == "probe"]
        for stalled in (False, True):
            mine = [e for e in probes if e["stalled"] == stalled]
            if mine:
                late = _percentiles([e["late_ms"] for e in mine])
                driver = _percentiles([e["driver_ms"] for e in mine if e["driver_ms"] is not None])
                print(
                    f"  probes {'during stalls' if stalled else 'otherwise'} ({len(mine)}): wake-up late {late} ms; "
                    f"driver call {driver} ms"
                )
        stalls = [e for e in events if e["what"] == "stall"]
        if stalls:
            print(f"  stalled launches, {sum(e['samples'] for e in stalls)} samples; most sampled stacks:")
            for e in sorted(stalls, key=lambda e: -e["samples"])[:6]:
                print(f"    {e['samples']:5d}  {e['engine']:<8} {' < '.join(e['stack'][:4])}")
        steps = (e for e in events if e["what"] not in ("stall", "probe") and e["t0"] * 1e3 < window_ms)
        print(f"  first {window_ms:.0f} ms:")
        for e in sorted(steps, key=lambda e: e["t0"]):
            detail = (
                f"{e['rows']} rows {e['kind']} lane {e['lane']}"
                if e["what"] == "token2wav"
                else f"{e['action']} {e['mb']:.1f} MB stream {e['stream']:#x}"
                if e["what"] == "segment"
                else " + ".join(_step_detail(b) for b in e["batches"])
            )
            print(f"    {e['t0'] * 1e3:7.1f} -> {e['t1'] * 1e3:7.1f} ms  {e['what']:<9} {detail}")


def _percentiles(values: list[float]) -> str:
    """Median / p90 / max, or a dash for none."""
    if not values:
        return "-"
    s = summary(values)
    return f"{s['median']:.2f} / {s['p90']:.2f} / {s['max']:.2f}"


def _step_detail(batch: dict[str, Any]) -> str:
    detail = f"{batch['seqs']}s/{batch['tokens']}t"
    if "launch_ms" in batch:
        detail += f" (launch {batch['launch_ms']:.1f} ms"
        if "device_s" in batch:
            a, b = batch["device_s"]
            detail += f"; device {a * 1e3:.1f} -> {b * 1e3:.1f} ms"
        detail += ")"
    return detail


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("file", type=Path)
    parser.add_argument("--window-ms", type=float, default=300.0, help="list every step that began this early")
    args = parser.parse_args()
    summarize(args.file, args.window_ms)


if __name__ == "__main__":
    main()
