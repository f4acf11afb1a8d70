"""Orchestration of a turn: encoders -> engine -> output heads, behind ``omni.protocol.OmniBackend``.

``import omni`` is cheap; ``load_backend`` pulls in torch and the models.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from omni_gateway.omni.config import OmniConfig
    from omni_gateway.omni.protocol import OmniBackend


def load_backend(config: OmniConfig) -> OmniBackend:
    """Load every configured model and start the engine thread."""
    from omni_gateway.engine.frontend.idle_threads import sleep_idle_workers

    sleep_idle_workers()  # before torch and the other model libraries load
    from omni_gateway.omni.pipeline import OmniPipeline

    return OmniPipeline.load(config)
