"""Hostile media through the live HTTP and realtime paths into the real decoders: every file refused with a
4xx or a failed response and a sanitised message, the server unharmed, memory bounded."""

from __future__ import annotations

import asyncio
import base64
import io
import json
import re
import struct
import time
import tracemalloc
import zlib
from collections.abc import AsyncIterator
from pathlib import Path

import httpx
from omni_gateway.encoders.audio import AudioDecodeError, decode_audio
from omni_gateway.encoders.image import ImageDecodeError, decode_image
from omni_gateway.gateway.config import GatewayConfig
from omni_gateway.omni.protocol import (
    AudioPart,
    Done,
    Error,
    ImagePart,
    OmniRequest,
    OutputChunk,
    TextDelta,
    Usage,
)
from PIL import Image
from websockets.asyncio.client import connect

from tests.harness.fake_backend import FakeBackend
from tests.harness.live_server import serve

# A memory address as Python prints it in a repr ("at 0x7f3a..."); random event/item ids, whose letters and
# digits may happen to spell "0x", are not addresses.
ADDRESS = re.compile(r"(?<![A-Za-z0-9_])0x[0-9a-f]{6,}")

MIB = 1024 * 1024


class DecodingBackend(FakeBackend):
    """The fake model side, but every image and encoded audio part goes through the real decoders first."""

    def generate(self, request: OmniRequest) -> AsyncIterator[OutputChunk]:
        self.requests.append(request)
        return self._decode_then_answer(request)

    async def _decode_then_answer(self, request: OmniRequest) -> AsyncIterator[OutputChunk]:
        try:
            for message in request.messages:
                for part in message.parts:
                    if isinstance(part, ImagePart):
                        decode_image(part.data)
                    elif isinstance(part, AudioPart) and part.encoded:
                        decode_audio(part.encoded)
        except (ImageDecodeError, AudioDecodeError) as exc:
            yield Error("invalid_media", str(exc), status=400)
            yield Done("error")
            return
        yield TextDelta("seen")
        yield Done("stop")
        yield Usage(input_tokens=1, output_tokens=1)


def png_chunk(kind: bytes, data: bytes) -> bytes:
    return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data) & 0xFFFFFFFF)


def png_declaring(width: int, height: int, idat: bytes = b"") -> bytes:
    ihdr = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    return (
        b"\x89PNG\r\n\x1a\n"
        + png_chunk(b"IHDR", ihdr)
        + (png_chunk(b"IDAT", idat) if idat else b"")
        + png_chunk(b"IEND", b"")
    )


def encoded(image: Image.Image, fmt: str) -> bytes:
    out = io.BytesIO()
    image.save(out, format=fmt)
    return out.getvalue()


def wav_declaring(rate: int, channels: int, data_bytes: int, payload: bytes = b"") -> bytes:
    byte_rate = (rate * max(channels, 1) * 2) & 0xFFFFFFFF
    fmt = struct.pack("<HHIIHH", 1, channels, rate, byte_rate, max(channels, 1) * 2, 16)
    return (
        b"RIFF"
        + struct.pack("<I", 36 + data_bytes)
        + b"WAVE"
        + b"fmt "
        + struct.pack("<I", 16)
        + fmt
        + b"data"
        + struct.pack("<I", data_bytes)
        + payload
    )


def image_corpus() -> list[tuple[str, bytes]]:
    good_png = encoded(Image.new("RGB", (64, 64), (200, 10, 10)), "PNG")
    good_jpeg = encoded(Image.new("RGB", (64, 64), (10, 200, 10)), "JPEG")
    # 12000 x 12000 of zeros: a 144-Mpixel bomb that compresses to a few hundred kB
    row = b"\x00" + bytes(12000 * 3)
    bomb = png_declaring(12000, 12000, zlib.compress(row * 12000, 9))
    gif_bomb = (
        b"GIF89a"
        + struct.pack("<HH", 65535, 65535)
        + b"\x00\x00\x00"
        + b",\x00\x00\x00\x00"
        + struct.pack("<HH", 65535, 65535)
        + b"\x00\x02\x02D\x01\x00;"
    )
    return [
        ("png bomb 12000x12000", bomb),
        ("png header 65535x65535", png_declaring(65535, 65535)),
        ("png header 1x2^31", png_declaring(1, 2**31 - 1)),
        ("png header 0x0", png_declaring(0, 0)),
        ("gif screen 65535x65535", gif_bomb),
        ("png truncated", good_png[: len(good_png) // 2]),
        ("jpeg truncated", good_jpeg[:200]),
        ("jpeg header only", good_jpeg[:20]),
        ("png signature only", b"\x89PNG\r\n\x1a\n"),
        ("png bad crc", good_png[:30] + bytes([good_png[30] ^ 0xFF]) + good_png[31:]),
        ("random bytes", bytes(range(256)) * 64),
        ("zip polyglot", b"PK\x03\x04" + bytes(200)),
        ("pdf", b"%PDF-1.4\n1 0 obj<<>>endobj\ntrailer<<>>\n%%EOF"),
        ("svg", b"<svg xmlns='http://www.w3.org/2000/svg' width='99999' height='99999'/>"),
        (
            "bmp header 2^30 wide",
            b"BM"
            + struct.pack("<IHHI", 54, 0, 0, 54)
            + struct.pack("<IiiHHIIiiII", 40, 2**30, 2**30, 1, 24, 0, 0, 0, 0, 0, 0),
        ),
    ]


def audio_corpus() -> list[tuple[str, bytes]]:
    return [
        ("wav declaring 6 h", wav_declaring(48000, 2, 48000 * 2 * 2 * 3600 * 6, bytes(4800))),
        ("wav 0 channels", wav_declaring(16000, 0, 3200, bytes(3200))),
        ("wav rate 2^31", wav_declaring(2**31 - 1, 1, 3200, bytes(3200))),
        ("wav truncated header", wav_declaring(16000, 1, 3200)[:30]),
        ("mp3 garbage", b"ID3\x04\x00\x00\x00\x00\x00\x00" + bytes(range(256)) * 40),
        ("riff not wave", b"RIFF\x00\x00\x00\x00AVI LIST" + bytes(100)),
    ]


def rss_mib() -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError("no VmRSS in /proc/self/status")


def data_uri(data: bytes, mime: str = "image/png") -> str:
    return f"data:{mime};base64,{base64.b64encode(data).decode()}"


def test_hostile_media_is_refused_on_every_path_without_harm() -> None:
    images, audio = image_corpus(), audio_corpus()
    backend = DecodingBackend()
    results: list[tuple[str, str, int | str]] = []
    leaks: list[str] = []
    worst_s = 0.0
    rss_before = rss_mib()
    tracemalloc.start()
    with serve(backend, GatewayConfig()) as port:
        base = f"http://127.0.0.1:{port}"
        with httpx.Client(base_url=base, timeout=60) as http:

            def post(label: str, content: list[dict]) -> None:
                nonlocal worst_s
                t0 = time.perf_counter()
                r = http.post(
                    "/v1/chat/completions",
                    json={
                        "model": "omni-test",
                        "messages": [
                            {"role": "user", "content": [{"type": "text", "text": "what is this?"}, *content]}
                        ],
                    },
                )
                worst_s = max(worst_s, time.perf_counter() - t0)
                results.append(("http", label, r.status_code))
                if ADDRESS.search(r.text) or "BytesIO" in r.text or "Traceback" in r.text:
                    leaks.append(label)

            for label, data in images:
                post(label, [{"type": "image_url", "image_url": {"url": data_uri(data)}}])
            for label, data in audio:
                fmt = "wav" if data.startswith(b"RIFF") else "mp3"
                post(
                    label,
                    [{"type": "input_audio", "input_audio": {"data": base64.b64encode(data).decode(), "format": fmt}}],
                )
            for label, data in audio:
                t0 = time.perf_counter()
                r = http.post(
                    "/v1/audio/transcriptions",
                    data={"model": "whisper-1"},
                    files={"file": ("a.wav", data, "audio/wav")},
                )
                worst_s = max(worst_s, time.perf_counter() - t0)
                results.append(("transcriptions", label, r.status_code))

        async def realtime() -> None:
            async with connect(f"ws://127.0.0.1:{port}/v1/realtime", max_size=None) as ws:
                await ws.recv()
                await ws.recv()
                for label, data in images:
                    await ws.send(
                        json.dumps(
                            {
                                "type": "conversation.item.create",
                                "item": {
                                    "type": "message",
                                    "role": "user",
                                    "content": [{"type": "input_image", "image_url": data_uri(data)}],
                                },
                            }
                        )
                    )
                    await ws.send(json.dumps({"type": "response.create", "response": {"output_modalities": ["text"]}}))
                    outcome: int | str = "no answer"
                    while True:
                        event = json.loads(await asyncio.wait_for(ws.recv(), 30))
                        if ADDRESS.search(json.dumps(event)) and event["type"] in ("error", "response.done"):
                            leaks.append(label)
                        if event["type"] == "error" and outcome == "no answer":
                            outcome = "error"
                        if event["type"] == "response.done":
                            outcome = event["response"]["status"] if outcome == "no answer" else outcome
                            break
                        if event["type"] == "error" and event["error"].get("param"):
                            break  # refused at item.create: the response over the rest still runs
                    results.append(("realtime", label, outcome))
                await ws.send(json.dumps({"type": "session.update", "session": {"type": "realtime"}}))
                while json.loads(await ws.recv())["type"] != "session.updated":
                    pass

        asyncio.run(asyncio.wait_for(realtime(), 300))
        assert httpx.get(f"{base}/health").status_code == 200
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    rss_delta = rss_mib() - rss_before
    accepted = [r for r in results if r[2] in (200, "completed")]
    print(
        f"\nhostile media: {len(images)} images + {len(audio)} audio files, {len(results)} deliveries over "
        f"HTTP chat, transcriptions and realtime; accepted {len(accepted)}, crashes 0, leaked addresses "
        f"{len(leaks)}; slowest {worst_s * 1000:.0f} ms, traced peak {peak / MIB:.0f} MiB, "
        f"RSS delta {rss_delta:.0f} MiB"
    )
    assert accepted == [], accepted
    assert all(r[2] in (400, 413, 415, 422, "failed", "error") for r in results), results
    assert leaks == []
    assert peak < 256 * MIB and rss_delta < 512
