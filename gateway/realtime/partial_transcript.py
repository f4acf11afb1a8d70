"""Partial transcripts of the turn being spoken, sent as ``conversation.item.input_audio_transcription.delta``.

While the user speaks, the turn's speech so far is transcribed again each time ``every_bytes`` more of it
arrived, one transcription at a time. Whisper re-reading a longer stretch may still change its last words,
so only the words two consecutive readings agree on are sent: the deltas never take a word back. The
committed turn's final transcript then sends the rest, when it continues the words already sent (else the
``completed`` event alone carries the correction). Pure state: no I/O, no clock.
"""

from __future__ import annotations

from dataclasses import dataclass, field

PARTIAL_SUFFIX = ":partial"
PREFILL_SUFFIX = ":prefill"
_KEPT_ITEMS = 8  # turns whose sent words are remembered until their final transcript


def partial_task_id(item_id: str) -> str:
    return item_id + PARTIAL_SUFFIX


def prefill_task_id(item_id: str) -> str:
    """The task prefilling the reply of ``item_id`` from its partial transcript."""
    return item_id + PREFILL_SUFFIX


def is_partial_task(task_id: str) -> bool:
    return task_id.endswith(PARTIAL_SUFFIX)


@dataclass(slots=True)
class _Turn:
    asked_bytes: int = 0  # speech length the last partial transcription was started at
    reading: list[str] = field(default_factory=list)  # the last partial transcript, in words
    sent: str = ""  # the text the deltas sent so far


class PartialTranscripts:
    def __init__(self, every_bytes: int) -> None:
        if every_bytes < 0:
            raise ValueError(f"every_bytes must be >= 0 (0: no partial transcripts); got {every_bytes}")
        self.every_bytes = every_bytes
        self.running: str | None = None  # the item whose partial transcription is under way
        self._turns: dict[str, _Turn] = {}

    def due(self, item_id: str, speech_bytes: int) -> bool:
        """Whether to transcribe ``item_id``'s speech so far (``speech_bytes`` long) now; if so it counts
        as started, and ``result`` or ``skipped`` must follow."""
        if not self.every_bytes or self.running is not None:
            return False
        turn = self._turns.get(item_id)
        if turn is None:
            turn = self._turns[item_id] = _Turn()
            while len(self._turns) > _KEPT_ITEMS:
                del self._turns[next(iter(self._turns))]
        if speech_bytes - turn.asked_bytes < self.every_bytes:
            return False
        turn.asked_bytes = speech_bytes
        self.running = item_id
        return True

    def skipped(self, item_id: str) -> None:
        """The partial transcription did not run (the recognizer was busy) or failed."""
        if self.running == item_id:
            self.running = None

    def result(self, item_id: str, text: str) -> str:
        """The delta to send for a partial transcript of ``item_id`` ("" for none)."""
        self.skipped(item_id)
        turn = self._turns.get(item_id)
        if turn is None:  # its final transcript came first
            return ""
        words = text.split()
        agreed = 0
        for before, now in zip(turn.reading, words):
            if before != now:
                break
            agreed += 1
        turn.reading = words
        return _advance(turn, " ".join(words[:agreed]))

    def final(self, item_id: str, text: str) -> str:
        """The last delta of ``item_id``, from its final transcript: the rest after the words already sent
        when it continues them, else "" (so does a turn that had no partials: its transcript comes whole)."""
        turn = self._turns.pop(item_id, None)
        return "" if turn is None or not turn.sent else _advance(turn, text.strip())


def _advance(turn: _Turn, text: str) -> str:
    if len(text) <= len(turn.sent) or not text.startswith(turn.sent):
        return ""
    delta, turn.sent = text[len(turn.sent) :], text
    return delta
