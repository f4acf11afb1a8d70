"""A run's records and the path language that reads one figure out of them, for the results page's tables.

A column reads a record field with a path ``kind[field=value,...]:dotted.path`` (the first record of that kind,
or of one of ``kind|kind``, with those fields; ``field=None`` picks records without the field), ``min kind[...]:path``
(the least over all of them), or ``A / B`` (a ratio of two paths); ``{}`` takes the row key (``{},{}`` keys carry
two, shown in columns of their own). A history record's metrics are read with a plain dotted path. What a path
cannot say, a ``Getter`` computes from the records.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

Record = dict[str, Any]
Getter = Callable[[Sequence[Record], str], float | None]


@dataclass(frozen=True)
class Col:
    header: str
    real: str | Getter | None = None  # path into a run's records (its run record first)
    hist: str | Getter | None = None  # path into a history record's metrics, transcribed in the column's unit
    scale: float = 1.0  # from a run record's unit to the column's


@dataclass(frozen=True)
class Table:
    area: str
    benchmark: str
    cols: tuple[Col, ...]
    key: str = ""  # header of the row-key column; "" for one row per run
    rows: tuple[str, ...] = ("",)
    variant: tuple[str, ...] = ()  # command options whose values tell runs apart
    needs: tuple[str, ...] = ()  # options a run's command must hold to belong here
    skips: tuple[str, ...] = ()  # options it must not hold


def _dig(value: Any, path: str) -> Any:
    for part in path.split(".") if path else ():
        if isinstance(value, dict):
            value = value.get(part)
        elif isinstance(value, list) and part.isdigit() and int(part) < len(value):
            value = value[int(part)]
        else:
            return None
    return value


def number(value: Any) -> float | None:
    """A record's value as a figure; None where it is missing, not a number, a bool or NaN."""
    if isinstance(value, bool) or not isinstance(value, int | float) or math.isnan(value):
        return None
    return value


def read_path(records: Sequence[Record], spec: str | Getter | None, key: str, history: bool) -> float | None:
    """The figure a path or getter reads from a run's records for the row ``key``; None where they hold none.
    A ``history`` run's one record is read with a plain dotted path."""
    if spec is None:
        return None
    if callable(spec):
        return spec(records, key)
    if " / " in spec:
        num, den = (read_path(records, part, key, history) for part in spec.split(" / "))
        return num / den if num is not None and den else None
    spec = spec.format(*key.split(",")) if "{}" in spec else spec
    if history:
        return number(_dig(records[0], spec))
    least = spec.startswith("min ")
    head, _, path = spec.removeprefix("min ").partition(":")
    kind, _, where = head.partition("[")
    wanted = [tuple(term.split("=", 1)) for term in where.rstrip("]").split(",") if term]
    values = [
        number(_dig(r, path))
        for r in records
        if r.get("kind") in kind.split("|") and all(str(r.get(field)) == value for field, value in wanted)
    ]
    values = [v for v in values if v is not None]
    if not values:
        return None
    return min(values) if least else values[0]
