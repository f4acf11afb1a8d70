"""The hearing-model prefill benchmark on the tiny shape: both modes answer, and only ``on`` prefills."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from benchmarks.audio_prefill import clip, load, save_checkpoint, turn

pytestmark = pytest.mark.slow


def test_a_turn_is_answered_with_and_without_prefills_while_spoken(tmp_path: Path) -> None:
    save_checkpoint(tmp_path, "tiny")
    pipeline = load(tmp_path)
    try:
        on = asyncio.run(turn(pipeline, "on", clip(1, 4.5), prefill=True, every_ms=1000))
        off = asyncio.run(turn(pipeline, "off", clip(2, 4.5), prefill=False, every_ms=1000))
    finally:
        pipeline.shutdown()
    assert on["commit_to_first_token_ms"] > 0 and off["commit_to_first_token_ms"] > 0
    assert off["prefill_ms"] == [] and len(on["prefill_ms"]) == 4  # at 1, 2, 3 and 4 s of the turn
    # nothing of the first 2 s group is settled before 2 s and its STFT edge; from then on each prefill runs
    assert on["prefill_ms"][0] is None and all(p is not None for p in on["prefill_ms"][2:])
