"""What the parts of a ``RealtimeSession`` share: the session's identity and settings, the state more than one
part reads (the conversation, the input audio buffer, the speculative turn, partial transcripts, the turns
awaiting a transcript, the idle timeout), the rules they all apply (what this server can output, the voices it
offers, whether transcripts are reported) and the one way out: the server events and commands they produce, in
order.

Every part holds this core and the parts below it, never the session nor a part above it (``session`` says
the order)."""

from __future__ import annotations

from collections.abc import Callable, Collection

from omni_gateway.gateway.client_text import shown
from omni_gateway.gateway.realtime import audio as audio_fmt
from omni_gateway.gateway.realtime.commands import Output, Send, SessionLimits, new_id
from omni_gateway.gateway.realtime.errors import RealtimeError, invalid_value
from omni_gateway.gateway.realtime.input_audio import InputAudioBuffer, SpeechStopped
from omni_gateway.gateway.realtime.items import ItemStore
from omni_gateway.gateway.realtime.partial_transcript import PartialTranscripts
from omni_gateway.gateway.realtime.response import Event
from omni_gateway.gateway.realtime.settings import Dialect, SessionSettings
from omni_gateway.gateway.realtime.speculation import TurnSpeculation
from omni_gateway.gateway.realtime.voice_timing import NoVoiceObserver, VoiceObserver
from omni_gateway.omni.protocol import Capabilities

_BETA_NAMES = {
    "response.output_text.delta": "response.text.delta",
    "response.output_text.done": "response.text.done",
    "response.output_audio.delta": "response.audio.delta",
    "response.output_audio.done": "response.audio.done",
    "response.output_audio_transcript.delta": "response.audio_transcript.delta",
    "response.output_audio_transcript.done": "response.audio_transcript.done",
    "conversation.item.added": "conversation.item.created",
}


class SessionCore:
    """A session's shared state and its output; the parts change the state and add to the output."""

    def __init__(
        self,
        *,
        dialect: Dialect,
        capabilities: Capabilities,
        limits: SessionLimits,
        settings: SessionSettings,
        now: Callable[[], float],
        partial_every_bytes: int,
        voice: VoiceObserver | None = None,
        adapters: Callable[[], Collection[str]] = tuple,
    ) -> None:
        self.dialect = dialect
        self.capabilities = capabilities
        self.adapters = adapters  # the LoRA adapters served now, by name (models a session may choose)
        self.limits = limits
        self.now = now
        self.voice = voice or NoVoiceObserver()  # told of voice turns and spoken audio, to time them
        self.id = new_id("sess")
        self.conversation_id = new_id("conv")
        self.expires_at = int(now()) + limits.session_seconds
        self.settings = settings
        self.items = ItemStore()
        self.audio = InputAudioBuffer()
        self.speculation = TurnSpeculation()
        self.partials = PartialTranscripts(partial_every_bytes)
        self.pending_asr: set[str] = set()  # committed turns whose transcript is not in yet
        self.audio_emitted = False  # a response sent audio: the voice is fixed from then on
        # server_vad idle_timeout_ms: when the silence after the last reply's audio ends (None: not armed)
        self.idle_deadline: float | None = None
        # where that silence starts in the input stream (the reply's playback end, input arriving in real time)
        self.idle_from = 0
        # Set when the idle timeout fired; only client audio clears it, so silence answers once, not in a loop.
        self.idle_spent = False
        self._out: list[Output] = []

    # ---- the output ---------------------------------------------------------------------------------
    def emit(self, event: Event) -> None:
        """Send ``event`` to the client (under its beta name in the beta dialect)."""
        kind = event["type"]
        if self.dialect == "beta":
            if kind == "conversation.item.done":
                return  # beta announces an item once, with conversation.item.created
            kind = _BETA_NAMES.get(kind, kind)
        self._out.append(Send({"event_id": new_id("event"), **event, "type": kind}))

    def error(self, err: RealtimeError, client_event_id: str | None) -> None:
        self.emit({"type": "error", "error": err.body(client_event_id)})

    def issue(self, *outputs: Output) -> None:
        """Commands for the connection (start or cancel a task, close), in order with the events."""
        self._out.extend(outputs)

    def mark(self) -> int:
        """Where the output stands, for ``rollback``."""
        return len(self._out)

    def rollback(self, mark: int) -> None:
        """Forget what was produced since ``mark`` (a client event that turned out bad changes nothing)."""
        del self._out[mark:]

    def take_output(self) -> list[Output]:
        out, self._out = self._out, []
        return out

    # ---- shared rules -------------------------------------------------------------------------------
    def new_item_id(self) -> str:
        return new_id("item")

    @property
    def transcribing(self) -> bool:
        """Whether transcription results are reported to the client."""
        return self.settings.transcription is not None or self.settings.kind == "transcription"

    def check_output(self, settings: SessionSettings, param: str) -> None:
        """Refuse output modalities this server cannot produce (``param`` names the field that asked)."""
        if settings.wants_audio and "audio" not in self.capabilities.output_modalities:
            raise invalid_value(param, "['text'] (this server has no speech output)", ["audio"])
        if settings.wants_image and "image" not in self.capabilities.output_modalities:
            raise RealtimeError(
                "unsupported_modality",
                f"Invalid value for '{param}': this server has no image output model, so 'image' is not available.",
                param,
            )

    def check_voice(self, settings: SessionSettings, param: str) -> None:
        """Refuse a voice the backend does not offer when it is asked for, not when a response would speak it
        (``param`` names the field that asked)."""
        if not self.capabilities.offers_voice(settings.voice):
            voices = ", ".join(repr(v) for v in self.capabilities.voices)
            raise invalid_value(param, f"one of {voices}", settings.voice)

    def chosen_model(self, name: str, param: str) -> str:
        """The model a session asks for: the served model or a LoRA adapter over it. A server without LoRA
        keeps its one model whatever is asked (clients send OpenAI's names); one with LoRA refuses a name it
        does not serve, as OpenAI's 404 does."""
        if name == self.capabilities.model or name in self.adapters():
            return name
        if not self.capabilities.serves_lora:
            return self.settings.model
        served = ", ".join(f"'{m}'" for m in (self.capabilities.model, *sorted(self.adapters())))
        raise RealtimeError(
            "model_not_found", f"The model {shown(name)} does not exist; this server serves {served}.", param
        )

    def turn_ended(self, item_id: str, stopped: SpeechStopped) -> None:
        """The detector's turn ``item_id`` was committed: the voice observer times the decision from it."""
        turn = self.settings.turn_detection
        pause_ms = None if stopped.pause_at is None else audio_fmt.duration_ms(stopped.pause_at)
        detection = turn.type if turn is not None else "server_vad"
        self.voice.turn_committed(item_id, detection, pause_ms, stopped.audio_end_ms, self.now())

    def drop_speculation(self) -> None:
        """Discard the speculative transcript of a pause and the reply prepared from it."""
        self._out += self.speculation.drop()

    def enforce_audio_budget(self) -> None:
        self.items.drop_oldest_media("audio", self.limits.max_conversation_audio_bytes)
