"""POST /v1/responses body -> a ``ResponsesCall``: the body is rewritten as a chat completion request and parsed
by ``parse_chat``, so both APIs share one validation of messages, media, sampling, tools and output constraints.
Pure, but for reading the store of earlier responses (``previous_response_id``).

Errors that the chat parser raises name the Responses field they came from (``messages[3]`` becomes
``input[1]``); what follows the message index keeps the chat spelling.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass, replace
from typing import Any

from omni_gateway.gateway.client_text import shown
from omni_gateway.gateway.http.chat_request import ChatCall, parse_chat
from omni_gateway.gateway.http.errors import ApiError, invalid
from omni_gateway.gateway.http.fields import get_bool, get_int, get_str, require_object
from omni_gateway.gateway.http.limits import HttpLimits
from omni_gateway.gateway.http.responses_store import ResponseStore
from omni_gateway.omni.protocol import Capabilities

_ROLES = ("user", "system", "developer", "assistant")
_ITEM_TYPES = ("message", "function_call", "function_call_output")
# input_file data URIs the model can take, by media type: audio as chat's input_audio, images as image_url
_FILE_AUDIO = {"audio/wav": "wav", "audio/x-wav": "wav", "audio/wave": "wav", "audio/mpeg": "mp3", "audio/mp3": "mp3"}


@dataclass(frozen=True, slots=True)
class ResponsesCall:
    chat: ChatCall  # the generation, as chat runs it (its request_id is the response's id)
    response_id: str
    stream: bool
    store: bool
    echo: dict[str, Any]  # request fields the response object repeats
    conversation: tuple[dict[str, Any], ...]  # chat-shaped messages before the answer, instructions left out


def parse_responses(raw: object, caps: Capabilities, limits: HttpLimits, store: ResponseStore) -> ResponsesCall:
    body: dict[str, Any] = require_object(raw, "body")
    history: list[tuple[dict[str, Any], str]] = []
    previous_id = get_str(body, "previous_response_id")
    if previous_id is not None:
        previous = store.get(previous_id)
        if previous is None:
            raise ApiError(
                404,
                f"Previous response with id {shown(previous_id)} not found.",
                param="previous_response_id",
                code="previous_response_not_found",
            )
        history = [(m, "previous_response_id") for m in previous.conversation]
    conversation = history + _input(body.get("input"))
    instructions = get_str(body, "instructions")
    system = [({"role": "system", "content": instructions}, "instructions")] if instructions else []
    messages = system + conversation
    _refuse_unsupported(body)
    tools, tool_choice = _tools(body)
    text_format = _text_format(body)
    chat_body: dict[str, Any] = {
        "model": body.get("model"),
        "messages": [m for m, _ in messages],
        "temperature": body.get("temperature"),
        "top_p": body.get("top_p"),
        "max_completion_tokens": get_int(body, "max_output_tokens", lo=1),
        "tools": tools,
        "tool_choice": tool_choice,
        "parallel_tool_calls": get_bool(body, "parallel_tool_calls", True),
        "response_format": text_format[0],
    }
    try:
        chat = parse_chat(chat_body, caps, limits)
    except ApiError as error:
        raise _renamed(error, [source for _, source in messages]) from None
    response_id = f"resp_{uuid.uuid4().hex}"
    metadata = body.get("metadata")
    if metadata is not None:
        require_object(metadata, "metadata")
    echo = {
        "instructions": instructions,
        "max_output_tokens": chat.request.sampling.max_tokens,
        "metadata": metadata or {},
        "parallel_tool_calls": chat.request.parallel_tool_calls,
        "previous_response_id": previous_id,
        "temperature": chat.request.sampling.temperature,
        "top_p": chat.request.sampling.top_p,
        "text": {"format": text_format[1]},
        "tool_choice": body.get("tool_choice") or "auto",
        "tools": body.get("tools") or [],
    }
    return ResponsesCall(
        chat=replace(chat, request=replace(chat.request, request_id=response_id)),
        response_id=response_id,
        stream=get_bool(body, "stream"),
        store=get_bool(body, "store", True),
        echo=echo,
        conversation=tuple(m for m, _ in conversation),
    )


def _input(value: object) -> list[tuple[dict[str, Any], str]]:
    """Responses input items -> chat messages, each with the field it came from."""
    if isinstance(value, str):
        if not value:
            raise invalid("'input' must not be empty.", "input")
        return [({"role": "user", "content": value}, "input")]
    if not isinstance(value, list) or not value:
        raise invalid("'input' must be a string or a non-empty array of input items.", "input")
    out: list[tuple[dict[str, Any], str]] = []
    for i, raw in enumerate(value):
        param = f"input[{i}]"
        item = require_object(raw, param)
        kind = get_str(item, "type", "message", param=f"{param}.type")
        if kind == "message":
            role = get_str(item, "role", required=True, choices=_ROLES, param=f"{param}.role")
            out.append(({"role": role, "content": _content(item.get("content"), f"{param}.content")}, param))
        elif kind == "function_call":
            call = {
                "id": get_str(item, "call_id", required=True, param=f"{param}.call_id"),
                "type": "function",
                "function": {
                    "name": get_str(item, "name", required=True, param=f"{param}.name"),
                    "arguments": get_str(item, "arguments", "{}", param=f"{param}.arguments"),
                },
            }
            last = out[-1][0] if out else None
            if last is not None and last["role"] == "assistant":
                last.setdefault("tool_calls", []).append(call)  # one assistant turn calls several functions
            else:
                out.append(({"role": "assistant", "content": None, "tool_calls": [call]}, param))
        elif kind == "function_call_output":
            message = {
                "role": "tool",
                "tool_call_id": get_str(item, "call_id", required=True, param=f"{param}.call_id"),
                "content": _output(item.get("output"), f"{param}.output"),
            }
            out.append((message, param))
        else:
            raise invalid(
                f"'{param}.type' must be one of {', '.join(_ITEM_TYPES)}, got {shown(kind)}.",
                f"{param}.type",
                "unsupported_value",
            )
    return out


def _content(value: object, param: str) -> str | list[dict[str, Any]]:
    if isinstance(value, str):
        return value
    if not isinstance(value, list):
        raise invalid(f"'{param}' must be a string or an array of content parts.", param)
    return [_part(require_object(part, f"{param}[{i}]"), f"{param}[{i}]") for i, part in enumerate(value)]


def _part(part: dict[str, Any], param: str) -> dict[str, Any]:
    kind = get_str(part, "type", required=True, param=f"{param}.type")
    if kind in ("input_text", "output_text"):
        return {"type": "text", "text": get_str(part, "text", required=True, param=f"{param}.text")}
    if kind == "refusal":
        return {"type": "refusal", "refusal": get_str(part, "refusal", required=True, param=f"{param}.refusal")}
    if kind == "input_image":
        if part.get("file_id") is not None:
            raise invalid(
                "'file_id' is not supported: send the image as a data URI in 'image_url'.", f"{param}.file_id"
            )
        url = get_str(part, "image_url", required=True, param=f"{param}.image_url")
        detail = get_str(part, "detail", "auto", choices=("auto", "low", "high"), param=f"{param}.detail")
        return {"type": "image_url", "image_url": {"url": url, "detail": detail}}
    if kind == "input_audio":
        return {"type": "input_audio", "input_audio": require_object(part.get("input_audio"), f"{param}.input_audio")}
    if kind == "input_file":
        return _file(part, param)
    raise invalid(
        f"'{param}.type' must be input_text, input_image, input_audio, input_file, output_text or refusal, "
        f"got {shown(kind)}.",
        f"{param}.type",
    )


def _file(part: dict[str, Any], param: str) -> dict[str, Any]:
    """An ``input_file`` given inline as a data URI: audio and images go to the model, other files do not."""
    if part.get("file_id") is not None or part.get("file_url") is not None:
        raise invalid("files are accepted inline only: send 'file_data' as a data URI.", f"{param}.file_data")
    data = get_str(part, "file_data", required=True, param=f"{param}.file_data")
    mime = data[5:].partition(";")[0].lower() if data.startswith("data:") else ""
    if mime in _FILE_AUDIO:
        payload = data.partition(",")[2]
        return {"type": "input_audio", "input_audio": {"format": _FILE_AUDIO[mime], "data": payload}}
    if mime.startswith("image/"):
        return {"type": "image_url", "image_url": {"url": data}}
    raise invalid(
        f"'{param}.file_data' must be a data URI of audio ({', '.join(_FILE_AUDIO)}) or an image; "
        f"this model does not read {shown(mime or data[:20])} files.",
        f"{param}.file_data",
        "unsupported_file",
    )


def _output(value: object, param: str) -> str:
    """A function call's output: a string, or text parts joined."""
    if isinstance(value, str):
        return value
    if isinstance(value, list):
        texts = []
        for i, raw in enumerate(value):
            part = require_object(raw, f"{param}[{i}]")
            get_str(part, "type", required=True, choices=("input_text", "output_text"), param=f"{param}[{i}].type")
            texts.append(get_str(part, "text", required=True, param=f"{param}[{i}].text"))
        return "".join(texts)
    raise invalid(f"'{param}' must be a string or an array of input_text parts.", param)


def _refuse_unsupported(body: dict[str, Any]) -> None:
    reasoning = body.get("reasoning")
    if reasoning is not None:
        options = require_object(reasoning, "reasoning")
        effort = get_str(options, "effort", param="reasoning.effort")
        summary = get_str(options, "summary", param="reasoning.summary")
        if effort not in (None, "none") or summary is not None:
            raise invalid(
                "this model does not reason: 'reasoning' accepts only effort \"none\".",
                "reasoning.effort" if effort not in (None, "none") else "reasoning.summary",
                "unsupported_parameter",
            )
    if get_bool(body, "background"):
        raise invalid("background responses are not supported; send 'background': false.", "background")


def _tools(body: dict[str, Any]) -> tuple[list[dict[str, Any]] | None, object]:
    """Responses function tools and tool_choice in chat's shape (chat's parser then checks them)."""
    value = body.get("tools")
    choice = body.get("tool_choice")
    if isinstance(choice, dict):
        kind = get_str(choice, "type", required=True, param="tool_choice.type")
        if kind != "function":
            raise invalid(f"'tool_choice.type' must be \"function\", got {shown(kind)}.", "tool_choice.type")
        choice = {"type": "function", "function": {"name": get_str(choice, "name", param="tool_choice.name")}}
    if value is None:
        return None, choice
    if not isinstance(value, list):
        raise invalid("'tools' must be an array of function tools.", "tools")
    tools = []
    for i, raw in enumerate(value):
        tool = require_object(raw, f"tools[{i}]")
        kind = get_str(tool, "type", required=True, param=f"tools[{i}].type")
        if kind != "function":
            raise invalid(
                f"'tools[{i}].type' must be \"function\": built-in tools ({shown(kind)}) do not run on this server.",
                f"tools[{i}].type",
                "unsupported_parameter",
            )
        function = {
            "name": get_str(tool, "name", required=True, max_len=64, param=f"tools[{i}].name"),
            "description": get_str(tool, "description", param=f"tools[{i}].description"),
            "parameters": tool.get("parameters"),
        }
        get_bool(tool, "strict", param=f"tools[{i}].strict")  # arguments always follow the schema
        if function["parameters"] is not None:
            require_object(function["parameters"], f"tools[{i}].parameters")
        tools.append({"type": "function", "function": {k: v for k, v in function.items() if v is not None}})
    return tools, choice


def _text_format(body: dict[str, Any]) -> tuple[dict[str, Any] | None, dict[str, Any]]:
    """``text.format`` as chat's ``response_format``, and as the response repeats it."""
    text = body.get("text")
    fmt = None if text is None else require_object(text, "text").get("format")
    if fmt is None:
        return None, {"type": "text"}
    fmt = require_object(fmt, "text.format")
    kind = get_str(fmt, "type", required=True, param="text.format.type")
    if kind in ("text", "json_object"):
        return {"type": kind}, {"type": kind}
    if kind != "json_schema":
        raise invalid(
            f'\'text.format.type\' must be "text", "json_object" or "json_schema", got {shown(kind)}.',
            "text.format.type",
        )
    spec = {
        "name": get_str(fmt, "name", required=True, max_len=64, param="text.format.name"),
        "strict": get_bool(fmt, "strict", param="text.format.strict"),
        "schema": require_object(fmt.get("schema"), "text.format.schema"),
    }
    return {"type": "json_schema", "json_schema": spec}, {"type": "json_schema", "description": None, **spec}


def _renamed(error: ApiError, sources: list[str]) -> ApiError:
    """``error`` with a chat field name translated to the Responses field it was built from."""
    param = error.param or ""
    renames = {
        "messages": "input",
        "max_completion_tokens": "max_output_tokens",
        "response_format": "text.format",
        "tool_choice.function.name": "tool_choice.name",
    }
    if param.startswith("messages["):
        index, _, rest = param[len("messages[") :].partition("]")
        if index.isdigit() and int(index) < len(sources):
            param = sources[int(index)] + rest
    elif param.startswith("response_format.json_schema"):
        param = "text.format" + param[len("response_format.json_schema") :]
    elif param.startswith("tools[") and ".function" in param:
        param = param.replace(".function", "", 1)
    else:
        param = next((new + param[len(old) :] for old, new in renames.items() if param.startswith(old)), param)
    renamed = ApiError(error.status, error.message, param=param or None, code=error.code)
    return renamed
