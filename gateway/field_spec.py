"""One client field as data: its JSON kinds, bounds and choices, as the parser that reads it accepts them.

The realtime protocol (``realtime/schema.py``) and the HTTP API (``http/schema.py``) each list their fields
in such a table; the GA realtime dialect refuses keys missing from it, tests check that no parser reads a
key the table lacks, and ``benchmarks/fuzz_fields.py`` derives hostile values for every entry.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

Kind = Literal["string", "integer", "number", "boolean", "object", "array", "any"]
Dialect = Literal["ga", "beta"]
BOTH: tuple[Dialect, ...] = ("ga", "beta")


@dataclass(frozen=True, slots=True)
class FieldSpec:
    path: str  # dotted from the event or body root; ``[]`` stands for any index of an array
    kinds: tuple[Kind, ...]  # empty: the key is refused whatever its value
    events: tuple[str, ...]  # the realtime client events, or the HTTP routes, that carry it
    dialects: tuple[Dialect, ...] = BOTH  # realtime only
    nullable: bool = False  # whether null (or, in HTTP bodies, leaving it out) is accepted
    choices: tuple[str, ...] = ()  # the strings accepted (any string when empty)
    lo: float | None = None  # numbers: inclusive bounds
    hi: float | None = None
    max_len: int | None = None  # strings: most characters accepted
    items: tuple[str, ...] = ()  # arrays of choices: the items accepted
    min_items: int = 0
    closed: bool = False  # objects: in GA, a key the table lacks is an unknown parameter
    required: tuple[str, ...] = ()  # objects: keys that must be present
    # Whether the kinds, bounds and choices above say all there is to validity (a fuzzer's oracle relies on
    # them). False where validity also depends on state or on other fields (an item id that must exist,
    # base64 audio, 'top_logprobs' needing 'logprobs').
    exact: bool = True
