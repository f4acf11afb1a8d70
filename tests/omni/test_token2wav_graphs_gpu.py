"""token2wav's chunks replayed from CUDA graphs (ODE and vocoder) give the audio their eager calls give."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest
import torch
from omni_gateway.omni.heads.call_graphs import BUCKETS
from omni_gateway.omni.heads.token2wav.head import GRAPH_CODES, Token2Wav, Token2WavConfig

from tests.harness.tiny_omni import CODEC_VOCAB, save_tiny_omni

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]


def test_graphed_chunks_match_eager(tmp_path: Path) -> None:
    directory = save_tiny_omni(tmp_path)
    chunks = dict(first_chunk_codes=4, chunk_codes=8, past_codes=4, lookahead_codes=2, num_steps=4)
    eager = Token2Wav.from_pretrained(directory, Token2WavConfig(**chunks, cuda_graphs=False), device="cuda")
    graphed = Token2Wav(eager.models, Token2WavConfig(**chunks, cuda_graphs=True, lanes=2))
    assert graphed._graphs is not None and graphed.config.lanes == 2  # a first-chunk lane and a general one
    (first_ode, first_vocoder), (ode, vocoder) = graphed._graphs
    replays_at_build = first_ode.replayed + ode.replayed
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
    for _ in range(2):  # replayed round after round, with the graphs' inputs overwritten in between
        got = together()
        for alone, replayed in zip(want, got):
            assert replayed is not None and len(replayed) == len(alone)
            for a, b in zip(alone, replayed):
                torch.testing.assert_close(b, a, rtol=1e-4, atol=1e-5)
    assert eager._graphs is None
    assert all(graphs.enabled and graphs.frozen for pair in graphed._graphs for graphs in pair)
    # captured when the head was built: on the general lane every regular window (first 6 codes, then the
    # block-aligned ones), on the first-chunk lane the first chunk's alone, each batch bucket; serving
    # captured nothing more, and the streams' regular chunks replayed
    windows = {window for window, _, _ in graphed.regular_shapes()}
    assert 6 in windows and {key[2][0][0] for key in ode._graphs} == windows
    assert {key[2][0][0] for key in first_ode._graphs} == {6}
    ref_lengths = {speaker.ref_mel.shape[1] for speaker in graphed.models.speakers.values()}

    def per_voice(ode_calls: set[tuple[int, int]]) -> int:
        return sum(1 for window, _ in ode_calls for rows in BUCKETS if rows * window <= GRAPH_CODES)

    shapes = graphed.regular_shapes()
    assert len(ode) == per_voice({(w, shape.steps) for w, _, shape in shapes}) * len(ref_lengths)
    assert len(first_ode) == per_voice({(w, shape.steps) for w, _, shape in shapes if shape.first}) * len(ref_lengths)
    assert first_ode.replayed + ode.replayed - replays_at_build >= 2 * 2
    assert first_vocoder.replayed == first_ode.replayed
    # each stream's last chunk (codes 12-20, no lookahead) ran its ODE in a regular window's graph, padded,
    # and its vocoder eagerly: at least one such call per round
    assert ode.replayed - vocoder.replayed >= 2
    eager.close()
    graphed.close()
