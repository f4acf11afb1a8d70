"""The structural tag of tool calls (xgrammar's format), shared by every call format.

Forced calls (``required``) are the whole answer: the first call starts at once, and after the last
call's closing markup only the stop token may follow. ``parallel`` lets a separator and another call
follow instead; without it the grammar ends after one call. Unforced calls (``auto``) are free text in
which the trigger starts a constrained call.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

# Whitespace between the arguments' JSON tokens: one character a run. Arguments are machine-read, and a
# small model sampling at temperature 1 otherwise spends its token budget on blank lines mid-call.
MAX_WHITESPACE = 1

CallTag = tuple[str, dict[str, Any], str]  # (begin, arguments schema, end)


def calls_tag(
    tags: Sequence[CallTag],
    *,
    separator: str,
    trigger: str | None,
    required: bool,
    parallel: bool,
    list_open: str = "",
    list_close: str = "",
) -> dict[str, Any]:
    """Calls as ``tags`` separated by ``separator``; forced ones wrapped in ``list_open``/``list_close``.
    Unforced calls need a ``trigger`` (the text every ``begin`` starts with).

    Where parallel calls are separated by whitespace, that whitespace may also end the answer: a model
    that writes a newline after its last call and then stops would otherwise be held to another call."""
    shaped = [
        {
            "type": "tag",
            "begin": begin,
            "content": {"type": "json_schema", "json_schema": schema, "max_whitespace_cnt": MAX_WHITESPACE},
            "end": end,
        }
        for begin, schema, end in tags
    ]
    if required:
        calls: dict[str, Any] = {
            "type": "tags_with_separator",
            "tags": shaped,
            "separator": separator,
            "at_least_one": True,
            "stop_after_first": not parallel,
        }
        parts = [{"type": "const_string", "value": list_open}, calls, {"type": "const_string", "value": list_close}]
        if parallel and separator and not separator.strip():
            parts.append({"type": "optional", "content": {"type": "const_string", "value": separator}})
        parts = [p for p in parts if p.get("value") != ""]
        calls = parts[0] if len(parts) == 1 else {"type": "sequence", "elements": parts}
    else:
        if trigger is None:
            raise ValueError("unforced calls need a trigger")
        calls = {"type": "triggered_tags", "triggers": [trigger], "tags": shaped, "stop_after_first": not parallel}
    return {"type": "structural_tag", "format": calls}
