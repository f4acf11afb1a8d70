"""Qwen3-Omni's code2wav head against transformers' ``Qwen3OmniMoeCode2Wav``, and streamed against itself."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from omni_gateway.omni.heads.code2wav.loader import Code2WavLoadError, load_code2wav
from omni_gateway.omni.heads.code2wav.model import Code2Wav
from omni_gateway.omni.heads.code2wav.stream import Chunking, Code2WavStream, decode_chunks

from tests.harness.tiny_qwen3_omni import CODE_GROUPS, CODEC_VOCAB

pytestmark = pytest.mark.usefixtures("one_torch_thread")

FRAMES = 30


@pytest.fixture(scope="module")
def tiny_dir(qwen3_omni_speech: tuple[Path, Any]) -> Path:
    return qwen3_omni_speech[0]


@pytest.fixture(scope="module")
def hf(qwen3_omni_speech: tuple[Path, Any]) -> Any:
    return qwen3_omni_speech[1]


@pytest.fixture(scope="module")
def code2wav(tiny_dir: Path) -> Code2Wav:
    return load_code2wav(tiny_dir, device="cpu")


def random_codes(batch: int, frames: int, seed: int) -> torch.Tensor:
    return torch.randint(0, CODEC_VOCAB, (batch, CODE_GROUPS, frames), generator=torch.Generator().manual_seed(seed))


def streamed(model: Code2Wav, codes: torch.Tensor, pushes: list[int], chunking: Chunking) -> list[torch.Tensor]:
    stream, waves, at = Code2WavStream(model, chunking), [], 0
    for n in pushes:
        waves += stream.push(codes[:, at : at + n])
        at += n
    return waves + stream.finish()


def test_decode_equals_transformers(hf: Any, code2wav: Code2Wav) -> None:
    codes = random_codes(2, FRAMES, seed=0)
    with torch.no_grad():
        expected = hf.code2wav(codes)[:, 0]
    got = code2wav.decode(codes)
    assert got.shape == expected.shape == (2, code2wav.samples(FRAMES))
    assert expected.abs().mean() > 1e-2  # audible, so the tolerance below means something
    torch.testing.assert_close(got, expected, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize(("pushes", "chunking"), [([1] * FRAMES, Chunking(2, 3)), ([7, 1, 13, 9], Chunking(1, 6))])
def test_stream_equals_whole_decode(code2wav: Code2Wav, pushes: list[int], chunking: Chunking) -> None:
    codes = random_codes(1, FRAMES, seed=1)
    whole = code2wav.decode(codes)[0]
    waves = streamed(code2wav, codes[0], pushes, chunking)
    assert len(waves) > 3  # streamed in several chunks, well past the sliding window and the conv context
    assert code2wav.context_frames < FRAMES and code2wav.config.sliding_window < FRAMES // 3
    torch.testing.assert_close(torch.cat(waves), whole, rtol=1e-4, atol=1e-5)
    first = chunking.first_chunk_frames
    assert len(waves[0]) == code2wav.samples(first)  # the first chunk is out after its few frames


def test_stream_needs_its_left_context(code2wav: Code2Wav, monkeypatch: pytest.MonkeyPatch) -> None:
    codes = random_codes(1, FRAMES, seed=2)
    whole = code2wav.decode(codes)[0]
    monkeypatch.setattr(code2wav, "context_frames", 1)
    waves = streamed(code2wav, codes[0], [FRAMES], Chunking(4, 4))
    assert not torch.allclose(torch.cat(waves), whole, rtol=1e-3, atol=1e-4)


def test_batched_chunks_equal_each_stream_alone(code2wav: Code2Wav) -> None:
    codes = random_codes(2, FRAMES, seed=3)
    alone = [torch.cat(streamed(code2wav, codes[b], [FRAMES], Chunking(4, 5))) for b in range(2)]
    # Two streams at different points of their utterances, with chunks of different sizes, run together.
    a, b = Code2WavStream(code2wav, Chunking(4, 5)), Code2WavStream(code2wav, Chunking(4, 5))
    waves_a = decode_chunks(code2wav, [(a, codes[0, :, :9])])
    cuts_b = [0, 4, 6, 20, FRAMES]
    cuts_a = [9, 14, 15, 27, FRAMES]
    waves_b: list[torch.Tensor] = []
    for i in range(len(cuts_b) - 1):
        work = [(b, codes[1, :, cuts_b[i] : cuts_b[i + 1]]), (a, codes[0, :, cuts_a[i] : cuts_a[i + 1]])]
        wave_b, wave_a = decode_chunks(code2wav, work)
        waves_b.append(wave_b)
        waves_a.append(wave_a)
    torch.testing.assert_close(torch.cat(waves_a), alone[0], rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(torch.cat(waves_b), alone[1], rtol=1e-4, atol=1e-5)


def test_push_checks_the_frame_shape(code2wav: Code2Wav) -> None:
    with pytest.raises(ValueError, match=rf"\[{CODE_GROUPS}, n\]"):
        Code2WavStream(code2wav).push(torch.zeros(CODE_GROUPS + 1, 3, dtype=torch.long))


def test_load_needs_the_code2wav_tensors(tiny_dir: Path, tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text((tiny_dir / "config.json").read_text())
    with pytest.raises(Code2WavLoadError, match="no safetensors"):
        load_code2wav(tmp_path, device="cpu")


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_stream_on_cuda_equals_transformers(hf: Any, tiny_dir: Path) -> None:
    model = load_code2wav(tiny_dir, device="cuda")
    codes = random_codes(1, FRAMES, seed=4)
    with torch.no_grad():
        expected = hf.code2wav(codes)[0, 0]
    waves = streamed(model, codes[0].cuda(), [3, 5, 9, 13], Chunking(2, 6))
    # cuDNN may run float32 convolutions in TF32: a looser tolerance than on the CPU.
    torch.testing.assert_close(torch.cat(waves).cpu(), expected, rtol=1e-2, atol=5e-3)
