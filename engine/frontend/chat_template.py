"""Render chat messages (and optional tool definitions) to a prompt string.

The model's own template (``tokenizer.chat_template``) is used whenever it exists. A tokenizer
without one is an error unless the caller asks for ``chat_template="chatml"``: the ChatML layout
below (``<|im_start|>role\\n...<|im_end|>``) is a fallback that suits ChatML-trained models only, so
it is never applied silently.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from omni_gateway.engine.errors import InvalidRequest

CHATML_TEMPLATE = (
    # No whitespace control: the string has no incidental whitespace, and "{%-" would eat the newlines.
    "{% if tools %}<|im_start|>system\n"
    "{% if messages and messages[0]['role'] == 'system' %}{{ messages[0]['content'] }}\n\n{% endif %}"
    'You may call these tools; answer with a JSON object {"name": ..., "arguments": {...}}:'
    "{% for tool in tools %}\n{{ tool | tojson }}{% endfor %}<|im_end|>\n{% endif %}"
    "{% for message in messages %}"
    "{% if not (tools and loop.first and message['role'] == 'system') %}"
    "<|im_start|>{{ message['role'] }}\n{{ message['content'] }}<|im_end|>\n"
    "{% endif %}"
    "{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)

Message = Mapping[str, Any]


def resolve_template(tokenizer: Any, chat_template: str | None = None) -> str:
    """The template to use: an explicit one ("chatml" names the fallback), else the tokenizer's."""
    if chat_template == "chatml":
        return CHATML_TEMPLATE
    if chat_template:
        return chat_template
    own = getattr(tokenizer, "chat_template", None)
    if own:
        return own
    name = getattr(tokenizer, "name_or_path", "") or type(tokenizer).__name__
    raise InvalidRequest(
        f"tokenizer {name!r} has no chat template; pass chat_template=<jinja template> or "
        f"chat_template='chatml' to use the ChatML fallback, or send a plain prompt instead"
    )


def render_chat(
    tokenizer: Any,
    messages: Sequence[Message],
    *,
    tools: Sequence[Mapping[str, Any]] | None = None,
    add_generation_prompt: bool = True,
    chat_template: str | None = None,
) -> str:
    if not messages:
        raise InvalidRequest("messages must be a non-empty list of {'role': ..., 'content': ...} objects, got []")
    template = resolve_template(tokenizer, chat_template)
    prompt = tokenizer.apply_chat_template(
        [_normalize(i, m) for i, m in enumerate(messages)],
        tools=list(tools) if tools else None,
        add_generation_prompt=add_generation_prompt,
        chat_template=template,
        tokenize=False,
    )
    if not isinstance(prompt, str):
        raise InvalidRequest(f"chat template rendered {type(prompt).__name__}, expected a string")
    return prompt


def _normalize(index: int, message: Message) -> dict[str, Any]:
    if not isinstance(message, Mapping) or "role" not in message:
        raise InvalidRequest(f"messages[{index}] must be a mapping with a 'role', got {message!r}")
    out = dict(message)
    content = out.get("content")
    if content is None:
        out["content"] = ""
    elif isinstance(content, list):
        # OpenAI content parts: text parts are joined; media parts reach the engine as embed spans, not text.
        texts = []
        for part in content:
            if not isinstance(part, Mapping) or "type" not in part:
                raise InvalidRequest(f"messages[{index}].content parts must be objects with a 'type', got {part!r}")
            if part["type"] == "text":
                texts.append(str(part.get("text", "")))
        out["content"] = "".join(texts)
    elif not isinstance(content, str):
        raise InvalidRequest(
            f"messages[{index}].content must be a string or a list of parts, got {type(content).__name__}"
        )
    return out
