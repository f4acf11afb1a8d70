"""``chat`` for every engine front (``AsyncEngine``, ``EngineCoreClient``, ``ReplicatedEngine``): a
conversation rendered with the model's chat template, then streamed through the front's ``generate``."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Mapping, Sequence
from typing import Any

from omni_gateway.engine.outputs import StreamDelta
from omni_gateway.engine.sampling_params import SamplingParams


class ChatStreaming:
    """Mixed into a class that has ``render_chat`` and ``generate`` with the engine fronts' signatures."""

    render_chat: Any
    generate: Any

    async def chat(
        self,
        messages: Sequence[Mapping[str, Any]],
        params: SamplingParams | None = None,
        *,
        tools: Sequence[Mapping[str, Any]] | None = None,
        add_generation_prompt: bool = True,
        chat_template: str | None = None,
        request_id: str | None = None,
        priority: int = 0,
    ) -> AsyncIterator[StreamDelta]:
        """``generate`` over messages rendered with the model's chat template."""
        prompt = self.render_chat(
            messages, tools=tools, add_generation_prompt=add_generation_prompt, chat_template=chat_template
        )
        async with contextlib.aclosing(
            self.generate(prompt, params, request_id=request_id, priority=priority, add_special_tokens=False)
        ) as deltas:
            async for delta in deltas:
                yield delta
