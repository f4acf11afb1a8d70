"""The ``--speech-*`` flags (``OmniConfig.speech_*``) as the settings of the speaking model a checkpoint has.

Sizes are given in Qwen2.5-Omni's codes, 20 ms of audio each (50 a second). Qwen3-Omni's code2wav counts frames
of ``samples_per_frame`` samples at 24 kHz (1920: 80 ms, 12.5 a second, in the released checkpoint), so a size
becomes the frames that cover at least as much audio. A flag left unset keeps the head's own default, which lives
in one place: ``Token2WavConfig`` and ``SpeechConfig`` for Qwen2.5-Omni, ``Chunking`` and ``Qwen3SpeechConfig`` for
Qwen3-Omni. The token2wav-only flags (ODE steps, CUDA graphs, DiT dtype, lanes, first chunks alone) have no
counterpart in code2wav; set for a Qwen3-Omni checkpoint they are reported and left unused.
"""

from __future__ import annotations

import dataclasses
import json
import logging
from pathlib import Path
from typing import TYPE_CHECKING

from omni_gateway.omni.config import OmniConfig

if TYPE_CHECKING:
    from omni_gateway.omni.qwen3_speech import Qwen3SpeechConfig
    from omni_gateway.omni.speech import SpeechConfig

log = logging.getLogger(__name__)

CODE_MS = 20  # one Qwen2.5-Omni code: 50 a second
CODE2WAV_RATE = 24000  # Qwen3-Omni's code2wav output, samples a second
TOKEN2WAV_ONLY = {
    "speech_ode_steps": "--speech-ode-steps",
    "speech_first_chunk_steps": "--speech-first-chunk-steps",
    "speech_cuda_graphs": "--no-speech-cuda-graphs",
    "speech_first_chunks_alone": "--no-speech-first-chunks-alone",
    "speech_dit_dtype": "--speech-dit-dtype",
    "speech_lanes": "--speech-lanes",
}


def spoken_settings(config: OmniConfig, path: str) -> SpeechConfig | Qwen3SpeechConfig:
    """The settings of the speaking model in ``path`` (checked here, before anything loads)."""
    if model_type(path) == "qwen3_omni_moe":
        return qwen3_speech_config(config, code2wav_samples_per_frame(path))
    return speech_config(config)


def speech_config(config: OmniConfig) -> SpeechConfig:
    """Qwen2.5-Omni's: the head's own, with what ``config`` sets over them."""
    from omni_gateway.omni.heads.token2wav.head import Token2WavConfig
    from omni_gateway.omni.speech import SpeechConfig

    chosen = {
        "first_chunk_codes": config.speech_first_chunk_codes,
        "chunk_codes": config.speech_chunk_codes,
        "num_steps": config.speech_ode_steps,
        "first_chunk_steps": config.speech_first_chunk_steps,
        "cuda_graphs": config.speech_cuda_graphs,
        "first_chunks_alone": config.speech_first_chunks_alone,
        "dit_dtype": config.speech_dit_dtype,
        "lanes": config.speech_lanes,
    }
    token2wav = dataclasses.replace(Token2WavConfig(), **{k: v for k, v in chosen.items() if v is not None})
    spoken = SpeechConfig(token2wav=token2wav)
    if config.speech_max_codes is not None:
        spoken = dataclasses.replace(spoken, max_codes=config.speech_max_codes)
    return spoken


def qwen3_speech_config(config: OmniConfig, samples_per_frame: int) -> Qwen3SpeechConfig:
    """Qwen3-Omni's: its own, with the sizes ``config`` sets converted to code2wav frames of
    ``samples_per_frame`` samples."""
    from omni_gateway.omni.heads.code2wav.stream import Chunking
    from omni_gateway.omni.qwen3_speech import Qwen3SpeechConfig

    unused = [flag for name, flag in TOKEN2WAV_ONLY.items() if getattr(config, name) is not None]
    if unused:
        log.warning("%s: Qwen2.5-Omni's token2wav only; Qwen3-Omni's code2wav leaves them unused", ", ".join(unused))
    spoken = Qwen3SpeechConfig()

    def frames(codes: int | None, default: int) -> int:
        return default if codes is None else frames_for_codes(codes, samples_per_frame)

    chunking = Chunking(
        first_chunk_frames=frames(config.speech_first_chunk_codes, spoken.chunking.first_chunk_frames),
        chunk_frames=frames(config.speech_chunk_codes, spoken.chunking.chunk_frames),
    )
    return dataclasses.replace(spoken, chunking=chunking, max_frames=frames(config.speech_max_codes, spoken.max_frames))


def frames_for_codes(codes: int, samples_per_frame: int) -> int:
    """The code2wav frames that cover at least the audio of ``codes`` Qwen2.5-Omni codes (at least one)."""
    if codes < 1 or samples_per_frame < 1:
        raise ValueError(f"expected a positive code count and frame size, got {codes} and {samples_per_frame}")
    samples = codes * CODE_MS * CODE2WAV_RATE // 1000
    return max(1, -(-samples // samples_per_frame))


def code2wav_samples_per_frame(path: str) -> int:
    """Waveform samples per code2wav frame of the Qwen3-Omni checkpoint in ``path`` (its config, nothing else)."""
    from omni_gateway.engine.models.qwen3_omni_talker import read_config
    from omni_gateway.omni.heads.code2wav.model import Code2WavConfig

    return Code2WavConfig.from_hf(read_config(Path(path)).code2wav_config).upsample


def model_type(path: str) -> str | None:
    """The ``model_type`` of the checkpoint config in ``path``; None when there is none to read."""
    try:
        return json.loads((Path(path) / "config.json").read_text()).get("model_type")
    except (OSError, ValueError):
        return None
