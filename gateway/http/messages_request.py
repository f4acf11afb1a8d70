"""POST /v1/messages (Anthropic's Messages API) body -> a ``MessagesCall``: the body is rewritten as a chat
completion request and parsed by ``parse_chat``, so both APIs share one validation of messages, media,
sampling and tools. Pure.

Errors the chat parser raises name the Messages field they came from (``messages[3]`` becomes the Anthropic
message it was built from); what follows the message index keeps the chat spelling.
"""

from __future__ import annotations

import json
import uuid
from dataclasses import dataclass, replace
from typing import Any

from omni_gateway.gateway.client_text import shown
from omni_gateway.gateway.http.chat_request import ChatCall, parse_chat
from omni_gateway.gateway.http.errors import ApiError, invalid
from omni_gateway.gateway.http.fields import get_bool, get_float, get_int, get_str, require_object
from omni_gateway.gateway.http.limits import HttpLimits
from omni_gateway.omni.protocol import Capabilities

_TOOL_CHOICES = ("auto", "any", "tool", "none")


@dataclass(frozen=True, slots=True)
class MessagesCall:
    chat: ChatCall  # the generation, as chat runs it (its request_id is the message's id)
    message_id: str
    stream: bool


def parse_messages_body(raw: object, caps: Capabilities, limits: HttpLimits) -> MessagesCall:
    body: dict[str, Any] = require_object(raw, "body")
    max_tokens = get_int(body, "max_tokens", lo=1)
    if max_tokens is None:
        raise invalid("Missing required parameter: 'max_tokens'.", "max_tokens", "missing_required_parameter")
    messages = _system(body.get("system")) + _messages(body.get("messages"))
    stop = body.get("stop_sequences")
    if stop is not None and not isinstance(stop, list):
        raise invalid("'stop_sequences' must be an array of strings.", "stop_sequences")
    thinking = body.get("thinking")
    if thinking is not None and get_str(require_object(thinking, "thinking"), "type", param="thinking.type") not in (
        None,
        "disabled",
    ):
        raise invalid("this model does not think aloud: 'thinking' must be disabled.", "thinking.type")
    if body.get("metadata") is not None:
        require_object(body["metadata"], "metadata")
    tools, tool_choice, parallel = _tools(body)
    chat_body: dict[str, Any] = {
        "model": body.get("model"),
        "messages": [m for m, _ in messages],
        "max_tokens": max_tokens,
        "temperature": get_float(body, "temperature", lo=0.0, hi=1.0),  # Anthropic's range
        "top_p": body.get("top_p"),
        "stop": stop,
        "tools": tools,
        "tool_choice": tool_choice,
        "parallel_tool_calls": parallel,
        "response_format": _output_format(body),
    }
    top_k = get_int(body, "top_k", lo=1)
    try:
        chat = parse_chat(chat_body, caps, limits)
    except ApiError as error:
        raise _renamed(error, [source for _, source in messages]) from None
    message_id = f"msg_{uuid.uuid4().hex}"
    sampling = replace(chat.request.sampling, top_k=top_k)
    request = replace(chat.request, request_id=message_id, sampling=sampling)
    return MessagesCall(chat=replace(chat, request=request), message_id=message_id, stream=get_bool(body, "stream"))


def _system(value: object) -> list[tuple[dict[str, Any], str]]:
    if value is None or value == "":
        return []
    if isinstance(value, str):
        return [({"role": "system", "content": value}, "system")]
    if not isinstance(value, list):
        raise invalid("'system' must be a string or an array of text blocks.", "system")
    texts = []
    for i, block in enumerate(value):
        block = require_object(block, f"system[{i}]")
        get_str(block, "type", required=True, choices=("text",), param=f"system[{i}].type")
        texts.append(get_str(block, "text", required=True, param=f"system[{i}].text"))
    return [({"role": "system", "content": "".join(texts)}, "system")] if texts else []


def _messages(value: object) -> list[tuple[dict[str, Any], str]]:
    """Anthropic messages -> chat messages, each with the field it came from. A user message's
    ``tool_result`` blocks become tool messages ahead of the rest of it."""
    if not isinstance(value, list) or not value:
        raise invalid("'messages' must be a non-empty array of message objects.", "messages")
    out: list[tuple[dict[str, Any], str]] = []
    for i, raw in enumerate(value):
        param = f"messages[{i}]"
        message = require_object(raw, param)
        role = get_str(message, "role", required=True, choices=("user", "assistant"), param=f"{param}.role")
        content = message.get("content")
        if isinstance(content, str):
            out.append(({"role": role, "content": content}, param))
            continue
        if not isinstance(content, list):
            raise invalid(f"'{param}.content' must be a string or an array of content blocks.", f"{param}.content")
        parts: list[dict[str, Any]] = []
        calls: list[dict[str, Any]] = []
        for j, block in enumerate(content):
            where = f"{param}.content[{j}]"
            block = require_object(block, where)
            kind = get_str(block, "type", required=True, param=f"{where}.type")
            if kind == "text":
                parts.append({"type": "text", "text": get_str(block, "text", required=True, param=f"{where}.text")})
            elif kind == "image":
                parts.append({"type": "image_url", "image_url": {"url": _image_url(block, where)}})
            elif kind == "tool_use" and role == "assistant":
                calls.append(_tool_use(block, where))
            elif kind == "tool_result" and role == "user":
                out.append((_tool_result(block, where), where))
            else:
                raise invalid(
                    f"'{where}.type' must be text or image, tool_use (assistant) or tool_result (user); "
                    f"got {shown(kind)} in a {role} message.",
                    f"{where}.type",
                )
        if parts or calls:
            chat: dict[str, Any] = {"role": role, "content": parts or None}
            if calls:
                chat["tool_calls"] = calls
            out.append((chat, param))
    return out


def _image_url(block: dict[str, Any], param: str) -> str:
    source = require_object(block.get("source"), f"{param}.source")
    kind = get_str(source, "type", required=True, param=f"{param}.source.type")
    if kind != "base64":
        raise invalid(
            f"'{param}.source.type' must be \"base64\": this server fetches no URLs, got {shown(kind)}.",
            f"{param}.source.type",
        )
    mime = get_str(source, "media_type", required=True, param=f"{param}.source.media_type")
    data = get_str(source, "data", required=True, param=f"{param}.source.data")
    return f"data:{mime};base64,{data}"


def _tool_use(block: dict[str, Any], param: str) -> dict[str, Any]:
    arguments = block.get("input", {})
    require_object(arguments, f"{param}.input")
    return {
        "id": get_str(block, "id", required=True, param=f"{param}.id"),
        "type": "function",
        "function": {
            "name": get_str(block, "name", required=True, param=f"{param}.name"),
            "arguments": json.dumps(arguments, ensure_ascii=False),
        },
    }


def _tool_result(block: dict[str, Any], param: str) -> dict[str, Any]:
    content = block.get("content", "")
    if isinstance(content, list):
        texts = []
        for k, part in enumerate(content):
            part = require_object(part, f"{param}.content[{k}]")
            get_str(part, "type", required=True, choices=("text",), param=f"{param}.content[{k}].type")
            texts.append(get_str(part, "text", required=True, param=f"{param}.content[{k}].text"))
        content = "".join(texts)
    elif not isinstance(content, str):
        raise invalid(f"'{param}.content' must be a string or an array of text blocks.", f"{param}.content")
    if get_bool(block, "is_error", param=f"{param}.is_error"):
        content = f"Error: {content}"
    call_id = get_str(block, "tool_use_id", required=True, param=f"{param}.tool_use_id")
    return {"role": "tool", "tool_call_id": call_id, "content": content or "(empty)"}


def _tools(body: dict[str, Any]) -> tuple[list[dict[str, Any]] | None, object, bool]:
    """Anthropic tools and tool_choice in chat's shape (chat's parser then checks them)."""
    value = body.get("tools")
    tools = None
    if value is not None:
        if not isinstance(value, list):
            raise invalid("'tools' must be an array of tools.", "tools")
        tools = []
        for i, raw in enumerate(value):
            tool = require_object(raw, f"tools[{i}]")
            kind = get_str(tool, "type", "custom", param=f"tools[{i}].type")
            if kind != "custom":
                raise invalid(
                    f"'tools[{i}].type' must be \"custom\": server tools ({shown(kind)}) do not run here.",
                    f"tools[{i}].type",
                )
            schema = require_object(tool.get("input_schema"), f"tools[{i}].input_schema")
            function = {
                "name": get_str(tool, "name", required=True, max_len=64, param=f"tools[{i}].name"),
                "description": get_str(tool, "description", param=f"tools[{i}].description"),
                "parameters": schema,
            }
            tools.append({"type": "function", "function": {k: v for k, v in function.items() if v is not None}})
    choice = body.get("tool_choice")
    if choice is None:
        return tools, None, True
    choice = require_object(choice, "tool_choice")
    kind = get_str(choice, "type", required=True, choices=_TOOL_CHOICES, param="tool_choice.type")
    parallel = not get_bool(choice, "disable_parallel_tool_use", param="tool_choice.disable_parallel_tool_use")
    if kind == "tool":
        name = get_str(choice, "name", required=True, param="tool_choice.name")
        return tools, {"type": "function", "function": {"name": name}}, parallel
    return tools, {"any": "required"}.get(kind, kind), parallel


def _output_format(body: dict[str, Any]) -> dict[str, Any] | None:
    """``output_config.format`` (structured outputs) as chat's ``response_format``; effort is refused."""
    value = body.get("output_config")
    if value is None:
        return None
    config = require_object(value, "output_config")
    if config.get("effort") is not None:
        raise invalid("this model has no effort levels: leave 'output_config.effort' out.", "output_config.effort")
    fmt = config.get("format")
    if fmt is None:
        return None
    fmt = require_object(fmt, "output_config.format")
    get_str(fmt, "type", required=True, choices=("json_schema",), param="output_config.format.type")
    schema = require_object(fmt.get("schema"), "output_config.format.schema")
    return {"type": "json_schema", "json_schema": {"name": "output", "schema": schema}}


def _renamed(error: ApiError, sources: list[str]) -> ApiError:
    """``error`` with a chat field name translated to the Messages field it was built from."""
    param = error.param or ""
    if param.startswith("messages["):
        index, _, rest = param[len("messages[") :].partition("]")
        if index.isdigit() and int(index) < len(sources):
            param = sources[int(index)] + rest
    elif param.startswith("response_format.json_schema.schema"):
        param = "output_config.format.schema"
    elif param.startswith("stop"):
        param = "stop_sequences"
    elif param.startswith("tools[") and ".function" in param:
        param = param.replace(".function.parameters", ".input_schema").replace(".function", "")
    elif param.startswith("tool_choice.function.name"):
        param = "tool_choice.name"
    return ApiError(error.status, error.message, param=param or None, code=error.code)
