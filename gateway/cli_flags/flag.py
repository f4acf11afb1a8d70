"""One row of the ``omni serve`` flag table (``Flag``), the config field default it reads, and the count type
several groups take."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import MISSING, dataclass, fields
from typing import Any


def _same(value: Any) -> Any:
    return value


# argparse names a type that raises ValueError in its error message ("invalid _positive value: '0'").
def _positive(value: str) -> int:
    number = int(value)
    if number < 1:
        raise ValueError(f"expected a positive integer, got {value}")
    return number


@dataclass(frozen=True)
class Flag:
    """One ``omni serve`` flag and the config field it sets; its default is read from that field."""

    name: str
    owner: type  # GatewayConfig, EngineConfig or OmniConfig
    field: str
    help: str
    group: str
    type: Callable[[str], Any] = str
    choices: tuple[str, ...] | None = None
    to_field: Callable[[Any], Any] = _same  # parsed value -> field value
    from_field: Callable[[Any], Any] = _same  # field default -> flag default
    switch: bool = False  # store_true; ``to_field`` maps the bool
    listing: bool = False  # repeatable, each occurrence a name or a comma list; a tuple in the config
    many: bool = False  # a listing whose one occurrence may take several values (vLLM's ``--lora-modules a b``)
    aliases: tuple[str, ...] = ()  # other spellings (vLLM's short forms)

    @property
    def dest(self) -> str:
        return self.name.removeprefix("--").replace("-", "_")

    def default(self) -> Any:
        return False if self.switch else self.from_field(field_default(self.owner, self.field))


def field_default(owner: type, name: str) -> Any:
    spec = next((f for f in fields(owner) if f.name == name), None)
    if spec is None:
        raise KeyError(f"{owner.__name__} has no field {name!r}")
    if spec.default is not MISSING:
        return spec.default
    if spec.default_factory is not MISSING:
        return spec.default_factory()
    raise KeyError(f"{owner.__name__}.{name} has no default")
