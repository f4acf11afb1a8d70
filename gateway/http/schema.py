"""The fields of every HTTP request body, as data (see ``gateway/field_spec.py``).

Bounds come from the parsers' own constants and ``HttpLimits()`` defaults; a test checks that every key a
parser reads is listed here, so a new field cannot be parsed without being described (and fuzzed).
"""

from __future__ import annotations

from omni_gateway.gateway.field_spec import FieldSpec
from omni_gateway.gateway.http.audio_request import SPEECH_FORMATS, TRANSCRIPTION_FORMATS
from omni_gateway.gateway.http.embeddings import ENCODINGS
from omni_gateway.gateway.http.image_request import MAX_PARTIAL_IMAGES
from omni_gateway.gateway.http.limits import HttpLimits

CHAT, COMPLETIONS = "/v1/chat/completions", "/v1/completions"
IMAGES, SPEECH, TRANSCRIPTIONS = "/v1/images/generations", "/v1/audio/speech", "/v1/audio/transcriptions"
RESPONSES, MESSAGES, EMBEDDINGS = "/v1/responses", "/v1/messages", "/v1/embeddings"
ROUTES = (CHAT, COMPLETIONS, IMAGES, SPEECH, TRANSCRIPTIONS, RESPONSES, MESSAGES, EMBEDDINGS)
_LIMITS = HttpLimits()
_BOTH_TEXT = (CHAT, COMPLETIONS)


def _sampling() -> list[FieldSpec]:
    """The knobs chat and completions share (``sampling.py``)."""
    return [
        FieldSpec("model", ("string",), _BOTH_TEXT, exact=False),  # must name the served model (else 404)
        FieldSpec("stream", ("boolean",), _BOTH_TEXT, nullable=True),
        FieldSpec("stream_options", ("object",), _BOTH_TEXT, nullable=True, exact=False),  # needs 'stream'
        FieldSpec("stream_options.include_usage", ("boolean",), _BOTH_TEXT, nullable=True),
        FieldSpec("max_tokens", ("integer",), _BOTH_TEXT, nullable=True, lo=1),
        FieldSpec("max_completion_tokens", ("integer",), _BOTH_TEXT, nullable=True, lo=1),
        FieldSpec("temperature", ("number",), _BOTH_TEXT, nullable=True, lo=0.0, hi=2.0),
        FieldSpec("top_p", ("number",), _BOTH_TEXT, nullable=True, lo=0.0, hi=1.0),
        FieldSpec("presence_penalty", ("number",), _BOTH_TEXT, nullable=True, lo=-2.0, hi=2.0),
        FieldSpec("frequency_penalty", ("number",), _BOTH_TEXT, nullable=True, lo=-2.0, hi=2.0),
        FieldSpec("seed", ("integer",), _BOTH_TEXT, nullable=True, lo=-(2**63), hi=2**64 - 1),
        FieldSpec("stop", ("string", "array"), _BOTH_TEXT, nullable=True, exact=False),
        FieldSpec("n", ("integer",), _BOTH_TEXT, nullable=True, lo=1, hi=_LIMITS.max_n),
        FieldSpec("logit_bias", ("object",), _BOTH_TEXT, nullable=True, exact=False),  # refused unless empty
        # Output constraints (vLLM's names): at most one per request; whether it compiles is the engine's say.
        FieldSpec("structured_outputs", ("object",), _BOTH_TEXT, nullable=True, exact=False),
        FieldSpec("guided_json", ("object", "string", "boolean"), _BOTH_TEXT, nullable=True, exact=False),
        FieldSpec("guided_regex", ("string",), _BOTH_TEXT, nullable=True, exact=False),
        FieldSpec("guided_choice", ("array",), _BOTH_TEXT, nullable=True, exact=False),
        FieldSpec("guided_grammar", ("string",), _BOTH_TEXT, nullable=True, exact=False),
    ]


def _chat() -> list[FieldSpec]:
    m = "messages[]"
    part = f"{m}.content[]"
    return [
        FieldSpec("messages", ("array",), (CHAT,), exact=False),
        FieldSpec(f"{m}.role", ("string",), (CHAT,), exact=False),
        FieldSpec(f"{m}.content", ("string", "array"), (CHAT,), nullable=True, exact=False),
        FieldSpec(f"{part}.type", ("string",), (CHAT,), exact=False),
        FieldSpec(f"{part}.text", ("string",), (CHAT,)),
        FieldSpec(f"{part}.refusal", ("string",), (CHAT,), exact=False),
        FieldSpec(f"{part}.image_url", ("string", "object"), (CHAT,), exact=False),
        FieldSpec(f"{part}.image_url.url", ("string",), (CHAT,), exact=False),
        FieldSpec(f"{part}.image_url.detail", ("string",), (CHAT,), nullable=True, choices=("auto", "low", "high")),
        FieldSpec(f"{part}.input_audio", ("object",), (CHAT,), exact=False),
        FieldSpec(f"{part}.input_audio.format", ("string",), (CHAT,), exact=False),
        FieldSpec(f"{part}.input_audio.data", ("string",), (CHAT,), exact=False),
        FieldSpec(f"{m}.tool_calls", ("array",), (CHAT,), nullable=True, exact=False),
        FieldSpec(f"{m}.tool_calls[].id", ("string",), (CHAT,), exact=False),
        FieldSpec(f"{m}.tool_calls[].function", ("object",), (CHAT,), exact=False),
        FieldSpec(f"{m}.tool_calls[].function.name", ("string",), (CHAT,), exact=False),
        FieldSpec(f"{m}.tool_calls[].function.arguments", ("string",), (CHAT,), nullable=True, exact=False),
        FieldSpec(f"{m}.tool_call_id", ("string",), (CHAT,), exact=False),
        FieldSpec("logprobs", ("boolean",), (CHAT,), nullable=True),
        FieldSpec("top_logprobs", ("integer",), (CHAT,), nullable=True, lo=0, hi=_LIMITS.max_top_logprobs, exact=False),
        FieldSpec("modalities", ("array",), (CHAT,), nullable=True, exact=False),  # "audio" needs 'audio'
        FieldSpec("audio", ("object",), (CHAT,), nullable=True, exact=False),
        FieldSpec("audio.voice", ("string",), (CHAT,), exact=False),
        FieldSpec("audio.format", ("string",), (CHAT,), exact=False),
        FieldSpec("tools", ("array",), (CHAT,), nullable=True, exact=False),
        FieldSpec("tools[].type", ("string",), (CHAT,), choices=("function",)),
        FieldSpec("tools[].function", ("object",), (CHAT,), exact=False),
        FieldSpec("tools[].function.name", ("string",), (CHAT,), max_len=64),
        FieldSpec("tools[].function.parameters", ("object",), (CHAT,), nullable=True, exact=False),
        FieldSpec("parallel_tool_calls", ("boolean",), (CHAT,), nullable=True),
        FieldSpec("tool_choice", ("string", "object"), (CHAT,), nullable=True, exact=False),
        FieldSpec("tool_choice.function", ("object",), (CHAT,), exact=False),
        FieldSpec("tool_choice.function.name", ("string",), (CHAT,), exact=False),
        FieldSpec("response_format", ("object",), (CHAT,), nullable=True, exact=False),
        FieldSpec("response_format.type", ("string",), (CHAT,), exact=False),
        FieldSpec("response_format.json_schema", ("object",), (CHAT,), exact=False),  # with type json_schema
        FieldSpec("response_format.json_schema.name", ("string",), (CHAT,), max_len=64, exact=False),
        FieldSpec("response_format.json_schema.strict", ("boolean",), (CHAT,), nullable=True, exact=False),
        FieldSpec("response_format.json_schema.schema", ("object",), (CHAT,), nullable=True, exact=False),
    ]


def _completions() -> list[FieldSpec]:
    return [
        FieldSpec("prompt", ("string", "array"), (COMPLETIONS,), exact=False),
        FieldSpec("logprobs", ("integer",), (COMPLETIONS,), nullable=True, lo=0, hi=_LIMITS.max_top_logprobs),
        FieldSpec("echo", ("boolean",), (COMPLETIONS,), nullable=True),
        FieldSpec("suffix", ("string",), (COMPLETIONS,), nullable=True, exact=False),  # refused unless empty
        FieldSpec("best_of", ("integer",), (COMPLETIONS,), nullable=True, exact=False),  # must equal 'n'
        FieldSpec("response_format", (), (COMPLETIONS,)),  # chat only
    ]


def _images() -> list[FieldSpec]:
    r = (IMAGES,)
    return [
        FieldSpec("prompt", ("string",), r, max_len=4000, exact=False),  # and not blank
        FieldSpec("model", ("string",), r, nullable=True),
        FieldSpec("n", ("integer",), r, nullable=True, lo=1, hi=_LIMITS.max_images),
        FieldSpec("size", ("string",), r, nullable=True, exact=False),
        FieldSpec("response_format", ("string",), r, nullable=True, choices=("b64_json",)),
        FieldSpec("output_format", ("string",), r, nullable=True, choices=("png",)),
        FieldSpec("stream", ("boolean",), r, nullable=True),
        FieldSpec("partial_images", ("integer",), r, nullable=True, lo=0, hi=MAX_PARTIAL_IMAGES, exact=False),
        FieldSpec("num_inference_steps", ("integer",), r, nullable=True, lo=1, hi=200),
        FieldSpec("guidance_scale", ("number",), r, nullable=True, lo=0.0, hi=50.0),
        FieldSpec("seed", ("integer",), r, nullable=True, lo=0, hi=2**32 - 1),
    ]


def _audio() -> list[FieldSpec]:
    s, t = (SPEECH,), (TRANSCRIPTIONS,)
    return [
        FieldSpec("model", ("string",), s),
        FieldSpec("input", ("string",), s, max_len=_LIMITS.max_speech_chars, exact=False),  # and not blank
        FieldSpec("voice", ("string",), s, exact=False),  # one of the served voices
        FieldSpec("response_format", ("string",), s, nullable=True, choices=SPEECH_FORMATS),
        FieldSpec("speed", ("number",), s, nullable=True, lo=0.25, hi=4.0),
        FieldSpec("stream_format", ("string",), s, nullable=True, choices=("audio", "sse")),
        # multipart form fields: text only (a file part under these names counts as absent)
        FieldSpec("model", ("string",), t, exact=False),
        FieldSpec("response_format", ("string",), t, nullable=True, choices=TRANSCRIPTION_FORMATS, exact=False),
        FieldSpec("language", ("string",), t, nullable=True, max_len=16, exact=False),
        FieldSpec("prompt", ("string",), t, nullable=True, max_len=4096, exact=False),
    ]


def _responses() -> list[FieldSpec]:
    """``responses_request.py``: rewritten as a chat request, so what chat checks is marked inexact here."""
    r = (RESPONSES,)
    item = "input[]"
    part = f"{item}.content[]"
    return [
        FieldSpec("model", ("string",), r, exact=False),
        FieldSpec("input", ("string", "array"), r, exact=False),
        FieldSpec(f"{item}.type", ("string",), r, nullable=True, exact=False),
        FieldSpec(f"{item}.role", ("string",), r, choices=("user", "system", "developer", "assistant"), exact=False),
        FieldSpec(f"{item}.content", ("string", "array"), r, exact=False),
        FieldSpec(f"{part}.type", ("string",), r, exact=False),
        FieldSpec(f"{part}.text", ("string",), r, exact=False),
        FieldSpec(f"{part}.refusal", ("string",), r, exact=False),
        FieldSpec(f"{part}.image_url", ("string",), r, exact=False),  # a data URI
        FieldSpec(f"{part}.detail", ("string",), r, nullable=True, choices=("auto", "low", "high")),
        FieldSpec(f"{part}.file_id", ("string",), r, nullable=True, exact=False),  # refused: no file store
        FieldSpec(f"{part}.file_url", ("string",), r, nullable=True, exact=False),  # refused: no fetching
        FieldSpec(f"{part}.file_data", ("string",), r, exact=False),  # an audio or image data URI
        FieldSpec(f"{part}.input_audio", ("object",), r, exact=False),
        FieldSpec(f"{part}.input_audio.format", ("string",), r, exact=False),
        FieldSpec(f"{part}.input_audio.data", ("string",), r, exact=False),
        FieldSpec(f"{item}.call_id", ("string",), r, exact=False),
        FieldSpec(f"{item}.name", ("string",), r, exact=False),
        FieldSpec(f"{item}.arguments", ("string",), r, nullable=True, exact=False),
        FieldSpec(f"{item}.output", ("string", "array"), r, exact=False),
        FieldSpec(f"{item}.output[].type", ("string",), r, choices=("input_text", "output_text"), exact=False),
        FieldSpec(f"{item}.output[].text", ("string",), r, exact=False),
        FieldSpec("instructions", ("string",), r, nullable=True),
        FieldSpec("previous_response_id", ("string",), r, nullable=True, exact=False),  # must be stored
        FieldSpec("store", ("boolean",), r, nullable=True),
        FieldSpec("stream", ("boolean",), r, nullable=True),
        FieldSpec("background", ("boolean",), r, nullable=True, exact=False),  # true is refused
        FieldSpec("metadata", ("object",), r, nullable=True),
        FieldSpec("temperature", ("number",), r, nullable=True, lo=0.0, hi=2.0, exact=False),
        FieldSpec("top_p", ("number",), r, nullable=True, lo=0.0, hi=1.0, exact=False),
        FieldSpec("max_output_tokens", ("integer",), r, nullable=True, lo=1),
        FieldSpec("parallel_tool_calls", ("boolean",), r, nullable=True),
        FieldSpec("reasoning", ("object",), r, nullable=True, exact=False),
        FieldSpec("reasoning.effort", ("string",), r, nullable=True, exact=False),  # "none" only
        FieldSpec("reasoning.summary", ("string",), r, nullable=True, exact=False),  # refused
        FieldSpec("tools", ("array",), r, nullable=True, exact=False),
        FieldSpec("tools[].type", ("string",), r, choices=("function",), exact=False),
        FieldSpec("tools[].name", ("string",), r, max_len=64, exact=False),
        FieldSpec("tools[].description", ("string",), r, nullable=True),
        FieldSpec("tools[].parameters", ("object",), r, nullable=True, exact=False),
        FieldSpec("tools[].strict", ("boolean",), r, nullable=True),
        FieldSpec("tool_choice", ("string", "object"), r, nullable=True, exact=False),
        FieldSpec("tool_choice.type", ("string",), r, exact=False),
        FieldSpec("tool_choice.name", ("string",), r, exact=False),
        FieldSpec("text", ("object",), r, nullable=True, exact=False),
        FieldSpec("text.format", ("object",), r, nullable=True, exact=False),
        FieldSpec("text.format.type", ("string",), r, exact=False),
        FieldSpec("text.format.name", ("string",), r, max_len=64, exact=False),
        FieldSpec("text.format.strict", ("boolean",), r, nullable=True, exact=False),
        FieldSpec("text.format.schema", ("object",), r, exact=False),
    ]


def _messages() -> list[FieldSpec]:
    """``messages_request.py`` (Anthropic's Messages API), rewritten as a chat request like /v1/responses."""
    r = (MESSAGES,)
    m = "messages[]"
    block = f"{m}.content[]"
    return [
        FieldSpec("model", ("string",), r, exact=False),
        FieldSpec("max_tokens", ("integer",), r, lo=1, exact=False),  # required
        FieldSpec("messages", ("array",), r, exact=False),
        FieldSpec(f"{m}.role", ("string",), r, choices=("user", "assistant"), exact=False),
        FieldSpec(f"{m}.content", ("string", "array"), r, exact=False),
        FieldSpec(f"{block}.type", ("string",), r, exact=False),
        FieldSpec(f"{block}.text", ("string",), r, exact=False),
        FieldSpec(f"{block}.source", ("object",), r, exact=False),
        FieldSpec(f"{block}.source.type", ("string",), r, exact=False),  # "base64" only
        FieldSpec(f"{block}.source.media_type", ("string",), r, exact=False),
        FieldSpec(f"{block}.source.data", ("string",), r, exact=False),
        FieldSpec(f"{block}.id", ("string",), r, exact=False),
        FieldSpec(f"{block}.name", ("string",), r, exact=False),
        FieldSpec(f"{block}.input", ("object",), r, nullable=True, exact=False),
        FieldSpec(f"{block}.tool_use_id", ("string",), r, exact=False),
        FieldSpec(f"{block}.content", ("string", "array"), r, nullable=True, exact=False),
        FieldSpec(f"{block}.content[].type", ("string",), r, choices=("text",), exact=False),
        FieldSpec(f"{block}.content[].text", ("string",), r, exact=False),
        FieldSpec(f"{block}.is_error", ("boolean",), r, nullable=True, exact=False),
        FieldSpec("system", ("string", "array"), r, nullable=True, exact=False),
        FieldSpec("system[].type", ("string",), r, choices=("text",), exact=False),
        FieldSpec("system[].text", ("string",), r, exact=False),
        FieldSpec("stop_sequences", ("array",), r, nullable=True, exact=False),
        FieldSpec("temperature", ("number",), r, nullable=True, lo=0.0, hi=1.0),
        FieldSpec("top_p", ("number",), r, nullable=True, lo=0.0, hi=1.0, exact=False),
        FieldSpec("top_k", ("integer",), r, nullable=True, lo=1),
        FieldSpec("stream", ("boolean",), r, nullable=True),
        FieldSpec("metadata", ("object",), r, nullable=True),
        FieldSpec("thinking", ("object",), r, nullable=True, exact=False),
        FieldSpec("thinking.type", ("string",), r, nullable=True, exact=False),  # "disabled" only
        FieldSpec("tools", ("array",), r, nullable=True, exact=False),
        FieldSpec("tools[].type", ("string",), r, nullable=True, choices=("custom",), exact=False),
        FieldSpec("tools[].name", ("string",), r, max_len=64, exact=False),
        FieldSpec("tools[].description", ("string",), r, nullable=True),
        FieldSpec("tools[].input_schema", ("object",), r, exact=False),
        FieldSpec("tool_choice", ("object",), r, nullable=True, exact=False),
        FieldSpec("tool_choice.type", ("string",), r, choices=("auto", "any", "tool", "none"), exact=False),
        FieldSpec("tool_choice.name", ("string",), r, exact=False),
        FieldSpec("tool_choice.disable_parallel_tool_use", ("boolean",), r, nullable=True),
        FieldSpec("output_config", ("object",), r, nullable=True, exact=False),
        FieldSpec("output_config.effort", ("string",), r, nullable=True, exact=False),  # refused
        FieldSpec("output_config.format", ("object",), r, nullable=True, exact=False),
        FieldSpec("output_config.format.type", ("string",), r, choices=("json_schema",), exact=False),
        FieldSpec("output_config.format.schema", ("object",), r, exact=False),
    ]


def _embeddings() -> list[FieldSpec]:
    r = (EMBEDDINGS,)
    return [
        FieldSpec("model", ("string",), r, exact=False),
        FieldSpec("input", ("string", "array"), r, exact=False),  # non-empty; strings or token ids
        FieldSpec("encoding_format", ("string",), r, nullable=True, choices=ENCODINGS),
        FieldSpec("dimensions", ("integer",), r, nullable=True, lo=1, exact=False),  # the model's size only
    ]


FIELDS: tuple[FieldSpec, ...] = (
    *_sampling(),
    *_chat(),
    *_completions(),
    *_images(),
    *_audio(),
    *_responses(),
    *_messages(),
    *_embeddings(),
)
