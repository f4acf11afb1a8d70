"""Images over a live /v1/realtime socket: a webcam-style frame stream in, a generated image out."""

from __future__ import annotations

import asyncio
import base64
import io
import json
from typing import Any

from omni_gateway.omni.protocol import ImagePart
from PIL import Image
from websockets.asyncio.client import connect

from tests.harness.fake_backend import FakeBackend, png
from tests.harness.live_server import serve, until

TIMEOUT = 15


def image_item(data: bytes, text: str | None = None) -> str:
    content: list[dict[str, Any]] = [{"type": "input_text", "text": text}] if text else []
    content.append({"type": "input_image", "image_url": "data:image/png;base64," + base64.b64encode(data).decode()})
    return json.dumps(
        {"type": "conversation.item.create", "item": {"type": "message", "role": "user", "content": content}}
    )


def test_frames_in_and_a_generated_image_out_over_a_socket() -> None:
    backend = FakeBackend(image_out=True)
    frames = [png(shade=k) for k in range(4)]

    async def session(port: int) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
        async with connect(f"ws://127.0.0.1:{port}/v1/realtime?model=omni-test") as ws:
            await until(ws, "conversation.created")
            await ws.send(image_item(png(shade=200), text="this is my desk"))
            echoed = (await until(ws, "conversation.item.done"))[-1]["item"]["content"][1]
            assert base64.b64decode(echoed["image_url"].split(",", 1)[1]) == png(shade=200)
            for frame in frames:  # one lone frame a second, as pipecat's live video does
                await ws.send(image_item(frame))
                await until(ws, "conversation.item.done")
            await ws.send(
                json.dumps(
                    {
                        "type": "conversation.item.create",
                        "item": {
                            "type": "message",
                            "role": "user",
                            "content": [{"type": "input_image", "image_url": "https://example.com/x.png"}],
                        },
                    }
                )
            )
            refused = (await until(ws, "error"))[-1]["error"]
            assert (refused["code"], refused["param"]) == ("invalid_value", "item.content[0].image_url")
            await ws.send(json.dumps({"type": "response.create", "response": {"output_modalities": ["text"]}}))
            text_turn = await until(ws, "response.done")
            await ws.send(
                json.dumps(
                    {
                        "type": "response.create",
                        "response": {"output_modalities": ["image"], "image": {"size": "64x64", "partial_images": 2}},
                    }
                )
            )
            return text_turn, await until(ws, "response.done")

    async def main() -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
        with serve(backend) as port:
            return await asyncio.wait_for(session(port), TIMEOUT)

    text_turn, image_turn = asyncio.run(main())
    assert text_turn[-1]["response"]["status"] == "completed"
    sent = [p.data for m in backend.requests[0].messages for p in m.parts if isinstance(p, ImagePart)]
    assert sent == [png(shade=200), frames[2], frames[3]]
    kinds = [e["type"] for e in image_turn]
    assert kinds.count("response.image_generation_call.partial_image") == 2
    final = next(e for e in image_turn if e["type"] == "response.output_item.done")["item"]
    assert final["type"] == "image_generation_call" and final["status"] == "completed"
    assert Image.open(io.BytesIO(base64.b64decode(final["result"]))).size == (64, 64)
    assert image_turn[-1]["response"]["status"] == "completed"


def test_a_model_without_vision_answers_an_image_turn_with_an_error_not_a_crash() -> None:
    backend = FakeBackend(vision=False)

    async def session(port: int) -> list[dict[str, Any]]:
        async with connect(f"ws://127.0.0.1:{port}/v1/realtime?model=omni-test") as ws:
            await until(ws, "conversation.created")
            await ws.send(image_item(png(), text="what is this?"))
            await until(ws, "conversation.item.done")
            await ws.send(json.dumps({"type": "response.create"}))
            turn = await until(ws, "response.done")
            await ws.send(json.dumps({"type": "conversation.item.delete", "item_id": turn[0]["response"]["id"]}))
            return turn + await until(ws, "error")  # the socket still serves the session

    async def main() -> list[dict[str, Any]]:
        with serve(backend) as port:
            return await asyncio.wait_for(session(port), TIMEOUT)

    turn = asyncio.run(main())
    errors = [e["error"] for e in turn if e["type"] == "error"]
    assert errors[0]["code"] == "unsupported_modality"
    done = next(e for e in turn if e["type"] == "response.done")["response"]
    assert done["status"] == "failed" and done["status_details"]["error"]["code"] == "unsupported_modality"
    assert errors[1]["code"] == "item_delete_invalid_item_id"
