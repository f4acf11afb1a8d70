"""The ``session.update`` client events of a ``RealtimeSession`` (and the beta ``transcription_session.update``):
which settings a session may take on this server. Uses the core and the input turns (new turn detection
settings install a new detector)."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from omni_gateway.gateway.realtime.errors import RealtimeError, invalid_value, missing
from omni_gateway.gateway.realtime.session_audio import InputTurns
from omni_gateway.gateway.realtime.session_core import SessionCore
from omni_gateway.gateway.realtime.settings import (
    SessionSettings,
    apply_transcription_update,
    apply_update,
    render_session,
)


class SessionConfiguration:
    """The session's settings as the client changes them."""

    def __init__(self, core: SessionCore, turns: InputTurns) -> None:
        self._core = core
        self._turns = turns

    def render(self) -> dict[str, Any]:
        """The ``session`` object of ``session.created`` and ``session.updated``."""
        core = self._core
        return render_session(core.settings, core.dialect, core.id, core.expires_at)

    def session_update(self, event: dict[str, Any]) -> None:
        core = self._core
        if "session" not in event:
            raise missing("session")
        new = apply_update(core.settings, event["session"], core.dialect)
        core.check_output(new, "session.output_modalities" if core.dialect == "ga" else "session.modalities")
        voice_param = "session.audio.output.voice" if core.dialect == "ga" else "session.voice"
        core.check_voice(new, voice_param)
        if new.voice != core.settings.voice and core.audio_emitted:
            raise RealtimeError(
                "cannot_update_voice", "Cannot update a session's voice after audio has been output.", voice_param
            )
        self._check_detector(new)
        asked = event["session"].get("model")  # a string: apply_update checked it
        new = replace(new, model=core.settings.model if asked is None else core.chosen_model(asked, "session.model"))
        if new.turn_detection != core.settings.turn_detection:
            self._turns.install_vad(new)
            core.idle_deadline = None
        core.settings = new
        core.emit({"type": "session.updated", "session": self.render()})

    def transcription_session_update(self, event: dict[str, Any]) -> None:
        core = self._core
        if "session" not in event:
            raise missing("session")
        new = apply_transcription_update(core.settings, event["session"])
        self._check_detector(new)
        if new.turn_detection != core.settings.turn_detection:
            self._turns.install_vad(new)
        core.settings = new
        core.emit({"type": "transcription_session.updated", "session": self.render()})

    def _check_detector(self, settings: SessionSettings) -> None:
        if settings.turn_detection is not None and not self._turns.can_detect:
            raise invalid_value(
                "session.turn_detection",
                "null (this server runs without voice activity detection)",
                settings.turn_detection.type,
            )
