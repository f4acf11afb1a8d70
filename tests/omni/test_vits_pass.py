"""VITS up to the spectrogram in stages (``vits.model_pass``) against ``VitsModel.forward``."""

from __future__ import annotations

import pytest
from omni_gateway.omni.heads.vits.model_pass import duration_noise, expand_priors, flow_stage, frame_lengths, text_stage

from tests.harness.shape_checkpoints import TINY_VITS

torch = pytest.importorskip("torch")


@pytest.fixture(scope="module")
def model():  # type: ignore[no-untyped-def]
    from transformers import VitsConfig, VitsModel

    torch.manual_seed(0)
    return VitsModel(VitsConfig(vocab_size=40, **TINY_VITS)).eval()


def batch() -> tuple[torch.Tensor, torch.Tensor]:
    ids = torch.tensor([[3, 9, 4, 12, 7, 2, 30, 5], [8, 1, 6, 22, 0, 0, 0, 0]])
    return ids, (ids != 0).long()


def stages(model, ids, mask, *, frames: int | None = None):  # type: ignore[no-untyped-def]
    noise = duration_noise(model, ids.shape[0], ids.shape[1], ids.device)
    duration, means, log_variances = text_stage(model, ids, mask, noise, 1.0 / model.speaking_rate)
    lengths = frame_lengths(duration)
    width = int(lengths.max()) if frames is None else frames
    latents, frame_mask = expand_priors(model, duration, means, log_variances, mask, width)
    return flow_stage(model, latents, frame_mask), lengths


def test_the_stages_give_the_models_spectrogram_for_a_seed(model) -> None:  # type: ignore[no-untyped-def]
    ids, mask = batch()
    assert model.noise_scale > 0 and model.noise_scale_duration > 0  # the noise is part of what is compared
    with torch.inference_mode():
        torch.manual_seed(3)
        expected = model(input_ids=ids, attention_mask=mask)
        torch.manual_seed(3)
        spectrogram, lengths = stages(model, ids, mask)
        torch.manual_seed(4)
        other, _ = stages(model, ids, mask)
    upsampling = int(torch.tensor(model.config.upsample_rates).prod())
    assert torch.equal(lengths * upsampling, expected.sequence_lengths)
    assert spectrogram.shape == expected.spectrogram.shape
    torch.testing.assert_close(spectrogram, expected.spectrogram, atol=1e-6, rtol=0)
    assert other.shape != spectrogram.shape or not torch.allclose(other, spectrogram)


def test_padded_tokens_and_frames_change_no_row(model) -> None:  # type: ignore[no-untyped-def]
    """The shapes a GPU pads a batch to (tokens and frames to powers of two) leave every row as it was."""
    ids, mask = batch()
    scales = model.noise_scale, model.noise_scale_duration
    model.noise_scale = model.noise_scale_duration = 0.0  # the noise's shape follows the padding
    try:
        with torch.inference_mode():
            spectrogram, lengths = stages(model, ids, mask)
            pad = torch.nn.functional.pad
            wide, wide_lengths = stages(model, pad(ids, (0, 5)), pad(mask, (0, 5)), frames=spectrogram.shape[-1] + 20)
    finally:
        model.noise_scale, model.noise_scale_duration = scales
    assert torch.equal(wide_lengths, lengths) and int(lengths.min()) < int(lengths.max())
    torch.testing.assert_close(wide[..., : spectrogram.shape[-1]], spectrogram, atol=1e-5, rtol=0)
    assert torch.count_nonzero(wide[..., spectrogram.shape[-1] :]) == 0
    for row, length in enumerate(lengths.tolist()):
        assert torch.count_nonzero(wide[row, :, length:]) == 0 and torch.count_nonzero(wide[row, :, :length]) > 0
