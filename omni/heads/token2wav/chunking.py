"""How token2wav cuts a stream of codes into chunks: its settings, each chunk's DiT window, and the ODE's times.

Pure arithmetic over code positions (``ode_times`` borrows torch's float32 linspace to match transformers'
times exactly); ``token2wav`` runs the models on what this decides.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

DIT_DTYPES = ("float32", "bfloat16")


@dataclass(frozen=True, slots=True)
class Token2WavConfig:
    first_chunk_codes: int = 4  # 80 ms of audio at 50 codes/s: audio starts after this many codes
    chunk_codes: int = 48  # later chunks
    past_codes: int = 24  # DiT context before a chunk
    lookahead_codes: int = 2  # DiT context after a chunk (a chunk waits for these codes)
    vocoder_context_frames: int = 16  # mel frames of vocoder context either side of a chunk
    num_steps: int = 10
    first_chunk_steps: int | None = None  # ODE steps of the first chunk; None: num_steps
    # On CUDA, replay regular chunks' ODE and vocoder from graphs captured at build (call_graphs): a first
    # chunk's call takes 126 ms instead of 259 ms on an H100 (10 steps, one row). Before the graphs had a
    # capture stream of their own, 2 of 6 runs at 32 concurrent streams failed in a replay; since, 13 of 13
    # (H100 and H200, concurrency 8 then 32, one and two lanes) ran clean.
    cuda_graphs: bool = True
    # The DiT's weights and activations (the ODE's state stays float32): "float32" as transformers runs it,
    # or "bfloat16", which puts its matrix products on tensor cores (the vocoder stays float32).
    dit_dtype: str = "float32"
    # Worker threads, each with its own CUDA stream (and graphs). With 2, one runs first chunks alone, so a
    # first chunk never waits behind another session's later chunk: first audio 214 ms instead of 248 at
    # concurrency 8 and 622 instead of 674 at 32 (H200, graphs, 4 first-chunk steps).
    lanes: int = 2
    # While a first chunk's call runs, the process's engines launch no step (engine.runner.step_gate): on an H100 at
    # 8 sessions the call takes 40 ms alone and 87 ms beside the engines' steps.
    first_chunks_alone: bool = True
    guidance_scale: float = 0.5
    sway_coefficient: float = -1.0

    def __post_init__(self) -> None:
        for name in ("first_chunk_codes", "chunk_codes", "num_steps"):
            if not isinstance(getattr(self, name), int) or getattr(self, name) < 1:
                raise ValueError(f"{name} must be a positive integer, got {getattr(self, name)!r}")
        if self.first_chunk_steps is not None and (
            not isinstance(self.first_chunk_steps, int) or self.first_chunk_steps < 2
        ):
            raise ValueError(f"first_chunk_steps must be None or an integer >= 2, got {self.first_chunk_steps!r}")
        if not isinstance(self.lanes, int) or self.lanes < 1:
            raise ValueError(f"lanes must be a positive integer, got {self.lanes!r}")
        if self.dit_dtype not in DIT_DTYPES:
            raise ValueError(f"dit_dtype must be one of {', '.join(DIT_DTYPES)}, got {self.dit_dtype!r}")
        for name in ("past_codes", "lookahead_codes", "vocoder_context_frames"):
            if not isinstance(getattr(self, name), int) or getattr(self, name) < 0:
                raise ValueError(f"{name} must be a non-negative integer, got {getattr(self, name)!r}")


@dataclass(frozen=True, slots=True)
class ChunkShape:
    """What a chunk's call computes beyond its inputs' shapes: its mel frames ``[lo, hi)`` of the window,
    its ODE steps, whether it is a stream's first chunk (batched first), and whether its window has one of the
    stream's steady shapes (its calls may replay from CUDA graphs; a stream's last window has a one-off one)."""

    lo: int
    hi: int
    steps: int
    first: bool
    regular: bool


def chunk_window(
    cfg: Token2WavConfig, block_codes: int, repeats: int, start: int, end: int, available: int, *, final: bool
) -> tuple[int, int, ChunkShape]:
    """The DiT window ``[win_start, win_end)`` (in codes) of the chunk of codes ``[start, end)``, with
    ``available`` codes known, and the chunk's shape in it. The window starts on a DiT block boundary, so its
    block masks match the whole utterance's, and reaches ``lookahead_codes`` past the chunk unless ``final``."""
    win_start = max(0, start - cfg.past_codes) // block_codes * block_codes
    win_end = available if final else min(available, end + cfg.lookahead_codes)
    steps = cfg.first_chunk_steps if start == 0 and cfg.first_chunk_steps is not None else cfg.num_steps
    regular = not final and win_end == end + cfg.lookahead_codes
    lo, hi = (start - win_start) * repeats, (end - win_start) * repeats
    return win_start, win_end, ChunkShape(lo, hi, steps, first=start == 0, regular=regular)


def padded_window(window: int, graph_windows: list[int]) -> int | None:
    """The smallest of ``graph_windows`` (sorted) that holds ``window`` codes, or None."""
    return next((w for w in graph_windows if w >= window), None)


def rk4_intervals(steps: int, sway: float | None) -> list[tuple[float, float, tuple[float, float, float, float]]]:
    """Each ODE interval's ends and the four times its RK4 (3/8 rule) step evaluates the DiT at."""
    times = ode_times(steps, sway)
    return [(t0, t1, (t0, t0 + (t1 - t0) / 3, t0 + (t1 - t0) * 2 / 3, t1)) for t0, t1 in zip(times[:-1], times[1:])]


def ode_times(steps: int, sway: float | None) -> list[float]:
    """The ODE's time points as transformers computes them (float32 linspace, then the sway warp)."""
    t = torch.linspace(0, 1, steps, dtype=torch.float32)
    if sway is not None:
        t += sway * (torch.cos(torch.pi / 2 * t) - 1 + t)
    return [float(v) for v in t]
