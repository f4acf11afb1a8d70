"""A generated corpus of malformed realtime client events over one live socket: one error each, no close."""

from __future__ import annotations

import asyncio
import base64
import json
from typing import Any

from omni_gateway.gateway.config import GatewayConfig
from websockets.asyncio.client import connect

from tests.harness.fake_backend import FakeBackend, silence
from tests.harness.live_server import serve

MIB = 1024 * 1024
JUNK: list[Any] = [None, True, -1, 2**70, 1e308, "", "x" * 10_000, [], [[[]]], {}, {"a": {"b": {"c": [1, {}]}}}]
# Fields of each client event, each replaced in turn by every junk value (or removed).
SHAPES: dict[str, dict[str, Any]] = {
    "session.update": {"session": {"type": "realtime", "instructions": "hi"}},
    "input_audio_buffer.append": {"audio": base64.b64encode(silence(20)).decode()},
    "conversation.item.create": {
        "item": {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "hi"}]}
    },
    "conversation.item.retrieve": {"item_id": "item_missing"},
    "conversation.item.delete": {"item_id": "item_missing"},
    "conversation.item.truncate": {"item_id": "item_missing", "content_index": 0, "audio_end_ms": 10},
}


def nested(depth: int) -> Any:
    value: Any = "leaf"
    for i in range(depth):
        value = {"k": value} if i % 2 else [value]
    return value


def corpus() -> list[tuple[str, str]]:
    """(label, frame text) pairs, every one of which a conforming server must refuse with an error event."""
    frames: list[tuple[str, str]] = [("commit empty buffer", json.dumps({"type": "input_audio_buffer.commit"}))]
    for text in [
        "",
        "{",
        "nul",
        "\x00",
        '{"type":',
        "[1,2",
        "[" * 200_000,
        '{"type": "session.update"' + " " * 1000,
        "{'type': 'x'}",
        "NaN",
        "\ufeff{}",
    ]:
        frames.append(("not json", text))
    for value in [[], 1, "session.update", None, True, [{"type": "response.create"}]]:
        frames.append(("not an object", json.dumps(value)))
    for value in [None, 5, ["session.update"], {"t": 1}, "", "x" * MIB, "Session.Update", "response.create "]:
        frames.append(("bad type", json.dumps({"type": value})))
    frames.append(("lone surrogate type", '{"type": "\\ud800"}'))
    frames.append(("no type", json.dumps({"event_id": "e", "session": {}})))
    for kind in [
        "session.create",
        "response.created",
        "input_audio_buffer.append.extra",
        "conversation.item",
        "x" * 300,
        "error",
        "transcription_session.update",
        "rate_limits.updated",
    ]:
        frames.append(("unknown type", json.dumps({"type": kind})))
    for kind, fields in SHAPES.items():
        for field in fields:
            others = {k: v for k, v in fields.items() if k != field}
            frames.append((f"{kind} missing {field}", json.dumps({"type": kind, **others})))
            for junk in JUNK:
                if (field == "session" and isinstance(junk, dict)) or (field == "audio" and isinstance(junk, str)):
                    continue  # an object is a session update and any "x..." string is base64: both valid
                if (
                    kind.startswith("conversation.item.")
                    and kind != "conversation.item.create"
                    and field == "item_id"
                    and isinstance(junk, str)
                ):
                    junk = junk or "nope"  # any string is a (missing) id: still an error
                frames.append((f"{kind}.{field}={str(junk)[:20]}", json.dumps({"type": kind, **others, field: junk})))
    for bad in ["!!!!", "abc", "a===", "QUJD\x00", "=" * 100, "YWJj" * 10 + "*", "\u00e9\u00e9\u00e9\u00e9"]:
        frames.append(("bad base64", json.dumps({"type": "input_audio_buffer.append", "audio": bad})))
    too_big = base64.b64encode(bytes(15 * MIB + 2)).decode()
    frames.append(("append over 15 MiB", json.dumps({"type": "input_audio_buffer.append", "audio": too_big})))
    del too_big
    for item in [
        {"type": "bogus"},
        {"type": "message"},
        {"type": "message", "role": "pirate", "content": []},
        {"type": "message", "role": "user", "content": "hi"},
        {"type": "message", "role": "user", "content": [{"type": "input_text"}]},
        {"type": "message", "role": "user", "content": [{"type": "input_audio", "audio": "!!"}]},
        {"type": "message", "role": "user", "content": [{"type": "input_image", "image_url": "http://x"}]},
        {"type": "message", "role": "user", "content": [{"type": "input_text", "text": 5}]},
        {"type": "function_call_output"},
        {"type": "function_call", "name": 5},
    ]:
        frames.append(("bad item", json.dumps({"type": "conversation.item.create", "item": item})))
    for session in [
        {"type": "bogus"},
        {"audio": {"input": {"turn_detection": {"type": "nope"}}}},
        {"audio": {"input": {"format": {"type": "audio/ogg"}}}},
        {"output_modalities": ["smell"]},
        {"max_output_tokens": -5},
        {"tools": "all"},
        {"type": "realtime", "tools": [nested(500)]},
    ]:
        frames.append(("bad session", json.dumps({"type": "session.update", "session": session})))
    for response in [
        5,
        "go",
        [],
        "",
        0,
        False,
        {"conversation": "bogus"},
        {"output_modalities": "text"},
        {"max_output_tokens": 0},
        {"input": 5},
        {"input": [{"type": "item_reference"}]},
    ]:
        frames.append(("bad response", json.dumps({"type": "response.create", "response": response})))
    frames.append(("cancel with none active", json.dumps({"type": "response.cancel"})))
    frames.append(("deeply nested junk", json.dumps({"type": "session.update", "session": nested(901)})))
    return frames


async def drive(port: int, frames: list[tuple[str, str]]) -> tuple[int, list[str], list[str], bool]:
    """Send every frame, wait for its error; returns (errors, labels without an error, other events, open)."""
    errors = 0
    missed: list[str] = []
    others: list[str] = []
    async with connect(f"ws://127.0.0.1:{port}/v1/realtime", max_size=None) as ws:
        await ws.recv()  # session.created
        await ws.recv()  # conversation.created
        for label, text in frames:
            await ws.send(text)
            try:
                while True:
                    event = json.loads(await asyncio.wait_for(ws.recv(), 5))
                    if event["type"] == "error":
                        errors += 1
                        break
                    others.append(f"{label}: {event['type']}")
            except TimeoutError:
                missed.append(label)
        await ws.send(json.dumps({"type": "session.update", "session": {"type": "realtime", "instructions": "ok"}}))
        still_open = json.loads(await asyncio.wait_for(ws.recv(), 5))["type"] == "session.updated"
    return errors, missed, others, still_open


def test_every_malformed_event_gets_one_error_and_the_session_stays_open() -> None:
    frames = corpus()
    with serve(FakeBackend(), GatewayConfig(max_frame_bytes=24 * MIB)) as port:
        errors, missed, others, still_open = asyncio.run(asyncio.wait_for(drive(port, frames), 300))
    kinds = {label.split(" ")[0].split(".")[0] for label, _ in frames}
    print(
        f"\nmalformed realtime events tried: {len(frames)} ({len(kinds)} families), error events: {errors}, "
        f"other events: {len(others)}, session closes: {0 if still_open else 1}"
    )
    assert len(frames) >= 150 and missed == [] and others == []
    assert errors == len(frames)
    assert still_open
