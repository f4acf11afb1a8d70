"""What a constraint may ask before it is compiled, and the shortest answer a JSON schema allows. Pure.

Compile time and memory grow with a constraint's size and shape (nested ``anyOf`` compiles in time
quadratic in its depth; a bounded repetition is unrolled), so a constraint past these limits is refused
with a message naming the limit, before any compile work is spent on it.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass
from typing import Any

from omni_gateway.engine.errors import InvalidConstraint
from omni_gateway.engine.sampling_params import StructuredOutputs

# ``{n}``, ``{n,}``, ``{n,m}`` (and ``{,m}`` in EBNF), as regexes and GBNF grammars write bounded repetition.
_BOUNDS = re.compile(r"\{\s*(\d*)\s*(,?)\s*(\d*)\s*\}")
# Work allowed to the shortest-answer analysis; past it the answer is "unknown" (no refusal).
_MAX_VISITS = 20_000
_UNKNOWN = 0


@dataclass(frozen=True, slots=True)
class ConstraintLimits:
    """Per-constraint limits. ``max_repetition`` bounds the product of nested repetition counts (``(a{100}){100}``
    unrolls to 10,000 copies) and every JSON schema length or item count (``minLength``, ``maxItems``, ...)."""

    max_bytes: int = 128 * 1024  # schema, regex, grammar or structural tag text, UTF-8
    max_depth: int = 64  # JSON objects and arrays nested in a schema or structural tag
    max_enum_values: int = 1024  # enum values and consts over a whole schema; choices
    max_repetition: int = 10_000

    def __post_init__(self) -> None:
        for name in ("max_bytes", "max_depth", "max_enum_values", "max_repetition"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")


def check_limits(spec: StructuredOutputs, limits: ConstraintLimits) -> None:
    """Raise InvalidConstraint naming the first limit ``spec`` exceeds."""
    kind = spec.kind
    text = spec.json or spec.regex or spec.grammar or spec.structural_tag or "".join(spec.choice or ())
    size = len(text.encode())
    if size > limits.max_bytes:
        raise InvalidConstraint(f"the {kind} constraint has {size} bytes; at most {limits.max_bytes} are accepted")
    if spec.choice is not None and len(spec.choice) > limits.max_enum_values:
        raise InvalidConstraint(
            f"the choice constraint has {len(spec.choice)} choices; at most {limits.max_enum_values} are accepted"
        )
    if spec.regex is not None:
        _check_repetition(spec.regex, "regex", limits, in_grammar=False)
    if spec.grammar is not None:
        _check_repetition(spec.grammar, "grammar", limits, in_grammar=True)
    if spec.json is not None or spec.structural_tag is not None:
        if _depth(text) > limits.max_depth:  # before parsing: a deep enough document overflows json's stack
            raise _too_deep(kind, limits)
        try:
            document = json.loads(text)
        except ValueError:
            return  # the compiler names the syntax error
        _check_document(document, kind, limits)


def _depth(text: str) -> int:
    """How deep the JSON text's objects and arrays nest (brackets inside strings not counted)."""
    deepest = depth = 0
    in_string = escaped = False
    for c in text:
        if in_string:
            if escaped:
                escaped = False
            elif c == "\\":
                escaped = True
            elif c == '"':
                in_string = False
        elif c == '"':
            in_string = True
        elif c in "[{":
            depth += 1
            deepest = max(deepest, depth)
        elif c in "]}":
            depth -= 1
    return deepest


def _too_deep(kind: str, limits: ConstraintLimits) -> InvalidConstraint:
    return InvalidConstraint(
        f"the {kind} constraint nests objects and arrays more than {limits.max_depth} deep; "
        f"at most {limits.max_depth} levels are accepted"
    )


def _check_document(document: Any, kind: str, limits: ConstraintLimits) -> None:
    enums = 0
    stack: list[tuple[Any, int]] = [(document, 1)]
    while stack:
        node, depth = stack.pop()
        if not isinstance(node, (dict, list)):
            continue
        if depth > limits.max_depth:
            raise _too_deep(kind, limits)
        if isinstance(node, list):
            stack.extend((child, depth + 1) for child in node)
            continue
        enum = node.get("enum")
        enums += (len(enum) if isinstance(enum, list) else 0) + ("const" in node)
        if enums > limits.max_enum_values:
            raise InvalidConstraint(
                f"the {kind} constraint has more than {limits.max_enum_values} enum values and consts; "
                f"at most {limits.max_enum_values} are accepted"
            )
        for key in ("minLength", "maxLength", "minItems", "maxItems", "minProperties", "maxProperties"):
            count = node.get(key)
            if isinstance(count, (int, float)) and not isinstance(count, bool) and count > limits.max_repetition:
                raise InvalidConstraint(
                    f"the {kind} constraint's {key} is {count:,.0f}; repetition counts above "
                    f"{limits.max_repetition:,} are not accepted"
                )
        pattern = node.get("pattern")
        if isinstance(pattern, str):
            _check_repetition(pattern, f"{kind} constraint's pattern", limits, in_grammar=False)
        stack.extend((child, depth + 1) for key, child in node.items() if key not in ("enum", "const"))


def _check_repetition(text: str, what: str, limits: ConstraintLimits, *, in_grammar: bool) -> None:
    """Refuse a bounded repetition whose count, multiplied by the counts of the repetitions around it, exceeds
    the limit. Quoted strings of a grammar, escapes and character classes are skipped."""
    # Per open group: the largest product of repetitions inside it so far.
    groups: list[int] = [1]
    last = 1  # the product of the atom just read (a closed group carries its inside's)
    i = 0
    while i < len(text):
        c = text[i]
        if c == "\\":
            i, last = i + 2, 1
            continue
        if c == "[":
            i, last = _skip_class(text, i), 1
            continue
        if in_grammar and c == '"':
            i, last = _skip_quoted(text, i), 1
            continue
        if c == "(":
            groups.append(1)
        elif c == ")" and len(groups) > 1:
            last = groups.pop()
            groups[-1] = max(groups[-1], last)
            i += 1
            continue
        elif c == "{":
            found = _BOUNDS.match(text, i)
            if found is not None:
                low, comma, high = found.groups()
                count = int(high or low or 0) if comma and high else int(low or 0)
                last *= max(count, 1)
                if last > limits.max_repetition:
                    raise InvalidConstraint(
                        f"the {what} repeats {last:,} times (nested repetition counts multiplied); "
                        f"at most {limits.max_repetition:,} are accepted"
                    )
                groups[-1] = max(groups[-1], last)
                i = found.end()
                continue
        last = 1
        i += 1


def _skip_class(text: str, i: int) -> int:
    i += 1
    if i < len(text) and text[i] == "^":
        i += 1
    if i < len(text) and text[i] == "]":
        i += 1  # a leading ] is a member
    while i < len(text) and text[i] != "]":
        i += 2 if text[i] == "\\" else 1
    return i + 1


def _skip_quoted(text: str, i: int) -> int:
    i += 1
    while i < len(text) and text[i] != '"':
        i += 2 if text[i] == "\\" else 1
    return i + 1


# ---- the shortest answer ------------------------------------------------------------------------------


def shortest_json_bytes(schema_text: str) -> float:
    """A lower bound on the bytes of any JSON text valid against the schema (compact): ``math.inf`` when
    every valid value would contain itself (a required recursive ``$ref``), 0 when unknown."""
    try:
        schema = json.loads(schema_text)
    except ValueError:
        return _UNKNOWN
    walk = _Shortest(schema)
    try:
        return walk.of(schema, ())
    except _GiveUp:
        return _UNKNOWN


class _GiveUp(Exception):
    pass


class _Shortest:
    def __init__(self, root: Any) -> None:
        self.root = root
        self.visits = 0

    def of(self, node: Any, refs: tuple[str, ...]) -> float:
        self.visits += 1
        if self.visits > _MAX_VISITS:
            raise _GiveUp
        if node is False:
            return math.inf
        if not isinstance(node, dict):
            return 1  # true, or no schema: any value, such as a digit
        bound = self._own(node, refs)
        ref = node.get("$ref")
        if isinstance(ref, str):
            if ref in refs:
                return math.inf  # this path never ends; another branch of an anyOf may
            target = self._resolve(ref)
            bound = max(bound, self.of(target, (*refs, ref)) if target is not None else _UNKNOWN)
        for part in node.get("allOf") or ():
            bound = max(bound, self.of(part, refs))
        for key in ("anyOf", "oneOf"):
            branches = node.get(key)
            if isinstance(branches, list) and branches:
                bound = max(bound, min(self.of(b, refs) for b in branches))
        return bound

    def _own(self, node: dict[str, Any], refs: tuple[str, ...]) -> float:
        if "const" in node:
            return len(json.dumps(node["const"], separators=(",", ":")).encode())
        if isinstance(node.get("enum"), list) and node["enum"]:
            return min(len(json.dumps(v, separators=(",", ":")).encode()) for v in node["enum"])
        kinds = node.get("type")
        kinds = [kinds] if isinstance(kinds, str) else kinds if isinstance(kinds, list) and kinds else [None]
        return min(self._typed(node, kind, refs) for kind in kinds)

    def _typed(self, node: dict[str, Any], kind: Any, refs: tuple[str, ...]) -> float:
        if kind == "string":
            return 2 + _count(node.get("minLength"))
        if kind in ("boolean", "null"):
            return 4
        if kind == "object":
            required = node.get("required")
            properties = node.get("properties") if isinstance(node.get("properties"), dict) else {}
            if not isinstance(required, list):
                return 2
            total = 1 + max(len(required), 1)  # two braces and a comma between properties
            for name in required:
                if isinstance(name, str):
                    total += len(json.dumps(name).encode()) + 1 + self.of(properties.get(name, True), refs)
            return total
        if kind == "array":
            items = _count(node.get("minItems"))
            if items == 0:
                return 2
            return 1 + items + items * self.of(node.get("items", True), refs)
        return 1  # a number, an integer, or any value

    def _resolve(self, ref: str) -> Any:
        if ref == "#":
            return self.root
        if not ref.startswith("#/"):
            return None
        node = self.root
        for part in ref[2:].split("/"):
            part = part.replace("~1", "/").replace("~0", "~")
            if isinstance(node, dict) and part in node:
                node = node[part]
            elif isinstance(node, list) and part.isdigit() and int(part) < len(node):
                node = node[int(part)]
            else:
                return None
        return node


def _count(value: Any) -> int:
    return int(value) if isinstance(value, (int, float)) and not isinstance(value, bool) and value > 0 else 0
