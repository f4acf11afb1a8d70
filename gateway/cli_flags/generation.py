"""``omni serve``'s generation flags: the defaults for what a request leaves unset, and tool calling."""

from __future__ import annotations

from omni_gateway.gateway.cli_flags.flag import Flag


def generation_flags() -> tuple[Flag, ...]:
    # Imported here: omni.config names the engine's config type, and importing the CLI stays light.
    from omni_gateway.omni.config import TOOL_CALL_PARSERS, OmniConfig

    om = OmniConfig
    return (
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
