"""Sampler behaviour: seeds, masks, penalties, logprobs, min_tokens."""

from __future__ import annotations

import torch
from omni_gateway.engine.core.sequence import Sequence
from omni_gateway.engine.runner.sampler import Sampler, apply_min_p, apply_penalties, apply_top_k_top_p
from omni_gateway.engine.sampling_params import SamplingParams
from omni_gateway.kernels.host_copies import to_device

VOCAB = 50


def _seq(
    params: SamplingParams,
    prompt: list[int] | None = None,
    output: list[int] = (),
    eos: frozenset[int] = frozenset({0}),
) -> Sequence:
    seq = Sequence("r", prompt or [1, 2, 3], params, eos_token_ids=eos)
    seq.token_ids.extend(output)
    return seq


def _logits(rows: int, seed: int = 0) -> torch.Tensor:
    return torch.randn(rows, VOCAB, generator=torch.Generator().manual_seed(seed)) * 3


def test_seeded_draws_do_not_depend_on_batch_composition() -> None:
    seeded = SamplingParams(temperature=1.0, seed=1234)
    logits = _logits(3)

    def draws(batch_other: int, steps: int = 8) -> list[int]:
        sampler = Sampler(torch.device("cpu"), seed=batch_other)
        target = _seq(seeded)
        others = [_seq(SamplingParams(temperature=1.0)) for _ in range(batch_other)]
        out = []
        for _ in range(steps):
            rows = torch.cat([logits[:1], logits[1:3].repeat(batch_other, 1)[:batch_other]])
            out.append(sampler(rows, [target, *others])[0].token_id)
        return out

    alone, crowded = draws(0), draws(2)
    assert alone == crowded
    assert len(set(alone)) > 1  # it really samples, it is not argmax


def test_unseeded_temperature_sampling_follows_the_distribution() -> None:
    sampler = Sampler(torch.device("cpu"), seed=0)
    logits = torch.log(torch.tensor([[0.7, 0.2, 0.1] + [1e-9] * (VOCAB - 3)]))
    seqs = [_seq(SamplingParams(temperature=1.0))] * 2000
    counts = torch.bincount(torch.tensor([r.token_id for r in sampler(logits.repeat(2000, 1), seqs)]), minlength=3)
    freq = counts[:3].float() / 2000
    assert torch.allclose(freq, torch.tensor([0.7, 0.2, 0.1]), atol=0.04)


def test_greedy_rows_take_argmax_next_to_sampled_rows() -> None:
    sampler = Sampler(torch.device("cpu"))
    logits = _logits(2, seed=3)
    results = sampler(logits, [_seq(SamplingParams(temperature=0.0)), _seq(SamplingParams(temperature=5.0))])
    assert results[0].token_id == int(logits[0].argmax())


def test_top_k_keeps_exactly_k_best() -> None:
    logits = _logits(2, seed=4)
    out = apply_top_k_top_p(logits, [3, 0], [1.0, 1.0])
    kept = torch.isfinite(out[0])
    assert int(kept.sum()) == 3
    assert set(kept.nonzero().flatten().tolist()) == set(logits[0].topk(3).indices.tolist())
    assert torch.equal(out[1], logits[1])  # k=0 disables


def test_top_p_keeps_smallest_prefix_reaching_p() -> None:
    probs = torch.tensor([[0.5, 0.3, 0.15, 0.05]])
    out = apply_top_k_top_p(probs.log(), [0], [0.8])
    assert torch.isfinite(out).tolist() == [[True, True, False, False]]
    out = apply_top_k_top_p(probs.log(), [0], [0.81])
    assert torch.isfinite(out).tolist() == [[True, True, True, False]]
    out = apply_top_k_top_p(probs.log(), [0], [0.1])  # the top token always survives
    assert torch.isfinite(out).tolist() == [[True, False, False, False]]


def test_min_p_drops_tokens_below_fraction_of_top() -> None:
    probs = torch.tensor([[0.5, 0.3, 0.15, 0.05]])
    out = apply_min_p(probs.log(), [0.35])  # threshold 0.175
    assert torch.isfinite(out).tolist() == [[True, True, False, False]]


def test_penalties_follow_vllm_semantics() -> None:
    logits = torch.tensor([[2.0, -2.0, 1.0, 3.0, 0.5]])
    seq = _seq(
        SamplingParams(repetition_penalty=2.0, presence_penalty=0.5, frequency_penalty=0.25),
        prompt=[0, 1],
        output=[2, 2],
    )
    out = apply_penalties(logits, [seq])
    # token 0 (prompt, positive): 2/2; token 1 (prompt, negative): -2*2; token 2 (output x2, positive):
    # 1/2 - 0.5 - 2*0.25; token 3, 4 unseen: unchanged.
    assert torch.allclose(out, torch.tensor([[1.0, -4.0, -0.5, 3.0, 0.5]]))


def test_logprobs_match_log_softmax_of_raw_logits() -> None:
    sampler = Sampler(torch.device("cpu"))
    logits = _logits(2, seed=5)
    params = [SamplingParams(temperature=0.0, logprobs=3), SamplingParams(temperature=0.7, logprobs=0)]
    results = sampler(logits, [_seq(p) for p in params])
    ref = torch.log_softmax(logits, dim=-1)
    for row, result in enumerate(results):
        assert result.logprob is not None
        assert abs(result.logprob.logprob - float(ref[row, result.token_id])) < 1e-5
    top = results[0].logprob.top
    assert [t for t, _ in top] == ref[0].topk(3).indices.tolist()
    assert torch.allclose(torch.tensor([v for _, v in top]), ref[0].topk(3).values)
    assert results[1].logprob.top == ()
    assert sampler(logits, [_seq(SamplingParams(temperature=0.0))] * 2)[0].logprob is None


def test_min_tokens_masks_eos_and_stop_ids_until_reached() -> None:
    sampler = Sampler(torch.device("cpu"))
    logits = torch.zeros(1, VOCAB)
    logits[0, 0] = 10.0  # EOS is the argmax
    logits[0, 7] = 9.0  # then a stop token id
    params = SamplingParams(temperature=0.0, min_tokens=2, stop_token_ids=(7,))
    assert sampler(logits, [_seq(params, output=[5])])[0].token_id not in (0, 7)
    assert sampler(logits, [_seq(params, output=[5, 6])])[0].token_id == 0
    ignoring = SamplingParams(temperature=0.0, min_tokens=2, ignore_eos=True)
    assert sampler(logits, [_seq(ignoring)])[0].token_id == 0  # EOS is not a stop when ignored


def test_precomputed_argmax_stands_in_only_for_unmodified_greedy_logits() -> None:
    sampler = Sampler(torch.device("cpu"))
    logits = torch.full((1, VOCAB), -30.0)
    logits[0, 0] = 10.0  # EOS is the argmax
    logits[0, 9] = 9.0
    given = torch.tensor([4])  # differs from the true argmax, so a test can tell which was used
    greedy = SamplingParams(temperature=0.0)
    assert sampler(logits, [_seq(greedy)], given)[0].token_id == 4
    # min_tokens masks EOS and a penalty rewrites logits: the argmax of the raw logits is stale.
    assert sampler(logits, [_seq(SamplingParams(temperature=0.0, min_tokens=3))], given)[0].token_id == 9
    penalized = SamplingParams(temperature=0.0, repetition_penalty=2.0)
    assert sampler(logits, [_seq(penalized, prompt=[0])], given)[0].token_id == 9
    # In a batch with sampled rows, the greedy rows still take the given argmax.
    mixed = sampler(logits.repeat(2, 1), [_seq(greedy), _seq(SamplingParams(temperature=1.0))], given.repeat(2))
    assert mixed[0].token_id == 4
    # Sampled rows draw from the distribution, whatever the argmax says.
    hot = sampler(logits.repeat(200, 1), [_seq(SamplingParams(temperature=1.0))] * 200, given.repeat(200))
    assert {r.token_id for r in hot} <= {0, 9} and len({r.token_id for r in hot}) == 2


def test_to_device_takes_host_lists_and_tensors() -> None:
    cpu = torch.device("cpu")
    positions = torch.arange(6, dtype=torch.int32).view(3, 2)  # an M-RoPE step's [3, T] positions
    moved = to_device(positions, torch.int64, cpu)
    assert moved.dtype == torch.int64 and torch.equal(moved, positions.long())
    assert to_device([1, 2], torch.int32, cpu).tolist() == [1, 2]
    if torch.cuda.is_available():
        cuda = torch.device("cuda")
        on_gpu = to_device(positions, torch.int64, cuda)
        assert on_gpu.is_cuda and torch.equal(on_gpu.cpu(), positions.long())
        assert to_device(on_gpu, torch.int32, cuda).dtype == torch.int32  # already there: cast only
