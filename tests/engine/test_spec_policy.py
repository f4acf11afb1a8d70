"""The speculation policy (k per step), the n-gram lookup and the speculative_config checks: pure logic."""

from __future__ import annotations

import numpy as np
import pytest
from omni_gateway.engine.config import EngineConfig
from omni_gateway.engine.spec.config import SpeculativeConfig
from omni_gateway.engine.spec.ngram import NgramProposer, lookup
from omni_gateway.engine.spec.policy import SpecPolicy, expected_tokens
from omni_gateway.engine.spec.proposer import Proposal, ProposalRequest, Proposer, TokenPrefix, check_proposals


def test_expected_tokens_counts_the_accepted_run_and_the_targets_own_token() -> None:
    assert expected_tokens(0.0, 4) == 1.0
    assert expected_tokens(1.0, 4) == 5.0
    assert expected_tokens(0.5, 2) == pytest.approx(1 + 0.5 + 0.25)


def test_large_batches_never_speculate() -> None:
    policy = SpecPolicy(max_k=4, disable_by_batch_size=32, weight_bound_tokens=128)
    assert policy.choose_k(33) == 0
    assert policy.choose_k(256) == 0
    assert policy.choose_k(1) == 4


def test_k_shrinks_as_the_step_stops_being_weight_bound() -> None:
    policy = SpecPolicy(max_k=8, disable_by_batch_size=1024, weight_bound_tokens=64, acceptance=0.8)
    ks = [policy.best_k(b) for b in (1, 8, 16, 32, 64, 128)]
    assert ks == sorted(ks, reverse=True)
    assert ks[0] == 8 and ks[-1] == 0


def test_low_acceptance_with_a_costly_draft_turns_speculation_off_then_probes() -> None:
    policy = SpecPolicy(max_k=4, disable_by_batch_size=32, draft_cost=0.3, probe_every=4)
    for _ in range(60):
        policy.record(proposed=4, accepted=0)
    assert policy.acceptance < 0.01
    chosen = [policy.choose_k(1) for _ in range(8)]
    assert chosen == [0, 0, 0, 1, 0, 0, 0, 1]
    for _ in range(60):
        policy.record(proposed=4, accepted=4)
    assert policy.choose_k(1) == 4


def test_record_refuses_more_accepted_than_proposed() -> None:
    with pytest.raises(ValueError, match="accepted"):
        SpecPolicy(max_k=2, disable_by_batch_size=4).record(1, 2)


def test_lookup_takes_the_longest_suffix_ngram_at_its_earliest_occurrence() -> None:
    tokens = np.array([1, 2, 3, 9, 2, 3, 7, 1, 2, 3])
    assert lookup(tokens, 1, 3, 2) == (9, 2)  # "1 2 3" first seen at 0
    assert lookup(tokens, 1, 1, 2) == (9, 2)  # "3" first seen at 2
    assert lookup(np.array([4, 5, 6]), 1, 3, 2) == ()
    assert lookup(np.array([5, 5, 5]), 1, 2, 4) == (5,)  # the match runs into the suffix: what follows it


def test_ngram_proposer_honours_the_asked_count() -> None:
    proposer = NgramProposer(1, 2)
    assert isinstance(proposer, Proposer)
    requests = [ProposalRequest(0, [1, 2, 3, 4, 1, 2], 1), ProposalRequest(1, [8, 9], 3)]
    proposals = proposer.propose(requests)
    check_proposals(requests, proposals)
    assert [p.token_ids for p in proposals] == [(3,), ()]


def test_a_token_prefix_keeps_its_length_while_the_sequence_grows() -> None:
    ids = [1, 2, 3, 4, 1, 2]
    view = TokenPrefix(ids)
    ids += [3, 9, 9]  # the engine appends the step's tokens after the request
    assert len(view) == 6 and list(view) == [1, 2, 3, 4, 1, 2] and view == [1, 2, 3, 4, 1, 2]
    assert view[-1] == 2 and view[2:] == [3, 4, 1, 2] and view[4:100] == [1, 2]
    assert np.asarray(view, dtype=np.int64).tolist() == [1, 2, 3, 4, 1, 2]
    with pytest.raises(IndexError):
        view[6]
    # A proposer reading it after the growth sees the request's tokens (the grown list would look up (9, 9)).
    assert NgramProposer(1, 2).propose([ProposalRequest(0, view, 3)])[0].token_ids == (3, 4, 1)


def test_check_proposals_names_a_proposer_that_overshoots() -> None:
    with pytest.raises(ValueError, match="at most 1"):
        check_proposals([ProposalRequest(7, [1], 1)], [Proposal((1, 2))])


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ({"method": "medusa", "num_speculative_tokens": 2}, "method must be one of"),
        ({"method": "ngram", "num_speculative_tokens": 0}, "num_speculative_tokens"),
        ({"method": "ngram", "num_speculative_tokens": 99}, "num_speculative_tokens"),
        ({"method": "draft_model", "num_speculative_tokens": 2}, "needs 'model'"),
        ({"method": "eagle3", "num_speculative_tokens": 2}, "needs 'model'"),
        ({"method": "ngram", "num_speculative_tokens": 2, "prompt_lookup_min": 4, "prompt_lookup_max": 2}, "<="),
        ({"method": "ngram", "num_speculative_tokens": 2, "bogus": 1}, "unknown keys"),
        ({"num_speculative_tokens": 2}, "needs 'method'"),
        ('{"method": "ngram",', "not valid JSON"),
    ],
)
def test_bad_speculative_configs_say_what_is_wrong(value: object, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        EngineConfig(device="cpu", speculative_config=value)


def test_speculative_config_takes_vllm_keys_and_json_text() -> None:
    config = EngineConfig(device="cpu", speculative_config='{"method": "ngram", "num_speculative_tokens": 3}')
    spec = config.speculative_config
    assert isinstance(spec, SpeculativeConfig)
    assert (spec.prompt_lookup_min, spec.prompt_lookup_max) == (5, 5)  # vLLM's default window
    one_bound = SpeculativeConfig.of({"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_max": 4})
    assert (one_bound.prompt_lookup_min, one_bound.prompt_lookup_max) == (4, 4)
    with pytest.raises(ValueError, match="tensor_parallel_size 1"):
        EngineConfig(device="cpu", tensor_parallel_size=2, speculative_config=config.speculative_config)


def test_omni_serve_accepts_the_flag() -> None:
    from omni_gateway.gateway.cli import build_parser, configs

    flag = '{"method": "ngram", "num_speculative_tokens": 2, "prompt_lookup_max": 3}'
    _, omni = configs(build_parser().parse_args(["serve", "--speculative-config", flag]))
    assert omni.engine.speculative_config == SpeculativeConfig("ngram", 2, prompt_lookup_min=3, prompt_lookup_max=3)
    _, plain = configs(build_parser().parse_args(["serve"]))
    assert plain.engine.speculative_config is None


def test_scoring_cost_turns_k_down_as_acceptance_falls() -> None:
    policy = SpecPolicy(max_k=4, disable_by_batch_size=32, weight_bound_tokens=16, token_cost=0.12)
    ks = []
    for acceptance in (0.95, 0.7, 0.4, 0.05):
        policy.acceptance = acceptance
        ks.append(policy.best_k(1))
    assert ks == sorted(ks, reverse=True)
    assert ks[0] == 4 and ks[-1] == 0


def test_a_proposer_reading_hidden_states_needs_a_runner_that_captures_them() -> None:
    from types import SimpleNamespace

    from omni_gateway.engine.spec.build import build_speculator

    class Eagle:
        name = "eagle3"
        aux_hidden_layers = (2, 16, 29)

        def propose(self, requests: object) -> list[Proposal]:
            return []

        def release(self, seq_ids: object) -> None:
            pass

    config = EngineConfig(device="cpu", speculative_config={"method": "ngram", "num_speculative_tokens": 2})
    runner = SimpleNamespace(device=SimpleNamespace(type="cpu"))
    with pytest.raises(ValueError, match=r"layers \[2, 16, 29\]"):
        build_speculator(config, runner, Eagle())
    capturing = SimpleNamespace(
        device=SimpleNamespace(type="cpu"), capture_aux_hidden=lambda layers: SimpleNamespace(take=lambda *a: None)
    )
    assert build_speculator(config, capturing, Eagle()).proposer.aux_hidden_layers == (2, 16, 29)
