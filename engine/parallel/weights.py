"""Reading one rank's slices of a checkpoint, under Hugging Face names.

A safetensors checkpoint is read slice by slice (``safe_open`` + ``get_slice``), so no rank ever
holds more than its shard. A source that is already in memory (a dequantized GGUF file) is sliced
after the fact.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any, Protocol

import torch
from omni_gateway.engine.parallel.layout import ShardLayout


class WeightSource(Protocol):
    """Named tensors that can be read in row or column slices without loading the rest."""

    def names(self) -> set[str]: ...

    def read(self, name: str, dim: int | None = None, start: int = 0, end: int | None = None) -> torch.Tensor: ...


class TensorDictSource:
    """Tensors already in memory (a GGUF file dequantized whole); slices are copied out of them."""

    def __init__(self, load: Callable[[], Mapping[str, torch.Tensor]]) -> None:
        self._load = load  # called in the process that reads (a spawned rank loads its own copy)

    def names(self) -> set[str]:
        return set(self._load())

    def read(self, name: str, dim: int | None = None, start: int = 0, end: int | None = None) -> torch.Tensor:
        tensor = self._load()[name]
        if dim is None:
            return tensor
        return tensor.narrow(dim, start, (tensor.shape[dim] if end is None else end) - start).clone()


class SafetensorsSource:
    """Every ``*.safetensors`` file of a directory; ``rename`` maps stored names to the model's."""

    def __init__(self, files: list[Path], rename: Callable[[dict[str, str]], dict[str, str]] | None = None) -> None:
        from safetensors import safe_open

        stored: dict[str, tuple[str, str]] = {}
        for file in files:
            with safe_open(str(file), framework="pt") as handle:
                for key in handle.keys():
                    stored[key] = (str(file), key)
        names = {key: key for key in stored}
        if rename is not None:
            names = rename(names)  # new name -> stored name
        self._index = {new: stored[old] for new, old in names.items()}
        self._handles: dict[str, Any] = {}

    def __getstate__(self) -> dict[str, Any]:
        return {"_index": self._index, "_handles": {}}  # open files stay in the process that opened them

    def __setstate__(self, state: dict[str, Any]) -> None:
        self._index, self._handles = state["_index"], state["_handles"]

    def names(self) -> set[str]:
        return set(self._index)

    def read(self, name: str, dim: int | None = None, start: int = 0, end: int | None = None) -> torch.Tensor:
        from safetensors import safe_open

        file, key = self._index[name]
        handle = self._handles.get(file)
        if handle is None:
            handle = self._handles[file] = safe_open(file, framework="pt")
        if dim is None:
            tensor: torch.Tensor = handle.get_tensor(key)
            return tensor
        piece = handle.get_slice(key)
        stop = piece.get_shape()[dim] if end is None else end
        sliced: torch.Tensor = piece[start:stop] if dim == 0 else piece[:, start:stop]
        return sliced


# Where each weight is split: rows of column-parallel linears, columns of row-parallel ones.
_Q, _KV, _MLP = "q", "kv", "mlp"
_COLUMN_PARALLEL = {
    "self_attn.q_proj": _Q,
    "self_attn.k_proj": _KV,
    "self_attn.v_proj": _KV,
    "mlp.gate_proj": _MLP,
    "mlp.up_proj": _MLP,
}
_ROW_PARALLEL = {"self_attn.o_proj": _Q, "mlp.down_proj": _MLP}
_VOCAB_PARALLEL = ("model.embed_tokens.weight", "lm_head.weight")


def shard_weights(source: WeightSource, layout: ShardLayout) -> dict[str, torch.Tensor]:
    """This rank's tensors under HF names. Merging q/k/v (gate/up) after slicing keeps the merged
    layout per rank: ``[q heads | k heads | v heads]`` of this rank only. A row-parallel bias is
    added once, after the all-reduce, so only rank 0 holds it."""
    return {name: shard_piece(source, name, layout) for name in sorted(source.names()) if owns(name, layout)}


class ShardView(Mapping[str, Any]):
    """This rank's tensors as ``shard_weights`` gives them, each read when asked for and kept by no one but the
    caller: the model turns them into its own layout (merged, stacked) one layer at a time, so the reads never
    all live at once beside the result. ``convert`` wraps a tensor by name (FP8 quantization at load)."""

    def __init__(
        self, source: WeightSource, layout: ShardLayout, convert: Callable[[str, torch.Tensor], Any] | None = None
    ) -> None:
        self._source, self._layout, self._convert = source, layout, convert
        self._names = {name: None for name in sorted(source.names()) if owns(name, layout)}

    def __getitem__(self, name: str) -> Any:
        if name not in self._names:
            raise KeyError(name)
        piece = shard_piece(self._source, name, self._layout)
        return piece if self._convert is None else self._convert(name, piece)

    def __iter__(self) -> Iterator[str]:
        return iter(self._names)

    def __len__(self) -> int:
        return len(self._names)

    def __contains__(self, name: object) -> bool:
        return name in self._names


def _sub(name: str) -> tuple[str, str]:
    """``name``'s module within its layer (``self_attn.q_proj``, ``mlp.experts.3.up_proj``; a global name's
    module whole) and its kind (``weight``, ``bias``)."""
    module, _, kind = name.rpartition(".")
    return (module.split(".", 3)[-1] if module.startswith("model.layers.") else module), kind


def owns(name: str, layout: ShardLayout) -> bool:
    """Whether this rank holds any of ``name``: another rank's whole experts (expert parallel) and a row-parallel
    bias past rank 0 are not its."""
    sub, kind = _sub(name)
    if sub.startswith("mlp.experts."):
        start, end = layout.expert_range()
        return start <= int(sub.split(".")[2]) < end
    return not (sub in _ROW_PARALLEL and kind == "bias" and layout.rank != 0)


def shard_piece(source: WeightSource, name: str, layout: ShardLayout) -> torch.Tensor:
    """This rank's part of ``name`` (one it ``owns``)."""
    sub, kind = _sub(name)
    if sub.startswith(("mlp.experts.", "mlp.shared_expert.")):
        return _expert_piece(source, name, sub, layout)
    if name in _VOCAB_PARALLEL:
        start, end = layout.vocab_rows()
        rows = source.read(name, 0, start, end) if end > start else None
        return _pad_rows(rows, layout.vocab_per_rank, source, name)
    spans = {_Q: layout.q_rows, _KV: layout.kv_rows, _MLP: layout.mlp_rows}
    if sub in _COLUMN_PARALLEL:
        start, end = spans[_COLUMN_PARALLEL[sub]]()
        return source.read(name, 0, start, end)  # weight rows, or the bias's entries
    if sub in _ROW_PARALLEL and kind != "bias":
        start, end = spans[_ROW_PARALLEL[sub]]()
        return source.read(name, 1, start, end)
    return source.read(name)  # norms, per-head q/k norms, rotary divisors, rank 0's row-parallel bias: replicated


def _expert_piece(source: WeightSource, name: str, sub: str, layout: ShardLayout) -> torch.Tensor:
    """This rank's part of an expert's projection (``mlp.experts.{j}.*`` or ``mlp.shared_expert.*``): whole
    under expert parallel, else its intermediate slice like a dense MLP's."""
    parts = sub.split(".")
    if parts[1] == "experts":
        rows = layout.expert_rows()
        if layout.expert_parallel:
            return source.read(name)
    else:
        rows = layout.shared_expert_rows()
    dim = 1 if parts[-1] == "down_proj" else 0
    return source.read(name, dim, *rows)


def _pad_rows(rows: torch.Tensor | None, count: int, source: WeightSource, name: str) -> torch.Tensor:
    if rows is None:  # a rank past the vocabulary (more ranks than rows): all padding
        rows = source.read(name, 0, 0, 1)[:0]
    if rows.shape[0] == count:
        return rows
    return torch.cat((rows, rows.new_zeros(count - rows.shape[0], rows.shape[1])), dim=0)
