"""The adapters an engine serves by name. Loading checks the adapter whole before it is registered, so a
refused one changes nothing; unloading forgets the name, while sequences already running with that adapter
keep it (they hold the adapter itself) until they finish."""

from __future__ import annotations

from omni_gateway.engine.errors import InvalidRequest
from omni_gateway.engine.lora.adapter import LoraAdapter, LoraAdapterError, LoraTargets, load_adapter


class LoraNotFound(InvalidRequest):
    """A request or an unload names an adapter this engine does not serve."""


class LoraRegistry:
    def __init__(self, targets: LoraTargets, max_rank: int, base_name: str) -> None:
        self.targets = targets
        self.max_rank = max_rank
        self.base_name = base_name
        self._adapters: dict[str, LoraAdapter] = {}

    def names(self) -> dict[str, str]:
        """Served adapter name -> the path it was loaded from. Safe from another thread than the engine's: the
        copy of the dict is one step, which a load or unload on the engine loop cannot interleave."""
        return {name: adapter.path for name, adapter in dict(self._adapters).items()}

    def load(self, name: str, path: str) -> LoraAdapter:
        if not isinstance(name, str) or not name.strip():
            raise LoraAdapterError(f"lora_name must be a non-empty string, got {name!r}")
        if name == self.base_name:
            raise LoraAdapterError(f"lora_name {name!r} is the base model's name; choose another")
        if name in self._adapters:
            raise LoraAdapterError(
                f"LoRA adapter {name!r} is already loaded (from {self._adapters[name].path!r}); unload it first"
            )
        adapter = load_adapter(name, path, self.targets, self.max_rank)
        self._adapters[name] = adapter
        return adapter

    def unload(self, name: str) -> None:
        if self._adapters.pop(name, None) is None:
            raise LoraNotFound(f"LoRA adapter {name!r} is not loaded; loaded: {sorted(self._adapters) or 'none'}")

    def get(self, name: str) -> LoraAdapter:
        adapter = self._adapters.get(name)
        if adapter is None:
            raise LoraNotFound(
                f"The model {name!r} does not exist: neither the base model {self.base_name!r} nor a loaded "
                f"LoRA adapter ({', '.join(sorted(self._adapters)) or 'none loaded'})"
            )
        return adapter
