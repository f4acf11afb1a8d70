"""token2wav's first chunk replayed from CUDA graphs gives the audio its eager ODE gives."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest
import torch
from omni_gateway.omni.heads.token2wav import Token2Wav, Token2WavConfig

from benchmarks.tiny_omni import CODEC_VOCAB, save_tiny_omni

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]


def test_graphed_first_chunks_match_eager(tmp_path: Path) -> None:
    directory = save_tiny_omni(tmp_path)
    chunks = dict(first_chunk_codes=4, chunk_codes=8, past_codes=4, lookahead_codes=2, num_steps=4)
    eager = Token2Wav.from_pretrained(directory, Token2WavConfig(**chunks), device="cuda")
    graphed = Token2Wav(eager.models, Token2WavConfig(**chunks, cuda_graphs=True))
    g = torch.Generator().manual_seed(0)
    jobs = [(torch.randint(0, CODEC_VOCAB - 4, (20,), generator=g).tolist(), voice) for voice in ("Ethan", "Chelsie")]

    def run(head: Token2Wav, codes: list[int], voice: str, seed: int) -> list[torch.Tensor]:
        stream = head.stream(voice, seed=seed)
        return [w.cpu() for w in stream.push(codes) + stream.finish()]

    def together() -> list[list[torch.Tensor] | None]:
        got: list[list[torch.Tensor] | None] = [None] * len(jobs)

        def worker(i: int) -> None:
            got[i] = run(graphed, *jobs[i], i)

        threads = [threading.Thread(target=worker, args=(i,)) for i in range(len(jobs))]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        return got

    want = [run(eager, codes, voice, i) for i, (codes, voice) in enumerate(jobs)]
    for _ in range(2):  # the second round replays what the first captured
        got = together()
        for alone, replayed in zip(want, got):
            assert replayed is not None and len(replayed) == len(alone)
            for a, b in zip(alone, replayed):
                torch.testing.assert_close(b, a, rtol=1e-4, atol=1e-5)
    assert graphed._graphs is not None and graphed._graphs.enabled and graphed._graphs._graphs
    eager.close()
    graphed.close()
