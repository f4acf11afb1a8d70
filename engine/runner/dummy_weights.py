"""Random weights for ``load_format="dummy"`` (vLLM's name): every tensor a checkpoint of the config would hold,
filled on the device that runs it, so benchmarking a 30B model needs its config and tokenizer but no download and
no pass of the weights through host memory.

Each tensor's values come from a generator seeded by the engine seed and the tensor's name, so two engines (and the
ranks of a tensor-parallel group, which each cut their slice out of the same whole tensor) see the same model. A
``namespace`` keeps two models of one checkpoint (Qwen3-Omni's thinker and talker both hold ``model.*``) apart.
Matrices are normal with std 0.02 (the usual initializer range) and norm weights ones: activations stay finite in
bfloat16 through dozens of layers, where vLLM's uniform fill in [-1e-3, 1e-3] makes every logit nearly equal.
"""

from __future__ import annotations

import zlib
from collections.abc import Callable, Mapping
from typing import Any

import torch
from omni_gateway.engine.parallel.layout import ShardLayout
from omni_gateway.engine.parallel.weights import ShardView

_STD = 0.02


class RandomSource:
    """A ``WeightSource`` of seeded random tensors of ``shapes`` (``checkpoint_shapes``). ``read`` makes them on the
    CPU in float32; the runner asks ``shard`` for its own, made on its device in its dtype. ``fp8_names`` are the
    linears that ``--quantization fp8`` quantizes at load. ``namespace`` goes before each name in its seed."""

    def __init__(
        self,
        shapes: Mapping[str, tuple[int, ...]],
        seed: int = 0,
        *,
        fp8_names: frozenset[str] = frozenset(),
        device: torch.device | str = "cpu",
        dtype: torch.dtype = torch.float32,
        namespace: str = "",
    ) -> None:
        self.shapes = dict(shapes)
        self.namespace = namespace
        self.seed = seed
        self.fp8_names = fp8_names
        self.device = torch.device(device)
        self.dtype = dtype

    def names(self) -> set[str]:
        return set(self.shapes)

    def read(self, name: str, dim: int | None = None, start: int = 0, end: int | None = None) -> torch.Tensor:
        tensor = random_tensor(self.namespace + name, self.shapes[name], self.seed, self.device, self.dtype)
        if dim is None:
            return tensor
        stop = tensor.shape[dim] if end is None else end
        if start == 0 and stop == tensor.shape[dim]:
            return tensor
        # A copy: a view would keep the whole tensor alive in the model that holds this rank's slice.
        return tensor.narrow(dim, start, stop - start).clone()

    def shard(self, layout: ShardLayout, device: torch.device, dtype: torch.dtype) -> Mapping[str, Any]:
        """This rank's tensors, each made on ``device`` in ``dtype`` when the model reads it (``ShardView``)."""
        placed = RandomSource(
            self.shapes, self.seed, fp8_names=self.fp8_names, device=device, dtype=dtype, namespace=self.namespace
        )
        return ShardView(placed, layout, _fp8_pending(self.fp8_names) if self.fp8_names else None)


def random_tensor(
    name: str, shape: tuple[int, ...], seed: int, device: torch.device, dtype: torch.dtype
) -> torch.Tensor:
    """Tensor ``name``'s values: ones for a norm's weight, else normal with std 0.02 from a generator of its own
    (seeded with 32 bits: the CPU's Mersenne Twister reads no more of a seed)."""
    if name.endswith("norm.weight"):
        return torch.ones(shape, device=device, dtype=dtype)
    generator = torch.Generator(device=device).manual_seed(zlib.crc32(f"{seed}/{name}".encode()))
    return torch.empty(shape, device=device, dtype=dtype).normal_(0.0, _STD, generator=generator)


def _fp8_pending(names: frozenset[str]) -> Callable[[str, torch.Tensor], Any]:
    from omni_gateway.engine.quant.fp8 import Fp8Pending

    return lambda name, tensor: Fp8Pending(tensor) if name in names else tensor
