"""``omni`` command line: argument mapping onto OmniConfig/GatewayConfig, startup line, version."""

from __future__ import annotations

import subprocess
import sys
from typing import Any

import pytest
from omni_gateway.gateway import cli, cli_flags
from omni_gateway.gateway.cli_flags.flag import Flag, field_default

from tests.harness.fake_backend import FakeBackend


def test_version_flag(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_info:
        cli.main(["--version"])
    assert exit_info.value.code == 0
    out = capsys.readouterr().out
    assert out.startswith("omni ") and out.split()[1][0].isdigit()


def test_importing_the_cli_loads_neither_torch_nor_the_engine() -> None:
    heavy = ("torch", "omni_gateway.engine", "omni_gateway.omni.pipeline")
    code = f"import sys, omni_gateway.gateway.cli; print(sorted(m for m in {heavy!r} if m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


def test_serve_builds_configs_loads_the_backend_and_runs_uvicorn(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    import uvicorn
    from omni_gateway import omni

    loaded: dict[str, Any] = {}

    def load_backend(config: Any) -> FakeBackend:
        loaded["config"] = config
        return FakeBackend()

    def run(app: Any, **kwargs: Any) -> None:
        loaded["app"], loaded["run"] = app, kwargs

    monkeypatch.setattr(omni, "load_backend", load_backend)
    monkeypatch.setattr(uvicorn, "run", run)
    assert (
        cli.main(
            [
                "serve",
                "--host",
                "0.0.0.0",
                "--port",
                "9123",
                "--model",
                "/models/x.gguf",
                "--asr",
                "none",
                "--tts",
                "/voices/v.onnx",
                "--no-vad",
                "--api-key",
                "k",
                "--max-frame-mib",
                "2",
                "--device",
                "cpu",
                "--image-model",
                "/models/dit",
                "--pipeline-decode",
                "off",
            ]
        )
        == 0
    )
    config = loaded["config"]
    assert config.engine.model == "/models/x.gguf" and config.engine.device == "cpu"
    assert config.engine.pipeline_decode == "off"
    assert (config.asr, config.tts, config.vad, config.image_model) == (None, "/voices/v.onnx", False, "/models/dit")
    assert loaded["run"]["host"] == "0.0.0.0" and loaded["run"]["port"] == 9123
    assert loaded["run"]["ws_max_size"] == 2 * 2**20 and loaded["run"]["ws_per_message_deflate"] is False
    gateway_config = loaded["app"].state.config
    assert gateway_config.api_key == "k" and gateway_config.max_frame_bytes == 2 * 2**20
    out = capsys.readouterr().out
    assert "ws://127.0.0.1:9123/v1/realtime" in out and "API key required" in out


def test_serve_requires_a_command() -> None:
    with pytest.raises(SystemExit):
        cli.main([])


def test_generation_defaults_reach_the_config_and_unset_ones_keep_the_model_side_defaults(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import uvicorn
    from omni_gateway import omni
    from omni_gateway.omni.config import OmniConfig

    seen: list[Any] = []
    monkeypatch.setattr(omni, "load_backend", lambda config: seen.append(config) or FakeBackend())
    monkeypatch.setattr(uvicorn, "run", lambda app, **kwargs: None)
    cli.main(["serve", "--temperature", "0", "--max-tokens", "40", "--system-prompt", "Be brief."])
    cli.main(["serve"])
    assert (seen[0].temperature, seen[0].max_tokens, seen[0].system_prompt) == (0.0, 40, "Be brief.")
    assert seen[0].top_p == OmniConfig().top_p
    assert (seen[1].temperature, seen[1].max_tokens, seen[1].system_prompt) == (
        OmniConfig().temperature,
        OmniConfig().max_tokens,
        None,
    )


def test_a_model_that_cannot_load_ends_with_a_one_line_reason(monkeypatch: pytest.MonkeyPatch) -> None:
    from omni_gateway import omni

    def fail(config: Any) -> Any:
        raise FileNotFoundError("model path '/nope' does not exist")

    monkeypatch.setattr(omni, "load_backend", fail)
    with pytest.raises(SystemExit) as exit_info:
        cli.main(["serve", "--model", "/nope"])
    assert "could not load the models" in str(exit_info.value.code) and "/nope" in str(exit_info.value.code)


def _serve_actions() -> list[Any]:
    parser = cli.build_parser()
    commands = next(a for a in parser._actions if a.dest == "command")
    return [a for a in commands.choices["serve"]._actions if a.dest != "help"]


FLAGS_WITHOUT_FIELD = {"log_level"}  # process logging, not a setting of the server or the models


def test_every_flag_sets_a_config_field_and_defaults_to_that_fields_default() -> None:
    flags = {flag.dest: flag for flag in cli_flags.serve_flags()}
    for action in _serve_actions():
        if action.dest in FLAGS_WITHOUT_FIELD:
            continue
        assert action.dest in flags, f"{action.option_strings} sets no config field"
        flag = flags[action.dest]
        default = field_default(flag.owner, flag.field)
        parsed = tuple(action.default) if flag.listing else action.default
        assert flag.to_field(parsed) == default, (action.option_strings, action.default, default)
    assert {a.dest for a in _serve_actions()} - FLAGS_WITHOUT_FIELD == set(flags)


def test_no_flags_build_the_default_configs() -> None:
    from omni_gateway.gateway.config import GatewayConfig
    from omni_gateway.omni.config import OmniConfig

    assert cli.configs(cli.build_parser().parse_args(["serve"])) == (GatewayConfig(), OmniConfig())


# One non-default command-line value per flag; a flag added without a value here fails the test below.
SAMPLES = {
    "--host": "10.0.0.5",
    "--port": "9001",
    "--api-key": "k",
    "--allowed-hosts": "a.example,b.example",
    "--allowed-origins": "https://app.example",
    "--ice-server": "turn:user:secret@turn.example:3478?transport=tcp",
    "--max-frame-mib": "2",
    "--ws-compression": None,
    "--max-sessions": "3",
    "--max-voice-sessions": "2",
    "--voice-admission-rtf": "0.75",
    "--max-stored-responses": "12",
    "--max-sessions-per-key": "2",
    "--model": "/m.gguf",
    "--served-model-name": "m",
    "--asr": "none",
    "--tts": "/v.onnx",
    "--no-vad": None,
    "--no-asr-batches-alone": None,
    "--no-vision": None,
    "--image-model": "/dit",
    "--speech-model": "/omni",
    "--speech-first-chunk-codes": "6",
    "--speech-chunk-codes": "24",
    "--speech-max-codes": "1000",
    "--speech-ode-steps": "6",
    "--speech-first-chunk-steps": "4",
    "--no-speech-cuda-graphs": None,
    "--no-speech-first-chunks-alone": None,
    "--speech-dit-dtype": "bfloat16",
    "--speech-lanes": "2",
    "--device": "cpu",
    "--dtype": "float16",
    "--load-format": "dummy",
    "--quantization": "fp8",
    "--quantize-lm-head": None,
    "--kv-cache-dtype": "fp8",
    "--max-model-len": "1024",
    "--max-num-seqs": "8",
    "--max-num-batched-tokens": "512",
    "--block-size": "32",
    "--gpu-memory-utilization": "0.5",
    "--enforce-eager": None,
    "--enable-expert-parallel": None,
    "--tensor-parallel-size": "2",
    "--warmup": "off",
    "--compile-cache-dir": "/var/cache/omni",
    "--pipeline-decode": "off",
    "--structured-outputs-compile-timeout": "2.5",
    "--structured-outputs-cache-mb": "64",
    "--data-parallel-size": "2",
    "--distributed-executor-backend": "ray",
    "--engine-in-process": None,
    "--speculative-config": '{"method": "ngram", "num_speculative_tokens": 2}',
    "--enable-lora": None,
    "--lora-modules": "persona=/adapters/persona",
    "--max-loras": "4",
    "--max-lora-rank": "32",
    "--temperature": "0.1",
    "--top-p": "0.5",
    "--max-tokens": "7",
    "--system-prompt": "Be brief.",
    "--tool-call-parser": "llama3_json",
    "--enable-auto-tool-choice": None,
}
# An explicit device resolves the default block size; naming adapters turns LoRA on.
DERIVED = {"--device": {"engine.block_size"}, "--lora-modules": {"engine.enable_lora"}}


@pytest.mark.parametrize("flag", cli_flags.serve_flags(), ids=lambda flag: flag.name)
def test_each_flag_changes_exactly_its_own_field(flag: Flag) -> None:
    import dataclasses

    assert flag.name in SAMPLES, f"add a sample value for {flag.name}"
    sample = SAMPLES[flag.name]
    argv = ["serve", flag.name] + ([] if sample is None else [sample])
    gateway, omni_config = cli.configs(cli.build_parser().parse_args(argv))
    default_gateway, default_omni = cli.configs(cli.build_parser().parse_args(["serve"]))

    def changed(new: Any, old: Any, prefix: str) -> set[str]:
        return {prefix + f.name for f in dataclasses.fields(new) if getattr(new, f.name) != getattr(old, f.name)}

    differences = (
        changed(gateway, default_gateway, "gateway.")
        | (changed(omni_config, default_omni, "omni.") - {"omni.engine"})
        | changed(omni_config.engine, default_omni.engine, "engine.")
    ) - DERIVED.get(flag.name, set())
    owner = {"GatewayConfig": "gateway.", "EngineConfig": "engine.", "OmniConfig": "omni."}[flag.owner.__name__]
    assert differences == {owner + flag.field}


def test_lora_modules_take_vllm_spellings() -> None:
    argv = ["serve", "--lora-modules", "a=/x/a", '{"name": "b", "path": "/x/b"}', "--lora-modules", "c=/x/c"]
    _, omni_config = cli.configs(cli.build_parser().parse_args(argv))
    assert omni_config.engine.lora_modules == (("a", "/x/a"), ("b", "/x/b"), ("c", "/x/c"))
    assert omni_config.engine.enable_lora
    with pytest.raises(SystemExit):
        cli.build_parser().parse_args(["serve", "--lora-modules", "no-path"])


def test_engine_sizing_flags_reach_the_engine_config() -> None:
    _, omni_config = cli.configs(
        cli.build_parser().parse_args(
            ["serve", "--max-num-batched-tokens", "4096", "--block-size", "32", "--device", "cuda"]
        )
    )
    assert (omni_config.engine.max_num_batched_tokens, omni_config.engine.block_size) == (4096, 32)
    assert omni_config.engine.device == "cuda" and not hasattr(omni_config, "device")  # one device setting


def test_warmup_and_compile_cache_flags_reach_the_engine_config() -> None:
    _, omni_config = cli.configs(
        cli.build_parser().parse_args(["serve", "--warmup", "minimal", "--compile-cache-dir", "/cache"])
    )
    assert (omni_config.engine.warmup, omni_config.engine.compile_cache_dir) == ("minimal", "/cache")
    with pytest.raises(SystemExit):
        cli.build_parser().parse_args(["serve", "--warmup", "sometimes"])


def test_host_lists_accept_repeats_and_commas() -> None:
    gateway, _ = cli.configs(
        cli.build_parser().parse_args(
            ["serve", "--allowed-hosts", "a.example, b.example", "--allowed-hosts", "c.example"]
        )
    )
    assert gateway.allowed_hosts == ("a.example", "b.example", "c.example")


@pytest.mark.parametrize(
    ("argv", "warned"),
    [
        (["--host", "0.0.0.0"], True),
        (["--allowed-hosts", "*"], True),
        (["--host", "0.0.0.0", "--allowed-hosts", "box.lan"], False),
        (["--host", "0.0.0.0", "--api-key", "k"], False),
        ([], False),
    ],
)
def test_accepting_any_host_without_a_key_is_warned_at_startup(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture, argv: list[str], warned: bool
) -> None:
    import uvicorn
    from omni_gateway import omni

    monkeypatch.setattr(omni, "load_backend", lambda config: FakeBackend())
    monkeypatch.setattr(uvicorn, "run", lambda app, **kwargs: None)
    with caplog.at_level("WARNING", logger="omni_gateway.gateway.cli"):
        cli.main(["serve", *argv])
    assert any("--allowed-hosts" in r.getMessage() for r in caplog.records) == warned


def test_speech_model_flag_takes_auto_a_path_or_none() -> None:
    def speech(*argv: str) -> str | None:
        return cli.configs(cli.build_parser().parse_args(["serve", *argv]))[1].speech_model

    assert speech() == "auto"  # an Omni checkpoint given as --model speaks in its own voice
    assert speech("--speech-model", "/omni") == "/omni"
    assert speech("--speech-model", "none") is None


def test_speech_chunking_flags_take_positive_counts() -> None:
    parser = cli.build_parser()
    _, omni_config = cli.configs(parser.parse_args(["serve", "--speech-first-chunk-codes", "2"]))
    assert omni_config.speech_first_chunk_codes == 2 and omni_config.speech_chunk_codes is None
    for bad in ("0", "-3", "four"):
        with pytest.raises(SystemExit):
            parser.parse_args(["serve", "--speech-first-chunk-codes", bad])


def test_voice_admission_rtf_takes_a_limit_from_0_to_1_5_and_says_so_otherwise(
    capsys: pytest.CaptureFixture[str],
) -> None:
    parser = cli.build_parser()

    def limit(*argv: str) -> float:
        return cli.configs(parser.parse_args(["serve", *argv]))[0].voice_admission_rtf

    assert limit() == 0.9 and limit("--voice-admission-rtf", "0") == 0 and limit("--voice-admission-rtf", "1.5") == 1.5
    for bad in ("fast", "-0.1", "1.6", "nan"):
        with pytest.raises(SystemExit):
            parser.parse_args(["serve", "--voice-admission-rtf", bad])
        error = capsys.readouterr().err
        assert "--voice-admission-rtf" in error and "from 0 (off) to 1.5" in error and bad in error, error


def test_ice_servers_parse_with_their_credentials_and_bad_ones_are_refused(capsys: pytest.CaptureFixture[str]) -> None:
    from omni_gateway.gateway.realtime.webrtc_config import IceServer

    argv = ["serve", "--ice-server", "stun:stun.example:3478", "--ice-server", "turn:u:p@turn.example:3478"]
    gateway, _ = cli.configs(cli.build_parser().parse_args(argv))
    assert gateway.ice_servers == (
        IceServer("stun:stun.example:3478"),
        IceServer("turn:turn.example:3478", "u", "p"),
    )
    assert cli.configs(cli.build_parser().parse_args(["serve"]))[0].ice_servers == ()  # host candidates only
    for bad in ("http://turn.example", "turn:u@turn.example", "stun:u:p@stun.example"):
        with pytest.raises(SystemExit):
            cli.build_parser().parse_args(["serve", "--ice-server", bad])
        assert "ICE server" in capsys.readouterr().err
