"""``omni`` command line: ``omni serve`` starts the gateway over the models; ``omni --version``.

Importing this module stays light (no torch): the model side is configured and loaded inside ``serve``.
"""

from __future__ import annotations

import argparse
import logging
import re
import sys
from collections.abc import Callable, Sequence
from dataclasses import MISSING, dataclass, fields
from importlib import metadata
from pathlib import Path
from typing import TYPE_CHECKING, Any

from omni_gateway.gateway.config import GatewayConfig

if TYPE_CHECKING:
    from omni_gateway.omni.config import OmniConfig

DISTRIBUTION = "omni-gateway"
log = logging.getLogger("omni_gateway.gateway.cli")


def version() -> str:
    try:
        return metadata.version(DISTRIBUTION)
    except metadata.PackageNotFoundError:  # running from a source checkout
        pyproject = Path(__file__).resolve().parents[1] / "pyproject.toml"
        if pyproject.is_file():
            found = re.search(r'^version\s*=\s*"([^"]+)"', pyproject.read_text(), re.MULTILINE)
            if found:
                return found.group(1)
        return "unknown"


def _stage(value: str | None) -> str | None:
    """``none`` disables a model stage; anything else is passed through ("default" or a path)."""
    return None if value is None or value.lower() == "none" else value


def _names(value: str) -> list[str]:
    """One occurrence of a list flag: a name or a comma-separated list of them."""
    return [part.strip() for part in value.split(",") if part.strip()]


def _same(value: Any) -> Any:
    return value


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


def _flags() -> tuple[Flag, ...]:
    # Imported here: omni.config names the engine's config type, and importing the CLI stays light.
    from omni_gateway.omni.config import EngineConfig, OmniConfig

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
            "Qwen2.5-Omni checkpoint whose talker and token2wav speak for the LLM (audio in the model's own "
            "voice instead of --tts): 'auto' (the --model directory when it has them), a path, or 'none' "
            "(default %(default)s)",
            "models",
            to_field=_stage,
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
            "--quantization",
            eng,
            "quantization",
            "weight quantization; default: the checkpoint's quantization_config (fp8 also quantizes a float "
            "checkpoint at load)",
            "engine",
            choices=("fp8", "awq", "gptq", "compressed-tensors", "none"),
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
    )


_GROUPS = {
    "network": "network",
    "models": "models",
    "engine": "engine",
    "generation": "generation defaults (for knobs a request leaves unset)",
}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="omni",
        description="Realtime multimodal gateway speaking the OpenAI Realtime and HTTP APIs over a local model stack.",
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {version()}")
    commands = parser.add_subparsers(dest="command", required=True)
    serve = commands.add_parser("serve", help="serve /v1/realtime and the OpenAI HTTP API")
    groups = {key: serve.add_argument_group(title) for key, title in _GROUPS.items()}
    for flag in _flags():
        group = groups[flag.group]
        if flag.switch:
            group.add_argument(flag.name, *flag.aliases, action="store_true", help=flag.help)
        elif flag.listing:
            group.add_argument(
                flag.name,
                action="extend",
                type=flag.type,
                default=list(flag.default()),
                metavar=flag.dest.removesuffix("s").upper(),
                help=flag.help,
            )
        else:
            group.add_argument(
                flag.name,
                *flag.aliases,
                type=flag.type,
                choices=flag.choices,
                default=flag.default(),
                help=flag.help,
            )
    groups["network"].add_argument(
        "--log-level", default="info", choices=["critical", "error", "warning", "info", "debug"]
    )
    return parser


def configs(args: argparse.Namespace) -> tuple[GatewayConfig, OmniConfig]:
    """The gateway's and the model side's config from parsed ``serve`` arguments, through the flag table."""
    from omni_gateway.omni.config import EngineConfig, OmniConfig

    values: dict[type, dict[str, Any]] = {GatewayConfig: {}, EngineConfig: {}, OmniConfig: {}}
    for flag in _flags():
        value = getattr(args, flag.dest)
        values[flag.owner][flag.field] = flag.to_field(tuple(value) if flag.listing else value)
    engine = EngineConfig(**values[EngineConfig])
    return GatewayConfig(**values[GatewayConfig]), OmniConfig(engine=engine, **values[OmniConfig])


def serve(args: argparse.Namespace) -> None:
    import uvicorn
    from omni_gateway import omni
    from omni_gateway.gateway.app import create_app

    config, omni_config = configs(args)
    if config.host_allow_list() is None and config.api_key is None:
        log.warning(
            "any Host header is accepted (bound to %s without --allowed-hosts, or '*'): a web page whose "
            "name resolves to this machine can drive this server; name its hosts with --allowed-hosts "
            "or require a key with --api-key",
            config.host or "every interface",
        )
    print(
        f"omni {version()}: loading models (model={omni_config.engine.model}, asr={omni_config.asr}, "
        f"tts={omni_config.tts}, "
        f"vad={omni_config.vad}) ...",
        flush=True,
    )
    try:
        backend = omni.load_backend(omni_config)
    except Exception as exc:  # a bad path or checkpoint: say what failed, without a traceback
        raise SystemExit(f"omni: could not load the models: {type(exc).__name__}: {exc}") from exc
    app = create_app(backend, config)
    shown_host = "127.0.0.1" if config.serves_all_interfaces else config.host
    print(
        f"omni: serving {backend.capabilities.model} at http://{shown_host}:{config.port}/v1 "
        f"(realtime: ws://{shown_host}:{config.port}/v1/realtime"
        f"{', API key required' if config.api_key else ''})",
        flush=True,
    )
    uvicorn.run(
        app,
        host=config.host,
        port=config.port,
        log_level=args.log_level,
        ws_max_size=config.max_frame_bytes,
        ws_per_message_deflate=config.ws_compression,
    )


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=getattr(logging, args.log_level.upper()), format="%(levelname)s %(name)s: %(message)s")
    try:
        serve(args)
    except KeyboardInterrupt:
        return 0
    return 0


if __name__ == "__main__":
    sys.exit(main())
