"""The table of ``omni serve`` flags: each names the config field it sets (``GatewayConfig``,
``EngineConfig`` or ``OmniConfig``) and takes its default from that field, so the two never drift apart.
Each help group's rows live in a module of their own; ``serve_flags`` puts them in help order.

Importing this package stays light (no torch): the model side's config types are imported when the table
is built.
"""

from __future__ import annotations

from omni_gateway.gateway.cli_flags.engine import engine_flags
from omni_gateway.gateway.cli_flags.flag import Flag
from omni_gateway.gateway.cli_flags.generation import generation_flags
from omni_gateway.gateway.cli_flags.lora import lora_flags
from omni_gateway.gateway.cli_flags.models import model_flags
from omni_gateway.gateway.cli_flags.network import network_flags


def serve_flags() -> tuple[Flag, ...]:
    """Every ``omni serve`` flag, in help order."""
    return (*network_flags(), *model_flags(), *engine_flags(), *lora_flags(), *generation_flags())


FLAG_GROUPS = {
    "network": "network",
    "models": "models",
    "engine": "engine",
    "lora": "LoRA adapters",
    "generation": "generation defaults (for knobs a request leaves unset)",
}
