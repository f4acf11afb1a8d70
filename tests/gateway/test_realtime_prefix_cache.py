"""A realtime conversation prefills only its new tokens: turn 2+ reuse the KV cache of earlier turns.

Over the real engine (a tiny random Llama) through the socket; usage in response.done reports the
prompt tokens served from the prefix cache, and the figures are printed.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
from websockets.sync.client import connect

from tests.harness.live_server import serve
from tests.harness.real_engine import tiny_pipeline

BLOCK = 16


@pytest.fixture(scope="module")
def pipeline(tmp_path_factory: pytest.TempPathFactory) -> Any:
    pipe = tiny_pipeline(tmp_path_factory.mktemp("tiny"), max_tokens=6, num_kv_blocks=64)
    yield pipe
    pipe.shutdown()


def _turn(ws: Any, text: str) -> dict[str, Any]:
    ws.send(
        json.dumps(
            {
                "type": "conversation.item.create",
                "item": {"type": "message", "role": "user", "content": [{"type": "input_text", "text": text}]},
            }
        )
    )
    ws.send(json.dumps({"type": "response.create"}))
    while True:
        event = json.loads(ws.recv(timeout=120))
        assert event["type"] != "error", event
        if event["type"] == "response.done":
            # The tiny model rarely says EOS: a reply cut at max_tokens is "incomplete" by design.
            assert event["response"]["status"] in ("completed", "incomplete"), event
            return event["response"]["usage"]


def test_turn_two_and_later_prefill_only_new_tokens(pipeline: Any) -> None:
    with serve(pipeline) as port, connect(f"ws://127.0.0.1:{port}/v1/realtime") as ws:
        assert json.loads(ws.recv(timeout=30))["type"] == "session.created"
        ws.send(json.dumps({"type": "session.update", "session": {"type": "realtime", "output_modalities": ["text"]}}))
        usages = [_turn(ws, text) for text in ("hi there, tell me a story about a cat and a dog", "and then?", "go on")]
    figures = [(u["input_tokens"], u["input_token_details"]["cached_tokens"]) for u in usages]
    print(
        "\nturn: prompt tokens, served from the prefix cache:",
        ", ".join(f"{i + 1}: {n} / {c}" for i, (n, c) in enumerate(figures)),
    )
    assert figures[0][1] == 0
    for (previous, _), (prompt, cached) in zip(figures, figures[1:]):
        assert prompt > previous
        # Every full block of the previous prompt is found again; at most the partial block is recomputed.
        assert cached >= previous // BLOCK * BLOCK, figures
        assert cached < prompt


def test_a_prefill_of_the_words_heard_so_far_serves_the_turns_reply_from_the_cache(pipeline: Any) -> None:
    import asyncio
    import types

    from omni_gateway.gateway.realtime.commands import Prefill
    from omni_gateway.gateway.realtime.tasks import run_task
    from omni_gateway.omni.protocol import Message, OmniRequest, TextPart, Usage

    system = Message("system", (TextPart("You are a helpful voice assistant. " * 3),))
    heard = OmniRequest("prefill-1", (system, Message("user", (TextPart("Tell me about the capital city of"),))))
    final = OmniRequest("reply-1", (system, Message("user", (TextPart("Tell me about the capital city of Spain."),))))
    common = 0
    for a, b in zip(pipeline.prompt_ids(heard), pipeline.prompt_ids(final)):
        if a != b:
            break
        common += 1

    async def usage_of(request: OmniRequest) -> Usage:
        return [c async for c in pipeline.generate(request) if isinstance(c, Usage)][-1]

    async def _ignore(outputs: list) -> None:
        raise AssertionError(f"a prefill reports nothing; got {outputs}")

    async def scenario() -> tuple[Usage, Usage]:
        await usage_of(OmniRequest("warm", (system, Message("user", (TextPart("Hi."),)))))  # the system prompt
        control = await usage_of(OmniRequest("other", (system, Message("user", (TextPart("Name a river."),)))))
        await run_task(pipeline, types.SimpleNamespace(id="sess_1"), "item_1:prefill", Prefill(heard), _ignore)
        return control, await usage_of(final)

    control, warm = asyncio.run(scenario())
    print(
        f"\nprompt {warm.input_tokens} tokens, cached {warm.cached_tokens} after a prefill, "
        f"{control.cached_tokens} without"
    )
    assert warm.cached_tokens >= common // BLOCK * BLOCK > control.cached_tokens
    assert warm.cached_tokens < warm.input_tokens
