"""The voice series of /metrics after a realtime voice turn over a live server."""

from __future__ import annotations

import asyncio
import base64
import json

import httpx
from prometheus_client.parser import text_string_to_metric_families
from websockets.asyncio.client import connect

from tests.harness.fake_backend import FakeBackend, silence, tone
from tests.harness.live_server import recv, serve, until

TIMEOUT = 15
# Observed once per turn or per spoken response.
ONCE = (
    ("omni_realtime_turn_decision_seconds_count", {"turn_detection": "server_vad"}),
    ("omni_realtime_speech_end_to_first_audio_seconds_count", {}),
    ("omni_realtime_stream_rtf_count", {}),
    ("omni_realtime_audio_gap_seconds_count", {}),
)


def scrape(port: int) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """Every sample of /metrics, by name and labels."""
    text = httpx.get(f"http://127.0.0.1:{port}/metrics").text
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def value(samples: dict[tuple[str, tuple[tuple[str, str], ...]], float], name: str, labels: dict[str, str]) -> float:
    return samples.get((name, tuple(sorted(labels.items()))), 0.0)


async def voice_turn(port: int) -> list[dict[str, object]]:
    """A server_vad turn: speech, then the silence that ends it; every event up to the reply's response.done."""
    async with connect(f"ws://127.0.0.1:{port}/v1/realtime") as ws:
        await recv(ws)  # session.created
        turn_detection = {"type": "server_vad", "silence_duration_ms": 200}
        update = {"type": "realtime", "audio": {"input": {"turn_detection": turn_detection}}}
        await ws.send(json.dumps({"type": "session.update", "session": update}))
        await until(ws, "session.updated")
        audio = base64.b64encode(tone(400) + silence(400)).decode()
        await ws.send(json.dumps({"type": "input_audio_buffer.append", "audio": audio}))
        return await until(ws, "response.done")


def test_a_voice_turn_feeds_the_voice_series() -> None:
    with serve(FakeBackend()) as port:
        before = scrape(port)
        seen = asyncio.run(asyncio.wait_for(voice_turn(port), TIMEOUT))
        after = scrape(port)
    assert "response.output_audio.delta" in [e["type"] for e in seen]
    for name, labels in ONCE:
        assert value(after, name, labels) == value(before, name, labels) + 1, name
    # exported; how often a reply streamed as fast as the fake's runs dry is not for this test to say
    assert ("omni_realtime_audio_underruns_total", ()) in after
    # the detector waited out the 200 ms of silence it was asked for
    decided = value(after, "omni_realtime_turn_decision_seconds_sum", {"turn_detection": "server_vad"}) - value(
        before, "omni_realtime_turn_decision_seconds_sum", {"turn_detection": "server_vad"}
    )
    assert abs(decided - 0.2) < 0.011
