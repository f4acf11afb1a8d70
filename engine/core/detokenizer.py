"""Streaming detokenization with stop-string detection.

Decoding one token at a time is wrong for byte-level BPE (a character can span tokens) and for
SentencePiece (whether a piece starts with a space depends on what precedes it). So each step
decodes a short window of already-emitted tokens plus the new ones and emits only the text beyond
the window's own decoding; text ending in U+FFFD (an unfinished UTF-8 sequence) waits for more tokens.

Stop strings: text that could still become a stop string is held back until it is resolved, so a
client never sees part of a stop string that later ends the output.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from omni_gateway.engine.sampling_params import SamplingParams

# Prompt tokens that seed the window: enough for any tokenizer's context-dependent spacing.
_PROMPT_CONTEXT = 6
_INCOMPLETE = "\ufffd"


def direct_decoder(tokenizer: Any) -> Callable[..., str] | None:
    """The Rust tokenizer's ``decode`` where the transformers wrapper only forwards to it: on the
    few ids of a streaming window the wrapper's argument handling costs several times the decode.
    None for tokenizers that override decoding (or are not ``PreTrainedTokenizerFast``)."""
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is None:
        return None
    try:
        from transformers import PreTrainedTokenizerFast
    except ImportError:
        return None
    cls = type(tokenizer)
    if (
        not isinstance(tokenizer, PreTrainedTokenizerFast)
        or cls.decode is not PreTrainedTokenizerFast.decode
        or cls._decode is not PreTrainedTokenizerFast._decode
    ):
        return None
    return backend.decode


class IncrementalDetokenizer:
    def __init__(self, tokenizer: Any, prompt_token_ids: list[int], params: SamplingParams) -> None:
        self._tokenizer = tokenizer
        self._direct = direct_decoder(tokenizer)
        self._skip_special = params.skip_special_tokens
        self._ids: list[int] = list(prompt_token_ids[-_PROMPT_CONTEXT:])
        self._prefix = 0  # window start: tokens before it are settled and no longer decoded
        self._read = len(self._ids)  # tokens before it have been turned into text
        self._stops = params.stop
        self._max_stop = max((len(s) for s in params.stop), default=0)
        self._include_stop = params.include_stop_str_in_output
        self._text = ""  # all decoded output text
        self._emitted = 0  # how much of _text has been returned
        self._searched = 0  # _text before this was already scanned for stop strings
        self._stop_floor = 0  # stop strings must start at or after this (min_tokens)
        self.stop_string: str | None = None

    @property
    def output_text(self) -> str:
        """Text returned so far (without held-back text)."""
        return self._text[: self._emitted]

    def add_token(self, token_id: int, *, check_stop: bool = True) -> str:
        """Feed one output token; returns the text now safe to emit. After a stop string matched,
        ``stop_string`` is set and the output is final."""
        if self.stop_string is not None:
            raise RuntimeError("add_token after a stop string ended the output")
        self._ids.append(token_id)
        self._text += self._decode_new(final=False)
        if not self._stops:
            return self._emit_to(len(self._text))
        if not check_stop:
            self._stop_floor = self._searched = len(self._text)
            return self._emit_to(len(self._text))
        start = max(self._searched - self._max_stop + 1, self._stop_floor)
        match = self._find_stop(start)
        if match is not None:
            pos, stop = match
            end = pos + len(stop) if self._include_stop else pos
            self.stop_string = stop
            out = self._emit_to(end)
            self._text = self._text[: max(end, self._emitted)]
            return out
        self._searched = len(self._text)
        return self._emit_to(len(self._text) - self._held_back())

    def flush(self) -> str:
        """The output ended for another reason: release held-back text and any undecodable tail."""
        if self.stop_string is not None:
            return ""
        self._text += self._decode_new(final=True)
        return self._emit_to(len(self._text))

    def _emit_to(self, end: int) -> str:
        if end <= self._emitted:
            return ""
        out = self._text[self._emitted : end]
        self._emitted = end
        return out

    def _decode_new(self, *, final: bool) -> str:
        ids = self._ids
        before = self._decode(ids[self._prefix : self._read])
        after = self._decode(ids[self._prefix :])
        if len(after) <= len(before) or (after.endswith(_INCOMPLETE) and not final):
            return ""
        # Slide the window; drop ids the next decode no longer needs.
        del ids[: self._read]
        self._prefix = 0
        self._read = len(ids)
        return after[len(before) :]

    def _decode(self, ids: list[int]) -> str:
        if not ids:
            return ""
        if self._direct is not None:
            return self._direct(ids, skip_special_tokens=self._skip_special)
        return self._tokenizer.decode(ids, skip_special_tokens=self._skip_special, clean_up_tokenization_spaces=False)

    def _find_stop(self, start: int) -> tuple[int, str] | None:
        best: tuple[int, str] | None = None
        for stop in self._stops:
            pos = self._text.find(stop, start)
            if pos != -1 and (best is None or pos < best[0]):
                best = (pos, stop)
        return best

    def _held_back(self) -> int:
        """Length of the longest text suffix that is a proper prefix of some stop string."""
        text = self._text
        limit = min(self._max_stop - 1, len(text) - self._emitted)
        for k in range(limit, 0, -1):
            tail = text[-k:]
            if any(stop.startswith(tail) for stop in self._stops):
                return k
        return 0
