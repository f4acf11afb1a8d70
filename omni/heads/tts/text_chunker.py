"""Cut a stream of text deltas into speakable segments for a non-autoregressive TTS model.

The first segment is short, so speech can start while the rest of the reply is still being
generated: it ends at the first clause boundary once it holds ``first_min_words`` words, or after
``first_max_words`` words when no boundary came sooner (each decoded token delays the first audio by
a decode step). Later segments end at sentence boundaries, which sound more natural, or at a clause
boundary once they hold ``clause_min_words`` words: a long sentence would otherwise keep the listener
waiting for its last word to be decoded while the audio before it has run out. A later segment that reaches
``growth`` times the previous segment's words with no boundary ends there (text without punctuation: 2, 8,
32 words, each segment's audio long enough to cover the wait for the next). Any segment longer than
``max_chars`` is cut at its last space.
A boundary is confirmed only by the character after it, so "3.5" or "e.g. this" is not split, and a
word only by the blank after it, so every cut is the same however the text arrives.
Segments keep their surrounding whitespace, so joined they give back the text (minus trailing blanks):
they double as transcript pieces.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

_SENTENCE_END = ".!?。！？"
_CLAUSE_END = ",;:—–"
_CLOSERS = "\"')]}»”’"
_WORD = re.compile(r"\S+")
_ABBREVIATIONS = frozenset(
    {"mr.", "mrs.", "ms.", "dr.", "prof.", "st.", "vs.", "etc.", "e.g.", "i.e.", "no.", "approx."}
)


@dataclass(frozen=True, slots=True)
class ChunkerConfig:
    first_min_words: int = 2
    first_max_words: int | None = 2  # None: the first segment waits for a clause boundary
    min_words: int = 3
    clause_min_words: int | None = 6  # None: later segments end at sentence boundaries only
    growth: int | None = 4  # None: a later segment with no boundary waits for max_chars
    first_max_chars: int = 120  # bounds the wait for the first audio when no punctuation comes
    max_chars: int = 250


class TextChunker:
    def __init__(self, config: ChunkerConfig = ChunkerConfig()) -> None:
        self.config = config
        self._buffer = ""
        self._scan_from = 0
        self._emitted = 0
        self._last_words = 0  # words in the segment emitted last

    def push(self, delta: str) -> list[str]:
        """Add text; return the segments it completes."""
        self._buffer += delta
        segments: list[str] = []
        while True:
            cut = self._find_cut()
            if cut is None:
                return segments
            segment, self._buffer = self._buffer[:cut], self._buffer[cut:]
            self._scan_from = 0
            segments.append(segment)
            self._emitted += 1
            self._last_words = len(segment.split())

    def flush(self) -> list[str]:
        """End of text: return whatever is left as the final segments."""
        segments: list[str] = []
        while len(self._buffer) > self._max_chars():
            cut = self._space_cut()
            segments.append(self._buffer[:cut])
            self._buffer = self._buffer[cut:]
            self._emitted += 1
        if self._buffer.strip():
            segments.append(self._buffer)
            self._emitted += 1
        self._buffer, self._scan_from = "", 0
        return segments

    def _find_cut(self) -> int | None:
        text = self._buffer
        first = not self._emitted
        min_words = self.config.first_min_words if first else self.config.min_words
        clause_words = self.config.first_min_words if first else self.config.clause_min_words
        boundaries = _SENTENCE_END if clause_words is None else _SENTENCE_END + _CLAUSE_END
        word_cut = self._word_cut()
        # The last character cannot be confirmed yet: it needs the one after it.
        stop = min(len(text) - 1, self._max_chars(), len(text) if word_cut is None else word_cut + 1)
        for i in range(self._scan_from, stop):
            if text[i] == "\n" and len(text[:i].split()) >= min_words:
                return i + 1
            if text[i] not in boundaries:
                continue
            end = i + 1
            while end < len(text) and text[end] in _CLOSERS:
                end += 1
            if end >= len(text):
                break  # closers may still follow; wait for more text
            if not text[end].isspace():
                continue
            if text[i] == "." and self._is_abbreviation(text, i):
                continue
            if len(text[:end].split()) >= (min_words if text[i] in _SENTENCE_END else clause_words):
                return end
        if word_cut is not None:
            return word_cut
        self._scan_from = max(0, len(text) - 1 - len(_CLOSERS))
        if len(text) > self._max_chars():
            return self._space_cut()
        return None

    def _word_cut(self) -> int | None:
        """Where the segment ends by word count (``first_max_words`` for the first, ``growth`` times the
        previous segment's words for a later one): at the blank after that word once that blank has arrived,
        or after it when it is a newline (which ends a segment it follows)."""
        growth = self.config.growth
        if not self._emitted:
            limit = self.config.first_max_words
        else:
            limit = None if growth is None else max(growth * self._last_words, self.config.min_words)
        if limit is None:
            return None
        for count, match in enumerate(_WORD.finditer(self._buffer), 1):
            if count == limit:
                end = match.end()
                if end >= len(self._buffer) or end > self._max_chars():
                    return None
                return end + 1 if self._buffer[end] == "\n" else end
        return None

    def _max_chars(self) -> int:
        return self.config.max_chars if self._emitted else self.config.first_max_chars

    def _space_cut(self) -> int:
        limit = self._max_chars()
        space = self._buffer.rfind(" ", 0, limit)
        return space + 1 if space > 0 else limit

    @staticmethod
    def _is_abbreviation(text: str, dot: int) -> bool:
        start = text.rfind(" ", 0, dot) + 1
        word = text[start : dot + 1].lstrip("\"'([{")
        is_initial = len(word) == 2 and word[0].isupper()  # "J. Smith"
        return is_initial or word.lower() in _ABBREVIATIONS
