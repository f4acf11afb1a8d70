"""The demo page in headless Chromium over the scripted backend (no real models): API key, webcam, typed turns.

The page loads without a key and hands the key to the realtime handshake. Webcam frames reach the model as
images; on a model without image input the failed turn stops the camera and removes the frames from the
conversation, so the next turn is answered.
"""

from __future__ import annotations

import dataclasses

import pytest
from omni_gateway.gateway.config import GatewayConfig
from omni_gateway.omni.protocol import ImagePart, OmniRequest
from playwright.sync_api import Page

from tests.demos.chromium_page import connect, demo_page
from tests.harness.fake_backend import FakeBackend
from tests.harness.live_server import serve

pytestmark = pytest.mark.slow

REPLY = "A test pattern."


def images_in(request: OmniRequest) -> list[ImagePart]:
    return [part for message in request.messages for part in message.parts if isinstance(part, ImagePart)]


def ask(page: Page, text: str, responses_before: int) -> None:
    page.fill("#text", text)
    page.click("#send")
    page.wait_for_function(f"() => window.demo.responsesDone > {responses_before}", timeout=30_000)


def test_webcam_frames_reach_the_model_as_jpeg_images() -> None:
    backend = FakeBackend(REPLY)
    with serve(backend) as port, demo_page(port) as (page, problems):
        connect(page)
        page.check("#webcam")
        page.wait_for_function("() => window.demo.frameCount >= 4", timeout=30_000)
        assert page.evaluate("() => document.getElementById('camera').videoWidth") == 640
        ask(page, "What do you see?", 0)
        answers = page.evaluate("() => window.demo.answers")
        page.uncheck("#webcam")
        assert page.evaluate("() => document.getElementById('camera').hidden")

    assert not problems, problems
    assert answers == [REPLY]
    frames = images_in(backend.requests[-1])
    # The page keeps only the latest two frames in the conversation; each is a JPEG from the camera.
    assert len(frames) == 2 and all(frame.data.startswith(b"\xff\xd8\xff") for frame in frames)


def test_a_model_without_image_input_gets_its_frames_removed_and_answers_the_next_turn() -> None:
    backend = FakeBackend(REPLY)
    backend.capabilities = dataclasses.replace(backend.capabilities, input_modalities=frozenset({"text", "audio"}))
    with serve(backend) as port, demo_page(port) as (page, problems):
        connect(page)
        page.check("#webcam")
        page.wait_for_function("() => window.demo.frameCount >= 2", timeout=30_000)
        ask(page, "What do you see?", 0)
        page.wait_for_function("() => !document.getElementById('webcam').checked")
        log = page.evaluate("() => [...document.querySelectorAll('#log .msg.system')].map((m) => m.textContent)")
        ask(page, "Hello?", 1)
        answers = page.evaluate("() => window.demo.answers")
        first_turn = page.inner_text("#latency tbody tr:first-child")

    assert not problems, problems
    assert any(line.startswith("unsupported_modality:") for line in log), log
    assert any("webcam frames stopped and removed" in line for line in log), log
    assert first_turn.split("\t")[-1] == "failed"
    assert answers == [REPLY]
    assert len(backend.requests) == 1 and not images_in(backend.requests[0])


@pytest.mark.parametrize("transport", ["webrtc", "websocket"])
def test_page_loads_without_a_key_and_connects_with_the_one_typed_in(transport: str) -> None:
    config = GatewayConfig(api_key="sk-page")
    with serve(FakeBackend(REPLY), config) as port, demo_page(port, transport=transport) as (page, problems):
        page.click("#connect")  # no key typed: refused (minting the client secret, or the handshake)
        page.wait_for_selector("#status.error")
        refused = page.inner_text("#status")
        page.fill("#api-key", "sk-page")
        connect(page)
        ask(page, "Hello?", 0)
        answers = page.evaluate("() => window.demo.answers")

    assert "check the API key" in refused, refused
    assert answers == [REPLY]
    # The refusal is the only thing that went wrong.
    if transport == "websocket":
        assert len(problems) == 1 and "WebSocket connection" in problems[0], problems
    else:  # the 401 of the client secret's mint, as the network and the console report it
        assert problems and all("/v1/realtime/client_secrets" in problem for problem in problems), problems
