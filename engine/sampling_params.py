"""Per-request sampling settings, validated once at construction (vLLM's names and defaults)."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from omni_gateway.engine.errors import InvalidRequest

_MAX_STOP_STRINGS = 16
_MAX_LOGPROBS = 20
_CONSTRAINTS = ("json", "json_object", "regex", "choice", "grammar", "structural_tag")


@dataclass(frozen=True, slots=True)
class StructuredOutputs:
    """A constraint on what a request may generate (vLLM's ``StructuredOutputsParams`` names): exactly
    one of a JSON schema, any JSON object, a regex, a choice among strings, an EBNF grammar or an
    xgrammar structural tag (free text that turns into constrained segments after trigger strings).

    ``json`` may be given as a dict; it is stored as JSON text (key order kept: the generated object's
    properties follow the schema's order), which keys the cache of compiled grammars. The engine
    compiles it (``engine.core.structured_output``); a constraint xgrammar rejects is an InvalidConstraint
    there."""

    json: str | None = None
    json_object: bool = False
    regex: str | None = None
    choice: tuple[str, ...] | None = None
    grammar: str | None = None  # EBNF (GBNF dialect)
    structural_tag: str | None = None  # xgrammar's structural tag as JSON text
    disable_any_whitespace: bool = False  # JSON: no whitespace outside strings

    def __post_init__(self) -> None:
        # Both may be given as Python objects; stored as JSON text (hashable, and the compile cache's key).
        for name, label in (("json", "json schema"), ("structural_tag", "structural_tag")):
            raw: Any = getattr(self, name)
            if raw is not None and not isinstance(raw, str):
                try:
                    object.__setattr__(self, name, json.dumps(raw, ensure_ascii=False))
                except (TypeError, ValueError) as exc:
                    raise InvalidRequest(f"{label} must be JSON-serializable, got {raw!r}: {exc}") from exc
        if self.choice is not None and not isinstance(self.choice, tuple):
            choice: Any = self.choice
            if isinstance(choice, str) or not hasattr(choice, "__iter__"):
                raise InvalidRequest(f"choice must be a list of strings, got {choice!r}")
            object.__setattr__(self, "choice", tuple(choice))
        given = [name for name in _CONSTRAINTS if getattr(self, name) not in (None, False)]
        _check(len(given) == 1, f"structured outputs take exactly one of {', '.join(_CONSTRAINTS)}; got {given}")
        _check(
            self.choice is None or (bool(self.choice) and all(isinstance(c, str) and c for c in self.choice)),
            f"choice must be a non-empty list of non-empty strings, got {self.choice!r}",
        )
        for name in ("json", "regex", "grammar", "structural_tag"):
            value = getattr(self, name)
            _check(value is None or (isinstance(value, str) and bool(value)), f"{name} must be a non-empty string")

    @property
    def kind(self) -> str:
        """The name of the one constraint given."""
        return next(name for name in _CONSTRAINTS if getattr(self, name) not in (None, False))


@dataclass(frozen=True, slots=True)
class SamplingParams:
    n: int = 1
    temperature: float = 1.0  # 0 means greedy
    top_p: float = 1.0
    top_k: int = 0  # 0 or -1: disabled
    min_p: float = 0.0
    repetition_penalty: float = 1.0
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    seed: int | None = None
    max_tokens: int | None = 16  # None: up to the context length
    min_tokens: int = 0
    stop: tuple[str, ...] = field(default=())
    stop_token_ids: tuple[int, ...] = field(default=())
    ignore_eos: bool = False
    logprobs: int | None = None  # number of top logprobs to return besides the sampled token's
    skip_special_tokens: bool = True
    include_stop_str_in_output: bool = False
    structured_outputs: StructuredOutputs | None = None
    # Return, with the deltas, the final-normed last-layer hidden state and the input embedding of every
    # position the request computes: the prompt's (no prefix-cache reuse then) and each generated token
    # fed back. What a speaking model's talker is conditioned on.
    return_hidden_states: bool = False
    # With return_hidden_states: the prompt's hidden rows are the output of the first ``hidden_layer`` decoder
    # layers (Hugging Face's ``hidden_states[hidden_layer]``) instead of the final-normed state; generated
    # positions keep the final-normed state, so decode steps keep their fused and graphed paths. None: final.
    hidden_layer: int | None = None
    # A pooling request: no token is sampled; the request ends once its prompt is computed, with one vector
    # pooled from the prompt's hidden states (``engine.core.pooling``): "model" pools as the checkpoint says.
    pooling: str | None = None
    # The LoRA adapter to generate with (engine/lora), by the name it was loaded under; None: the base model.
    lora_name: str | None = None

    def __post_init__(self) -> None:
        # Accept lists and a bare string for convenience; store tuples so the object stays hashable.
        if isinstance(self.stop, str):
            object.__setattr__(self, "stop", (self.stop,))
        elif not isinstance(self.stop, tuple):
            object.__setattr__(self, "stop", tuple(self.stop))
        if not isinstance(self.stop_token_ids, tuple):
            object.__setattr__(self, "stop_token_ids", tuple(self.stop_token_ids))
        if self.top_k == -1:
            object.__setattr__(self, "top_k", 0)
        _check(isinstance(self.n, int) and 1 <= self.n <= 128, f"n must be an integer in [1, 128], got {self.n!r}")
        _check(
            _finite(self.temperature) and self.temperature >= 0.0,
            f"temperature must be a finite number >= 0, got {self.temperature!r}",
        )
        _check(_finite(self.top_p) and 0.0 < self.top_p <= 1.0, f"top_p must be in (0, 1], got {self.top_p!r}")
        _check(
            isinstance(self.top_k, int) and self.top_k >= 0,
            f"top_k must be -1, 0 or a positive integer, got {self.top_k!r}",
        )
        _check(_finite(self.min_p) and 0.0 <= self.min_p <= 1.0, f"min_p must be in [0, 1], got {self.min_p!r}")
        _check(
            _finite(self.repetition_penalty) and self.repetition_penalty > 0.0,
            f"repetition_penalty must be > 0, got {self.repetition_penalty!r}",
        )
        _check(
            _finite(self.presence_penalty) and -2.0 <= self.presence_penalty <= 2.0,
            f"presence_penalty must be in [-2, 2], got {self.presence_penalty!r}",
        )
        _check(
            _finite(self.frequency_penalty) and -2.0 <= self.frequency_penalty <= 2.0,
            f"frequency_penalty must be in [-2, 2], got {self.frequency_penalty!r}",
        )
        _check(self.seed is None or isinstance(self.seed, int), f"seed must be an integer or None, got {self.seed!r}")
        _check(
            self.max_tokens is None or (isinstance(self.max_tokens, int) and self.max_tokens >= 1),
            f"max_tokens must be a positive integer or None, got {self.max_tokens!r}",
        )
        _check(
            isinstance(self.min_tokens, int) and self.min_tokens >= 0,
            f"min_tokens must be >= 0, got {self.min_tokens!r}",
        )
        _check(
            self.max_tokens is None or self.min_tokens <= self.max_tokens,
            f"min_tokens ({self.min_tokens}) must not exceed max_tokens ({self.max_tokens})",
        )
        _check(
            len(self.stop) <= _MAX_STOP_STRINGS and all(isinstance(s, str) and s for s in self.stop),
            f"stop must be at most {_MAX_STOP_STRINGS} non-empty strings, got {self.stop!r}",
        )
        _check(
            all(isinstance(t, int) and t >= 0 for t in self.stop_token_ids),
            f"stop_token_ids must be non-negative integers, got {self.stop_token_ids!r}",
        )
        _check(
            self.logprobs is None or (isinstance(self.logprobs, int) and 0 <= self.logprobs <= _MAX_LOGPROBS),
            f"logprobs must be an integer in [0, {_MAX_LOGPROBS}] or None, got {self.logprobs!r}",
        )
        _check(
            isinstance(self.return_hidden_states, bool),
            f"return_hidden_states must be a bool, got {self.return_hidden_states!r}",
        )
        _check(
            self.hidden_layer is None
            or (isinstance(self.hidden_layer, int) and self.hidden_layer >= 1 and self.return_hidden_states),
            f"hidden_layer must be None or a positive layer count with return_hidden_states, got {self.hidden_layer!r}",
        )
        _check(
            self.pooling in (None, "model", "last", "mean", "cls"),
            f"pooling must be None, 'model', 'last', 'mean' or 'cls', got {self.pooling!r}",
        )
        _check(
            self.pooling is None or (self.n == 1 and self.structured_outputs is None and self.logprobs is None),
            "a pooling request samples nothing: it takes n=1 and neither structured_outputs nor logprobs",
        )
        _check(
            self.structured_outputs is None or isinstance(self.structured_outputs, StructuredOutputs),
            f"structured_outputs must be a StructuredOutputs or None, got {type(self.structured_outputs).__name__}",
        )
        _check(
            self.lora_name is None or (isinstance(self.lora_name, str) and bool(self.lora_name)),
            f"lora_name must be a non-empty string or None, got {self.lora_name!r}",
        )

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0

    @property
    def penalized(self) -> bool:
        """Whether a repetition, presence or frequency penalty changes the logits (they read the tokens so far)."""
        return self.repetition_penalty != 1.0 or self.presence_penalty != 0.0 or self.frequency_penalty != 0.0


def _finite(x: object) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and x == x and abs(x) != float("inf")


def _check(ok: bool, message: str) -> None:
    if not ok:
        raise InvalidRequest(message)
