"""The adapters resident on the device: stacked weights the model's projections read, one slot each.

Every decoder layer has, per projection group (the model's merged q/k/v, its gate/up or apart gate and
up, o, down), ``a`` ``[max_loras, W, K]`` and ``b`` ``[max_loras, N, R]`` (R the padded max rank). A group
of S projections gives projection s the ranks ``[s * R, s * R + r)`` of the shrink's width W (the next
power of two of S * R; the rest is padding the kernel never reads) and its own output columns of ``b``,
which read those ranks alone: one shrink and one expand serve the whole merged projection. Each token's
slot sits in ``token_slots``, a device tensor written before every step, which captured CUDA graphs read
where they were captured: loading another adapter into a slot is a copy into these tensors, never a new one.

An adapter not resident takes a free slot, else the least recently used one that the step does not use.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence as Seq
from typing import Any

import numpy as np
import torch
from omni_gateway.engine.lora.adapter import LoraAdapter, LoraTargets
from omni_gateway.kernels import lora_reference

# Projection groups by the model's layout: (group, projections in output order).
MERGED_GROUPS = (("qkv", ("q_proj", "k_proj", "v_proj")), ("o", ("o_proj",)), ("gate_up", ("gate_proj", "up_proj")))
SPLIT_MLP_GROUPS = (("gate", ("gate_proj",)), ("up", ("up_proj",)))
DOWN_GROUP = (("down", ("down_proj",)),)


def padded_rank(max_rank: int) -> int:
    """The rank every slot holds: a power of two, at least 16 (the matrix units' smallest operand)."""
    return max(16, 1 << (max_rank - 1).bit_length())


class LoraSlots:
    def __init__(
        self,
        targets: LoraTargets,
        *,
        merged_mlp: bool,
        max_loras: int,
        max_rank: int,
        max_tokens: int,
        device: torch.device,
        dtype: torch.dtype,
        triton: bool,
    ) -> None:
        """``triton``: the Triton kernels (kernels/lora.py; CUDA, or their interpreter in tests), else the torch
        twin (the CPU path)."""
        self.targets = targets
        self.max_loras = max_loras
        self.rank = padded_rank(max_rank)
        self.device, self.dtype = device, dtype
        groups = MERGED_GROUPS[:2] + (MERGED_GROUPS[2:] if merged_mlp else SPLIT_MLP_GROUPS) + DOWN_GROUP
        self.groups: dict[str, tuple[str, ...]] = dict(groups)
        # The output column where each projection of a group starts.
        self._starts = {group: _starts(targets, modules) for group, modules in groups}
        if triton and any(start % 16 for starts in self._starts.values() for start in starts):
            raise ValueError(
                f"LoRA on the Triton kernels needs the merged projections' parts at multiples of 16 output columns; "
                f"this model's start at {self._starts}"
            )
        self.weights: list[dict[str, tuple[torch.Tensor, torch.Tensor]]] = [
            {group: self._stack(modules) for group, modules in groups} for _ in range(targets.num_layers)
        ]
        self.token_slots = torch.full((max_tokens,), -1, dtype=torch.int32, device=device)
        # Whether the step about to run has rows with an adapter: an eager step without any skips the
        # LoRA launches (graphs replay them regardless, and their rows of slot -1 cost nothing).
        self.active = False
        self._resident: OrderedDict[int, int] = OrderedDict()  # adapter uid -> slot, least recent first
        self._uploaded_any = True  # token_slots may hold slots >= 0 (it starts as -1, but say so once)
        self._shrink, self._expand = _kernels(triton)

    def _stack(self, modules: tuple[str, ...]) -> tuple[torch.Tensor, torch.Tensor]:
        fan_in = self.targets.widths(modules[0])[0]
        width = padded_rank(len(modules) * self.rank)
        fan_out = sum(self.targets.widths(m)[1] for m in modules)
        a = torch.zeros(self.max_loras, width, fan_in, dtype=self.dtype, device=self.device)
        b = torch.zeros(self.max_loras, fan_out, self.rank, dtype=self.dtype, device=self.device)
        return a, b

    @property
    def resident(self) -> list[int]:
        """Uids of the adapters on the device, least recently used first."""
        return list(self._resident)

    def assign(self, adapters: Seq[LoraAdapter | None]) -> list[int]:
        """The slot of each entry (-1 for None), loading the adapters not resident."""
        wanted = {a.uid: a for a in adapters if a is not None}
        if len(wanted) > self.max_loras:
            raise RuntimeError(f"a step uses {len(wanted)} adapters; max_loras is {self.max_loras}")
        for uid, adapter in wanted.items():
            if uid in self._resident:
                self._resident.move_to_end(uid)
            else:
                self._resident[uid] = self._free_slot(wanted)
                self._write(self._resident[uid], adapter)
        return [-1 if a is None else self._resident[a.uid] for a in adapters]

    def _free_slot(self, wanted: dict[int, LoraAdapter]) -> int:
        taken = set(self._resident.values())
        free = [s for s in range(self.max_loras) if s not in taken]
        if free:
            return free[0]
        victim = next(uid for uid in self._resident if uid not in wanted)  # least recently used
        return self._resident.pop(victim)

    def _write(self, slot: int, adapter: LoraAdapter) -> None:
        """Copy ``adapter`` into ``slot`` of every stack; projections it leaves alone get zeros."""
        for layer, stacks in enumerate(self.weights):
            for group, (a, b) in stacks.items():
                a[slot].zero_()
                b[slot].zero_()
                col = 0
                for s, module in enumerate(self.groups[group]):
                    fan_out = self.targets.widths(module)[1]
                    pair = adapter.weights.get((layer, module))
                    if pair is not None:
                        lo = s * self.rank
                        a[slot, lo : lo + adapter.rank].copy_(pair[0])
                        b[slot, col : col + fan_out, : adapter.rank].copy_(pair[1])
                    col += fan_out

    def set_step(self, adapters: Seq[LoraAdapter | None], num_new_tokens: Seq[int]) -> None:
        """Write the slot of every token of a step: rows in the order the runner flattens them (the one-token
        sequences first, then the longer chunks, each in batch order), -1 past the step's tokens."""
        slots = self.assign(adapters)
        self.active = any(s >= 0 for s in slots)
        if not self.active and not self._uploaded_any:
            return  # token_slots is all -1 already
        rows = np.full(self.token_slots.shape[0], -1, dtype=np.int32)
        if sum(num_new_tokens) > rows.shape[0]:
            raise ValueError(f"a step of {sum(num_new_tokens)} tokens; the adapter slots index {rows.shape[0]}")
        order = [i for i, n in enumerate(num_new_tokens) if n == 1] + [i for i, n in enumerate(num_new_tokens) if n > 1]
        at = 0
        for i in order:
            rows[at : at + num_new_tokens[i]] = slots[i]
            at += num_new_tokens[i]
        host = torch.from_numpy(rows)
        # From pinned memory the copy is queued behind the step in flight, which may still read the old slots.
        self.token_slots.copy_(host.pin_memory() if self.device.type == "cuda" else host, non_blocking=True)
        self._uploaded_any = self.active

    def apply(self, layer: int, group: str, x: torch.Tensor, y: torch.Tensor) -> None:
        """Add each row's adapter delta of projection ``group`` (input ``x``, base output ``y``) into ``y``."""
        a, b = self.weights[layer][group]
        slots = self.token_slots[: x.shape[0]]
        starts = self._starts[group]
        self._expand(self._shrink(x, a, slots, len(starts) * self.rank), b, slots, y, starts)


def _starts(targets: LoraTargets, modules: tuple[str, ...]) -> tuple[int, ...]:
    widths = [targets.widths(m)[1] for m in modules]
    return tuple(sum(widths[:i]) for i in range(len(widths)))


def model_targets(model: Any) -> LoraTargets:
    """The projection widths of ``model`` (engine.models.llama.LlamaModel) an adapter must match."""
    s = model.shape
    return LoraTargets(s.num_layers, s.hidden_size, model.q_size, model.kv_size, model.intermediate_size)


def attached_lora(config: Any, model: Any, device: torch.device, dtype: torch.dtype) -> LoraSlots:
    """Slots for ``config``'s max_loras adapters (an EngineConfig), attached to ``model``, on the kernels of the
    model's backend. They are active until the first step says otherwise: a CUDA graph captured before it
    captures the adapters' launches."""
    slots = LoraSlots(
        model_targets(model),
        merged_mlp=model.layers[0].gate_up is not None,
        max_loras=config.max_loras,
        max_rank=config.max_lora_rank,
        # The most rows a step runs: an eager step's token budget, a decode graph's batch, a prefill graph's
        # bucket (at most the token budget) plus its scratch row.
        max_tokens=max(config.max_num_batched_tokens, config.max_num_seqs, 256) + 1,
        device=device,
        dtype=dtype,
        triton=model.ops.name == "triton",
    )
    attach_lora(model, slots)
    slots.active = True
    return slots


def attach_lora(model: Any, slots: LoraSlots) -> None:
    """Make ``model`` add the deltas of ``slots`` to its projections. Its batch-1 decode keeps the fused
    one-row kernels (engine/lora/rows.py); the paths that never materialise a projection's input or output
    go: the float32 residual stream of the int4 row kernels and the fused CPU layers."""
    model.lora = slots
    model.fused_cpu_layers = False
    model.row_stream = model.rotary_fold = model.head_stream = False


def _kernels(triton: bool) -> tuple[Any, Any]:
    if triton:
        from omni_gateway.kernels import lora

        return lora.lora_shrink, lora.lora_expand
    return lora_reference.lora_shrink, lora_reference.lora_expand
