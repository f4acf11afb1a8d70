"""The proposer and policy an engine's ``speculative_config`` asks for."""

from __future__ import annotations

import logging
from typing import Any

from omni_gateway.engine.config import EngineConfig
from omni_gateway.engine.spec.config import SpeculativeConfig
from omni_gateway.engine.spec.policy import SpecPolicy
from omni_gateway.engine.spec.proposer import Proposer
from omni_gateway.engine.spec.speculator import Speculator

log = logging.getLogger(__name__)

# Tokens per step below which a step is bound by reading the weights (its time barely grows with them):
# on a GPU a few hundred for a 1-8B model; on the CPU the matmuls turn compute-bound far sooner.
WEIGHT_BOUND_TOKENS = {"cuda": 128, "cpu": 16}
# What one more scored token adds to such a step: a tiny Llama on 2 CPU cores spent 1.56x a plain step's
# time scoring 4 drafts (benchmarks/spec_decode.py, p=0); on a GPU the extra rows are nearly free.
TOKEN_COST = {"cuda": 0.01, "cpu": 0.12}
# One proposed token's price relative to a target step: a lookup is free, a draft model a forward of its own.
DRAFT_COST = {"ngram": 0.0, "draft_model": 0.15, "eagle3": 0.05}


def build_proposer(spec: SpeculativeConfig, config: EngineConfig, target: Any) -> Proposer:
    """``target``: the engine's runner (a draft model shares its device and dtype)."""
    if spec.method == "ngram":
        from omni_gateway.engine.spec.ngram import NgramProposer

        assert spec.prompt_lookup_min is not None and spec.prompt_lookup_max is not None
        return NgramProposer(spec.prompt_lookup_min, spec.prompt_lookup_max)
    if spec.method == "draft_model":
        from omni_gateway.engine.spec.draft_model import DraftModelProposer

        return DraftModelProposer.build(spec, config, target)
    if spec.method == "eagle3":
        from omni_gateway.engine.spec.eagle3 import Eagle3Proposer

        return Eagle3Proposer.build(spec, target)
    raise ValueError(f"speculative_config method {spec.method!r}: no proposer of that kind is built into this engine")


def build_speculator(config: EngineConfig, target: Any, proposer: Proposer | None = None) -> Speculator:
    spec = config.speculative_config
    assert isinstance(spec, SpeculativeConfig)
    proposer = proposer or build_proposer(spec, config, target)
    if proposer.aux_hidden_layers and not callable(getattr(target, "capture_aux_hidden", None)):
        raise ValueError(
            f"the {proposer.name!r} proposer reads the target's hidden states of layers "
            f"{list(proposer.aux_hidden_layers)}; this engine's runner does not capture them"
        )
    device = "cuda" if target.device.type == "cuda" else "cpu"
    policy = SpecPolicy(
        max_k=spec.num_speculative_tokens,
        disable_by_batch_size=spec.disable_by_batch_size,
        weight_bound_tokens=WEIGHT_BOUND_TOKENS[device],
        token_cost=TOKEN_COST[device],
        draft_cost=DRAFT_COST[spec.method],
    )
    log.info(
        "speculative decoding: %s, up to %d drafts per sequence and step, none above %d running sequences; "
        "pipelined decode is off (each step's drafts start from the tokens of the step before)",
        spec.method,
        spec.num_speculative_tokens,
        spec.disable_by_batch_size,
    )
    aux_source = None
    if proposer.aux_hidden_layers:
        aux_source = target.capture_aux_hidden(proposer.aux_hidden_layers).take
    return Speculator(proposer, policy, config.max_num_batched_tokens, aux_source)
