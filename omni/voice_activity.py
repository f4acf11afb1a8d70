"""Voice activity detection for a session: server VAD (silero) or semantic VAD (silero capped by Smart Turn).

The detectors of ``omni_gateway.encoders`` know nothing of omni; these wrap them as the protocol's
``VoiceActivityDetector``. Every session's windows go through one shared ``VadBatcher``.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import TYPE_CHECKING

from omni_gateway.omni.collaborators import SpeechDetector, TurnDetector
from omni_gateway.omni.prompting import UnsupportedInput
from omni_gateway.omni.protocol import VadEvent, VadSettings, VoiceActivityDetector

if TYPE_CHECKING:
    from omni_gateway.encoders.vad import VadBatcher

log = logging.getLogger(__name__)


def open_detector(settings: VadSettings, batcher: VadBatcher) -> VoiceActivityDetector:
    """One session's detector; ``settings.eagerness`` set asks for semantic VAD."""
    from omni_gateway.encoders.vad import SileroVad

    if settings.eagerness is None:
        batched = SileroVad(
            threshold=settings.threshold,
            prefix_padding_ms=settings.prefix_padding_ms,
            silence_duration_ms=settings.silence_duration_ms,
            batcher=batcher,
        )
        return SileroDetector(batched)
    from omni_gateway.encoders.turn import (
        EAGERNESS,
        PACKAGE,
        SemanticTurn,
        default_model_path,
        load_smart_turn,
        scoring_pool,
    )

    policy = EAGERNESS[settings.eagerness]
    # silero's own stop is the cap of a turn that sounds unfinished
    vad = SileroVad(
        threshold=settings.threshold,
        prefix_padding_ms=settings.prefix_padding_ms,
        silence_duration_ms=policy.max_silence_ms,
        batcher=batcher,
    )

    try:
        default_model_path()
    except FileNotFoundError as exc:
        log.warning("%s", exc)
        raise UnsupportedInput(
            "semantic_vad needs the Smart Turn v3 model of the pipecat-ai package, which this server lacks "
            f"(pip install --no-deps {PACKAGE}); use server_vad"
        ) from None
    scoring_pool().submit(load_smart_turn)  # loaded by the first pause, off the event loop
    return SemanticDetector(SemanticTurn(vad, policy))


class SileroDetector:
    """``VoiceActivityDetector`` of the protocol over the encoders' detector (which knows nothing of omni)."""

    def __init__(self, detector: SpeechDetector) -> None:
        self._detector = detector

    def feed(self, pcm16: bytes) -> list[VadEvent]:
        return [VadEvent(event.kind, event.audio_ms) for event in self._detector.feed(pcm16)]

    def reset(self) -> None:
        self._detector.reset()

    def listen(self, notify: Callable[[], None]) -> None:
        self._detector.listen(notify)

    def expect_words(self) -> None:
        """Server VAD judges sound alone."""

    def hear(self, words: str | None) -> None:
        """Server VAD judges sound alone."""


class SemanticDetector(SileroDetector):
    """Semantic turn detection: the session's transcripts reach the detector."""

    def __init__(self, detector: TurnDetector) -> None:
        super().__init__(detector)
        self._turns = detector

    def expect_words(self) -> None:
        self._turns.expect_words()

    def hear(self, words: str | None) -> None:
        self._turns.hear(words)
