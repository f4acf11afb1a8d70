"""``omni`` command line: ``omni serve`` starts the gateway over the models; ``omni --version``.

Its flags are a table (``cli_flags``), each row naming the config field it sets.

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
from typing import TYPE_CHECKING, Any

from omni_gateway.gateway.cli_flags import FLAG_GROUPS, serve_flags
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


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="omni",
        description="Realtime multimodal gateway speaking the OpenAI Realtime and HTTP APIs over a local model stack.",
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {version()}")
    commands = parser.add_subparsers(dest="command", required=True)
    serve = commands.add_parser("serve", help="serve /v1/realtime and the OpenAI HTTP API")
    groups = {key: serve.add_argument_group(title) for key, title in FLAG_GROUPS.items()}
    for flag in serve_flags():
        group = groups[flag.group]
        if flag.switch:
            group.add_argument(flag.name, *flag.aliases, action="store_true", help=flag.help)
        elif flag.listing:
            group.add_argument(
                flag.name,
                action="extend",
                nargs="+" if flag.many else None,
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
    for flag in serve_flags():
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
