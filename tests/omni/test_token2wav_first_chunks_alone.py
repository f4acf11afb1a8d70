"""A first chunk's token2wav call holds the process's engine steps back (``first_chunks_alone``); later
chunks' calls do not, and with the setting off none does."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from omni_gateway.engine.step_gate import wait_for_urgent
from omni_gateway.omni.heads.token2wav import Token2Wav, Token2WavConfig

from benchmarks.tiny_omni import CODEC_VOCAB, save_tiny_omni

pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> Any:
    return Token2Wav.from_pretrained(save_tiny_omni(tmp_path_factory.mktemp("omni")), device="cpu").models


def _calls_held(head: Token2Wav, monkeypatch: pytest.MonkeyPatch) -> list[tuple[bool, bool]]:
    """(first chunk, engines held) for each of ``head``'s calls of one stream."""
    seen: list[tuple[bool, bool]] = []
    run = head._run_group

    def recorded(calls: list[tuple[Any, ...]], lane: int) -> Any:
        seen.append((calls[0][4].first, not wait_for_urgent(0.0)))
        return run(calls, lane)

    monkeypatch.setattr(head, "_run_group", recorded)
    codes = torch.randint(0, CODEC_VOCAB - 4, (30,), generator=torch.Generator().manual_seed(2)).tolist()
    stream = head.stream(head.voices[0], seed=1)
    waves = stream.push(codes) + stream.finish()
    head.close()
    assert len(waves) >= 3 and all(len(w) > 0 for w in waves)
    return seen


@pytest.mark.parametrize("alone", [True, False])
def test_first_chunk_calls_hold_engine_steps(models: Any, alone: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    config = Token2WavConfig(first_chunk_codes=4, chunk_codes=8, first_chunks_alone=alone)
    seen = _calls_held(Token2Wav(models, config), monkeypatch)
    assert seen[0] == (True, alone)
    assert len(seen) > 1 and all(not first and not held for first, held in seen[1:])
    assert wait_for_urgent(0.0)  # released once the calls are done
