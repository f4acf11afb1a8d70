"""Random weights for Qwen3-Omni's speech side and audio tower (``load_format="dummy"``), so a checkpoint directory
holding only its config, tokenizer and preprocessor config speaks and hears, with every tensor a real one would hold.

Names and shapes come from the config: the talker decoder's from the engine's listing of a Qwen3-MoE checkpoint
(``engine.models.weight_shapes``, experts one by one as checkpoints store them), everything else (code predictor,
the talker's projections, code2wav, audio tower) from transformers' own modules of the config built on the meta
device, so they are the names ``save_pretrained`` writes. Values follow ``engine.runner.dummy_weights``: seeded
per tensor, made on the device in its dtype. The talker's seeds carry the namespace ``talker/`` (the thinker
holds ``model.*`` names too); the thinker's embedding table keeps the engine's seed, so the audio tower's marker
rows are the thinker engine's rows.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from omni_gateway.engine.models.qwen3_omni_talker import decoder_checkpoint_name, talker_config
from omni_gateway.engine.models.weight_shapes import checkpoint_shapes
from omni_gateway.engine.runner.dummy_weights import RandomSource, random_tensor

TALKER_NAMESPACE = "talker/"
_THINKER_EMBED = "thinker.model.embed_tokens.weight"


def talker_decoder_source(hf_config: Any, seed: int) -> RandomSource:
    """The talker decoder's tensors under the engine's names, made on the engine's device as it reads them."""
    return RandomSource(checkpoint_shapes(talker_config(hf_config)), seed, namespace=TALKER_NAMESPACE)


def talker_side_shapes(hf_config: Any) -> dict[str, tuple[int, ...]]:
    """Checkpoint name -> shape of the ``talker.*`` tensors outside the decoder (code predictor, projections)."""
    from transformers.models.qwen3_omni_moe.modeling_qwen3_omni_moe import Qwen3OmniMoeTalkerForConditionalGeneration

    shapes = _meta_shapes(Qwen3OmniMoeTalkerForConditionalGeneration, hf_config.talker_config, "talker.")
    return {n: s for n, s in shapes.items() if not n.startswith(("talker.model.", "talker.codec_head."))}


def talker_tensors(hf_config: Any, seed: int, device: torch.device | str, dtype: torch.dtype) -> dict[str, Any]:
    """What ``Qwen3Talker`` reads besides the decoder: the side tensors and the codec embedding (the decoder's
    own, same seed), under checkpoint names, made on ``device``."""
    device = torch.device(device)
    out = {
        n: random_tensor(TALKER_NAMESPACE + n, s, seed, device, dtype) for n, s in talker_side_shapes(hf_config).items()
    }
    decoder = talker_decoder_source(hf_config, seed)
    embed = "model.embed_tokens.weight"
    out[decoder_checkpoint_name(embed)] = random_tensor(
        TALKER_NAMESPACE + embed, decoder.shapes[embed], seed, device, dtype
    )
    return out


def code2wav_shapes(hf_config: Any) -> dict[str, tuple[int, ...]]:
    from transformers.models.qwen3_omni_moe.modeling_qwen3_omni_moe import Qwen3OmniMoeCode2Wav

    return _meta_shapes(Qwen3OmniMoeCode2Wav, hf_config.code2wav_config, "")


def code2wav_tensors(hf_config: Any, seed: int, device: torch.device | str, dtype: torch.dtype) -> dict[str, Any]:
    """code2wav's tensors without their ``code2wav.`` prefix (``load_code2wav(tensors=...)``)."""
    device = torch.device(device)
    return {n: random_tensor("code2wav." + n, s, seed, device, dtype) for n, s in code2wav_shapes(hf_config).items()}


def audio_fill(seed: int, device: torch.device | str, dtype: torch.dtype) -> Callable[[str, tuple[int, ...]], Any]:
    """``load_audio_encoder(fill=...)``: a tower tensor by its checkpoint name, made on ``device``; the thinker's
    embedding table (the marker rows) under the thinker engine's name, so both see the same rows."""
    device = torch.device(device)

    def fill(name: str, shape: tuple[int, ...]) -> torch.Tensor:
        seeded = name.removeprefix("thinker.") if name == _THINKER_EMBED else name
        return random_tensor(seeded, shape, seed, device, dtype)

    return fill


def speech_checkpoint_shapes(hf_config: Any) -> dict[str, tuple[int, ...]]:
    """Every ``talker.*``, ``code2wav.*`` and ``thinker.audio_tower.*`` tensor a checkpoint of ``hf_config`` holds."""
    from transformers.models.qwen3_omni_moe.modeling_qwen3_omni_moe import Qwen3OmniMoeAudioEncoder

    decoder = talker_decoder_source(hf_config, 0).shapes
    shapes = {decoder_checkpoint_name(n): s for n, s in decoder.items()}
    shapes |= talker_side_shapes(hf_config)
    shapes |= {"code2wav." + n: s for n, s in code2wav_shapes(hf_config).items()}
    audio = hf_config.thinker_config.audio_config
    return shapes | _meta_shapes(Qwen3OmniMoeAudioEncoder, audio, "thinker.audio_tower.")


def _meta_shapes(cls: Any, config: Any, prefix: str) -> dict[str, tuple[int, ...]]:
    with torch.device("meta"):
        module = cls._from_config(config)
    return {prefix + n: tuple(t.shape) for n, t in module.state_dict().items()}
