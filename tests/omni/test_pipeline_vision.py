"""The pipeline serves a vision-language checkpoint: image parts reach the engine as embedding spans."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from omni_gateway.engine.sampling_params import SamplingParams
from omni_gateway.omni.pipeline import OmniPipeline
from omni_gateway.omni.protocol import (
    Done,
    Error,
    ImagePart,
    Message,
    OmniRequest,
    SamplingOptions,
    TextDelta,
    TextPart,
    Usage,
)
from omni_gateway.omni.vision import build_vision_prompt

from tests.harness.checkpoints import picture, png_bytes, save_tiny_llava
from tests.harness.real_engine import checkpoint_config


@pytest.fixture(scope="module")
def pipeline(tmp_path_factory: pytest.TempPathFactory) -> Any:
    directory = tmp_path_factory.mktemp("llava")
    save_tiny_llava(directory)
    config = checkpoint_config(directory, max_tokens=6, warm_up=True)
    pipe = OmniPipeline.load(config)
    yield pipe
    pipe.shutdown()


def _ask(pipeline: OmniPipeline, image: bytes, rid: str) -> list[Any]:
    request = OmniRequest(
        rid,
        (Message("user", (TextPart("describe"), ImagePart(image, "image/png"))),),
        sampling=SamplingOptions(max_tokens=6, temperature=0.0),
    )

    async def run() -> list[Any]:
        return [c async for c in pipeline.generate(request)]

    return asyncio.run(run())


def test_vision_checkpoint_advertises_image_input(pipeline: OmniPipeline) -> None:
    assert {"image", "video"} <= pipeline.capabilities.input_modalities


def test_image_turn_matches_the_engine_driven_directly(pipeline: OmniPipeline) -> None:
    image = png_bytes(picture(3))
    chunks = _ask(pipeline, image, "v1")
    assert not [c for c in chunks if isinstance(c, Error)], chunks
    text = "".join(c.text for c in chunks if isinstance(c, TextDelta))
    usage = [c for c in chunks if isinstance(c, Usage)][0]
    assert [c for c in chunks if isinstance(c, Done)] and usage.input_image_tokens > 0

    # The same prompt through omni.vision and the engine, without the pipeline in between.
    request = OmniRequest("direct", (Message("user", (TextPart("describe"), ImagePart(image, "image/png"))),))
    built = build_vision_prompt(request, pipeline.engine.tokenizer, pipeline.vision)
    assert usage.input_tokens == len(built.token_ids)

    async def direct() -> str:
        out = ""
        async for delta in pipeline.engine.generate(
            built.token_ids,
            SamplingParams(temperature=0.0, max_tokens=6),
            request_id="direct",
            embed_spans=built.embed_spans,
        ):
            out += delta.text
        return out

    assert asyncio.run(direct()) == text


def test_undecodable_image_is_a_client_error_and_the_pipeline_keeps_serving(pipeline: OmniPipeline) -> None:
    chunks = _ask(pipeline, b"\x89PNG\r\n\x1a\n-truncated", "bad")
    assert isinstance(chunks[0], Error) and chunks[0].status == 400 and chunks[0].code == "invalid_request"
    good = _ask(pipeline, png_bytes(picture(4)), "after")
    assert [c for c in good if isinstance(c, Done)]
