"""/v1/completions through the official openai SDK against a live server and the fake backend."""

from __future__ import annotations

import time

import httpx
import openai
import pytest

from tests.harness.fake_backend import overloaded


def test_prompt_list_with_n_numbers_choices_by_prompt(fake):
    backend, _, client = fake
    r = client.completions.create(model="omni-test", prompt=["one two", "three"], n=2, max_tokens=2, logprobs=1)
    assert [c.index for c in r.choices] == [0, 1, 2, 3]
    assert all(c.text == "hello from" and c.finish_reason == "length" for c in r.choices)
    assert r.choices[2].logprobs.tokens == ["hello", " from"] and r.choices[2].logprobs.text_offset == [0, 5]
    assert [q.raw_prompt for q in backend.requests] == ["one two", "three"]
    assert r.usage.prompt_tokens == 3 and r.usage.completion_tokens == 8


def test_default_max_tokens_is_sixteen_and_echo_prepends_the_prompt(fake):
    backend, _, client = fake
    r = client.completions.create(model="omni-test", prompt="Say:", echo=True)
    assert r.choices[0].text == "Say:hello from the fake model" and r.choices[0].finish_reason == "stop"
    assert backend.requests[-1].sampling.max_tokens == 16


def test_streaming_completions_with_usage(fake):
    _, _, client = fake
    chunks = list(
        client.completions.create(
            model="omni-test", prompt=["a", "b"], stream=True, stream_options={"include_usage": True}
        )
    )
    by_choice: dict[int, str] = {}
    for c in chunks[:-1]:
        by_choice[c.choices[0].index] = by_choice.get(c.choices[0].index, "") + c.choices[0].text
    assert by_choice == {0: "hello from the fake model", 1: "hello from the fake model"}
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == 10


def test_token_id_prompts_are_refused(fake):
    _, _, client = fake
    with pytest.raises(openai.BadRequestError) as info:
        client.completions.create(model="omni-test", prompt=[1, 2, 3])
    assert info.value.param == "prompt" and "token-id" in info.value.message


def test_overload_is_503_before_streaming(fake):
    backend, _, client = fake
    backend.script = overloaded(503)
    with pytest.raises(openai.InternalServerError) as info:
        list(client.completions.create(model="omni-test", prompt="x", stream=True))
    assert info.value.status_code == 503


def test_unknown_model_is_404(fake):
    _, _, client = fake
    with pytest.raises(openai.NotFoundError):
        client.completions.create(model="davinci-002", prompt="x")


def test_client_leaving_a_completion_stream_aborts_the_open_generation(fake):
    backend, url, _ = fake
    backend.chunk_delay = 0.2
    body = {"model": "omni-test", "prompt": ["a", "b"], "stream": True}
    with httpx.stream("POST", f"{url}/v1/completions", json=body, timeout=10) as r:
        assert next(r.iter_lines()).startswith("data: ")
    deadline = time.monotonic() + 5
    while not backend.aborted and time.monotonic() < deadline:
        time.sleep(0.02)
    assert backend.aborted == [backend.requests[0].request_id] == backend.closed
    assert len(backend.requests) == 1 and backend.completed == []
