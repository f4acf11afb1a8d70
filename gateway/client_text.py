"""Client text at the boundary: refusing what no encoder can carry, and showing client values in errors.

JSON may spell a lone UTF-16 surrogate (``"\\ud800"``); Python decodes it into a ``str`` that no UTF-8
encoder, tokenizer included, accepts. Each protocol checks every decoded body or event once, where it is
parsed, so nothing past the boundary meets such a string.
"""

from __future__ import annotations

from typing import Any


def _encodable(text: str) -> bool:
    if text.isascii():
        return True
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def invalid_text_path(value: Any) -> str | None:
    """Where in decoded JSON a string (key or value) holds a lone surrogate, as ``a.b[2].c``; None if nowhere.
    Iterative: the parser's own nesting limit is the only one."""
    stack: list[tuple[Any, str]] = [(value, "")]
    while stack:
        node, path = stack.pop()
        if isinstance(node, str):
            if not _encodable(node):
                return path
        elif isinstance(node, dict):
            for key, child in node.items():
                if not _encodable(key):
                    return path
                stack.append((child, f"{path}.{key}" if path else key))
        elif isinstance(node, list):
            stack.extend((child, f"{path}[{i}]") for i, child in enumerate(node))
    return None


def invalid_text_message(path: str) -> str:
    where = f"'{path}'" if path else "the body"
    return f"Invalid value for {where}: the text holds a lone UTF-16 surrogate, which is not valid Unicode."


SHOWN_CHARS = 80


def shown(value: Any) -> str:
    """``value`` as an error message quotes it: its repr, cut to ``SHOWN_CHARS`` with the full size said, so
    an error never echoes a megabyte of hostile input back."""
    text = repr(value)
    if len(text) <= SHOWN_CHARS:
        return text
    size = len(value) if isinstance(value, str) else len(text)
    return f"{text[:SHOWN_CHARS]}... ({size} characters)"
