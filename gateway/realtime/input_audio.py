"""The input audio buffer and the server-VAD turn tracking that cuts it into user turns.

Positions are byte offsets into the session's whole input stream (24 kHz pcm16), so VAD times,
``audio_start_ms``/``audio_end_ms`` and buffer slices all agree.
"""

from __future__ import annotations

from dataclasses import dataclass

from omni_gateway.gateway.realtime.audio import BYTES_PER_MS
from omni_gateway.omni.protocol import VoiceActivityDetector

# While nobody speaks, only this much audio (beyond the prefix padding) is kept for the next turn.
IDLE_RETENTION_MS = 2000


@dataclass(frozen=True, slots=True)
class SpeechStarted:
    audio_start_ms: int


@dataclass(frozen=True, slots=True)
class SpeechPaused:
    """The speaker went quiet; the turn ends here unless speech resumes within the silence duration."""

    pause_at: int  # stream offset where the speech so far ends
    pcm16: bytes  # the turn's audio so far, from speech start to the pause


@dataclass(frozen=True, slots=True)
class SpeechResumed:
    pass


@dataclass(frozen=True, slots=True)
class SpeechStopped:
    audio_end_ms: int
    pcm16: bytes  # the turn's audio, from speech start to speech end
    pause_at: int | None = None  # the pause this stop closes: its speech ends there, the rest is silence


Signal = SpeechStarted | SpeechPaused | SpeechResumed | SpeechStopped


class InputAudioBuffer:
    def __init__(self) -> None:
        self._pcm = bytearray()
        self._start = 0  # stream offset of self._pcm[0]
        self._vad: VoiceActivityDetector | None = None
        self._vad_base = 0  # stream offset where the current detector started
        self._prefix_ms = 0
        self._speech_start: int | None = None
        self._pause_at: int | None = None

    @property
    def size(self) -> int:
        return len(self._pcm)

    @property
    def start(self) -> int:
        return self._start

    @property
    def end(self) -> int:
        return self._start + len(self._pcm)

    @property
    def in_speech(self) -> bool:
        return self._speech_start is not None

    def speech_so_far(self) -> bytes | None:
        """The turn being spoken, from speech start to now; None between turns and during a pause."""
        if self._speech_start is None or self._pause_at is not None:
            return None
        return self._slice(self._speech_start, self.end)

    def set_vad(self, vad: VoiceActivityDetector | None, prefix_padding_ms: int = 0) -> None:
        """Swap the detector (turn detection changed); the detector's clock starts at the current stream end."""
        self._vad = vad
        self._vad_base = self.end
        self._prefix_ms = prefix_padding_ms
        self._speech_start = self._pause_at = None

    def expect_words(self) -> None:
        """A transcript of the turn up to the pause under way is coming: a detector that weighs words waits."""
        if self._vad is not None and self._pause_at is not None:
            self._vad.expect_words()

    def hear(self, words: str | None) -> None:
        """The transcript of the turn up to the pause under way (None: it failed), for the detector."""
        if self._vad is not None and self._pause_at is not None:
            self._vad.hear(words)

    def append(self, pcm16: bytes) -> list[Signal]:
        self._pcm += pcm16
        if self._vad is None:
            return []
        signals: list[Signal] = []
        for event in self._vad.feed(pcm16):
            at = min(self.end, max(self._start, self._vad_base + event.audio_ms * BYTES_PER_MS))
            if event.kind == "speech_started" and self._speech_start is None:
                self._speech_start = at
                self._pause_at = None
                signals.append(SpeechStarted(at // BYTES_PER_MS))
            elif event.kind == "speech_paused" and self._speech_start is not None:
                self._pause_at = at
                signals.append(SpeechPaused(at, self._slice(self._speech_start, at)))
            elif event.kind == "speech_resumed" and self._speech_start is not None:
                self._pause_at = None
                signals.append(SpeechResumed())
            elif event.kind == "speech_stopped" and self._speech_start is not None:
                segment = self._take(self._speech_start, at)
                signals.append(SpeechStopped(at // BYTES_PER_MS, segment, self._pause_at))
                self._speech_start = self._pause_at = None
        if self._speech_start is None:
            self._drop_before(self.end - (self._prefix_ms + IDLE_RETENTION_MS) * BYTES_PER_MS)
        return signals

    def take_all(self) -> bytes:
        """Manual commit: everything buffered becomes one turn."""
        pcm = bytes(self._pcm)
        self._drop_before(self.end)
        self._speech_start = self._pause_at = None
        return pcm

    def take_since(self, offset: int) -> bytes:
        """Everything buffered from stream ``offset`` on becomes one turn; what came before is dropped."""
        pcm = self._slice(offset, self.end)
        self._drop_before(self.end)
        self._speech_start = self._pause_at = None
        return pcm

    def clear(self) -> None:
        self._drop_before(self.end)
        self._speech_start = self._pause_at = None
        if self._vad is not None:
            self._vad.reset()
            self._vad_base = self.end

    def _slice(self, start: int, stop: int) -> bytes:
        lo, hi = max(0, start - self._start), max(0, stop - self._start)
        return bytes(self._pcm[lo:hi])

    def _take(self, start: int, stop: int) -> bytes:
        pcm = self._slice(start, stop)
        self._drop_before(stop)
        return pcm

    def _drop_before(self, offset: int) -> None:
        cut = offset - self._start
        if cut > 0:
            cut -= cut % 2
            del self._pcm[:cut]
            self._start += cut
