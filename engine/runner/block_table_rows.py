"""Block tables as numpy rows, kept per sequence and extended as the tables grow.

A graphed decode step copies every sequence's block table into one pinned host buffer. Turning
each Python list into numpy again on every step costs time proportional to batch x context; a
table only grows by appended blocks until it is emptied (preemption, finish), so its numpy row is
kept and only the new tail is converted. ``Sequence.block_table_version`` tells an emptied table
from a grown one.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import numpy as np

_MIN_CAPACITY = 16


class BlockTableRows:
    def __init__(self) -> None:
        # seq_id -> (table version, int32 buffer with spare capacity, entries filled)
        self._rows: dict[int, tuple[int, np.ndarray, int]] = {}

    def row(self, seq: Any) -> np.ndarray:
        """int32 view of ``seq.block_table`` (valid until the next call for the same sequence)."""
        table: list[int] = seq.block_table
        version: int = seq.block_table_version
        entry = self._rows.get(seq.seq_id)
        if entry is None or entry[0] != version or entry[2] > len(table):
            buf, filled = np.empty(max(_MIN_CAPACITY, 2 * len(table)), dtype=np.int32), 0
        else:
            _, buf, filled = entry
        if filled < len(table):
            if len(table) > len(buf):
                grown = np.empty(2 * len(table), dtype=np.int32)
                grown[:filled] = buf[:filled]
                buf = grown
            buf[filled : len(table)] = table[filled:]
        self._rows[seq.seq_id] = (version, buf, len(table))
        return buf[: len(table)]

    def release(self, seq_ids: Iterable[int]) -> None:
        """Forget finished sequences."""
        for seq_id in seq_ids:
            self._rows.pop(seq_id, None)

    def __len__(self) -> int:
        return len(self._rows)
