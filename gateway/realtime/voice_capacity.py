"""Whether the speech stages have room for one more voice session, judged by how the admitted ones sound.

A fixed session cap cannot know what the models and the hardware hold; the replies themselves tell. Every spoken
reply of every session of the process lands in one sliding window (the latest ``replies``, none older than
``max_age_s``). Past ``min_replies`` in it, a new voice session is refused while the window's p90 real-time factor
(first to last audio delta over the audio's duration) is at or above the limit, or while more of its replies ran
dry mid-playback than ``dry_share`` of them: the admitted streams are falling behind real time, and another would
slow them all. As the window ages out, admission reopens by itself.

Pure: the clock is injected, and the window is fed as a ``voice_timing.VoiceSink``.
"""

from __future__ import annotations

import math
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

from omni_gateway.gateway.realtime.voice_timing import Playback

# An RTF limit past this would admit sessions while every reply already plays with gaps: a typo, not a policy.
MAX_RTF_LIMIT = 1.5


def check_rtf_limit(value: object, name: str = "the RTF limit") -> float:
    """``value`` as an RTF limit: a number from 0 (admission by RTF off) to ``MAX_RTF_LIMIT``; ``name`` is what
    the error calls it (the config field, the flag)."""
    number = value if isinstance(value, (int, float)) and not isinstance(value, bool) else math.nan
    if not 0 <= number <= MAX_RTF_LIMIT:  # NaN fails both comparisons
        raise ValueError(f"{name} must be a number from 0 (off) to {MAX_RTF_LIMIT}, got {value!r}")
    return float(number)


@dataclass(frozen=True, slots=True)
class _Reply:
    at: float  # when it ended, on the tracker's clock
    rtf: float
    ran_dry: bool


class VoiceCapacity:
    """The window of the latest spoken replies across sessions, and the admission verdict it gives."""

    def __init__(
        self,
        rtf_limit: float,
        *,
        clock: Callable[[], float] = time.monotonic,
        replies: int = 32,
        max_age_s: float = 30.0,
        min_replies: int = 8,
        dry_share: float = 0.25,
    ) -> None:
        self.rtf_limit = check_rtf_limit(rtf_limit)
        if not 1 <= min_replies <= replies:
            raise ValueError(f"min_replies must be from 1 to replies ({replies}), got {min_replies}")
        self._clock = clock
        self._window: deque[_Reply] = deque(maxlen=replies)
        self._max_age_s = max_age_s
        self._min_replies = min_replies
        self._dry_share = dry_share

    @property
    def enabled(self) -> bool:
        return self.rtf_limit > 0

    # ---- the VoiceSink side: only the playback of a reply counts --------------------------------
    def turn_decision(self, detection: str, seconds: float) -> None:
        pass

    def first_audio(self, seconds: float) -> None:
        pass

    def playback(self, playback: Playback) -> None:
        rtf = playback.rtf
        if rtf is not None:  # a reply without audio says nothing of the speech stages
            self._window.append(_Reply(self._clock(), rtf, playback.underruns > 0))

    # ---- the verdict ----------------------------------------------------------------------------
    def _current(self) -> list[_Reply]:
        oldest = self._clock() - self._max_age_s
        while self._window and self._window[0].at < oldest:
            self._window.popleft()
        return list(self._window)

    def rtf_p90(self) -> float | None:
        """The p90 RTF of the replies in the window (nearest rank); None when it is empty."""
        window = self._current()
        return _p90([r.rtf for r in window]) if window else None

    def admits(self) -> tuple[bool, str]:
        """Whether a new voice session may start, and what was measured to say so."""
        if not self.enabled:
            return True, "admission by real-time factor is off"
        window = self._current()
        count = len(window)
        if count < self._min_replies:
            return True, f"{count} spoken replies measured in the window, fewer than the {self._min_replies} judged"
        p90 = _p90([r.rtf for r in window])
        measured = f"p90 real-time factor {p90:.2f} over the last {count} replies (limit {self.rtf_limit:g})"
        if p90 >= self.rtf_limit:
            return False, f"spoken replies are falling behind real time: {measured}"
        dry, allowed = sum(r.ran_dry for r in window), math.floor(count * self._dry_share)
        if dry > allowed:
            return False, (
                f"spoken replies are running dry: {dry} of the last {count} replies ran out of audio mid-playback "
                f"(allowance {allowed})"
            )
        return True, measured


def _p90(values: list[float]) -> float:
    ordered = sorted(values)
    return ordered[math.ceil(0.9 * len(ordered)) - 1]
