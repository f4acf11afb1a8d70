"""``omni`` command line: argument mapping onto OmniConfig/GatewayConfig, startup line, version."""
from __future__ import annotations

import subprocess
import sys
from typing import Any

import pytest

from fakes import FakeBackend
from omni_gateway.gateway import cli


def test_version_flag(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_info:
        cli.main(["--version"])
    assert exit_info.value.code == 0
    out = capsys.readouterr().out
    assert out.startswith("omni ") and out.split()[1][0].isdigit()


def test_importing_the_cli_loads_neither_torch_nor_the_engine() -> None:
    code = "import sys, omni_gateway.gateway.cli; print(sorted(m for m in ('torch', 'omni_gateway.engine', 'omni_gateway.omni.pipeline') if m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


def test_serve_builds_configs_loads_the_backend_and_runs_uvicorn(monkeypatch: pytest.MonkeyPatch,
                                                                   capsys: pytest.CaptureFixture[str]) -> None:
    from omni_gateway import omni
    import uvicorn

    loaded: dict[str, Any] = {}

    def load_backend(config: Any) -> FakeBackend:
        loaded["config"] = config
        return FakeBackend()

    def run(app: Any, **kwargs: Any) -> None:
        loaded["app"], loaded["run"] = app, kwargs

    monkeypatch.setattr(omni, "load_backend", load_backend)
    monkeypatch.setattr(uvicorn, "run", run)
    assert cli.main(["serve", "--host", "0.0.0.0", "--port", "9123", "--model", "/models/x.gguf", "--asr", "none",
                     "--tts", "/voices/v.onnx", "--no-vad", "--api-key", "k", "--max-frame-mib", "2",
                     "--device", "cpu", "--image-model", "/models/dit", "--pipeline-decode", "off"]) == 0
    config = loaded["config"]
    assert config.engine.model == "/models/x.gguf" and config.engine.device == "cpu"
    assert config.engine.pipeline_decode == "off"
    assert (config.asr, config.tts, config.vad, config.image_model) == (None, "/voices/v.onnx", False, "/models/dit")
    assert loaded["run"]["host"] == "0.0.0.0" and loaded["run"]["port"] == 9123
    assert loaded["run"]["ws_max_size"] == 2 * 2**20
    gateway_config = loaded["app"].state.config
    assert gateway_config.api_key == "k" and gateway_config.max_frame_bytes == 2 * 2**20
    out = capsys.readouterr().out
    assert "ws://127.0.0.1:9123/v1/realtime" in out and "API key required" in out


def test_serve_requires_a_command() -> None:
    with pytest.raises(SystemExit):
        cli.main([])


def test_generation_defaults_reach_the_config_and_unset_ones_keep_the_model_side_defaults(
        monkeypatch: pytest.MonkeyPatch) -> None:
    from omni_gateway import omni
    import uvicorn

    from omni_gateway.omni.config import OmniConfig

    seen: list[Any] = []
    monkeypatch.setattr(omni, "load_backend", lambda config: seen.append(config) or FakeBackend())
    monkeypatch.setattr(uvicorn, "run", lambda app, **kwargs: None)
    cli.main(["serve", "--temperature", "0", "--max-tokens", "40", "--system-prompt", "Be brief."])
    cli.main(["serve"])
    assert (seen[0].temperature, seen[0].max_tokens, seen[0].system_prompt) == (0.0, 40, "Be brief.")
    assert seen[0].top_p == OmniConfig().top_p
    assert (seen[1].temperature, seen[1].max_tokens, seen[1].system_prompt) == (
        OmniConfig().temperature, OmniConfig().max_tokens, None)


def test_a_model_that_cannot_load_ends_with_a_one_line_reason(monkeypatch: pytest.MonkeyPatch) -> None:
    from omni_gateway import omni
    def fail(config: Any) -> Any:
        raise FileNotFoundError("model path '/nope' does not exist")

    monkeypatch.setattr(omni, "load_backend", fail)
    with pytest.raises(SystemExit) as exit_info:
        cli.main(["serve", "--model", "/nope"])
    assert "could not load the models" in str(exit_info.value.code) and "/nope" in str(exit_info.value.code)
