"""Input streams: rows that reach a running request while it generates, and the waiting they cause."""

from __future__ import annotations

import pytest
from omni_gateway.engine.input_stream import InputStream
from omni_gateway.engine.sampling_params import SamplingParams

from tests.engine.engine_fakes import make_engine


def test_rows_then_fill_after_close() -> None:
    stream = InputStream(start=5)
    assert stream.ready(5) and not stream.ready(6)
    stream.append(["a", "b"])
    assert stream.ready(7) and not stream.ready(8)
    assert stream.rows(3, 7) == ["a", "b"]  # positions before the start have no rows
    with pytest.raises(RuntimeError, match="position 7"):
        stream.rows(5, 8)
    stream.close(["c"], "pad")
    assert stream.ready(100)
    assert stream.rows(6, 10) == ["b", "c", "pad", "pad"]
    with pytest.raises(RuntimeError, match="closed"):
        stream.close([], "pad")
    with pytest.raises(ValueError, match=">= 0"):
        InputStream(start=-1)


def test_a_request_waits_for_its_rows_and_others_run_meanwhile() -> None:
    engine = make_engine()
    prompt = [5, 6, 7, 8]
    stream = InputStream(start=len(prompt))
    params = SamplingParams(max_tokens=4, ignore_eos=True)
    engine.add_request("talker", prompt, params, input_stream=stream)
    engine.add_request("plain", [9, 10, 11], params)
    got: dict[str, int] = {"talker": 0, "plain": 0}

    def step() -> None:
        for delta in engine.step():
            got[delta.request_id] += len(delta.token_ids)

    step()  # prefills: both sample their first token
    assert got == {"talker": 1, "plain": 1}
    for _ in range(3):  # the talker needs the row of its first generated position to go on; "plain" does not
        step()
    assert got == {"talker": 1, "plain": 4}
    assert engine.waits_for_input() and engine.step() == []  # nothing to do, and no error either
    stream.append(["row"])
    step()
    assert got["talker"] == 2
    stream.close([], "pad")
    while engine.has_unfinished():
        step()
    assert got["talker"] == 4
    assert engine.scheduler.kv.usage().num_used_blocks == 0


def test_decoded_text_after_mrope_spans_shifts_like_mrope_positions() -> None:
    """A graph decodes text past M-RoPE media at index + text_shift, which all three axes agree on."""
    import torch
    from omni_gateway.engine.mrope import mrope_positions, text_shift
    from omni_gateway.engine.sequence import EmbedSpan

    grid = torch.tensor([[0, 0, 0, 0, 1, 1], [0, 0, 1, 1, 0, 0], [0, 1, 0, 1, 0, 1]])  # t, h, w of 6 patches
    spans = (
        EmbedSpan(offset=0, length=3, key="text", embeds=None),
        EmbedSpan(offset=3, length=6, key="image", embeds=None, positions=grid),
        EmbedSpan(offset=11, length=6, key="image2", embeds=None, positions=grid),
    )
    for index in (17, 18, 40):
        want = mrope_positions(spans, index, index + 1)[:, 0]
        assert want.tolist() == [index + text_shift(spans)] * 3
    assert text_shift(spans) == 2 * (2 - 6)
