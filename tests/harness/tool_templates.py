"""Chat templates that call tools as each model family does, small enough for the tiny models' 256-token
context: the tools are listed up front (by name only), earlier calls are written in the family's format and
tool results answer them.

- Hermes (Qwen2.5/Qwen3, Hermes fine-tunes): ``<tools>`` in the system turn, ``<tool_call>`` per call,
  ``<tool_response>`` in a user turn;
- Llama 3.x JSON: the tools in the first user turn, a call as ``{"name": ..., "parameters": ...}``,
  results from the ``ipython`` role;
- Mistral: ``[AVAILABLE_TOOLS]`` before the last user turn, ``[TOOL_CALLS][...]``, ``[TOOL_RESULTS]``.
"""

from __future__ import annotations

_TURNS_END = "{% endfor %}{% if add_generation_prompt %}assistant:{% endif %}"

HERMES = (
    "{% if tools %}system: <tools>{% for t in tools %}{{ t.function.name }} {% endfor %}</tools>\n{% endif %}"
    "{% for m in messages %}"
    "{% if m.role == 'assistant' and m.tool_calls %}assistant: {% for c in m.tool_calls %}"
    '<tool_call>\n{"name": {{ c.function.name | tojson }}, "arguments": {{ c.function.arguments | tojson }}}'
    "\n</tool_call>{% endfor %}\n"
    "{% elif m.role == 'tool' %}user: <tool_response>{{ m.content }}</tool_response>\n"
    "{% else %}{{ m.role }}: {{ m.content }}\n{% endif %}" + _TURNS_END
)

LLAMA3_JSON = (
    "{% for m in messages %}"
    '{% if loop.first and tools %}user: Call a function as {"name": ..., "parameters": ...}. '
    "{% for t in tools %}{{ t.function.name }} {% endfor %}\n{% endif %}"
    "{% if m.role == 'assistant' and m.tool_calls %}assistant: {% for c in m.tool_calls %}"
    '{"name": {{ c.function.name | tojson }}, "parameters": {{ c.function.arguments | tojson }}}'
    "{% if not loop.last %}; {% endif %}{% endfor %}\n"
    "{% elif m.role == 'tool' %}ipython: {{ m.content }}\n"
    "{% else %}{{ m.role }}: {{ m.content }}\n{% endif %}" + _TURNS_END
)

MISTRAL = (
    "{% for m in messages %}"
    "{% if loop.last and tools %}[AVAILABLE_TOOLS]{% for t in tools %}{{ t.function.name }} {% endfor %}"
    "[/AVAILABLE_TOOLS]{% endif %}"
    "{% if m.role == 'assistant' and m.tool_calls %}assistant: [TOOL_CALLS][{% for c in m.tool_calls %}"
    '{"name": {{ c.function.name | tojson }}, "arguments": {{ c.function.arguments | tojson }}}'
    "{% if not loop.last %}, {% endif %}{% endfor %}]\n"
    "{% elif m.role == 'tool' %}[TOOL_RESULTS]{{ m.content }}[/TOOL_RESULTS]\n"
    "{% else %}{{ m.role }}: {{ m.content }}\n{% endif %}" + _TURNS_END
)

TEMPLATES = {"hermes": HERMES, "llama3_json": LLAMA3_JSON, "mistral": MISTRAL}
