"""The start-up advice to run CUDA MPS when voice stages share the GPU with an engine core in another process."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

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
