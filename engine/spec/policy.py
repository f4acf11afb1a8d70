"""How many drafts a step asks for (``k``, 0 included): speculation only where it pays. Pure logic.

A decode step of a small batch costs about the same whether it scores 1 or 1+k tokens per sequence: it is
bound by reading the weights. Past ``weight_bound_tokens`` scored tokens it grows with them, so large batches
get k=0 and never get slower. Within the bound, k maximizes expected kept tokens per unit of step time, with
the acceptance rate measured so far (an exponential moving average of accepted/proposed drafts):
a step with k drafts keeps ``(1 - a**(k+1)) / (1 - a)`` tokens on average (each draft accepted with
probability a, one token of the target's own after the first rejection), and costs
``max(1, batch * (1 + k) / weight_bound_tokens) + token_cost * batch * k + draft_cost * k`` steps' time:
``token_cost`` is what one more scored token adds to a weight-bound step, ``draft_cost`` one proposal
token's price (0 for n-gram lookup), both relative to a one-token-per-sequence target step. Where measured
acceptance drives k to 0, every ``probe_every``-th step still asks for one draft so the estimate can recover.
"""

from __future__ import annotations

from dataclasses import dataclass, field


def expected_tokens(acceptance: float, k: int) -> float:
    """Mean tokens a step keeps with ``k`` drafts, each accepted with probability ``acceptance`` in turn."""
    if acceptance >= 1.0:
        return float(k + 1)
    return (1.0 - acceptance ** (k + 1)) / (1.0 - acceptance)


@dataclass(slots=True)
class SpecPolicy:
    max_k: int
    disable_by_batch_size: int
    weight_bound_tokens: int = 64
    token_cost: float = 0.02
    draft_cost: float = 0.0
    ema_weight: float = 0.1  # weight of the newest step in the acceptance average
    acceptance: float = 0.7  # the average before any measurement: optimistic, so speculation gets tried
    probe_every: int = 16
    _idle_steps: int = field(default=0, init=False)

    def __post_init__(self) -> None:
        if self.max_k < 0:
            raise ValueError(f"max_k must be >= 0, got {self.max_k}")
        if self.disable_by_batch_size < 1 or self.weight_bound_tokens < 1:
            raise ValueError(
                f"disable_by_batch_size and weight_bound_tokens must be >= 1, got {self.disable_by_batch_size} "
                f"and {self.weight_bound_tokens}"
            )
        if not 0.0 < self.ema_weight <= 1.0:
            raise ValueError(f"ema_weight must be in (0, 1], got {self.ema_weight}")
        if self.draft_cost < 0 or self.token_cost < 0:
            raise ValueError(f"draft_cost and token_cost must be >= 0, got {self.draft_cost} and {self.token_cost}")

    def step_cost(self, batch_size: int, k: int) -> float:
        """A step's time relative to a weight-bound one-token-per-sequence step."""
        bound = max(1.0, batch_size * (1 + k) / self.weight_bound_tokens)
        return bound + self.token_cost * batch_size * k + self.draft_cost * k

    def best_k(self, batch_size: int) -> int:
        """The k with the most expected tokens per unit of step time (the smallest such k), before probing."""
        if batch_size < 1 or batch_size > self.disable_by_batch_size:
            return 0
        rates = [expected_tokens(self.acceptance, k) / self.step_cost(batch_size, k) for k in range(self.max_k + 1)]
        best = max(rates)
        return next(k for k, r in enumerate(rates) if r >= best - 1e-12)

    def choose_k(self, batch_size: int) -> int:
        """k for the next step of ``batch_size`` decoding sequences."""
        k = self.best_k(batch_size)
        if k > 0 or batch_size < 1 or batch_size > self.disable_by_batch_size or self.max_k == 0:
            self._idle_steps = 0
            return k
        self._idle_steps += 1
        if self._idle_steps >= self.probe_every:
            self._idle_steps = 0
            return 1  # a probe: the acceptance estimate only moves when something is proposed
        return 0

    def record(self, proposed: int, accepted: int) -> None:
        """One step's drafts: how many were proposed and how many the target accepted, over all sequences."""
        if not 0 <= accepted <= proposed:
            raise ValueError(f"accepted must be in [0, proposed], got {accepted} of {proposed}")
        if proposed == 0:
            return
        rate = accepted / proposed
        self.acceptance += self.ema_weight * (rate - self.acceptance)
