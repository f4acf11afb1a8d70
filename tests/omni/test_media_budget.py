"""Decoded-pixel budgets with a vision model loaded (a tiny random LLaVA): per request, media that
declare too many pixels are refused before decoding; per server, requests wait for room or fail
cleanly, and every reservation comes back, on success, decode errors and cancellation alike."""

from __future__ import annotations

import asyncio
import base64
import json
import struct
import zlib
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from omni_gateway.encoders.budget import PixelBudget
from omni_gateway.omni import vision
from omni_gateway.omni.pipeline import OmniPipeline
from omni_gateway.omni.protocol import Done, Error, ImagePart, Message, OmniRequest, SamplingOptions, TextPart
from PIL import Image
from websockets.asyncio.client import connect

from tests.harness.checkpoints import picture, png_bytes, save_tiny_llava
from tests.harness.live_server import serve, until
from tests.harness.real_engine import checkpoint_config

SIDE = 64  # test pictures are SIDE x SIDE
PIXELS = SIDE * SIDE


def declared_png(width: int, height: int) -> bytes:
    """A tiny PNG whose header declares ``width`` x ``height``: sized from the header, corrupt to decode."""
    data = bytearray(png_bytes(Image.new("L", (1, 1))))
    ihdr = data.index(b"IHDR")
    data[ihdr + 4 : ihdr + 12] = struct.pack(">II", width, height)
    data[ihdr + 17 : ihdr + 21] = struct.pack(">I", zlib.crc32(bytes(data[ihdr : ihdr + 17])) & 0xFFFFFFFF)
    return bytes(data)


@pytest.fixture(scope="module")
def loaded(tmp_path_factory: pytest.TempPathFactory) -> Iterator[OmniPipeline]:
    directory = tmp_path_factory.mktemp("llava")
    save_tiny_llava(directory)
    config = checkpoint_config(directory, max_tokens=4, warm_up=True)
    pipe = OmniPipeline.load(config)
    yield pipe
    pipe.shutdown()


@pytest.fixture
def pipeline(loaded: OmniPipeline) -> Iterator[OmniPipeline]:
    """The loaded pipeline with the server budget as shipped; each test may swap it and must leave it empty."""
    loaded.media_budget = PixelBudget(256_000_000, 10.0)
    yield loaded
    assert (loaded.media_budget.in_use, loaded.media_budget.waiting) == (0, 0)


@pytest.fixture
def seen_in_use(pipeline: OmniPipeline, monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Pixels the budget held each time the vision tower ran."""
    seen: list[int] = []
    encode = pipeline.vision.encode_image

    def watched(image: Image.Image) -> Any:
        seen.append(pipeline.media_budget.in_use)
        return encode(image)

    monkeypatch.setattr(pipeline.vision, "encode_image", watched)
    return seen


def request(rid: str, *images: bytes) -> OmniRequest:
    parts = (TextPart("describe"),) + tuple(ImagePart(data, "image/png") for data in images)
    return OmniRequest(rid, (Message("user", parts),), sampling=SamplingOptions(max_tokens=4, temperature=0.0))


async def answer(pipeline: OmniPipeline, req: OmniRequest) -> list[Any]:
    return [chunk async for chunk in pipeline.generate(req)]


def test_many_large_images_in_one_request_are_refused_before_any_is_decoded(
    pipeline: OmniPipeline, monkeypatch: pytest.MonkeyPatch
) -> None:
    decoded: list[object] = []
    monkeypatch.setattr(vision, "decode_image", lambda *args: decoded.append(args))
    # Sixteen 4.9-KB-class files declaring 9 Mpx each: 144 Mpx, over the 128-Mpx request limit.
    chunks = asyncio.run(answer(pipeline, request("many", *[declared_png(3000, 3000)] * 16)))
    assert len(chunks) == 1 and isinstance(chunks[0], Error)
    assert (chunks[0].status, chunks[0].code) == (413, "media_too_large")
    assert "declare 144000000 pixels; the limit is 128000000 per request" in chunks[0].message
    assert decoded == []


def test_each_image_holds_its_pixels_while_encoded_and_returns_them(
    pipeline: OmniPipeline, seen_in_use: list[int]
) -> None:
    images = [png_bytes(picture(k, (SIDE, SIDE))) for k in range(3)]
    chunks = asyncio.run(answer(pipeline, request("three", *images)))
    assert [c for c in chunks if isinstance(c, Done)], chunks
    assert seen_in_use == [PIXELS] * 3  # one image at a time, never the whole request at once


def test_a_decode_error_after_the_header_returns_its_reservation(
    pipeline: OmniPipeline, seen_in_use: list[int]
) -> None:
    chunks = asyncio.run(
        answer(pipeline, request("lying", png_bytes(picture(5, (SIDE, SIDE))), declared_png(2000, 2000)))
    )
    assert isinstance(chunks[0], Error) and (chunks[0].status, chunks[0].code) == (400, "invalid_request")
    assert "truncated or corrupt" in chunks[0].message
    assert seen_in_use == [PIXELS]  # the first image was encoded; the second failed while it held its 4 Mpx


def test_concurrent_requests_over_the_server_budget_wait_their_turn(
    pipeline: OmniPipeline, seen_in_use: list[int]
) -> None:
    budget = pipeline.media_budget = PixelBudget(PIXELS + PIXELS // 2, wait_s=60)  # room for one image at a time

    async def main() -> list[list[Any]]:
        busy = await budget.reserve(budget.capacity)  # another request is decoding
        tasks = [
            asyncio.create_task(answer(pipeline, request(f"c{k}", png_bytes(picture(10 + k, (SIDE, SIDE))))))
            for k in range(4)
        ]
        while budget.waiting < 4:
            await asyncio.sleep(0.01)
        assert not any(task.done() for task in tasks)
        busy.release()
        return await asyncio.gather(*tasks)

    results = asyncio.run(main())
    assert all(any(isinstance(c, Done) for c in chunks) for chunks in results), results
    assert seen_in_use == [PIXELS] * 4  # served one by one, never over the capacity


def test_a_full_server_budget_fails_cleanly_after_the_wait_and_serves_again(pipeline: OmniPipeline) -> None:
    budget = pipeline.media_budget = PixelBudget(10 * PIXELS, wait_s=0.05)

    async def main() -> tuple[list[Any], list[Any]]:
        with await budget.reserve(budget.capacity):
            refused = await answer(pipeline, request("busy", png_bytes(picture(20, (SIDE, SIDE)))))
        return refused, await answer(pipeline, request("later", png_bytes(picture(20, (SIDE, SIDE)))))

    refused, later = asyncio.run(main())
    assert len(refused) == 1 and (refused[0].status, refused[0].code) == (429, "rate_limit_exceeded")
    assert "try again shortly" in refused[0].message
    assert [c for c in later if isinstance(c, Done)]


def test_an_image_larger_than_the_whole_server_budget_is_refused_not_queued(pipeline: OmniPipeline) -> None:
    pipeline.media_budget = PixelBudget(PIXELS - 1, wait_s=60)
    chunks = asyncio.run(answer(pipeline, request("huge", png_bytes(picture(21, (SIDE, SIDE))))))
    assert (chunks[0].status, chunks[0].code) == (413, "media_too_large")


def test_a_request_abandoned_while_waiting_holds_nothing(pipeline: OmniPipeline) -> None:
    budget = pipeline.media_budget = PixelBudget(PIXELS, wait_s=60)

    async def main() -> None:
        with await budget.reserve(budget.capacity):
            task = asyncio.create_task(answer(pipeline, request("gone", png_bytes(picture(22, (SIDE, SIDE))))))
            while budget.waiting < 1:
                await asyncio.sleep(0.01)
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
            assert (budget.in_use, budget.waiting) == (PIXELS, 0)

    asyncio.run(main())


# ---- over the wire -------------------------------------------------------------------------------


def data_uri(data: bytes) -> str:
    return "data:image/png;base64," + base64.b64encode(data).decode()


def test_http_refuses_too_many_pixels_with_openai_error_shape(pipeline: OmniPipeline) -> None:
    content = [{"type": "text", "text": "describe"}] + [
        {"type": "image_url", "image_url": {"url": data_uri(declared_png(3000, 3000))}}
    ] * 16
    with serve(pipeline) as port:
        reply = httpx.post(
            f"http://127.0.0.1:{port}/v1/chat/completions",
            timeout=30,
            json={"model": pipeline.capabilities.model, "messages": [{"role": "user", "content": content}]},
        )
        ok = httpx.post(
            f"http://127.0.0.1:{port}/v1/chat/completions",
            timeout=30,
            json={
                "model": pipeline.capabilities.model,
                "max_tokens": 2,
                "messages": [
                    {
                        "role": "user",
                        "content": [
                            {"type": "image_url", "image_url": {"url": data_uri(png_bytes(picture(30, (SIDE, SIDE))))}}
                        ],
                    }
                ],
            },
        )
    assert reply.status_code == 413, reply.text
    error = reply.json()["error"]
    assert (error["type"], error["code"]) == ("invalid_request_error", "media_too_large")
    assert ok.status_code == 200, ok.text


def test_realtime_turn_over_a_full_budget_is_an_error_event_and_the_session_goes_on(pipeline: OmniPipeline) -> None:
    budget = pipeline.media_budget = PixelBudget(PIXELS, wait_s=0.05)
    item = json.dumps(
        {
            "type": "conversation.item.create",
            "item": {
                "type": "message",
                "role": "user",
                "content": [
                    {"type": "input_text", "text": "what is it?"},
                    {"type": "input_image", "image_url": data_uri(png_bytes(picture(31, (SIDE, SIDE))))},
                ],
            },
        }
    )
    create = json.dumps({"type": "response.create", "response": {"output_modalities": ["text"]}})

    async def session(port: int) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
        async with connect(f"ws://127.0.0.1:{port}/v1/realtime") as ws:
            await until(ws, "session.created")
            await ws.send(item)
            await until(ws, "conversation.item.done")
            with await budget.reserve(budget.capacity):
                await ws.send(create)
                refused = await until(ws, "response.done")
            await ws.send(create)
            return refused, await until(ws, "response.done")

    async def main() -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
        with serve(pipeline) as port:
            return await asyncio.wait_for(session(port), 60)

    refused, served = asyncio.run(main())
    errors = [e["error"] for e in refused if e["type"] == "error"]
    assert [e["code"] for e in errors] == ["rate_limit_exceeded"]
    assert refused[-1]["response"]["status"] == "failed"
    assert not [e for e in served if e["type"] == "error"]
    assert served[-1]["response"]["status"] in ("completed", "incomplete")  # incomplete: the 4-token cap
