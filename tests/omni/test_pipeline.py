"""OmniPipeline orchestration over fake stages: what reaches the engine, and what the gateway receives."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from typing import Any

import pytest
from omni_gateway.engine.errors import EngineOverloaded
from omni_gateway.engine.outputs import StreamDelta
from omni_gateway.omni.config import OmniConfig
from omni_gateway.omni.loading import stage_threads
from omni_gateway.omni.pipeline import OmniPipeline
from omni_gateway.omni.prompting import UnsupportedInput
from omni_gateway.omni.protocol import (
    AudioChunk,
    AudioOutputOptions,
    AudioPart,
    Done,
    Error,
    ImagePart,
    Message,
    OmniRequest,
    SamplingOptions,
    TextDelta,
    TextPart,
    ToolCallDelta,
    Usage,
    VadSettings,
)


class CharTokenizer:
    """One token per character, and a chat template that tags roles: enough to see what the engine got."""

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        return [ord(c) for c in text]

    def decode(self, ids: list[int]) -> str:
        return "".join(chr(i) for i in ids)

    def render(self, messages: list[dict[str, Any]], tools: Any = None, add_generation_prompt: bool = True) -> str:
        head = f"<tools>{json.dumps(tools)}</tools>" if tools else ""
        body = "".join(f"<{m['role']}>{m['content']}</{m['role']}>" for m in messages)
        return head + body + ("<assistant>" if add_generation_prompt else "")


class FakeEngine:
    def __init__(self, pieces: list[str], *, fail: Exception | None = None) -> None:
        self.tokenizer = CharTokenizer()
        self.pieces = pieces
        self.fail = fail
        self.prompts: list[str] = []
        self.params: list[Any] = []
        self.closed_early = False
        self.aborted: list[str] = []

    async def generate(
        self, prompt_ids: list[int], params: Any, *, request_id: str, priority: int = 0
    ) -> AsyncIterator[StreamDelta]:
        if self.fail is not None:
            raise self.fail
        self.prompts.append(self.tokenizer.decode(prompt_ids))
        self.params.append(params)
        emitted = 0
        try:
            for i, piece in enumerate(self.pieces):
                emitted += 1
                last = i == len(self.pieces) - 1
                yield StreamDelta(
                    request_id,
                    piece,
                    (i,),
                    finished=last,
                    finish_reason="stop" if last else None,
                    num_prompt_tokens=len(prompt_ids),
                    num_cached_tokens=3,
                    num_output_tokens=emitted,
                )
                await asyncio.sleep(0)
        except (GeneratorExit, asyncio.CancelledError):  # closed by its consumer, or its task cancelled
            self.closed_early = True
            raise

    def render_chat(
        self, messages: list[dict[str, Any]], *, tools: Any = None, add_generation_prompt: bool = True
    ) -> str:
        return self.tokenizer.render(messages, tools, add_generation_prompt)

    def abort(self, request_id: str) -> None:
        self.aborted.append(request_id)

    def health(self) -> dict[str, Any]:
        return {"alive": True, "error": None, "open_streams": 0}

    def stats(self) -> dict[str, float]:
        return {"kv_blocks_used": 0.0}


class FakeASR:
    def __init__(self) -> None:
        self.calls = 0

    def transcribe(
        self, pcm16: bytes, *, sample_rate: int, language: str | None = None, prompt: str | None = None
    ) -> Any:
        self.calls += 1
        rate = sample_rate

        class Result:
            text = "what is the capital of France"
            language = "en"
            duration_s = len(pcm16) / 2 / rate

        return Result()


class FakeTTS:
    """10 ms of silence per character, cut into 100 ms chunks; the text rides on each segment's first chunk."""

    voices = ("joe",)

    async def stream(self, texts: AsyncIterator[str], options: AudioOutputOptions) -> AsyncIterator[AudioChunk]:
        async for text in texts:
            samples = len(text) * options.sample_rate // 100
            step = options.sample_rate // 10
            for start in range(0, samples, step):
                n = min(step, samples - start)
                yield AudioChunk(b"\0\0" * n, options.sample_rate, text if start == 0 else "")


def _pipeline(engine: FakeEngine, config: OmniConfig | None = None, **kw: Any) -> OmniPipeline:
    return OmniPipeline(
        config or OmniConfig(temperature=0.0),
        engine=engine,
        model_name="fake-llm",
        max_context_tokens=4096,
        asr=kw.get("asr"),
        tts=kw.get("tts"),
    )


def _user(text: str) -> tuple[Message, ...]:
    return (Message("user", (TextPart(text),)),)


async def _collect(pipeline: OmniPipeline, request: OmniRequest) -> list[Any]:
    return [chunk async for chunk in pipeline.generate(request)]


def test_text_turn_streams_deltas_then_done_and_usage() -> None:
    engine = FakeEngine(["Paris", " is", " the capital."])
    chunks = asyncio.run(_collect(_pipeline(engine), OmniRequest("r1", _user("capital of France?"))))
    assert "".join(c.text for c in chunks if isinstance(c, TextDelta)) == "Paris is the capital."
    assert [type(c) for c in chunks[-2:]] == [Done, Usage]
    usage = chunks[-1]
    assert usage.input_tokens == len(engine.prompts[0]) and usage.output_tokens == 3 and usage.cached_tokens == 3
    assert engine.prompts[0] == "<user>capital of France?</user><assistant>"
    assert engine.params[0].temperature == 0.0  # the configured default fills the unset knob


def test_client_sampling_options_reach_the_engine() -> None:
    engine = FakeEngine(["ok"])
    request = OmniRequest(
        "r1", _user("hi"), sampling=SamplingOptions(temperature=1.3, max_tokens=7, seed=5, stop=("\n",))
    )
    asyncio.run(_collect(_pipeline(engine), request))
    p = engine.params[0]
    assert (p.temperature, p.max_tokens, p.seed, p.stop) == (1.3, 7, 5, ("\n",))


def test_tool_call_in_output_becomes_a_tool_call_chunk() -> None:
    call = '<tool_call>{"name": "get_weather", "arguments": {"city": "Paris"}}</tool_call>'
    engine = FakeEngine([call[:20], call[20:]])
    tools = ({"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}},)
    chunks = asyncio.run(_collect(_pipeline(engine), OmniRequest("r1", _user("weather?"), tools=tools)))
    calls = [c for c in chunks if isinstance(c, ToolCallDelta)]
    assert len(calls) == 1 and calls[0].name == "get_weather" and json.loads(calls[0].arguments) == {"city": "Paris"}
    assert not [c for c in chunks if isinstance(c, TextDelta)]
    assert [c for c in chunks if isinstance(c, Done)][0].finish_reason == "tool_calls"
    assert engine.prompts[0].startswith("<tools>")


WEATHER_TOOL = ({"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}},)


def test_a_spoken_answer_speaks_its_content_and_sends_its_calls() -> None:
    call = '<tool_call>{"name": "get_weather", "arguments": {"city": "Paris"}}</tool_call>'
    engine = FakeEngine(["Let me check. ", call[:30], call[30:]])
    request = OmniRequest("r1", _user("weather?"), modalities=("audio",), tools=WEATHER_TOOL)
    chunks = asyncio.run(_collect(_pipeline(engine, tts=FakeTTS()), request))
    assert "".join(c.transcript for c in chunks if isinstance(c, AudioChunk)).strip() == "Let me check."
    calls = [c for c in chunks if isinstance(c, ToolCallDelta)]
    assert [(c.name, json.loads(c.arguments)) for c in calls] == [("get_weather", {"city": "Paris"})]
    assert [c for c in chunks if isinstance(c, Done)][0].finish_reason == "tool_calls"


def test_the_configured_parser_reads_and_constrains_calls_in_its_family_format() -> None:
    engine = FakeEngine(['[TOOL_CALLS][{"name": "get_weather", ', '"arguments": {"city": "Rome"}}]'])
    config = OmniConfig(temperature=0.0, tool_call_parser="mistral", enable_auto_tool_choice=True)
    request = OmniRequest("r1", _user("weather?"), tools=WEATHER_TOOL, tool_choice="required")
    chunks = asyncio.run(_collect(_pipeline(engine, config), request))
    calls = [c for c in chunks if isinstance(c, ToolCallDelta)]
    assert [(c.name, json.loads(c.arguments)) for c in calls] == [("get_weather", {"city": "Rome"})]
    assert not [c for c in chunks if isinstance(c, TextDelta)]
    tag = json.loads(engine.params[0].structured_outputs.structural_tag)
    assert tag["format"]["elements"][0] == {"type": "const_string", "value": "["}


def test_auto_tool_choice_is_refused_when_a_parser_is_named_without_enabling_it() -> None:
    engine = FakeEngine(["hi"])
    config = OmniConfig(temperature=0.0, tool_call_parser="hermes")
    chunks = asyncio.run(_collect(_pipeline(engine, config), OmniRequest("r1", _user("hi?"), tools=WEATHER_TOOL)))
    [error] = [c for c in chunks if isinstance(c, Error)]
    assert error.param == "tool_choice" and "--enable-auto-tool-choice" in error.message and not engine.prompts


def test_audio_output_speaks_the_text_in_chunks_of_at_most_100ms() -> None:
    engine = FakeEngine(["Paris is", " the capital", " of France."])
    request = OmniRequest("r1", _user("capital?"), modalities=("audio",))
    chunks = asyncio.run(_collect(_pipeline(engine, tts=FakeTTS()), request))
    audio = [c for c in chunks if isinstance(c, AudioChunk)]
    assert audio and all(len(c.pcm16) <= 2 * 2400 for c in audio)
    assert "".join(c.transcript for c in audio) == "Paris is the capital of France."
    usage = chunks[-1]
    assert isinstance(usage, Usage)
    seconds = sum(len(c.pcm16) // 2 for c in audio) / 24000
    assert usage.output_audio_tokens == round(seconds * 20)


def test_audio_input_without_transcript_is_transcribed_before_prompting() -> None:
    engine, asr = FakeEngine(["Paris."]), FakeASR()
    audio = AudioPart(pcm16=b"\0\0" * 16000, sample_rate=16000)
    request = OmniRequest("r1", (Message("user", (audio,)),))
    asyncio.run(_collect(_pipeline(engine, asr=asr), request))
    assert asr.calls == 1
    assert "what is the capital of France" in engine.prompts[0]


def test_image_for_a_text_only_model_is_a_clear_error() -> None:
    engine = FakeEngine(["x"])
    request = OmniRequest("r1", (Message("user", (TextPart("what is this?"), ImagePart(b"\x89PNG"))),))
    chunks = asyncio.run(_collect(_pipeline(engine), request))
    assert len(chunks) == 1 and isinstance(chunks[0], Error)
    assert chunks[0].code == "unsupported_modality" and "image" in chunks[0].message
    assert engine.prompts == []


def test_overloaded_engine_becomes_a_503_error_chunk() -> None:
    engine = FakeEngine([], fail=EngineOverloaded("waiting queue is full (4096 requests)"))
    chunks = asyncio.run(_collect(_pipeline(engine), OmniRequest("r1", _user("hi"))))
    assert isinstance(chunks[-1], Error) and chunks[-1].status == 503 and chunks[-1].code == "overloaded"


def test_closing_the_stream_early_closes_the_engine_stream() -> None:
    engine = FakeEngine(["a", "b", "c", "d"])

    async def first_only() -> None:
        stream = _pipeline(engine).generate(OmniRequest("r1", _user("hi")))
        async for chunk in stream:
            assert isinstance(chunk, TextDelta)
            break
        await stream.aclose()

    asyncio.run(first_only())
    assert engine.closed_early


def test_image_output_without_an_image_model_is_a_clear_error() -> None:
    chunks = asyncio.run(
        _collect(_pipeline(FakeEngine(["x"])), OmniRequest("r1", _user("a cat"), modalities=("image",)))
    )
    assert isinstance(chunks[0], Error) and "image model" in chunks[0].message


@pytest.mark.parametrize("bad", [{"temperature": -1.0}, {"top_p": 0.0}, {"max_tokens": 0}])
def test_bad_sampling_values_are_invalid_request_errors(bad: dict[str, Any]) -> None:
    chunks = asyncio.run(
        _collect(_pipeline(FakeEngine(["x"])), OmniRequest("r1", _user("hi"), sampling=SamplingOptions(**bad)))
    )
    assert isinstance(chunks[0], Error) and chunks[0].code == "invalid_request" and chunks[0].status == 400


def test_count_tokens_bounds_untranscribed_audio_by_its_duration() -> None:
    pipeline = _pipeline(FakeEngine(["x"]))
    text_only = pipeline.count_tokens(_user("hi"))
    one_s = pipeline.count_tokens((Message("user", (TextPart("hi"), AudioPart(b"\0\0" * 16000, 16000))),))
    ten_s = pipeline.count_tokens((Message("user", (TextPart("hi"), AudioPart(b"\0\0" * 160000, 16000))),))
    assert text_only < one_s < ten_s
    assert ten_s - text_only >= 10 * 4  # at least the token rate of fast speech


def test_count_tokens_leaves_media_to_the_engine_check() -> None:
    pipeline = _pipeline(FakeEngine(["x"]))
    with_image = (Message("user", (TextPart("what is this?"), ImagePart(b"\x89PNG"))),)
    assert pipeline.count_tokens(with_image) == pipeline.count_tokens(_user("what is this?"))


class FakeImageHead:
    def __init__(self, *, fail: Exception | None = None) -> None:
        self.fail = fail
        self.closed = False

    async def generate(self, prompt: str, options: Any, cancel: asyncio.Event) -> AsyncIterator[Any]:
        from omni_gateway.omni.protocol import ImageFinal, ImagePartial

        yield ImagePartial(index=0, png=b"preview", step=1)
        if self.fail is not None:
            raise self.fail
        cancel.set() if prompt == "cancel me" else None
        if not cancel.is_set():
            yield ImageFinal(png=b"final", seed=1)

    def close(self) -> None:
        self.closed = True


def _image_pipeline(head: FakeImageHead) -> OmniPipeline:
    return OmniPipeline(
        OmniConfig(), engine=FakeEngine(["x"]), model_name="fake", max_context_tokens=4096, image_head=head
    )


def test_image_output_streams_previews_then_the_final_image() -> None:
    from omni_gateway.omni.protocol import ImageFinal, ImagePartial

    pipeline = _image_pipeline(FakeImageHead())
    assert "image" in pipeline.capabilities.output_modalities
    chunks = asyncio.run(_collect(pipeline, OmniRequest("r1", _user("a cat"), modalities=("image",))))
    assert [type(c) for c in chunks] == [ImagePartial, ImageFinal, Done] and chunks[-1].finish_reason == "stop"


def test_image_generation_failure_is_a_server_error_and_cancel_is_an_abort() -> None:
    from omni_gateway.omni.heads.dit.errors import ImageGenerationError

    failing = _image_pipeline(FakeImageHead(fail=ImageGenerationError("VAE decode ran out of memory")))
    chunks = asyncio.run(_collect(failing, OmniRequest("r1", _user("a cat"), modalities=("image",))))
    assert isinstance(chunks[-1], Error) and chunks[-1].status == 500 and "out of memory" in chunks[-1].message
    cancelled = asyncio.run(
        _collect(_image_pipeline(FakeImageHead()), OmniRequest("r2", _user("cancel me"), modalities=("image",)))
    )
    assert cancelled[-1] == Done("abort")


def test_shutdown_closes_the_image_head() -> None:
    head = FakeImageHead()
    pipeline = _image_pipeline(head)
    pipeline.engine.shutdown = lambda: None
    pipeline.shutdown()
    assert head.closed


def test_text_and_image_in_one_response_run_side_by_side() -> None:
    from omni_gateway.omni.protocol import ImageFinal, ImagePartial

    pipeline = _image_pipeline(FakeImageHead())
    pipeline.engine.pieces = ["Here", " is", " a cat."]
    chunks = asyncio.run(_collect(pipeline, OmniRequest("r1", _user("draw a cat"), modalities=("text", "image"))))
    assert "".join(c.text for c in chunks if isinstance(c, TextDelta)) == "Here is a cat."
    assert [type(c) for c in chunks if isinstance(c, (ImagePartial, ImageFinal))] == [ImagePartial, ImageFinal]
    assert [c for c in chunks if isinstance(c, Done)] == [Done("stop"), Done("stop")]
    assert any(isinstance(c, Usage) for c in chunks)


def test_closing_a_text_and_image_response_closes_both_stages() -> None:
    pipeline = _image_pipeline(FakeImageHead())
    pipeline.engine.pieces = [f"w{i} " for i in range(50)]  # more than the merge queue holds

    async def first_only() -> None:
        stream = pipeline.generate(OmniRequest("r1", _user("draw"), modalities=("text", "image")))
        while not isinstance(await stream.__anext__(), TextDelta):
            pass
        await stream.aclose()

    asyncio.run(first_only())
    assert pipeline.engine.closed_early


def test_each_stage_gets_half_the_cores_unless_configured(monkeypatch: pytest.MonkeyPatch) -> None:
    import os

    monkeypatch.setattr(os, "cpu_count", lambda: 2)
    assert stage_threads(OmniConfig()) == 1  # the LLM and the voice render at once on two cores
    monkeypatch.setattr(os, "cpu_count", lambda: 16)
    assert stage_threads(OmniConfig()) == 8
    assert stage_threads(OmniConfig(stage_threads=3)) == 3
    with pytest.raises(ValueError, match="stage_threads must be >= 1; got 0"):
        stage_threads(OmniConfig(stage_threads=0))


def test_warm_up_runs_each_stage_once_with_the_prompt_every_conversation_starts_with() -> None:
    class SpokenTTS(FakeTTS):
        def __init__(self) -> None:
            self.said: list[str] = []

        def synthesize(self, text: str) -> Any:
            self.said.append(text)
            return b""

    engine, asr, tts = FakeEngine(["Hi"]), FakeASR(), SpokenTTS()
    pipeline = OmniPipeline(
        OmniConfig(system_prompt="Be brief."),
        engine=engine,
        model_name="fake-llm",
        max_context_tokens=4096,
        asr=asr,
        tts=tts,
    )
    pipeline.warm_up()
    (prompt,) = engine.prompts
    assert prompt.startswith("<system>Be brief.</system><user>") and engine.params[0].max_tokens > 1
    asyncio.run(_collect(pipeline, OmniRequest(request_id="r1", messages=_user("What time is it?"))))
    assert engine.prompts[1].startswith("<system>Be brief.</system><user>")  # the prefix the cache now holds
    assert asr.calls == 1 and len(tts.said) == 1


def _vad_pipeline() -> OmniPipeline:
    from omni_gateway.encoders.vad import load_session

    return OmniPipeline(
        OmniConfig(), engine=FakeEngine([]), model_name="fake-llm", max_context_tokens=4096, vad_session=load_session()
    )


def test_semantic_settings_get_the_end_of_turn_detector(monkeypatch: pytest.MonkeyPatch) -> None:
    from omni_gateway.encoders import turn
    from omni_gateway.encoders.turn import SemanticTurn

    warmed: list[object] = []
    monkeypatch.setattr(
        turn, "scoring_pool", lambda: type("Pool", (), {"submit": lambda self, fn: warmed.append(fn)})()
    )
    pipeline = _vad_pipeline()
    semantic = pipeline.new_vad(VadSettings(eagerness="high"))
    assert isinstance(semantic._detector, SemanticTurn)  # type: ignore[attr-defined]
    assert semantic._detector.policy == turn.EAGERNESS["high"]  # type: ignore[attr-defined]
    assert warmed == [turn.load_smart_turn]  # the model loads off the event loop before the first pause
    plain = pipeline.new_vad(VadSettings())
    assert not isinstance(plain._detector, SemanticTurn)  # type: ignore[attr-defined]


def test_semantic_vad_without_pipecat_names_the_package(monkeypatch: pytest.MonkeyPatch) -> None:
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "pipecat" else real(name, *a))
    pipeline = _vad_pipeline()
    with pytest.raises(UnsupportedInput, match="pip install --no-deps pipecat-ai"):
        pipeline.new_vad(VadSettings(eagerness="auto"))
    pipeline.new_vad(VadSettings())  # server VAD needs no end-of-turn model
