"""Which decode steps may run one step ahead of the host (``Scheduler.schedule_lookahead`` builds
them). No torch here.

A step launched ahead starts before the host has read the tokens of the step in flight: each of
its sequences decodes the position whose token that step is sampling, and the runner takes the
token from the device. The device then computes step N+1 while the host detokenizes step N and
checks its stops, instead of idling while the host works.

That is sound only where the host would not change what the device picks and would schedule the
same step itself. The token must come from the logits and the sequence's parameters alone: no
logprobs to return, no penalty (which reads the token history), no min_tokens mask left to apply;
greedy or sampled (a seeded sequence draws from its own generator either way). A grammar is the one
exception that reads the history: the step's forward is launched ahead, and its sampling waits until
the host has absorbed the step in flight and advanced the matchers (``PendingDecode.deferred``), so
the masks are filled on the host while the device runs the forward. Every running
sequence must be in the step, none waiting to be admitted, and no sequence certain to stop on
length at the step in flight. A sequence that stops on EOS, a stop token or a stop string, or is
aborted, while its next step is in flight has that step's row discarded.
"""

from __future__ import annotations

from omni_gateway.engine.core.sequence import ScheduledBatch, Sequence


def may_run_ahead(seq: Sequence) -> bool:
    """Whether ``seq`` may decode ahead of the host: the sampler picks its next tokens from the logits,
    its parameters and its grammar (whose mask waits for the token in flight) alone: no logprobs, no
    penalty, min_tokens reached, no media (whose decode steps run eagerly)."""
    p = seq.params
    return (
        p.logprobs is None
        and not p.penalized
        and seq.num_output_tokens >= p.min_tokens
        and not seq.embed_spans
        and not p.return_hidden_states
    )


def launchable(batch: ScheduledBatch) -> bool:
    """A scheduled step the runner may launch without the host waiting for it: every sequence decodes
    its last token and samples the next from the logits alone."""
    return bool(batch.seqs) and all(
        n == 1 and seq.num_computed_tokens + 1 == len(seq) and may_run_ahead(seq)
        for seq, n in zip(batch.seqs, batch.num_new_tokens)
    )


def continues_after_next_token(seq: Sequence) -> bool:
    """False when the token in flight is certain to end ``seq`` on length (max_tokens or the context)."""
    p = seq.params
    if p.max_tokens is not None and seq.num_output_tokens + 1 >= p.max_tokens:
        return False
    return seq.max_model_len is None or len(seq) + 1 < seq.max_model_len
