"""Find function calls in generated text.

Chat templates of Qwen2.5/Qwen3, Hermes-style fine-tunes and SmolLM2 ask the model to answer
with ``<tool_call>{"name": ..., "arguments": {...}}</tool_call>``; Llama 3.x answers with a bare JSON
object ``{"name": ..., "parameters": {...}}``. Both are parsed; anything else is plain text.
"""

from __future__ import annotations

import json
import re
import uuid
from dataclasses import dataclass

_TAGGED = re.compile(r"<tool_call>\s*(.*?)\s*</tool_call>", re.DOTALL)


@dataclass(frozen=True, slots=True)
class ParsedCall:
    call_id: str
    name: str
    arguments: str  # JSON text


def parse_tool_calls(text: str, tool_names: frozenset[str]) -> tuple[str, list[ParsedCall]]:
    """Split ``text`` into (content without the calls, calls). Only names in ``tool_names`` count."""
    calls: list[ParsedCall] = []
    for body in _TAGGED.findall(text):
        call = _call_from_json(body, tool_names)
        if call is not None:
            calls.append(call)
    if calls:
        return _TAGGED.sub("", text).strip(), calls
    stripped = text.strip()
    if stripped.startswith("{") and stripped.endswith("}"):
        call = _call_from_json(stripped, tool_names)
        if call is not None:
            return "", [call]
    return text, []


def _call_from_json(body: str, tool_names: frozenset[str]) -> ParsedCall | None:
    try:
        obj = json.loads(body)
    except ValueError:
        return None
    if not isinstance(obj, dict) or obj.get("name") not in tool_names:
        return None
    args = obj.get("arguments", obj.get("parameters", {}))
    if isinstance(args, str):
        arguments = args
    else:
        arguments = json.dumps(args, ensure_ascii=False)
    return ParsedCall(call_id=f"call_{uuid.uuid4().hex[:24]}", name=obj["name"], arguments=arguments)
