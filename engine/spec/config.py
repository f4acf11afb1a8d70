"""``speculative_config``: vLLM's JSON keys, checked once at the entry point. No torch here."""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, fields
from typing import Any

SPEC_METHODS: tuple[str, ...] = ("ngram", "draft_model", "eagle3")
MAX_SPECULATIVE_TOKENS = 16
# vLLM's default n-gram window when neither bound is given.
DEFAULT_PROMPT_LOOKUP = 5
# Batch size above which no step speculates when the config leaves it open: past it a decode step stops
# being bound by reading the weights, so scoring k extra tokens per sequence costs real time.
DEFAULT_DISABLE_BY_BATCH_SIZE = 32


@dataclass(frozen=True, slots=True)
class SpeculativeConfig:
    """How drafts are proposed. ``method``: "ngram" (prompt lookup), "draft_model" (a smaller model sharing the
    tokenizer, ``model`` its checkpoint) or "eagle3" (an EAGLE-3 head, ``model`` its checkpoint).
    ``num_speculative_tokens``: the most drafts per sequence and step. ``disable_by_batch_size``: steps with
    more running sequences than this do not speculate."""

    method: str
    num_speculative_tokens: int
    model: str | None = None
    prompt_lookup_min: int | None = None
    prompt_lookup_max: int | None = None
    disable_by_batch_size: int = DEFAULT_DISABLE_BY_BATCH_SIZE

    def __post_init__(self) -> None:
        if self.method not in SPEC_METHODS:
            raise ValueError(f"speculative_config method must be one of {', '.join(SPEC_METHODS)}, got {self.method!r}")
        k = self.num_speculative_tokens
        if not isinstance(k, int) or isinstance(k, bool) or not 1 <= k <= MAX_SPECULATIVE_TOKENS:
            raise ValueError(
                f"speculative_config num_speculative_tokens must be an integer in [1, {MAX_SPECULATIVE_TOKENS}], "
                f"got {k!r}"
            )
        if self.method in ("draft_model", "eagle3") and not self.model:
            raise ValueError(f"speculative_config method {self.method!r} needs 'model' (the draft checkpoint)")
        if self.method == "ngram":
            if self.model is not None:
                raise ValueError(f"speculative_config method 'ngram' reads no model, got model={self.model!r}")
            self._settle_lookup()
        elif self.prompt_lookup_min is not None or self.prompt_lookup_max is not None:
            raise ValueError(f"prompt_lookup_min/max apply to method 'ngram' only, not {self.method!r}")
        if self.disable_by_batch_size < 1:
            raise ValueError(f"speculative_config disable_by_batch_size must be >= 1, got {self.disable_by_batch_size}")

    def _settle_lookup(self) -> None:
        lo, hi = self.prompt_lookup_min, self.prompt_lookup_max
        if lo is None and hi is None:
            lo = hi = DEFAULT_PROMPT_LOOKUP
        elif lo is None:
            lo = hi
        elif hi is None:
            hi = lo
        assert lo is not None and hi is not None
        if not 1 <= lo <= hi:
            raise ValueError(f"speculative_config needs 1 <= prompt_lookup_min <= prompt_lookup_max, got {lo} and {hi}")
        object.__setattr__(self, "prompt_lookup_min", lo)
        object.__setattr__(self, "prompt_lookup_max", hi)

    @classmethod
    def of(cls, value: SpeculativeConfig | Mapping[str, Any] | str) -> SpeculativeConfig:
        """From a mapping of vLLM's keys or its JSON text; unknown keys are refused by name."""
        if isinstance(value, SpeculativeConfig):
            return value
        if isinstance(value, str):
            try:
                value = json.loads(value)
            except ValueError as exc:
                raise ValueError(f"speculative_config is not valid JSON: {exc}") from exc
        if not isinstance(value, Mapping):
            raise ValueError(f"speculative_config must be a JSON object, got {type(value).__name__}")
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(value) - known)
        if unknown:
            raise ValueError(f"speculative_config has unknown keys {unknown}; known: {sorted(known)}")
        for key in ("method", "num_speculative_tokens"):
            if key not in value:
                raise ValueError(f"speculative_config needs {key!r}, got keys {sorted(value)}")
        return cls(**dict(value))
