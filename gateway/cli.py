"""``omni`` command line: ``omni serve`` starts the gateway over the models; ``omni --version``.

Importing this module stays light (no torch): the model side is configured and loaded inside ``serve``.
"""
from __future__ import annotations

import argparse
import logging
import re
import sys
from collections.abc import Sequence
from importlib import metadata
from pathlib import Path

from omni_gateway.gateway.config import GatewayConfig

DISTRIBUTION = "omni-gateway"
_DEFAULTS = GatewayConfig()


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


def _stage(value: str) -> str | None:
    """``none`` disables a model stage; anything else is passed through ("default" or a path)."""
    return None if value.lower() == "none" else value


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="omni", description="Realtime multimodal gateway speaking the OpenAI "
                                     "Realtime and HTTP APIs over a local model stack.")
    parser.add_argument("--version", action="version", version=f"%(prog)s {version()}")
    commands = parser.add_subparsers(dest="command", required=True)
    serve = commands.add_parser("serve", help="serve /v1/realtime and the OpenAI HTTP API")
    net = serve.add_argument_group("network")
    net.add_argument("--host", default=_DEFAULTS.host, help="address to bind (default %(default)s)")
    net.add_argument("--port", type=int, default=_DEFAULTS.port, help="port to bind (default %(default)s)")
    net.add_argument("--api-key", default=None, help="require this key (Bearer header or "
                     "openai-insecure-api-key subprotocol); default: no authentication")
    net.add_argument("--max-frame-mib", type=float, default=_DEFAULTS.max_frame_bytes / 2**20,
                     help="largest WebSocket message accepted, in MiB (default %(default)s)")
    net.add_argument("--max-sessions", type=int, default=_DEFAULTS.max_sessions,
                     help="concurrent realtime sessions (default %(default)s)")
    net.add_argument("--allowed-origin", action="append", default=[], metavar="ORIGIN",
                     help="a browser origin (e.g. https://app.example) that may open /v1/realtime besides this "
                     "server's own; repeatable, '*' allows any (clients without Origin are always allowed)")
    net.add_argument("--max-sessions-per-key", type=int, default=_DEFAULTS.max_sessions_per_key,
                     help="realtime sessions one API key (or client address) may hold (default %(default)s)")
    net.add_argument("--log-level", default="info", choices=["critical", "error", "warning", "info", "debug"])
    models = serve.add_argument_group("models")
    models.add_argument("--model", default="default", help="LLM: 'default' (packaged SmolLM2), a Hugging Face "
                        "directory or a .gguf file")
    models.add_argument("--served-model-name", default=None, help="model name reported to clients")
    models.add_argument("--asr", default="default", help="speech recognition: 'default', a path, or 'none'")
    models.add_argument("--tts", default="default", help="speech synthesis: 'default', a path, or 'none'")
    models.add_argument("--no-vad", action="store_true", help="no server-side voice activity detection "
                        "(realtime clients must commit turns themselves)")
    models.add_argument("--no-vision", action="store_true", help="ignore the LLM's vision tower")
    models.add_argument("--image-model", default=None, help="local diffusers pipeline directory for image output")
    engine = serve.add_argument_group("engine")
    engine.add_argument("--device", default="auto", help="'auto', 'cpu' or 'cuda' (default %(default)s)")
    engine.add_argument("--dtype", default="auto", choices=["auto", "float32", "bfloat16", "float16"])
    engine.add_argument("--max-model-len", type=int, default=None, help="context length cap")
    engine.add_argument("--max-num-seqs", type=int, default=256, help="sequences decoded together")
    engine.add_argument("--gpu-memory-utilization", type=float, default=0.85)
    engine.add_argument("--enforce-eager", action="store_true", help="no CUDA graphs")
    engine.add_argument("--pipeline-decode", default="auto", choices=["auto", "on", "off"],
                        help="launch each decode step before the host has read the one in flight "
                             "(default %(default)s: on with CUDA)")
    gen = serve.add_argument_group("generation defaults (for knobs a request leaves unset)")
    # None keeps omni.config.OmniConfig's defaults (0.7, 0.95 and 512), defined there once.
    gen.add_argument("--temperature", type=float, default=None, help="default 0.7")
    gen.add_argument("--top-p", type=float, default=None, help="default 0.95")
    gen.add_argument("--max-tokens", type=int, default=None, help="longest answer in tokens (default 512)")
    gen.add_argument("--system-prompt", default=None,
                     help="system message for conversations that bring none (realtime instructions override it)")
    return parser


def gateway_config(args: argparse.Namespace) -> GatewayConfig:
    return GatewayConfig(host=args.host, port=args.port, api_key=args.api_key or None,
                         max_frame_bytes=int(args.max_frame_mib * 2**20), max_sessions=args.max_sessions,
                         allowed_origins=tuple(args.allowed_origin),
                         max_sessions_per_key=args.max_sessions_per_key)


def serve(args: argparse.Namespace) -> None:
    import uvicorn

    from omni_gateway import omni
    from omni_gateway.gateway.app import create_app
    # omni.config re-exports the engine's config type, so the gateway never names the engine package.
    from omni_gateway.omni.config import EngineConfig, OmniConfig

    config = gateway_config(args)
    omni_config = OmniConfig(
        engine=EngineConfig(model=args.model, device=args.device, dtype=args.dtype, max_model_len=args.max_model_len,
                            max_num_seqs=args.max_num_seqs, gpu_memory_utilization=args.gpu_memory_utilization,
                            enforce_eager=args.enforce_eager, pipeline_decode=args.pipeline_decode),
        asr=_stage(args.asr), tts=_stage(args.tts), vad=not args.no_vad, vision=not args.no_vision,
        image_model=args.image_model, device=args.device, served_model_name=args.served_model_name,
        system_prompt=args.system_prompt,
        **{k: v for k, v in (("temperature", args.temperature), ("top_p", args.top_p), ("max_tokens", args.max_tokens))
           if v is not None})
    print(f"omni {version()}: loading models (model={args.model}, asr={omni_config.asr}, tts={omni_config.tts}, "
          f"vad={omni_config.vad}) ...", flush=True)
    try:
        backend = omni.load_backend(omni_config)
    except Exception as exc:  # a bad path or checkpoint: say what failed, without a traceback
        raise SystemExit(f"omni: could not load the models: {type(exc).__name__}: {exc}") from exc
    app = create_app(backend, config)
    shown_host = "127.0.0.1" if config.host in ("0.0.0.0", "") else config.host
    print(f"omni: serving {backend.capabilities.model} at http://{shown_host}:{config.port}/v1 "
          f"(realtime: ws://{shown_host}:{config.port}/v1/realtime"
          f"{', API key required' if config.api_key else ''})", flush=True)
    uvicorn.run(app, host=config.host, port=config.port, log_level=args.log_level,
                ws_max_size=config.max_frame_bytes)


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
