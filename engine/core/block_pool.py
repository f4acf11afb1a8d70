"""Ref-counted KV blocks with an LRU free list and a content-hash index (the prefix cache).

A block whose last user leaves keeps its hash and stays findable until the pool hands it out
again; the free list is in eviction order, so the least recently freed block is reused first.
A cached block may also keep ``rows``: the hidden states of its positions, as a request that asks for them
computed them (opaque here), so such requests can reuse it too. They are kept by kind: None for the final-normed
states, ``n`` for the output of the first ``n`` decoder layers (``SamplingParams.hidden_layer``); a hit needs the
kind asked. A bounded number of such row sets are kept, the least recently used losing theirs first.
Pure Python: no torch, no I/O.
"""

from __future__ import annotations

import hashlib
from array import array
from collections import OrderedDict
from collections.abc import Iterable
from collections.abc import Sequence as Seq
from typing import Any

BlockHash = bytes

# The chain starts from a fixed root so hashes are stable across processes (reproducible cache keys).
_ROOT_HASH: BlockHash = hashlib.sha256(b"kv-block-root").digest()


def hash_block(parent: BlockHash | None, token_ids: Seq[int], extra_keys: tuple[str, ...] = ()) -> BlockHash:
    """Chain hash of one full block: equal hashes mean equal prefixes up to and including this block."""
    h = hashlib.sha256(parent if parent is not None else _ROOT_HASH)
    h.update(array("q", token_ids).tobytes())
    for key in extra_keys:
        # Length-prefixed so ("ab", "c") and ("a", "bc") hash differently.
        raw = key.encode()
        h.update(len(raw).to_bytes(4, "little"))
        h.update(raw)
    return h.digest()


class Block:
    __slots__ = ("block_id", "ref_count", "hash", "rows")

    def __init__(self, block_id: int) -> None:
        self.block_id = block_id
        self.ref_count = 0
        self.hash: BlockHash | None = None
        # hidden states of its positions, in pieces, by kind (the layer count they are the output of; None: final)
        self.rows: dict[int | None, tuple[Any, ...]] = {}

    def __repr__(self) -> str:
        return f"Block({self.block_id}, ref={self.ref_count}, cached={self.hash is not None})"


class BlockPool:
    """All blocks, preallocated. Free blocks sit in an ordered dict used as an O(1) LRU list."""

    def __init__(self, num_blocks: int) -> None:
        if num_blocks < 1:
            raise ValueError(f"num_blocks must be >= 1, got {num_blocks}")
        self.blocks = [Block(i) for i in range(num_blocks)]
        self._free: OrderedDict[int, Block] = OrderedDict((b.block_id, b) for b in self.blocks)
        self._by_hash: dict[BlockHash, Block] = {}
        # (block id, kind) of every kept row set, least recently used first
        self._with_rows: OrderedDict[tuple[int, int | None], Block] = OrderedDict()

    @property
    def num_blocks(self) -> int:
        return len(self.blocks)

    @property
    def num_free_blocks(self) -> int:
        return len(self._free)

    @property
    def num_used_blocks(self) -> int:
        return len(self.blocks) - len(self._free)

    @property
    def num_cached_blocks(self) -> int:
        return len(self._by_hash)

    def free_order(self) -> list[int]:
        """Block ids in eviction order (first is reused first)."""
        return list(self._free)

    def lookup(self, block_hash: BlockHash) -> Block | None:
        return self._by_hash.get(block_hash)

    def allocate(self, count: int) -> list[Block]:
        if count > len(self._free):
            raise ValueError(f"asked for {count} blocks but only {len(self._free)} are free")
        out = []
        for _ in range(count):
            _, block = self._free.popitem(last=False)
            self._evict_hash(block)
            block.ref_count = 1
            out.append(block)
        return out

    def touch(self, blocks: Iterable[Block]) -> None:
        """Take a reference on cached blocks (a prefix hit); free ones leave the free list."""
        for block in blocks:
            if block.ref_count == 0:
                del self._free[block.block_id]
            block.ref_count += 1
            for layer in block.rows:
                self._with_rows.move_to_end((block.block_id, layer))

    def keep_rows(self, block: Block, rows: tuple[Any, ...], max_blocks: int, layer: int | None = None) -> None:
        """Keep ``rows`` of kind ``layer`` (see ``Block.rows``) with a cached block that has none of that kind;
        beyond ``max_blocks`` row sets, the least recently used one is dropped (the KV stays cached)."""
        if block.hash is None or layer in block.rows or max_blocks < 1:
            return
        block.rows[layer] = rows
        self._with_rows[(block.block_id, layer)] = block
        while len(self._with_rows) > max_blocks:
            (_, kind), oldest = self._with_rows.popitem(last=False)
            del oldest.rows[kind]

    @property
    def num_blocks_with_rows(self) -> int:
        """Row sets kept (a block keeping two kinds counts twice)."""
        return len(self._with_rows)

    def release(self, blocks: Iterable[Block]) -> None:
        """Drop one reference each; blocks reaching zero join the tail of the free list in the given order."""
        for block in blocks:
            if block.ref_count <= 0:
                raise RuntimeError(f"{block!r} released more often than taken")
            block.ref_count -= 1
            if block.ref_count == 0:
                self._free[block.block_id] = block

    def register(self, block: Block, block_hash: BlockHash) -> Block:
        """Make a full block findable by its hash; returns the block findable under it. An equal block
        already indexed wins; block tables are append-only, so the duplicate simply stays private to its
        sequence."""
        if block.hash is not None or block_hash in self._by_hash:
            return self._by_hash.get(block_hash, block)
        block.hash = block_hash
        self._by_hash[block_hash] = block
        return block

    def _evict_hash(self, block: Block) -> None:
        if block.hash is not None:
            if self._by_hash.get(block.hash) is block:
                del self._by_hash[block.hash]
            block.hash = None
        for layer in block.rows:
            del self._with_rows[(block.block_id, layer)]
        block.rows = {}
