"""How a realtime voice session sounds to its user, timed on the session's own clock: how long the turn detector
took to end a turn after the speech ended, how long the user then waited for the first audio of the answer, and
whether that answer, played at real time from its first delta on, ran dry before it was done.

Pure: the session calls a ``VoiceObserver`` at the moments that matter (a detector's turn committed, a response
created for it, an audio delta emitted, a response done) with its ``now``; ``VoiceTiming`` turns those calls into
numbers and hands them to each of its ``VoiceSink``s (the gateway's Prometheus series and its voice admission, or a
test's list).

Input audio is taken to arrive at real-time pace, so the silence the detector consumed before deciding is also
the wall time that passed between the speech's end and the commit.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol


class VoiceObserver(Protocol):
    """What a session reports of its voice turns and spoken responses."""

    def turn_committed(self, item_id: str, detection: str, pause_ms: float | None, stop_ms: float, now: float) -> None:
        """The detector ``detection`` ended turn ``item_id``: its speech ended at stream offset ``pause_ms``
        (None: the detector named no pause), the detector decided at ``stop_ms``; committed at ``now``."""

    def response_created(self, response_id: str, item_id: str) -> None:
        """Response ``response_id`` answers the turn ``item_id``."""

    def audio_delta(self, response_id: str, duration_s: float, now: float) -> None:
        """Response ``response_id`` sent ``duration_s`` of audio to the client at ``now``."""

    def response_done(self, response_id: str, heard: bool = True) -> None:
        """Response ``response_id`` ended (completed, cancelled, failed or incomplete). ``heard`` False: its
        client stopped reading, so how its audio went out says nothing of the server's pace."""


class NoVoiceObserver:
    """The observer of a session nobody times."""

    def turn_committed(self, item_id: str, detection: str, pause_ms: float | None, stop_ms: float, now: float) -> None:
        pass

    def response_created(self, response_id: str, item_id: str) -> None:
        pass

    def audio_delta(self, response_id: str, duration_s: float, now: float) -> None:
        pass

    def response_done(self, response_id: str, heard: bool = True) -> None:
        pass


@dataclass(frozen=True, slots=True)
class Playback:
    """One spoken response as a client that plays its audio in real time from the first delta on hears it."""

    audio_s: float  # the audio's duration
    stream_s: float  # from the first delta to the last
    underruns: int  # deltas that came after everything before them had played: the client's buffer ran dry
    longest_gap_s: float  # the longest silence those caused (0 when the buffer never ran dry)
    stall_s: float = 0.0  # the silences they caused, summed

    @property
    def rtf(self) -> float | None:
        """Time to stream the audio over its duration (below 1: faster than it plays); None without audio."""
        return self.stream_s / self.audio_s if self.audio_s > 0 else None


class PlaybackClock:
    """The client's playback of one response, simulated from the times its deltas were emitted."""

    def __init__(self, now: float, duration_s: float) -> None:
        self._first = self._last = now
        self._ends = now + duration_s  # when everything emitted so far has played
        self._audio_s = duration_s
        self._underruns = 0
        self._longest_gap_s = 0.0
        self._stall_s = 0.0

    def delta(self, now: float, duration_s: float) -> None:
        if now > self._ends:
            self._underruns += 1
            self._longest_gap_s = max(self._longest_gap_s, now - self._ends)
            self._stall_s += now - self._ends
            self._ends = now
        self._ends += duration_s
        self._audio_s += duration_s
        self._last = now

    def result(self) -> Playback:
        return Playback(self._audio_s, self._last - self._first, self._underruns, self._longest_gap_s, self._stall_s)


class VoiceSink(Protocol):
    """Where ``VoiceTiming`` puts its numbers."""

    def turn_decision(self, detection: str, seconds: float) -> None: ...

    def first_audio(self, seconds: float) -> None: ...

    def playback(self, playback: Playback) -> None: ...


class VoiceTiming:
    """A ``VoiceObserver`` that measures: the detector's decision time per turn, speech end to first audio per
    answered turn, and the playback of every response that spoke."""

    def __init__(self, *sinks: VoiceSink) -> None:
        self._sinks = sinks
        self._turn: tuple[str, float] | None = None  # the last turn committed: its item, when its speech ended
        self._answering: dict[str, float] = {}  # responses not yet heard, to when their turn's speech ended
        self._playing: dict[str, PlaybackClock] = {}

    def turn_committed(self, item_id: str, detection: str, pause_ms: float | None, stop_ms: float, now: float) -> None:
        decided_s = 0.0
        if pause_ms is not None:
            # stop_ms is whole milliseconds, the pause exact: a stop at the pause itself may come out below it
            decided_s = max(0.0, stop_ms - pause_ms) / 1000
            for sink in self._sinks:
                sink.turn_decision(detection, decided_s)
        self._turn = (item_id, now - decided_s)

    def response_created(self, response_id: str, item_id: str) -> None:
        if self._turn is not None and self._turn[0] == item_id:
            self._answering[response_id] = self._turn[1]
            self._turn = None

    def audio_delta(self, response_id: str, duration_s: float, now: float) -> None:
        clock = self._playing.get(response_id)
        if clock is not None:
            clock.delta(now, duration_s)
            return
        self._playing[response_id] = PlaybackClock(now, duration_s)
        speech_end = self._answering.pop(response_id, None)
        if speech_end is not None:
            for sink in self._sinks:
                sink.first_audio(now - speech_end)

    def response_done(self, response_id: str, heard: bool = True) -> None:
        self._answering.pop(response_id, None)
        clock = self._playing.pop(response_id, None)
        if clock is not None and heard:
            playback = clock.result()
            for sink in self._sinks:
                sink.playback(playback)
