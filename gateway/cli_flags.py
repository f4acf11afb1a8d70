"""The table of ``omni serve`` flags: each names the config field it sets (``GatewayConfig``,
``EngineConfig`` or ``OmniConfig``) and takes its default from that field, so the two never drift apart.

Importing this module stays light (no torch): the model side's config types are imported when the table
is built.
"""

from __future__ import annotations

import argparse
import contextlib
import json
from collections.abc import Callable
from dataclasses import MISSING, dataclass, fields
from typing import Any

from omni_gateway.gateway.config import GatewayConfig
from omni_gateway.gateway.realtime.voice_capacity import check_rtf_limit
from omni_gateway.gateway.realtime.webrtc_config import IceServer, parse_ice_server


def _stage(value: str | None) -> str | None:
    """``none`` disables a model stage; anything else is passed through ("default" or a path)."""
    return None if value is None or value.lower() == "none" else value


def _names(value: str) -> list[str]:
    """One occurrence of a list flag: a name or a comma-separated list of them."""
    return [part.strip() for part in value.split(",") if part.strip()]


def _same(value: Any) -> Any:
    return value


def _positive(value: str) -> int:
    number = int(value)
    if number < 1:
        raise ValueError(f"expected a positive integer, got {value}")
    return number


def _lora_module(value: str) -> tuple[str, str]:
    """One ``--lora-modules`` value, as vLLM takes it: ``name=path`` or a JSON object with "name" and "path"."""
    if value.lstrip().startswith("{"):
        try:
            spec = json.loads(value)
        except ValueError as exc:
            raise argparse.ArgumentTypeError(f"--lora-modules: {value!r} is not valid JSON: {exc}") from exc
        if not isinstance(spec, dict) or not all(isinstance(spec.get(k), str) and spec[k] for k in ("name", "path")):
            raise argparse.ArgumentTypeError(f"--lora-modules: expected {{'name': ..., 'path': ...}}, got {value!r}")
        return spec["name"], spec["path"]
    name, sep, path = value.partition("=")
    if not sep or not name.strip() or not path.strip():
        raise argparse.ArgumentTypeError(f"--lora-modules: expected name=path, got {value!r}")
    return name.strip(), path.strip()


def _json_object(value: str) -> dict[str, Any]:
    """A flag whose value is a JSON object (vLLM's ``--speculative-config``); the config checks its keys."""
    try:
        parsed = json.loads(value)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"expected a JSON object, got {value!r}: {exc}") from exc
    if not isinstance(parsed, dict):
        raise argparse.ArgumentTypeError(f"expected a JSON object, got {value!r}")
    return parsed


def _rtf_limit(value: str) -> float:
    """``--voice-admission-rtf``; argparse shows an ArgumentTypeError's message, a ValueError's it drops."""
    number: object = value
    with contextlib.suppress(ValueError):
        number = float(value)
    try:
        return check_rtf_limit(number)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from exc


def _ice_server(value: str) -> list[IceServer]:
    """One ``--ice-server`` occurrence (``listing`` flags extend their list with what the type returns)."""
    try:
        return [parse_ice_server(value)]
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from exc


@dataclass(frozen=True)
class Flag:
    """One ``omni serve`` flag and the config field it sets; its default is read from that field."""

    name: str
    owner: type  # GatewayConfig, EngineConfig or OmniConfig
    field: str
    help: str
    group: str
    type: Callable[[str], Any] = str
    choices: tuple[str, ...] | None = None
    to_field: Callable[[Any], Any] = _same  # parsed value -> field value
    from_field: Callable[[Any], Any] = _same  # field default -> flag default
    switch: bool = False  # store_true; ``to_field`` maps the bool
    listing: bool = False  # repeatable, each occurrence a name or a comma list; a tuple in the config
    many: bool = False  # a listing whose one occurrence may take several values (vLLM's ``--lora-modules a b``)
    aliases: tuple[str, ...] = ()  # other spellings (vLLM's short forms)

    @property
    def dest(self) -> str:
        return self.name.removeprefix("--").replace("-", "_")

    def default(self) -> Any:
        return False if self.switch else self.from_field(field_default(self.owner, self.field))


def field_default(owner: type, name: str) -> Any:
    spec = next((f for f in fields(owner) if f.name == name), None)
    if spec is None:
        raise KeyError(f"{owner.__name__} has no field {name!r}")
    if spec.default is not MISSING:
        return spec.default
    if spec.default_factory is not MISSING:
        return spec.default_factory()
    raise KeyError(f"{owner.__name__}.{name} has no default")


def serve_flags() -> tuple[Flag, ...]:
    """Every ``omni serve`` flag, in help order."""
    # Imported here: omni.config names the engine's config type, and importing the CLI stays light.
    from omni_gateway.omni.config import TOOL_CALL_PARSERS, EngineConfig, OmniConfig

    gw, eng, om = GatewayConfig, EngineConfig, OmniConfig
    mib = 2**20
    return (
        Flag(
            "--host",
            gw,
            "host",
            "address to bind; 0.0.0.0 or :: serves every interface (default %(default)s)",
            "network",
        ),
        Flag("--port", gw, "port", "port to bind (default %(default)s)", "network", type=int),
        Flag(
            "--api-key",
            gw,
            "api_key",
            "require this key (Bearer header or openai-insecure-api-key subprotocol); default: no authentication",
            "network",
            to_field=lambda v: v or None,
        ),
        Flag(
            "--allowed-hosts",
            gw,
            "allowed_hosts",
            "Host header names accepted besides the bound address, "
            "localhost, 127.0.0.1 and [::1]; repeatable or comma-separated, '*' accepts any. Bound to 0.0.0.0 "
            "or :: without it, any Host is accepted",
            "network",
            type=_names,
            listing=True,
        ),
        Flag(
            "--allowed-origins",
            gw,
            "allowed_origins",
            "browser origins (e.g. https://app.example) that may "
            "open /v1/realtime besides this server's own; repeatable or comma-separated, '*' allows any "
            "(clients without Origin are always allowed)",
            "network",
            type=_names,
            listing=True,
        ),
        Flag(
            "--ice-server",
            gw,
            "ice_servers",
            "a STUN or TURN server WebRTC calls gather candidates from: stun:HOST:PORT or "
            "turn:USER:CREDENTIAL@HOST:PORT[?transport=udp|tcp]; repeatable (aiortc uses the first STUN and the "
            "first TURN server). Default: none, host candidates only and nothing outside is contacted. The UDP "
            "ports of a call cannot be restricted to a range (aiortc binds ephemeral ports): open the ephemeral "
            "range or relay calls through a TURN server",
            "network",
            type=_ice_server,
            listing=True,
        ),
        Flag(
            "--max-frame-mib",
            gw,
            "max_frame_bytes",
            "largest WebSocket message accepted, in MiB (default %(default)s)",
            "network",
            type=float,
            to_field=lambda v: int(v * mib),
            from_field=lambda v: v / mib,
        ),
        Flag(
            "--ws-compression",
            gw,
            "ws_compression",
            "accept WebSocket permessage-deflate from clients that offer it (audio deltas cost five "
            "times the event-loop time for a third fewer bytes)",
            "network",
            switch=True,
        ),
        Flag(
            "--max-sessions",
            gw,
            "max_sessions",
            "concurrent realtime sessions (default %(default)s)",
            "network",
            type=int,
        ),
        Flag(
            "--max-sessions-per-key",
            gw,
            "max_sessions_per_key",
            "realtime sessions one API key (or client address) may hold (default %(default)s)",
            "network",
            type=int,
        ),
        Flag(
            "--max-voice-sessions",
            gw,
            "max_voice_sessions",
            "concurrent realtime sessions the speech stages serve; past it new ones are refused "
            "(default: no cap beyond --max-sessions)",
            "network",
            type=int,
        ),
        Flag(
            "--voice-admission-rtf",
            gw,
            "voice_admission_rtf",
            "refuse new voice sessions while the p90 real-time factor of the latest spoken replies (first to last "
            "audio delta over the audio's duration, across sessions) is at or above this, or too many of them ran "
            "dry mid-playback; 0 turns it off (default %(default)s)",
            "network",
            type=_rtf_limit,
        ),
        Flag(
            "--max-stored-responses",
            gw,
            "max_stored_responses",
            "/v1/responses answers kept in memory for previous_response_id and GET; past it the oldest is "
            "forgotten (default %(default)s)",
            "network",
            type=_positive,
        ),
        Flag(
            "--model",
            eng,
            "model",
            "LLM: 'default' (packaged SmolLM2), a Hugging Face directory or a .gguf file",
            "models",
        ),
        Flag("--served-model-name", om, "served_model_name", "model name reported to clients", "models"),
        Flag("--asr", om, "asr", "speech recognition: 'default', a path, or 'none'", "models", to_field=_stage),
        Flag("--tts", om, "tts", "speech synthesis: 'default', a path, or 'none'", "models", to_field=_stage),
        Flag(
            "--no-asr-batches-alone",
            om,
            "asr_batches_alone",
            "let an engine in the server's process keep stepping while a speech recognition batch runs (by "
            "default it waits: transcripts sooner, the other sessions' steps later)",
            "models",
            switch=True,
            to_field=lambda v: not v,
        ),
        Flag(
            "--no-vad",
            om,
            "vad",
            "no server-side voice activity detection (realtime clients must commit turns themselves)",
            "models",
            switch=True,
            to_field=lambda v: not v,
        ),
        Flag(
            "--no-vision",
            om,
            "vision",
            "ignore the LLM's vision tower",
            "models",
            switch=True,
            to_field=lambda v: not v,
        ),
        Flag("--image-model", om, "image_model", "local diffusers pipeline directory for image output", "models"),
        Flag(
            "--speech-model",
            om,
            "speech_model",
            "Qwen2.5-Omni or Qwen3-Omni checkpoint whose talker and token2wav (code2wav) speak for the LLM (audio "
            "in the model's own voice instead of --tts): 'auto' (the --model directory when it has them), a path, "
            "or 'none' "
            "(default %(default)s)",
            "models",
            to_field=_stage,
        ),
        Flag(
            "--speech-first-chunk-codes",
            om,
            "speech_first_chunk_codes",
            "codes (20 ms of audio each) before a speaking model's first audio: the latency knob; Qwen3-Omni "
            "takes the code2wav frames (80 ms each) covering as much (default: the speech head's: Qwen2.5-Omni 4, "
            "Qwen3-Omni 4 frames)",
            "models",
            type=_positive,
        ),
        Flag(
            "--speech-chunk-codes",
            om,
            "speech_chunk_codes",
            "codes (20 ms each) in each later audio chunk; Qwen3-Omni takes the code2wav frames covering as much "
            "(default: the speech head's: Qwen2.5-Omni 48, Qwen3-Omni 25 frames)",
            "models",
            type=_positive,
        ),
        Flag(
            "--speech-max-codes",
            om,
            "speech_max_codes",
            "codes (20 ms each) of the longest spoken reply; Qwen3-Omni takes the code2wav frames covering as "
            "much (default: the speech head's, about 82 s: Qwen2.5-Omni 4096, Qwen3-Omni 1024 frames)",
            "models",
            type=_positive,
        ),
        Flag(
            "--speech-ode-steps",
            om,
            "speech_ode_steps",
            "flow-matching steps of each audio chunk, Qwen2.5-Omni's token2wav only (default: the speech head's, "
            "Qwen's)",
            "models",
            type=_positive,
        ),
        Flag(
            "--speech-first-chunk-steps",
            om,
            "speech_first_chunk_steps",
            "flow-matching steps of the first audio chunk alone, Qwen2.5-Omni's token2wav only: fewer start the "
            "audio sooner, coarser (default: as --speech-ode-steps)",
            "models",
            type=_positive,
        ),
        Flag(
            "--no-speech-cuda-graphs",
            om,
            "speech_cuda_graphs",
            "run Qwen2.5-Omni's token2wav chunk calls eagerly, not from CUDA graphs captured at load (CUDA only)",
            "models",
            switch=True,
            to_field=lambda v: False if v else None,
        ),
        Flag(
            "--no-speech-first-chunks-alone",
            om,
            "speech_first_chunks_alone",
            "let the engines keep stepping while Qwen2.5-Omni's token2wav runs a first audio chunk (by default "
            "they wait: first audio sooner, the other sessions' steps later)",
            "models",
            switch=True,
            to_field=lambda v: False if v else None,
        ),
        Flag(
            "--speech-dit-dtype",
            om,
            "speech_dit_dtype",
            "precision of Qwen2.5-Omni's token2wav DiT: float32 as the checkpoint's authors run it, or bfloat16 "
            "(tensor cores: keeps up with many more streams; the vocoder stays float32) "
            "(default: the speech head's, float32)",
            "models",
            choices=("float32", "bfloat16"),
        ),
        Flag(
            "--speech-lanes",
            om,
            "speech_lanes",
            "Qwen2.5-Omni's token2wav worker threads, each on its own CUDA stream; with 2 one runs first audio "
            "chunks alone, so they never wait behind another session's later chunk (default: the speech head's, 2)",
            "models",
            type=_positive,
        ),
        Flag(
            "--device",
            eng,
            "device",
            "'auto', 'cpu' or 'cuda[:N]', for the LLM and every other stage (default %(default)s)",
            "engine",
        ),
        Flag(
            "--dtype",
            eng,
            "dtype",
            "weights and activations (default %(default)s)",
            "engine",
            choices=("auto", "float32", "bfloat16", "float16"),
        ),
        Flag(
            "--load-format",
            eng,
            "load_format",
            "'auto' reads the checkpoint's weights; 'dummy' reads only config.json and the tokenizer and runs seeded "
            "random weights (benchmarks without a download) (default %(default)s)",
            "engine",
            choices=("auto", "dummy"),
        ),
        Flag(
            "--quantization",
            eng,
            "quantization",
            "weight quantization; default: the checkpoint's quantization_config (fp8 also quantizes a float "
            "checkpoint at load)",
            "engine",
            choices=("fp8", "awq", "gptq", "compressed-tensors", "none"),
        ),
        Flag(
            "--quantize-lm-head",
            eng,
            "quantize_lm_head",
            "the LM head quantized too: FP8 per channel with FP8 weights (--quantization fp8 or an FP8 "
            "checkpoint), int4 in the checkpoint's groups with an AWQ or GPTQ one; by default it stays in the "
            "model dtype, as in vLLM",
            "engine",
            switch=True,
        ),
        Flag(
            "--kv-cache-dtype",
            eng,
            "kv_cache_dtype",
            "KV cache storage: 'auto' (the model dtype) or 'fp8' (float8_e4m3fn, scale 1.0) (default %(default)s)",
            "engine",
            choices=("auto", "fp8", "fp8_e4m3"),
        ),
        Flag("--max-model-len", eng, "max_model_len", "context length cap (default: the model's)", "engine", type=int),
        Flag(
            "--max-num-seqs",
            eng,
            "max_num_seqs",
            "sequences decoded together (default %(default)s)",
            "engine",
            type=int,
        ),
        Flag(
            "--max-num-batched-tokens",
            eng,
            "max_num_batched_tokens",
            "tokens one engine step processes, prefill chunks and decodes together (default %(default)s)",
            "engine",
            type=int,
        ),
        Flag(
            "--block-size",
            eng,
            "block_size",
            "tokens per KV-cache block, a power of two (default: 16 on CUDA, 8 on the CPU)",
            "engine",
            type=int,
        ),
        Flag(
            "--gpu-memory-utilization",
            eng,
            "gpu_memory_utilization",
            "fraction of GPU memory the engine may use (default %(default)s)",
            "engine",
            type=float,
        ),
        Flag("--enforce-eager", eng, "enforce_eager", "no CUDA graphs", "engine", switch=True),
        Flag(
            "--tensor-parallel-size",
            eng,
            "tensor_parallel_size",
            "split the model over this many GPUs of this machine, one process each; it must divide the "
            "model's attention heads (default %(default)s)",
            "engine",
            type=int,
            aliases=("-tp",),
        ),
        Flag(
            "--enable-expert-parallel",
            eng,
            "enable_expert_parallel",
            "mixture-of-experts models: each tensor-parallel rank holds its share of the experts whole instead "
            "of a slice of every expert",
            "engine",
            switch=True,
        ),
        Flag(
            "--warmup",
            eng,
            "warmup",
            "step shapes run before the server answers: 'full' compiles every kernel and path a request can "
            "hit, 'minimal' one prefill and decode, 'off' none, 'auto' full on CUDA and minimal on the CPU "
            "or over a --compile-cache-dir a full warm-up of the same configuration filled (default %(default)s)",
            "engine",
            choices=("auto", "full", "minimal", "off"),
        ),
        Flag(
            "--compile-cache-dir",
            eng,
            "compile_cache_dir",
            "directory of compiled Triton kernels; keep it on a volume so restarts skip compiling "
            "(default: Triton's, ~/.triton/cache)",
            "engine",
        ),
        Flag(
            "--pipeline-decode",
            eng,
            "pipeline_decode",
            "launch each decode step before the host has read the one in flight (default %(default)s: on with CUDA)",
            "engine",
            choices=("auto", "on", "off"),
        ),
        Flag(
            "--speculative-config",
            eng,
            "speculative_config",
            'speculative decoding as vLLM takes it, a JSON object: {"method": "ngram", "num_speculative_tokens": '
            '4, "prompt_lookup_max": 5} or {"method": "draft_model", "model": PATH, "num_speculative_tokens": 4}; '
            "it turns pipelined decode off (default: none)",
            "engine",
            type=_json_object,
        ),
        Flag(
            "--structured-outputs-compile-timeout",
            eng,
            "structured_outputs_compile_timeout",
            "seconds a request's output constraint may take to compile before it is refused with a 400 "
            "(default %(default)s)",
            "engine",
            type=float,
        ),
        Flag(
            "--structured-outputs-cache-mb",
            eng,
            "structured_outputs_cache_bytes",
            "memory for compiled output constraints, in MiB (default %(default)s)",
            "engine",
            type=int,
            to_field=lambda mib: mib << 20,
            from_field=lambda n: n >> 20,
        ),
        Flag(
            "--data-parallel-size",
            eng,
            "data_parallel_size",
            "engine replicas, each a whole copy of the model; a realtime session stays on one (default %(default)s)",
            "engine",
            type=int,
        ),
        Flag(
            "--distributed-executor-backend",
            eng,
            "distributed_executor_backend",
            "where replicas run: 'mp' processes on this machine, 'ray' actors on a Ray cluster (default %(default)s)",
            "engine",
            choices=("mp", "ray"),
        ),
        Flag(
            "--engine-in-process",
            eng,
            "engine_in_process",
            "run the engine core in a thread of the server's process, not its own (debugging)",
            "engine",
            switch=True,
        ),
        Flag(
            "--enable-lora",
            eng,
            "enable_lora",
            "serve LoRA adapters over the model: each is a model name of its own, loaded by --lora-modules or "
            "POST /v1/load_lora_adapter",
            "lora",
            switch=True,
        ),
        Flag(
            "--lora-modules",
            eng,
            "lora_modules",
            "adapters served from the start, each name=path (a PEFT adapter folder) or a JSON object with "
            "name and path; several after one flag or the flag repeated; they enable LoRA",
            "lora",
            type=_lora_module,
            listing=True,
            many=True,
        ),
        Flag(
            "--max-loras",
            eng,
            "max_loras",
            "adapters resident on the device at once, the most one engine step mixes; beyond them the least "
            "recently used leaves (default %(default)s)",
            "lora",
            type=_positive,
        ),
        Flag(
            "--max-lora-rank",
            eng,
            "max_lora_rank",
            "the largest adapter rank served, up to 64; device memory for adapters grows with it (default %(default)s)",
            "lora",
            type=_positive,
        ),
        Flag("--temperature", om, "temperature", "default %(default)s", "generation", type=float),
        Flag("--top-p", om, "top_p", "default %(default)s", "generation", type=float),
        Flag(
            "--max-tokens", om, "max_tokens", "longest answer in tokens (default %(default)s)", "generation", type=int
        ),
        Flag(
            "--system-prompt",
            om,
            "system_prompt",
            "system message for conversations that bring none (realtime instructions override it)",
            "generation",
        ),
        Flag(
            "--tool-call-parser",
            om,
            "tool_call_parser",
            "the model family's tool-call format, as vLLM names it: hermes (Qwen2.5/Qwen3, Hermes; also "
            "qwen, qwen25, qwen3), llama3_json, mistral (default: hermes, with tool_choice auto served)",
            "generation",
            choices=TOOL_CALL_PARSERS,
        ),
        Flag(
            "--enable-auto-tool-choice",
            om,
            "enable_auto_tool_choice",
            'serve tool_choice "auto" with the --tool-call-parser named (vLLM\'s flag; needs that parser)',
            "generation",
            switch=True,
        ),
    )


FLAG_GROUPS = {
    "network": "network",
    "models": "models",
    "engine": "engine",
    "lora": "LoRA adapters",
    "generation": "generation defaults (for knobs a request leaves unset)",
}
