from __future__ import annotations

import copy
from typing import Any

import pytest
from omni_gateway.engine.core.detokenizer import IncrementalDetokenizer, direct_decoder
from omni_gateway.engine.sampling_params import SamplingParams

from tests.harness.engine_fakes import byte_level_tokenizer, sentencepiece_style_tokenizer

TEXT = "Hello world! 日本語 🐍🎉 naïve café, Grüße — the end."


def char_by_char(tok: Any, text: str) -> list[int]:
    """Token ids that spell ``text`` one character at a time, so words and stop strings span tokens."""
    ids: list[int] = []
    for ch in text:
        ids.extend(tok.encode(ch, add_special_tokens=False))
    return ids


def stream(tok: Any, prompt: list[int], output: list[int], **params: Any) -> tuple[list[str], IncrementalDetokenizer]:
    detok = IncrementalDetokenizer(tok, prompt, SamplingParams(**params))
    pieces = []
    for t in output:
        pieces.append(detok.add_token(t))
        if detok.stop_string is not None:
            return pieces, detok
    pieces.append(detok.flush())
    return pieces, detok


@pytest.mark.parametrize("make_tok", [byte_level_tokenizer, sentencepiece_style_tokenizer])
def test_streamed_text_equals_decoding_in_context(make_tok: Any) -> None:
    tok = make_tok()
    prompt = tok.encode("User: hi. Assistant:", add_special_tokens=False)
    output = tok.encode(" " + TEXT, add_special_tokens=False)
    assert any(tok.decode([t]) == "\ufffd" for t in output)  # some characters really span several tokens
    pieces, detok = stream(tok, prompt, output)
    expected = tok.decode(prompt + output)[len(tok.decode(prompt)) :]
    assert "".join(pieces) == expected == detok.output_text
    assert "\ufffd" not in "".join(pieces)
    assert all("\ufffd" not in p for p in pieces)


def test_sentencepiece_word_start_keeps_its_space_mid_text() -> None:
    tok = sentencepiece_style_tokenizer()
    prompt = tok.encode("Hello", add_special_tokens=False)
    full = tok.encode("Hello world", add_special_tokens=False)
    output = full[len(prompt) :]
    assert full[: len(prompt)] == prompt and tok.convert_ids_to_tokens(output)[0].startswith("▁")
    assert tok.decode(output) == "world"  # decoded alone, the leading space is lost
    pieces, _ = stream(tok, prompt, output)
    assert "".join(pieces) == " world"


def test_special_tokens_are_skipped_unless_asked() -> None:
    tok = byte_level_tokenizer()
    out = tok.encode("hi", add_special_tokens=False) + [tok.eos_token_id]
    assert "".join(stream(tok, [5], out)[0]) == "hi"
    assert "".join(stream(tok, [5], out, skip_special_tokens=False)[0]) == "hi<eos>"


def test_stop_string_split_across_tokens_is_never_partly_emitted() -> None:
    tok = byte_level_tokenizer()
    output = char_by_char(tok, "The answer is 42.\nUser: next")
    pieces, detok = stream(tok, [5], output, stop=["\nUser:"])
    assert detok.stop_string == "\nUser:"
    assert "".join(pieces) == detok.output_text == "The answer is 42."
    assert not any("\n" in p for p in pieces)


def test_include_stop_str_in_output() -> None:
    tok = byte_level_tokenizer()
    pieces, detok = stream(tok, [5], char_by_char(tok, "abc STOP def"), stop=["STOP"], include_stop_str_in_output=True)
    assert "".join(pieces) == detok.output_text == "abc STOP"


def test_held_back_text_is_released_when_it_turns_out_not_to_stop() -> None:
    tok = byte_level_tokenizer()
    detok = IncrementalDetokenizer(tok, [5], SamplingParams(stop=["STOP"]))
    emitted = [detok.add_token(t) for t in char_by_char(tok, "a ST")]
    assert "".join(emitted) == "a "  # "ST" might start "STOP"
    emitted += [detok.add_token(t) for t in char_by_char(tok, "AMP")]
    assert "".join(emitted) == "a STAMP" and detok.stop_string is None
    emitted += [detok.add_token(t) for t in char_by_char(tok, " ST")]
    assert "".join(emitted) == "a STAMP "
    assert detok.flush() == "ST"  # the output ended otherwise: nothing is lost


def test_earliest_of_several_stop_strings_wins() -> None:
    tok = byte_level_tokenizer()
    pieces, detok = stream(tok, [5], char_by_char(tok, "one two three"), stop=["three", "two"])
    assert detok.stop_string == "two" and "".join(pieces) == "one "


def test_stop_strings_ignored_while_check_disabled() -> None:
    tok = byte_level_tokenizer()
    detok = IncrementalDetokenizer(tok, [5], SamplingParams(stop=["x"]))
    ids = char_by_char(tok, "xax")
    assert detok.add_token(ids[0], check_stop=False) == "x"
    assert detok.add_token(ids[1]) == "a"
    assert detok.add_token(ids[2]) == "" and detok.stop_string == "x"
    assert detok.output_text == "xa"


def test_wrapper_decode_is_bypassed_only_where_it_merely_forwards() -> None:
    tok = byte_level_tokenizer()
    ids = tok.encode("<bos>" + TEXT, add_special_tokens=False)
    direct = direct_decoder(tok)
    assert direct is not None
    for skip in (True, False):
        assert direct(ids, skip_special_tokens=skip) == tok.decode(
            ids, skip_special_tokens=skip, clean_up_tokenization_spaces=False
        )

    class Shouting(type(tok)):  # a tokenizer whose own decode must not be skipped
        def _decode(self, token_ids: Any, **kwargs: Any) -> str:
            return super()._decode(token_ids, **kwargs).upper()

    loud = copy.copy(tok)
    loud.__class__ = Shouting
    assert direct_decoder(loud) is None
    pieces, _ = stream(loud, [], tok.encode(" hello", add_special_tokens=False))
    assert "".join(pieces) == " HELLO"
