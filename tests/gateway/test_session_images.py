"""Images in the Realtime session: input_image parts (checks, echo, webcam frame window, models without
vision) and image output (the image_generation_call extension items and partial_image events)."""

from __future__ import annotations

import base64
import io
from typing import Any

import pytest
from omni_gateway.gateway.realtime.commands import SessionLimits
from omni_gateway.gateway.realtime.session import RealtimeSession
from omni_gateway.omni.protocol import Done, Error, ImageFinal, ImagePart, ImagePartial, TextDelta
from PIL import Image

from tests.harness.fake_backend import FakeBackend, png
from tests.harness.session_driver import Driver, b64, error, events, generations, only, started, types


def encoded(fmt: str) -> bytes:
    out = io.BytesIO()
    Image.new("RGB", (4, 4), (10, 20, 30)).save(out, format=fmt)
    return out.getvalue()


def uri(data: bytes, mime: str = "image/png") -> str:
    return f"data:{mime};base64,{b64(data)}"


def image_item(*urls: str, text: str | None = None, detail: str | None = None) -> dict[str, Any]:
    content: list[dict[str, Any]] = [{"type": "input_text", "text": text}] if text is not None else []
    content += [{"type": "input_image", "image_url": u, **({"detail": detail} if detail else {})} for u in urls]
    return {"type": "conversation.item.create", "item": {"type": "message", "role": "user", "content": content}}


def request_images(d: Driver, rid: str) -> list[ImagePart]:
    request = d.session.build_request(rid)
    assert request is not None
    return [p for m in request.messages for p in m.parts if isinstance(p, ImagePart)]


def limited(limits: SessionLimits) -> Driver:
    d = Driver(vad=False)
    d.session = RealtimeSession(
        dialect="ga",
        capabilities=d.backend.capabilities,  # type: ignore[arg-type]
        vad_factory=None,
        limits=limits,
    )
    d.session.open()
    return d


# ---- image input --------------------------------------------------------------------------------
@pytest.mark.parametrize(("fmt", "mime"), [("PNG", "image/png"), ("JPEG", "image/jpeg"), ("WEBP", "image/webp")])
def test_data_uri_images_are_echoed_and_reach_the_model_as_image_parts(fmt: str, mime: str) -> None:
    d = Driver()
    data = encoded(fmt)
    out = d.send(image_item(uri(data, mime), text="what is this?", detail="low"))
    assert types(out) == ["conversation.item.added", "conversation.item.done"]
    content = only(out, "conversation.item.done")["item"]["content"]
    assert content == [
        {"type": "input_text", "text": "what is this?"},
        {"type": "input_image", "image_url": uri(data, mime), "detail": "low"},
    ]
    rid = started(d.send({"type": "response.create"}))
    assert request_images(d, rid) == [ImagePart(data=data, mime=mime, detail="low")]


@pytest.mark.parametrize(
    ("url", "why"),
    [
        ("https://example.com/cat.png", "http(s) URLs are not fetched"),
        ("http://169.254.169.254/latest", "http(s) URLs are not fetched"),
        (uri(b"GIF89a....", "image/gif"), "data:image/png|jpeg|webp"),
        ("data:image/png;base64,@@@@", "valid base64"),
        (uri(b"plain text, not an image"), "PNG, JPEG or WebP image data"),
        ("data:image/png;base64,", "a non-empty image"),
    ],
)
def test_bad_image_urls_are_refused_naming_the_param_and_the_session_goes_on(url: str, why: str) -> None:
    d = Driver()
    out = d.send({**image_item(url, text="look"), "event_id": "evt_1"})
    err = error(out)
    assert err["code"] == "invalid_value" and err["param"] == "item.content[1].image_url"
    assert why in err["message"] and err["event_id"] == "evt_1"
    assert len(d.session.items) == 0
    assert types(d.text_item("still here")) == ["conversation.item.added", "conversation.item.done"]


def test_an_image_over_the_byte_cap_is_refused_before_and_after_decoding() -> None:
    d = limited(SessionLimits(max_image_bytes=100))
    assert types(d.send(image_item(uri(png())))) == ["conversation.item.added", "conversation.item.done"]  # 79 B
    big = encoded("PNG") + bytes(200)  # a valid signature, then too many bytes
    err = error(d.send(image_item(uri(big))))
    assert err["code"] == "invalid_value" and "at most 100 bytes" in err["message"]
    assert err["param"] == "item.content[0].image_url"
    assert len(d.session.items) == 1


def test_detail_must_be_auto_low_or_high() -> None:
    d = Driver()
    err = error(d.send(image_item(uri(png()), detail="ultra")))
    assert err["param"] == "item.content[0].detail"


def test_a_webcam_stream_sends_only_the_most_recent_frames_but_keeps_every_item() -> None:
    d = limited(SessionLimits(max_image_frames=2))
    frames = [png(shade=k) for k in range(6)]
    d.send(image_item(uri(frames[0])))
    d.send(image_item(uri(frames[1]), text="remember this one"))  # a message with text is never dropped
    for frame in frames[2:]:
        d.send(image_item(uri(frame)))
    d.text_item("what changed?")
    assert len(d.session.items) == 7
    rid = started(d.send({"type": "response.create"}))
    assert [p.data for p in request_images(d, rid)] == [frames[1], frames[4], frames[5]]
    request = d.session.build_request(rid)
    assert request is not None and request.messages[-1].text == "what changed?"


def test_old_image_bytes_leave_the_conversation_past_its_image_budget() -> None:
    first, second = png(shade=1), png(shade=2)
    d = limited(SessionLimits(max_conversation_image_bytes=len(first) + len(second) - 1, max_image_frames=9))
    d.send({**image_item(uri(first), text="a"), "item": {**image_item(uri(first), text="a")["item"], "id": "old"}})
    d.send(image_item(uri(second), text="b"))
    retrieved = only(d.send({"type": "conversation.item.retrieve", "item_id": "old"}), "conversation.item.retrieved")
    assert retrieved["item"]["content"][1] == {"type": "input_image", "image_url": None, "detail": "auto"}
    rid = started(d.send({"type": "response.create"}))
    assert [p.data for p in request_images(d, rid)] == [second]


def test_a_model_without_vision_fails_the_response_with_unsupported_modality() -> None:
    d = Driver(backend=FakeBackend(vision=False))
    d.send(image_item(uri(png()), text="what is this?"))
    out = d.send({"type": "response.create"})
    assert types(out) == ["response.created", "error", "response.done"]
    assert not generations(out)
    assert error(out)["code"] == "unsupported_modality" and "no image input" in error(out)["message"]
    done = only(out, "response.done")["response"]
    assert done["status"] == "failed" and done["status_details"]["error"]["code"] == "unsupported_modality"
    assert d.session.running_responses == ()
    d.text_item("then just text")
    assert d.session.running_responses == () and types(d.send({"type": "response.create"})) == [
        "response.created",
        "error",
        "response.done",
    ]


def test_an_error_chunk_fails_the_response_and_sends_an_error_event() -> None:
    d = Driver()
    d.text_mode()
    d.text_item()
    rid = started(d.send({"type": "response.create"}))
    out = d.run(rid, [TextDelta("par"), Error("unsupported_modality", "no image input here")])
    assert types(out)[-6:] == [
        "error",
        "response.output_text.done",
        "response.content_part.done",
        "response.output_item.done",
        "conversation.item.done",
        "response.done",
    ]
    assert error(out) == {
        "type": "invalid_request_error",
        "code": "unsupported_modality",
        "message": "no image input here",
        "param": None,
        "event_id": None,
    }
    done = only(out, "response.done")["response"]
    assert done["status"] == "failed" and done["output"][0]["status"] == "incomplete"
    assert done["status_details"]["error"] == {
        "type": "invalid_request_error",
        "code": "unsupported_modality",
        "message": "no image input here",
    }
    rid = started(d.send({"type": "response.create"}))
    out = d.run(rid, [Error("engine_dead", "the engine stopped", status=503)])
    assert error(out)["type"] == "server_error" and d.session.running_responses == ()


# ---- image output -------------------------------------------------------------------------------
def image_driver(dialect: str = "ga") -> Driver:
    return Driver(dialect, backend=FakeBackend(image_out=True))


def test_an_image_response_streams_partial_images_then_the_completed_item() -> None:
    d = image_driver()
    d.text_item("a red square", id="u1")
    created = d.send(
        {
            "type": "response.create",
            "response": {
                "output_modalities": ["image"],
                "image": {"size": "64x128", "partial_images": 2, "num_inference_steps": 9},
            },
        }
    )
    response = only(created, "response.created")["response"]
    assert response["output_modalities"] == ["image"]
    rid = started(created)
    request = d.session.build_request(rid)
    assert request is not None and request.modalities == ("image",)
    assert request.image.size == (64, 128) and request.image.preview_every == 3
    previews = [png(shade=1), png(shade=2)]
    final = png(3, 3)
    out = d.run(
        rid,
        [ImagePartial(0, previews[0], step=3), ImagePartial(1, previews[1], step=6), ImageFinal(final), Done("stop")],
    )
    assert types(out) == [
        "response.output_item.added",
        "conversation.item.added",
        "response.image_generation_call.partial_image",
        "response.image_generation_call.partial_image",
        "response.output_item.done",
        "conversation.item.done",
        "response.done",
    ]
    evs = events(out)
    item_id = evs[0]["item"]["id"]
    assert evs[0]["item"] == {
        "id": item_id,
        "type": "image_generation_call",
        "object": "realtime.item",
        "status": "in_progress",
    }
    assert evs[0]["output_index"] == 0 and evs[1]["previous_item_id"] == "u1"
    for k, ev in enumerate(evs[2:4]):
        assert set(ev) == {
            "type",
            "event_id",
            "response_id",
            "item_id",
            "output_index",
            "partial_image_index",
            "partial_image_b64",
            "size",
        }
        assert (ev["response_id"], ev["item_id"], ev["output_index"], ev["partial_image_index"], ev["size"]) == (
            rid,
            item_id,
            0,
            k,
            "64x128",
        )
        assert base64.b64decode(ev["partial_image_b64"]) == previews[k]
    done_item = evs[4]["item"]
    assert done_item["status"] == "completed" and base64.b64decode(done_item["result"]) == final
    assert evs[5]["item"] == done_item
    response = evs[6]["response"]
    assert response["status"] == "completed" and response["output"] == [done_item]
    retrieved = only(d.send({"type": "conversation.item.retrieve", "item_id": item_id}), "conversation.item.retrieved")
    assert retrieved["item"] == done_item
    # The generated image is not fed back to the model on the next turn.
    rid = started(d.send({"type": "response.create", "response": {"output_modalities": ["text"]}}))
    request = d.session.build_request(rid)
    assert request is not None and [m.text for m in request.messages] == ["a red square"]


def test_image_output_needs_an_image_model() -> None:
    d = Driver()
    d.text_item()
    out = d.send({"type": "response.create", "response": {"output_modalities": ["image"]}, "event_id": "e"})
    assert types(out) == ["error"]
    assert error(out)["code"] == "unsupported_modality" and error(out)["param"] == "response.output_modalities"
    assert d.session.running_responses == ()


def test_image_is_a_per_response_modality_not_a_session_one() -> None:
    d = image_driver()
    err = error(d.send({"type": "session.update", "session": {"type": "realtime", "output_modalities": ["image"]}}))
    assert err["code"] == "invalid_value" and err["param"] == "session.output_modalities"


@pytest.mark.parametrize(
    ("image", "param"),
    [
        ({"size": "100x100"}, "response.image.size"),
        ({"size": "64"}, "response.image.size"),
        ({"partial_images": 4}, "response.image.partial_images"),
        ({"num_inference_steps": True}, "response.image.num_inference_steps"),
        ("big", "response.image"),
    ],
)
def test_bad_image_options_are_refused(image: Any, param: str) -> None:
    d = image_driver()
    d.text_item()
    out = d.send({"type": "response.create", "response": {"output_modalities": ["image"], "image": image}})
    assert types(out) == ["error"] and error(out)["param"] == param


def test_beta_text_and_image_in_one_response() -> None:
    d = image_driver("beta")
    d.text_item("draw a cat and say something")
    created = d.send({"type": "response.create", "response": {"modalities": ["text", "image"]}})
    assert only(created, "response.created")["response"]["modalities"] == ["text", "image"]
    rid = started(created)
    request = d.session.build_request(rid)
    assert request is not None and request.modalities == ("text", "image")
    out = d.run(rid, [TextDelta("Here"), ImageFinal(png()), Done("stop")])
    assert types(out) == [
        "response.output_item.added",
        "conversation.item.created",
        "response.content_part.added",
        "response.text.delta",
        "response.output_item.added",
        "conversation.item.created",
        "response.output_item.done",
        "response.text.done",
        "response.content_part.done",
        "response.output_item.done",
        "response.done",
    ]
    output = only(out, "response.done")["response"]["output"]
    assert [o["type"] for o in output] == ["message", "image_generation_call"]
    assert output[0]["content"] == [{"type": "text", "text": "Here"}]


def test_a_cancelled_image_response_leaves_an_incomplete_item_without_result() -> None:
    d = image_driver()
    d.text_item()
    rid = started(d.send({"type": "response.create", "response": {"output_modalities": ["image"]}}))
    d.session.on_chunk(rid, ImagePartial(0, png(), step=1))
    out = d.send({"type": "response.cancel"})
    assert types(out) == ["response.output_item.done", "conversation.item.done", "response.done"]
    item = only(out, "response.output_item.done")["item"]
    assert item["status"] == "incomplete" and "result" not in item
    assert only(out, "response.done")["response"]["status"] == "cancelled"
    assert d.session.on_chunk(rid, ImageFinal(png())) == []  # late chunks of a cancelled response are dropped


def test_each_image_of_a_response_gets_its_own_item() -> None:
    d = image_driver()
    d.text_item()
    rid = started(d.send({"type": "response.create", "response": {"output_modalities": ["image"]}}))
    out = d.run(
        rid,
        [
            ImagePartial(0, png(), step=1, image_index=1),
            ImageFinal(png(), image_index=0),
            ImageFinal(png(2, 2, 9), image_index=1),
            Done("stop"),
        ],
    )
    output = only(out, "response.done")["response"]["output"]
    assert [o["status"] for o in output] == ["completed", "completed"]
    assert base64.b64decode(output[0]["result"]) == png(2, 2, 9)  # image 1 opened first, with its preview
    assert base64.b64decode(output[1]["result"]) == png()
