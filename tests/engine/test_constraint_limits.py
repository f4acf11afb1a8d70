"""Limits a constraint is held to before compiling, and the shortest answer a JSON schema allows."""

from __future__ import annotations

import json
import math

import pytest
from omni_gateway.engine import InvalidRequest, StructuredOutputs
from omni_gateway.engine.core.constraint_limits import ConstraintLimits, check_limits, shortest_json_bytes

LIMITS = ConstraintLimits(max_bytes=4096, max_depth=8, max_enum_values=10, max_repetition=100)


def nested_any_of(depth: int) -> str:
    """``anyOf`` nested ``depth`` levels, as text (deeper than Python's json module can write)."""
    head = '{"anyOf": [{"type": "integer"}, {"type": "object", "properties": {"x": '
    return head * depth + '{"type": "integer"}' + "}}]}" * depth


@pytest.mark.parametrize(
    ("spec", "named"),
    [
        (StructuredOutputs(regex="a" * 5000), "5000 bytes; at most 4096"),
        (StructuredOutputs(json={"description": "é" * 2100}), "bytes; at most 4096"),  # UTF-8 bytes, not characters
        (StructuredOutputs(json=nested_any_of(3)), "more than 8 deep"),
        (StructuredOutputs(structural_tag=json.dumps([[[[[[[[[1]]]]]]]]])), "more than 8 deep"),
        (StructuredOutputs(json={"enum": list(range(11))}), "more than 10 enum values"),
        (StructuredOutputs(json={"anyOf": [{"const": i} for i in range(11)]}), "more than 10 enum values"),
        (StructuredOutputs(choice=[str(i) for i in range(11)]), "11 choices; at most 10"),
        (StructuredOutputs(regex="a{1000}{1000}"), "repeats 1,000 times"),
        (StructuredOutputs(regex="a{50}{50}"), "repeats 2,500 times"),
        (StructuredOutputs(regex="(a{20}){20}"), "repeats 400 times"),
        (StructuredOutputs(regex="((ab){11,}c){10}"), "repeats 110 times"),
        (StructuredOutputs(grammar='root ::= ("x"{0,50}){3}'), "repeats 150 times"),
        (StructuredOutputs(json={"type": "string", "pattern": "[0-9]{101}"}), "pattern repeats 101 times"),
        (StructuredOutputs(json={"type": "string", "minLength": 1000000}), "minLength is 1,000,000"),
        (StructuredOutputs(json={"type": "array", "maxItems": 101}), "maxItems is 101"),
    ],
)
def test_each_limit_is_refused_by_name(spec: StructuredOutputs, named: str) -> None:
    with pytest.raises(InvalidRequest, match=named):
        check_limits(spec, LIMITS)


@pytest.mark.parametrize(
    "spec",
    [
        StructuredOutputs(json=nested_any_of(1)),
        StructuredOutputs(json={"enum": list(range(10))}),
        StructuredOutputs(regex=r"(a{10}){10}\{1000\}[{]{5}"),  # escaped and bracketed braces are literals
        StructuredOutputs(grammar='root ::= "{1000}" [a-z]{1,100}'),  # a quoted string is not a repetition
        StructuredOutputs(json={"type": "string", "pattern": "^[a-z]{1,100}$", "maxLength": 100}),
        StructuredOutputs(json="{not json"),  # its syntax is the compiler's to name
        StructuredOutputs(choice=["a"] * 10),
    ],
)
def test_constraints_within_the_limits_pass(spec: StructuredOutputs) -> None:
    check_limits(spec, LIMITS)


def test_the_defaults_refuse_the_deep_anyof_that_compiles_for_seconds() -> None:
    # 240 levels (18 KB) compiled for 11.5 s on a 150k vocabulary; depth is refused long before that,
    # and a depth json.loads itself cannot parse is refused too.
    for depth in (240, 1500):
        with pytest.raises(InvalidRequest, match="more than 64 deep"):
            check_limits(StructuredOutputs(json=nested_any_of(depth)), ConstraintLimits())
    check_limits(StructuredOutputs(json=nested_any_of(15)), ConstraintLimits())
    check_limits(StructuredOutputs(json={"description": "[[[[" * 100}), ConstraintLimits())  # inside a string


def test_limits_must_be_positive() -> None:
    with pytest.raises(ValueError, match="max_depth"):
        ConstraintLimits(max_depth=0)


SELF_X = {"type": "object", "properties": {"x": {"$ref": "#"}}}
OBJECT_XY = {"type": "object", "properties": {"x": {"type": "integer"}, "y": {"type": "string"}}}


@pytest.mark.parametrize(
    ("schema", "shortest"),
    [
        ({"type": "object"}, 2),  # {}
        ({**OBJECT_XY, "required": ["x", "y"]}, len('{"x":0,"y":""}')),
        ({**OBJECT_XY, "required": ["y"]}, len('{"y":""}')),
        ({"type": "string", "minLength": 5000}, 5002),
        ({"type": "array", "items": {"type": "string", "minLength": 3}, "minItems": 2}, len('["xxx","xxx"]')),
        ({"enum": ["long value", "ab"]}, len('"ab"')),
        ({"const": {"k": True}}, len('{"k":true}')),
        ({"anyOf": [{"type": "string", "minLength": 9}, {"type": "null"}]}, 4),
        ({"allOf": [{"type": "string", "minLength": 9}, {"type": "string"}]}, 11),
        ({"type": ["boolean", "integer"]}, 1),
        # Recursion with a way out: the anyOf's integer ends it.
        ({"anyOf": [{"type": "integer"}, {**SELF_X, "required": ["x"]}]}, 1),
        (SELF_X, 2),  # optional: "{}" ends it
    ],
)
def test_shortest_answer_of_a_schema(schema: dict[str, object], shortest: float) -> None:
    assert shortest_json_bytes(json.dumps(schema)) == shortest


@pytest.mark.parametrize(
    "schema",
    [
        {"type": "object", "properties": {"x": {"$ref": "#"}}, "required": ["x"]},
        {"$defs": {"a": {"allOf": [{"$ref": "#/$defs/a"}]}}, "$ref": "#/$defs/a"},
        {"$defs": {"a": {"$ref": "#/$defs/b"}, "b": {"$ref": "#/$defs/a"}}, "$ref": "#/$defs/a"},
        {"type": "array", "items": {"$ref": "#"}, "minItems": 1},
        False,
    ],
)
def test_a_schema_that_requires_itself_has_no_finite_answer(schema: object) -> None:
    assert shortest_json_bytes(json.dumps(schema)) == math.inf


def test_an_unknown_shortest_answer_is_zero() -> None:
    assert shortest_json_bytes("{not json") == 0
    assert shortest_json_bytes(json.dumps({"$ref": "https://example.com/schema"})) == 1
