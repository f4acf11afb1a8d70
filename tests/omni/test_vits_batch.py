"""The VITS vocoder decoded in windows of frames gives the samples of the whole decode."""

from __future__ import annotations

from typing import Any

import pytest
from omni_gateway.omni.heads.vits.vocoder_batch import decode_masked, decode_window, receptive_frames, window_frames

torch = pytest.importorskip("torch")

# Float rounding only: the windowed convolutions see the same inputs, in shorter tensors.
ATOL = 1e-5


def vocoder(**shape: Any) -> Any:
    """A random ``VitsHifiGan`` with MMS-TTS's kernels, dilations and upsampling unless ``shape`` says
    otherwise, and few channels (the receptive field does not depend on them)."""
    from transformers import VitsConfig
    from transformers.models.vits.modeling_vits import VitsHifiGan

    torch.manual_seed(0)
    config = VitsConfig(flow_size=8, upsample_initial_channel=16, **shape)
    return VitsHifiGan(config).eval()


def windowed(decoder: Any, spectrogram: Any, frames: Any, window: int, context: int) -> Any:
    pieces = [
        decode_window(decoder, spectrogram, frames, None, start, window, context)
        for start in range(0, spectrogram.shape[-1], window)
    ]
    return torch.cat(pieces, dim=1)


def test_receptive_frames_of_mms_tts() -> None:
    # conv_pre 3 + first upsampling 2 + its residual blocks 60/8 + the later stages' fractions: 14.5 -> 15, + 1
    assert receptive_frames(vocoder()) == 16
    # one stage of x4 with a kernel-3, dilation-1 residual block: 3 + 2 + 2/4 + 3/4 = 6.25 -> 7, + 1
    small = vocoder(
        upsample_rates=[4], upsample_kernel_sizes=[8], resblock_kernel_sizes=[3], resblock_dilation_sizes=[[1]]
    )
    assert receptive_frames(small) == 8


@pytest.mark.parametrize("window", [7, 16, 50])
def test_windows_with_the_receptive_field_as_context_equal_the_whole_decode(window: int) -> None:
    decoder = vocoder()
    context = receptive_frames(decoder)
    with torch.inference_mode():
        spectrogram = torch.randn(3, 8, 60)
        frames = torch.tensor([60, 23, 41])
        whole = decode_masked(decoder, spectrogram, frames)
        got = windowed(decoder, spectrogram, frames, window, context)
    assert got.shape == whole.shape == (3, 60 * 256)
    torch.testing.assert_close(got, whole, atol=ATOL, rtol=0)


def test_too_little_context_changes_the_samples_near_a_window_edge() -> None:
    decoder = vocoder()
    with torch.inference_mode():
        spectrogram = torch.randn(1, 8, 48)
        frames = torch.tensor([48])
        whole = decode_masked(decoder, spectrogram, frames)
        short = windowed(decoder, spectrogram, frames, 16, 2)  # two frames where sixteen are needed
    assert (short - whole).abs().max() > 100 * ATOL


def test_a_window_outside_the_spectrogram_is_refused() -> None:
    decoder = vocoder()
    spectrogram, frames = torch.randn(1, 8, 10), torch.tensor([10])
    with pytest.raises(ValueError, match=r"expected 0 <= start < 10 frames.*got start 10, window 4"):
        decode_window(decoder, spectrogram, frames, None, 10, 4, 3)


def test_windows_take_few_sizes() -> None:
    # 2048 frames over the rows, as a power of two per row, unless the whole batch fits a smaller one
    assert window_frames(5000, 16, 2048) == 128
    assert window_frames(5000, 3, 2048) == 512
    assert window_frames(40, 1, 2048) == 64
    assert window_frames(3, 64, 2048) == 16
    sizes = {window_frames(frames, rows, 2048) for frames in range(1, 3000, 7) for rows in range(1, 65)}
    assert sizes == {16, 32, 64, 128, 256, 512, 1024, 2048}
