"""Tool calls in generated text, in each model family's own format (``--tool-call-parser``).

A format reads a model's calls into OpenAI's shape, streaming (``stream``) or whole (``parse``), and
writes the structural tag that constrains them (``grammar``): a forced call follows its tool's
parameters and the answer ends after it.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from omni_gateway.omni.tools.calls import (
    ArgumentsDelta,
    CallEnd,
    CallStart,
    ParsedCall,
    StreamEvent,
    template_tool,
    tool_name,
)
from omni_gateway.omni.tools.hermes import HermesStream, hermes_tag
from omni_gateway.omni.tools.llama3_json import Llama3JsonStream, llama3_json_tag
from omni_gateway.omni.tools.mistral import MistralStream, mistral_tag
from omni_gateway.omni.tools.stream import CallStream

__all__ = [
    "ArgumentsDelta",
    "CallEnd",
    "CallStart",
    "CallStream",
    "ParsedCall",
    "StreamEvent",
    "ToolCallFormat",
    "template_tool",
    "tool_call_format",
    "tool_name",
    "TOOL_CALL_PARSERS",
]


@dataclass(frozen=True, slots=True)
class ToolCallFormat:
    name: str
    _stream: type[CallStream]
    _tag: Callable[..., dict[str, Any] | None]

    def stream(self, tool_names: frozenset[str], *, forced: bool = False) -> CallStream:
        """An incremental reader; ``forced``: the answer is calls only, so no text is content, and a call
        repeating an earlier one ends it (see ``CallStream``)."""
        return self._stream(tool_names, forced=forced)

    def parse(self, text: str, tool_names: frozenset[str], *, forced: bool = False) -> tuple[str, list[ParsedCall]]:
        """(content without the calls, the complete calls) of a whole answer."""
        reader = self.stream(tool_names, forced=forced)
        events = reader.feed(text) + reader.finish()
        content = "".join(e for e in events if isinstance(e, str))
        return (content.strip() if reader.calls else content), reader.calls

    def grammar(self, tools: Sequence[dict[str, Any]], *, required: bool, parallel: bool) -> dict[str, Any] | None:
        """The structural tag of calls of ``tools``; None where unforced calls go unconstrained."""
        return self._tag(tools, required=required, parallel=parallel)


_HERMES = ToolCallFormat("hermes", HermesStream, hermes_tag)
_FORMATS = {
    "hermes": _HERMES,
    "llama3_json": ToolCallFormat("llama3_json", Llama3JsonStream, llama3_json_tag),
    "mistral": ToolCallFormat("mistral", MistralStream, mistral_tag),
}
# Qwen2.5/Qwen3 write Hermes calls (vLLM serves them with "hermes"); their names are accepted as well.
_ALIASES = {"qwen": "hermes", "qwen2": "hermes", "qwen25": "hermes", "qwen2_5": "hermes", "qwen3": "hermes"}
TOOL_CALL_PARSERS: tuple[str, ...] = (*_FORMATS, *_ALIASES)


def tool_call_format(name: str | None) -> ToolCallFormat:
    """The format named by ``--tool-call-parser``; None: Hermes, the server's default."""
    if name is None:
        return _HERMES
    key = _ALIASES.get(name, name)
    if key not in _FORMATS:
        raise ValueError(f"unknown tool call parser {name!r}; expected one of {', '.join(TOOL_CALL_PARSERS)}")
    return _FORMATS[key]
