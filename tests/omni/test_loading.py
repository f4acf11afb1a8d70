"""Loading the stages: the voice stages before the engine, and the start-up advice to run CUDA MPS."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest
from omni_gateway.omni.loading import _on_cuda, mps_advice


def test_the_advice_comes_only_for_gpu_stages_beside_a_separate_core_without_an_mps_daemon(tmp_path: Path) -> None:
    env = {"CUDA_MPS_PIPE_DIRECTORY": str(tmp_path)}
    advice = mps_advice(engine_apart=True, stages_on_cuda=True, environ=env)
    assert advice is not None and str(tmp_path) in advice and "nvidia-cuda-mps-control -d" in advice
    assert mps_advice(engine_apart=False, stages_on_cuda=True, environ=env) is None  # one process, one context
    assert mps_advice(engine_apart=True, stages_on_cuda=False, environ=env) is None  # nothing of ours on the GPU
    (tmp_path / "control").touch()  # the daemon's control pipe
    assert mps_advice(engine_apart=True, stages_on_cuda=True, environ=env) is None


def test_a_stage_is_on_cuda_when_it_or_the_model_it_wraps_says_so() -> None:
    vits = SimpleNamespace(device="cuda:0")
    head = SimpleNamespace(synthesizer=SimpleNamespace(synthesizer=vits))  # TtsHead -> batcher -> model
    assert _on_cuda(head)
    assert _on_cuda(SimpleNamespace(recognizer=SimpleNamespace(device="cuda")))
    assert not _on_cuda(SimpleNamespace(recognizer=SimpleNamespace(device="cpu")))
    assert not _on_cuda(SimpleNamespace(synthesizer=SimpleNamespace())) and not _on_cuda(None)


def test_the_voice_stages_load_before_the_engine_sizes_its_kv_cache(monkeypatch: pytest.MonkeyPatch) -> None:
    """The engine takes its share of the memory still free: loaded first, the voice stages keep theirs, and
    an engine that fails to start leaves no voice stage's worker running."""
    import omni_gateway.encoders.asr as asr_module
    import omni_gateway.engine.frontend.launch as launch
    from omni_gateway.omni.config import EngineConfig, OmniConfig
    from omni_gateway.omni.heads.tts.head import TtsHead
    from omni_gateway.omni.loading import load_pipeline

    order: list[str] = []

    class EngineDidNotStart(Exception):
        pass

    def start_engine(*args: object, **kwargs: object) -> None:
        order.append("engine")
        raise EngineDidNotStart

    monkeypatch.setattr(launch, "start_engine", start_engine)

    def stage(name: str) -> SimpleNamespace:
        order.append(name)
        return SimpleNamespace(close=lambda: order.append(f"close {name}"))

    monkeypatch.setattr(asr_module, "load_recognizer", lambda *a, **k: stage("asr"))
    monkeypatch.setattr(TtsHead, "load", classmethod(lambda cls, *a, **k: stage("tts")))
    config = OmniConfig(engine=EngineConfig(device="cpu"), asr="asr-dir", tts="tts-dir", speech_model=None)
    with pytest.raises(EngineDidNotStart):
        load_pipeline(config)
    assert order == ["asr", "tts", "engine", "close asr", "close tts"]


def test_a_voice_that_fails_to_load_stops_the_recognizer_loaded_before_it(monkeypatch: pytest.MonkeyPatch) -> None:
    import omni_gateway.encoders.asr as asr_module
    import omni_gateway.engine.frontend.launch as launch
    from omni_gateway.omni.config import EngineConfig, OmniConfig
    from omni_gateway.omni.heads.tts.head import TtsHead
    from omni_gateway.omni.loading import load_pipeline

    order: list[str] = []

    def no_voice(*args: object, **kwargs: object) -> None:
        raise FileNotFoundError("TTS model 'tts-dir': no config.json")

    monkeypatch.setattr(launch, "start_engine", lambda *a, **k: order.append("engine"))
    monkeypatch.setattr(
        asr_module, "load_recognizer", lambda *a, **k: SimpleNamespace(close=lambda: order.append("close asr"))
    )
    monkeypatch.setattr(TtsHead, "load", classmethod(no_voice))
    config = OmniConfig(engine=EngineConfig(device="cpu"), asr="asr-dir", tts="tts-dir", speech_model=None)
    with pytest.raises(FileNotFoundError, match="no config.json"):
        load_pipeline(config)
    assert order == ["close asr"]  # and the engine never started


def test_a_speaking_model_under_tensor_parallel_is_refused_before_anything_loads(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Its talker reads the thinker's hidden states, which one rank alone hands out: refused up front, not a
    hang at the first spoken turn."""
    import omni_gateway.engine.frontend.launch as launch
    from omni_gateway.engine.config import EngineConfig
    from omni_gateway.omni.config import OmniConfig
    from omni_gateway.omni.loading import load_pipeline

    monkeypatch.setattr(launch, "start_engine", lambda *a, **k: pytest.fail("the engine must not start"))
    config = OmniConfig(
        engine=EngineConfig(device="cpu", tensor_parallel_size=2), asr=None, tts=None, speech_model="/models/omni"
    )
    with pytest.raises(ValueError, match="tensor_parallel_size 1, got 2.*--speech-model none"):
        load_pipeline(config)


def test_the_speech_flags_set_the_heads_chunking_over_its_defaults() -> None:
    from omni_gateway.omni.config import OmniConfig
    from omni_gateway.omni.heads.token2wav.head import Token2WavConfig
    from omni_gateway.omni.speech import SpeechConfig
    from omni_gateway.omni.speech_settings import speech_config

    assert speech_config(OmniConfig()).token2wav == Token2WavConfig()  # nothing set: the head's own
    chosen = speech_config(
        OmniConfig(
            speech_first_chunk_codes=2,
            speech_first_chunk_steps=4,
            speech_cuda_graphs=False,
            speech_first_chunks_alone=False,
            speech_dit_dtype="bfloat16",
            speech_lanes=1,
        )
    )
    default = Token2WavConfig()
    assert (chosen.token2wav.first_chunk_codes, chosen.token2wav.first_chunk_steps) == (2, 4)
    assert chosen.token2wav.dit_dtype == "bfloat16" and default.dit_dtype == "float32"
    assert (chosen.token2wav.lanes, default.lanes) == (1, 2)
    assert (chosen.token2wav.cuda_graphs, default.cuda_graphs) == (False, True)
    assert (chosen.token2wav.first_chunks_alone, default.first_chunks_alone) == (False, True)
    assert chosen.token2wav.chunk_codes == default.chunk_codes
    assert chosen.max_codes == SpeechConfig().max_codes == 4096
    assert speech_config(OmniConfig(speech_max_codes=500)).max_codes == 500


def test_the_speech_sizes_become_qwen3_code2wav_frames_covering_as_much_audio() -> None:
    from omni_gateway.omni.config import OmniConfig
    from omni_gateway.omni.heads.code2wav.stream import Chunking
    from omni_gateway.omni.qwen3_speech import Qwen3SpeechConfig
    from omni_gateway.omni.speech_settings import frames_for_codes, qwen3_speech_config

    released = 1920  # samples per frame of the released checkpoint's code2wav: 80 ms at 24 kHz, 4 codes' worth
    assert qwen3_speech_config(OmniConfig(), released) == Qwen3SpeechConfig()  # nothing set: the head's own
    assert [frames_for_codes(n, released) for n in (1, 4, 5, 8, 100, 4096)] == [1, 1, 2, 2, 25, 1024]
    chosen = qwen3_speech_config(
        OmniConfig(speech_first_chunk_codes=10, speech_chunk_codes=48, speech_max_codes=400), released
    )
    assert chosen.chunking == Chunking(first_chunk_frames=3, chunk_frames=12) and chosen.max_frames == 100
    assert (chosen.temperature, chosen.predictor) == (Qwen3SpeechConfig().temperature, Qwen3SpeechConfig().predictor)
    # Another frame size converts by its own: 32 samples are 4/3 ms, so 20 ms is 15 frames.
    assert qwen3_speech_config(OmniConfig(speech_first_chunk_codes=1), 32).chunking.first_chunk_frames == 15
    with pytest.raises(ValueError, match="positive code count"):
        frames_for_codes(0, released)


def test_token2wav_only_flags_are_reported_unused_for_qwen3(caplog: pytest.LogCaptureFixture) -> None:
    from omni_gateway.omni.config import OmniConfig
    from omni_gateway.omni.speech_settings import qwen3_speech_config

    with caplog.at_level("WARNING", logger="omni_gateway.omni.speech_settings"):
        qwen3_speech_config(OmniConfig(speech_ode_steps=4, speech_lanes=1), 1920)
    assert "--speech-ode-steps, --speech-lanes: Qwen2.5-Omni's token2wav only" in caplog.text


def test_an_impossible_speech_setting_is_refused_before_anything_loads(monkeypatch: pytest.MonkeyPatch) -> None:
    import omni_gateway.engine.frontend.launch as launch
    from omni_gateway.engine.config import EngineConfig
    from omni_gateway.omni.config import OmniConfig
    from omni_gateway.omni.loading import load_pipeline

    monkeypatch.setattr(launch, "start_engine", lambda *a, **k: pytest.fail("the engine must not start"))
    config = OmniConfig(
        engine=EngineConfig(device="cpu"), asr=None, tts=None, speech_model="/models/omni", speech_first_chunk_steps=1
    )
    with pytest.raises(ValueError, match="first_chunk_steps must be None or an integer >= 2, got 1"):
        load_pipeline(config)
