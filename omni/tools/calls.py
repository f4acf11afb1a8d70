"""What every tool-call format parses into: whole calls, and the events of a call as it streams."""

from __future__ import annotations

import json
import uuid
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True, slots=True)
class ParsedCall:
    call_id: str
    name: str
    arguments: str  # JSON text


@dataclass(frozen=True, slots=True)
class CallStart:
    call_id: str
    name: str


@dataclass(frozen=True, slots=True)
class ArgumentsDelta:
    call_id: str
    name: str
    delta: str


@dataclass(frozen=True, slots=True)
class CallEnd:
    call: ParsedCall


StreamEvent = str | CallStart | ArgumentsDelta | CallEnd  # a str is content


def new_call_id() -> str:
    return f"call_{uuid.uuid4().hex[:24]}"


def tool_name(tool: dict[str, Any]) -> str:
    """The name of a tool in either shape: chat's ``{"function": {"name": ...}}`` or the flat one."""
    name = tool.get("name") or tool.get("function", {}).get("name")
    return str(name)


def template_tool(tool: dict[str, Any]) -> dict[str, Any]:
    """A tool in the shape chat templates read (``{"type": "function", "function": {...}}``), whichever
    shape it came in: the realtime API's tools are flat."""
    if "function" in tool:
        return tool
    return {"type": "function", "function": {k: v for k, v in tool.items() if k != "type"}}


def tool_parameters(tool: dict[str, Any]) -> dict[str, Any]:
    """A tool's arguments schema; a tool without one takes an object of any properties."""
    fn = tool.get("function", tool)
    return fn.get("parameters") or {"type": "object", "properties": {}}


def strict_json(text: str) -> str:
    """``text`` unchanged where strict JSON parsers read it; re-serialized where it holds a raw control
    character in a string (the JSON grammar lets a tab through), so the final arguments always parse."""
    try:
        json.loads(text)
        return text
    except ValueError:
        pass
    try:
        return json.dumps(json.loads(text, strict=False), ensure_ascii=False)
    except ValueError:
        return text  # not JSON at all: left for the caller to report
