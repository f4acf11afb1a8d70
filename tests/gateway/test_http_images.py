"""/v1/images/generations through the official openai SDK against a live server and the fake backend."""

from __future__ import annotations

import base64

import openai
import pytest
from omni_gateway.omni.protocol import Capabilities

from tests.harness.fake_backend import FakeBackend, overloaded, png
from tests.harness.live_server import served

IMAGE_CAPS = Capabilities(
    model="omni-test", input_modalities=frozenset({"text"}), output_modalities=frozenset({"text", "image"})
)


@pytest.fixture(scope="module")
def live():
    backend = FakeBackend(capabilities=IMAGE_CAPS)
    with served(backend) as (url, client):
        yield backend, url, client


@pytest.fixture
def fake(live):
    live[0].reset()
    live[0].capabilities = IMAGE_CAPS
    return live


def test_without_an_image_model_the_route_says_so():
    with served(FakeBackend()) as (_, client):
        with pytest.raises(openai.BadRequestError) as info:
            client.images.generate(prompt="a red square")
        assert "no image model configured" in info.value.message


def test_generation_returns_base64_pngs(fake):
    backend, _, client = fake
    r = client.images.generate(prompt="a red square", n=2, size="512x256", extra_body={"seed": 11})
    assert [base64.b64decode(d.b64_json) for d in r.data] == [png(512, 256)] * 2
    sent = backend.requests[-1]
    assert sent.modalities == ("image",) and sent.messages[0].text == "a red square"
    assert sent.image.size == (512, 256) and sent.image.n == 2 and sent.image.seed == 11


def test_streaming_sends_partial_images_then_the_completed_one(fake):
    backend, _, client = fake
    events = list(client.images.generate(prompt="a red square", stream=True, partial_images=1))
    assert [e.type for e in events] == ["image_generation.partial_image", "image_generation.completed"]
    final = png(*backend.requests[-1].image.size)
    assert events[0].partial_image_index == 0 and base64.b64decode(events[1].b64_json) == final
    assert (
        events[1].usage.input_tokens == backend.count_tokens(backend.requests[-1].messages)
        and backend.requests[-1].image.preview_every == 1
    )


def test_overload_is_reported_with_its_status(fake):
    backend, _, client = fake
    backend.script = overloaded(429)
    with pytest.raises(openai.RateLimitError):
        client.images.generate(prompt="a red square")
