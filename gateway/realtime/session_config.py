"""The ``session.update`` client events of a ``RealtimeSession`` (and the beta ``transcription_session.update``):
which settings a session may take on this server, and the voice activity detector they install."""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING, Any

from omni_gateway.gateway.realtime.commands import VadFactory
from omni_gateway.gateway.realtime.errors import RealtimeError, invalid_value, missing
from omni_gateway.gateway.realtime.input_audio import InputAudioBuffer
from omni_gateway.gateway.realtime.response import Event
from omni_gateway.gateway.realtime.settings import (
    Dialect,
    SessionSettings,
    apply_transcription_update,
    apply_update,
    render_session,
)
from omni_gateway.omni.protocol import Capabilities, InvalidInput


class SessionConfiguration:
    """Part of ``RealtimeSession``, which holds the state named below."""

    id: str
    expires_at: int
    settings: SessionSettings
    dialect: Dialect
    capabilities: Capabilities
    audio: InputAudioBuffer
    idle_deadline: float | None
    _vad_factory: VadFactory | None
    _audio_emitted: bool

    if TYPE_CHECKING:

        def _emit(self, event: Event) -> None: ...
        def _drop_speculation(self) -> None: ...

    def _render_session(self) -> dict[str, Any]:
        return render_session(self.settings, self.dialect, self.id, self.expires_at)

    def _check_output(self, settings: SessionSettings, param: str) -> None:
        if settings.wants_audio and "audio" not in self.capabilities.output_modalities:
            raise invalid_value(param, "['text'] (this server has no speech output)", ["audio"])
        if settings.wants_image and "image" not in self.capabilities.output_modalities:
            raise RealtimeError(
                "unsupported_modality",
                f"Invalid value for '{param}': this server has no image output model, so 'image' is not available.",
                param,
            )

    def _session_update(self, event: dict[str, Any]) -> None:
        if "session" not in event:
            raise missing("session")
        new = apply_update(self.settings, event["session"], self.dialect)
        self._check_output(new, "session.output_modalities" if self.dialect == "ga" else "session.modalities")
        if new.voice != self.settings.voice and self._audio_emitted:
            raise RealtimeError(
                "cannot_update_voice", "Cannot update a session's voice after audio has been output.", "session.voice"
            )
        if new.turn_detection is not None and self._vad_factory is None:
            raise invalid_value(
                "session.turn_detection",
                "null (this server runs without voice activity detection)",
                new.turn_detection.type,
            )
        new = replace(new, model=self.settings.model)  # the served model is fixed for the connection
        if new.turn_detection != self.settings.turn_detection:
            self._install_vad(new)
            self.idle_deadline = None
        self.settings = new
        self._emit({"type": "session.updated", "session": self._render_session()})

    def _transcription_session_update(self, event: dict[str, Any]) -> None:
        if "session" not in event:
            raise missing("session")
        new = apply_transcription_update(self.settings, event["session"])
        if new.turn_detection is not None and self._vad_factory is None:
            raise invalid_value(
                "session.turn_detection",
                "null (this server runs without voice activity detection)",
                new.turn_detection.type,
            )
        if new.turn_detection != self.settings.turn_detection:
            self._install_vad(new)
        self.settings = new
        self._emit({"type": "transcription_session.updated", "session": self._render_session()})

    @property
    def _transcribing(self) -> bool:
        """Whether transcription results are reported to the client."""
        return self.settings.transcription is not None or self.settings.kind == "transcription"

    def _install_vad(self, settings: SessionSettings) -> None:
        turn = settings.turn_detection
        if turn is None or self._vad_factory is None:
            self._drop_speculation()
            self.audio.set_vad(None)
            return
        vad_settings = turn.vad_settings()
        try:
            vad = self._vad_factory(vad_settings)
        except ValueError as exc:  # the detector's own bounds (e.g. a threshold of exactly 0 or 1)
            raise invalid_value(
                "session.turn_detection", "settings the voice activity detector accepts", str(exc)
            ) from None
        except InvalidInput as exc:  # a detector this server cannot build (semantic_vad without its model)
            raise RealtimeError("invalid_value", str(exc), "session.turn_detection.type") from None
        self._drop_speculation()  # the new detector starts a new turn
        self.audio.set_vad(vad, vad_settings.prefix_padding_ms)
