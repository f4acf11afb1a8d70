"""Per-sequence view of the block pool: prefix lookup, slot allocation, hash registration, freeing.

Pure Python: no torch, no I/O. The scheduler is its only caller.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from omni_gateway.engine.core.block_pool import Block, BlockHash, BlockPool, hash_block
from omni_gateway.engine.core.sequence import Sequence


@dataclass(frozen=True, slots=True)
class CachedPrefix:
    """Blocks already holding the KV of a sequence's leading tokens."""

    blocks: tuple[Block, ...]
    num_tokens: int


_NO_PREFIX = CachedPrefix((), 0)


@dataclass(frozen=True, slots=True)
class KVUsage:
    allocated_slots: int  # used blocks x block size
    stored_tokens: int  # slots of those blocks that hold computed KV
    num_used_blocks: int
    num_free_blocks: int

    @property
    def waste_fraction(self) -> float:
        return 1.0 - self.stored_tokens / self.allocated_slots if self.allocated_slots else 0.0


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


class KVCacheManager:
    def __init__(
        self, num_blocks: int, block_size: int, *, enable_prefix_caching: bool = True, max_row_blocks: int = 0
    ) -> None:
        self.block_size = block_size
        self.enable_prefix_caching = enable_prefix_caching
        # Blocks that may keep the hidden states of their positions (``BlockPool.keep_rows``); 0: none, and
        # requests asking for hidden states compute every position.
        self.max_row_blocks = max_row_blocks
        self.pool = BlockPool(num_blocks)
        self._held: dict[int, list[Block]] = {}
        self._seqs: dict[int, Sequence] = {}
        self._hashes: dict[int, list[BlockHash]] = {}
        self._num_registered: dict[int, int] = {}
        self.prefix_query_tokens = 0
        self.prefix_hit_tokens = 0

    @property
    def num_blocks(self) -> int:
        count: int = self.pool.num_blocks
        return count

    @property
    def num_free_blocks(self) -> int:
        count: int = self.pool.num_free_blocks
        return count

    @property
    def num_used_blocks(self) -> int:
        count: int = self.pool.num_used_blocks
        return count

    def find_cached_prefix(self, seq: Sequence) -> CachedPrefix:
        """Longest run of cached full blocks at the start of ``seq``. It never covers the last token,
        because that token's forward pass is what produces the next token's logits. A request that wants
        every position's hidden state reuses only blocks that kept theirs, of the kind it asks (the final-normed
        states, or with ``hidden_layer`` that layer's outputs)."""
        wants_rows = seq.params.return_hidden_states
        if not self.enable_prefix_caching or (wants_rows and not self.max_row_blocks):
            return _NO_PREFIX
        layer = seq.params.hidden_layer
        max_blocks = (len(seq) - 1) // self.block_size
        hits: list[Block] = []
        for block_hash in self._block_hashes(seq, max_blocks):
            block = self.pool.lookup(block_hash)
            if block is None or (wants_rows and layer not in block.rows):
                break
            hits.append(block)
        return CachedPrefix(tuple(hits), len(hits) * self.block_size) if hits else _NO_PREFIX

    def hashes_filled_by(self, seq: Sequence, num_new_tokens: int) -> list[BlockHash]:
        """Hashes of the blocks that computing the next ``num_new_tokens`` of ``seq`` will fill."""
        if not self.enable_prefix_caching:
            return []
        first = seq.num_computed_tokens // self.block_size
        last = (seq.num_computed_tokens + num_new_tokens) // self.block_size
        return self._block_hashes(seq, last)[first:] if last > first else []

    def next_block_hash(self, seq: Sequence, prefix: CachedPrefix) -> BlockHash | None:
        """Hash of the block right after ``prefix``, if a later prefix lookup could hit it."""
        i = len(prefix.blocks)
        if not self.enable_prefix_caching or i >= (len(seq) - 1) // self.block_size:
            return None
        return self._block_hashes(seq, i + 1)[i]

    def allocate_slots(self, seq: Sequence, num_new_tokens: int, prefix: CachedPrefix | None = None) -> bool:
        """Give ``seq`` the blocks for its next ``num_new_tokens`` tokens (after the prefix when it is being
        admitted). Returns False, changing nothing, when the pool is short."""
        held = self._held.get(seq.seq_id, [])
        if prefix is None and held and seq.num_computed_tokens + num_new_tokens <= len(held) * self.block_size:
            return True  # most decode steps: the slots lie in blocks the sequence holds already
        if prefix is not None and held:
            raise RuntimeError(f"{seq!r} already holds blocks; a cached prefix applies only on admission")
        hit_blocks = prefix.blocks if prefix is not None else ()
        start = prefix.num_tokens if prefix is not None else seq.num_computed_tokens
        num_new_blocks = _cdiv(start + num_new_tokens, self.block_size) - len(held) - len(hit_blocks)
        revived = sum(1 for b in hit_blocks if b.ref_count == 0)  # these leave the free list too
        if max(num_new_blocks, 0) + revived > self.pool.num_free_blocks:
            return False
        self.pool.touch(hit_blocks)
        new_blocks = self.pool.allocate(max(num_new_blocks, 0))
        if seq.seq_id not in self._held:
            self._held[seq.seq_id] = held
            self._seqs[seq.seq_id] = seq
            self._num_registered[seq.seq_id] = len(hit_blocks)
        held.extend(hit_blocks)
        held.extend(new_blocks)
        seq.block_table.extend(b.block_id for b in (*hit_blocks, *new_blocks))
        if prefix is not None:
            self.prefix_query_tokens += len(seq)
            self.prefix_hit_tokens += prefix.num_tokens
            if seq.params.return_hidden_states:
                layer = seq.params.hidden_layer
                seq.prefix_rows = tuple(piece for b in hit_blocks for piece in b.rows[layer])
        return True

    def cache_full_blocks(self, seq: Sequence) -> None:
        """Index the blocks whose every slot now holds computed KV, so later sequences can reuse them."""
        if not self.enable_prefix_caching or seq.seq_id not in self._held:
            return
        num_full = seq.num_computed_tokens // self.block_size
        done = self._num_registered[seq.seq_id]
        if num_full <= done:
            return
        held = self._held[seq.seq_id]
        hashes = self._block_hashes(seq, num_full)
        bs = self.block_size
        for i in range(done, num_full):
            cached = self.pool.register(held[i], hashes[i])
            if seq.pending_rows:
                rows = _take_rows(seq, i * bs, (i + 1) * bs)
                if rows is not None:
                    self.pool.keep_rows(cached, rows, self.max_row_blocks, seq.params.hidden_layer)
        self._num_registered[seq.seq_id] = num_full

    def trim(self, seq: Sequence) -> int:
        """Return the blocks past the ones ``len(seq)`` tokens need (slots of rejected draft tokens); the
        number returned. Those blocks were never registered: they hold no computed token's K/V."""
        held = self._held.get(seq.seq_id)
        keep = _cdiv(len(seq), self.block_size)
        if not held or len(held) <= keep:
            return 0
        if self._num_registered[seq.seq_id] > keep:
            raise RuntimeError(f"{seq!r}: blocks past its tokens are registered in the prefix cache")
        extra = held[keep:]
        del held[keep:]
        # The block table was "only appended to": emptied and rebuilt, so its readers convert it afresh.
        seq.block_table[:] = seq.block_table[:keep]
        seq.block_table_version += 1
        self.pool.release(reversed(extra))
        return len(extra)

    def free(self, seq: Sequence) -> None:
        """Return the sequence's blocks. Its last block is freed first so it is evicted first: a long
        prefix is less likely to be shared than the short one its first blocks hold."""
        blocks = self._held.pop(seq.seq_id, None)
        self._seqs.pop(seq.seq_id, None)
        self._hashes.pop(seq.seq_id, None)
        self._num_registered.pop(seq.seq_id, None)
        seq.pending_rows.clear()
        seq.prefix_rows = ()
        seq.block_table.clear()
        seq.block_table_version += 1
        if blocks:
            self.pool.release(reversed(blocks))

    def usage(self) -> KVUsage:
        stored: dict[int, int] = {}
        for seq_id, blocks in self._held.items():
            computed = self._seqs[seq_id].num_computed_tokens
            for i, block in enumerate(blocks):
                filled = min(self.block_size, max(computed - i * self.block_size, 0))
                stored[block.block_id] = max(stored.get(block.block_id, 0), filled)
        used = self.pool.num_used_blocks
        return KVUsage(used * self.block_size, sum(stored.values()), used, self.pool.num_free_blocks)

    def _block_hashes(self, seq: Sequence, num_blocks: int) -> list[BlockHash]:
        hashes = self._hashes.setdefault(seq.seq_id, [])
        bs = self.block_size
        while len(hashes) < num_blocks:
            i = len(hashes)
            start, end = i * bs, (i + 1) * bs
            parent = hashes[-1] if hashes else None
            hashes.append(hash_block(parent, seq.token_ids[start:end], seq.extra_keys_for(start, end)))
        return hashes[:num_blocks]


def _take_rows(seq: Sequence, start: int, end: int) -> tuple[Any, ...] | None:
    """The pieces of ``seq.pending_rows`` covering positions ``[start, end)``, or None where some are
    missing; rows up to ``end`` leave the list."""
    pieces: list[Any] = []
    covered = start
    for first, rows in seq.pending_rows:
        last = first + len(rows)
        if last <= covered or first >= end:
            continue
        if first > covered:
            break  # a gap
        pieces.append(rows[covered - first : min(end, last) - first])
        covered = min(end, last)
    seq.pending_rows = [(first, rows) for first, rows in seq.pending_rows if first + len(rows) > end]
    return tuple(pieces) if covered == end else None
