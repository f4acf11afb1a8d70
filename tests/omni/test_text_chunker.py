from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st
from omni_gateway.omni.heads.tts.text_chunker import ChunkerConfig, TextChunker


def chunk(text: str, config: ChunkerConfig = ChunkerConfig(), step: int = 1) -> list[str]:
    chunker = TextChunker(config)
    segments: list[str] = []
    for at in range(0, len(text), step):
        segments += chunker.push(text[at : at + step])
    return segments + chunker.flush()


CLAUSES_ONLY = ChunkerConfig(first_min_words=4, first_max_words=None, clause_min_words=None)


def test_first_segment_ends_at_the_first_long_enough_clause() -> None:
    text = "Sure, the weather today looks fine, and tomorrow is sunny too. Bring a hat, though."
    assert chunk(text, CLAUSES_ONLY) == [
        "Sure, the weather today looks fine,",
        " and tomorrow is sunny too.",
        " Bring a hat, though.",
    ]


def test_first_segment_is_cut_after_a_few_words_when_no_clause_ends_sooner() -> None:
    assert chunk("The capital of France is Paris. It is big.") == ["The capital", " of France is Paris.", " It is big."]
    assert chunk("Yes, the capital is Paris.") == ["Yes, the", " capital is Paris."]  # "Yes," is too short
    assert chunk("Paris is, of course, the capital.") == ["Paris is,", " of course, the capital."]
    three = ChunkerConfig(first_max_words=3)
    assert chunk("The capital of France is Paris.", three) == ["The capital of", " France is Paris."]


def test_a_word_ends_the_first_segment_once_the_blank_after_it_arrives() -> None:
    chunker = TextChunker()
    assert chunker.push("Bees make") == []  # "make" may still become "makes"
    assert chunker.push(" ") == ["Bees make"]  # a blank can be a token of its own; no need to wait for more
    assert chunker.push("honey.") == []
    assert chunker.flush() == [" honey."]
    assert chunk("Bees make\nhoney.") == ["Bees make\n", "honey."]


def test_replies_shorter_than_the_first_segment_stay_whole() -> None:
    assert chunk("Paris.") == ["Paris."]
    assert chunk("Paris it is.") == ["Paris it", " is."]  # the first two words go first, however short the rest


def test_later_segments_end_only_at_sentences() -> None:
    text = "One two three four. Then, after a while, we left. Done now, really!"
    assert chunk(text, CLAUSES_ONLY) == ["One two three four.", " Then, after a while, we left.", " Done now, really!"]


def test_long_later_sentences_are_cut_at_clauses_short_ones_are_not() -> None:
    text = (
        "Yes, the sky is blue on most days. On a clear day, the sky is a deep and rich shade of blue, with a "
        "hint of pink near the horizon. Then, later, it darkens."
    )
    assert chunk(text) == [
        "Yes, the",
        " sky is blue on most days.",
        " On a clear day, the sky is a deep and rich shade of blue,",  # "day," came too soon
        " with a hint of pink near the horizon.",
        " Then, later, it darkens.",
    ]


def test_segments_appear_as_soon_as_the_boundary_is_confirmed() -> None:
    chunker = TextChunker(CLAUSES_ONLY)
    assert chunker.push("It is ten past nine") == []
    assert chunker.push(".") == []  # could still be "9.30" or a closing quote
    assert chunker.push(" And") == ["It is ten past nine."]


def test_numbers_abbreviations_and_initials_do_not_split() -> None:
    text = "The price is 3.50 dollars today. Dr. Smith met J. R. Tolkien, e.g. at noon. Fine."
    assert chunk(text, CLAUSES_ONLY) == [
        "The price is 3.50 dollars today.",
        " Dr. Smith met J. R. Tolkien, e.g. at noon.",
        " Fine.",
    ]


def test_closing_quotes_stay_with_their_sentence() -> None:
    assert chunk('He said "we will go now." Then we went home.', CLAUSES_ONLY) == [
        'He said "we will go now."',
        " Then we went home.",
    ]


def test_unpunctuated_text_is_cut_at_spaces_within_the_limits() -> None:
    config = ChunkerConfig(first_max_chars=30, max_chars=50)
    words = " ".join(f"word{i}" for i in range(40))
    segments = chunk(words, config)
    assert len(segments[0]) <= 30 and all(len(s) <= 50 for s in segments[1:])
    assert all(token in words.split() for s in segments for token in s.split())  # no word cut in two
    assert "".join(segments) == words


def test_unpunctuated_later_segments_grow_by_words() -> None:
    words = " ".join(f"w{i}" for i in range(60))
    segments = chunk(words)
    assert [len(s.split()) for s in segments] == [2, 8, 32, 18]  # each four times the one before, then the rest
    assert "".join(segments) == words
    assert [len(s.split()) for s in chunk(words, ChunkerConfig(growth=None))] == [2, 58]  # max_chars alone
    # a boundary before the word limit still ends the segment there
    assert chunk("one two three four five. six seven") == ["one two", " three four five.", " six seven"]


def test_newline_ends_a_segment() -> None:
    assert chunk("Here are the steps to take\nfirst open the door", CLAUSES_ONLY) == [
        "Here are the steps to take\n",
        "first open the door",
    ]
    assert chunk("Steps to\nfirst open the door") == ["Steps to\n", "first open the door"]


@settings(max_examples=200, deadline=None)
@given(st.text(alphabet=st.sampled_from(list("ab cd.,!?;\"'\n3")), max_size=400), st.integers(1, 17))
def test_segments_rebuild_the_text_for_any_input_and_split(text: str, step: int) -> None:
    config = ChunkerConfig(first_max_chars=40, max_chars=60)
    segments = chunk(text, config, step)
    joined = "".join(segments)
    assert text.startswith(joined) and text[len(joined) :].strip() == ""
    assert all(s.strip() for s in segments)
    assert all(len(s) <= 60 + 10 for s in segments)
    assert segments == chunk(text, config, len(text) or 1)  # how the text arrives does not matter
