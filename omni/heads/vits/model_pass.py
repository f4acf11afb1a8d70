"""A Hugging Face ``VitsModel`` up to the spectrogram, in stages whose shapes the caller chooses.

``VitsModel.forward`` draws its noise on the host, copies it to the device, and sizes its frames from the
predicted durations, all in one call: on a GPU that is several synchronizations per batch, and every batch
brings new shapes. Here the same arithmetic runs in three stages, each with shapes fixed by its inputs, so
that a GPU can replay the first and the last from CUDA graphs captured once per padded shape:

1. ``text_stage``: the text encoder and the duration predictor (run backwards from ``noise``, which the
   caller draws) give each token's duration in frames and the prior over its frames;
2. ``expand_priors``: the durations lay the tokens' priors out over ``frames`` frames and the prior noise
   is drawn (a few operations, eagerly; the caller reads the lengths between stages 1 and 2, to choose
   ``frames``);
3. ``flow_stage``: the flow, run backwards, turns the latents into the spectrogram.

Padding (tokens past a row's end, frames past its length) is masked in every stage, as in the model's own
batches. Drawn in the same order and shapes, the noise is the model's own: run with ``frames`` the
longest row's length, the stages give ``VitsModel.forward``'s spectrogram for the same seed.
"""

from __future__ import annotations

from typing import Any


def duration_noise(model: Any, rows: int, tokens: int, device: Any) -> Any:
    """The duration predictor's noise for ``rows`` rows of ``tokens`` tokens, drawn as the model draws it
    (float32 standard normal, scaled by its ``noise_scale_duration``)."""
    import torch

    dtype = model.text_encoder.embed_tokens.weight.dtype
    return torch.randn(rows, 2, tokens, device=device).to(dtype) * model.noise_scale_duration


def text_stage(
    model: Any, input_ids: Any, attention_mask: Any, noise: Any, length_scale: Any, conditioning: Any | None = None
) -> tuple[Any, Any, Any]:
    """Each token's duration in frames ``(rows, 1, tokens)`` (0 past a row's end) and its prior's means
    and log variances ``(rows, tokens, flow channels)``. ``length_scale``: a number, or a tensor that
    broadcasts against the durations (one value per row: ``(rows, 1, 1)``)."""
    import torch

    dtype = model.text_encoder.embed_tokens.weight.dtype
    padding = attention_mask.unsqueeze(-1).to(dtype)
    # The attention's additive mask, made here: from a 2D mask transformers makes it after asking the host
    # whether any token is padding (a read of the device that a CUDA graph cannot capture); a 4D mask it takes
    # as it is. Every query of a row masks the same keys, the row's padding.
    tokens = input_ids.shape[1]
    bias = (1.0 - attention_mask[:, None, None, :].to(dtype)) * torch.finfo(dtype).min
    encoded = model.text_encoder(
        input_ids=input_ids,
        padding_mask=padding,
        attention_mask=bias.expand(-1, 1, tokens, tokens),
        return_dict=True,
    )
    hidden = encoded.last_hidden_state.transpose(1, 2)
    padding = padding.transpose(1, 2)
    if model.config.use_stochastic_duration_prediction:
        log_duration = _reverse_durations(model.duration_predictor, hidden, padding, noise, conditioning)
    else:
        log_duration = model.duration_predictor(hidden, padding, conditioning)
    duration = torch.ceil(torch.exp(log_duration) * padding * length_scale)
    return duration, encoded.prior_means, encoded.prior_log_variances


def frame_lengths(duration: Any) -> Any:
    """Each row's length in frames: its durations' sum, at least one frame."""
    import torch

    return torch.clamp_min(torch.sum(duration, [1, 2]), 1).long()


def expand_priors(
    model: Any, duration: Any, means: Any, log_variances: Any, attention_mask: Any, frames: int
) -> tuple[Any, Any]:
    """The latents ``(rows, flow channels, frames)`` to run the flow backwards from (each token's prior
    repeated over its frames, plus noise scaled by the model's ``noise_scale``), and the frames' mask
    ``(rows, 1, frames)``. ``frames`` must be at least the longest row's length."""
    import torch
    from torch.nn import functional

    lengths = frame_lengths(duration)
    padding = attention_mask.unsqueeze(1).to(duration.dtype)
    positions = torch.arange(frames, dtype=lengths.dtype, device=lengths.device)
    frame_mask = (positions.unsqueeze(0) < lengths.unsqueeze(1)).unsqueeze(1).to(duration.dtype)
    # token t covers the frames from its cumulative duration's start to its end
    rows, tokens = duration.shape[0], duration.shape[-1]
    ends = torch.cumsum(duration, -1).view(rows * tokens, 1)
    covered = (positions.to(duration.dtype).unsqueeze(0) < ends).to(duration.dtype).view(rows, tokens, frames)
    alignment = covered - functional.pad(covered, [0, 0, 1, 0, 0, 0])[:, :-1]
    alignment = alignment.transpose(1, 2) * (padding.unsqueeze(2) * frame_mask.unsqueeze(-1)).squeeze(1)
    prior_means = torch.matmul(alignment, means).transpose(1, 2)
    prior_log_variances = torch.matmul(alignment, log_variances).transpose(1, 2)
    noise = torch.randn_like(prior_means) * torch.exp(prior_log_variances) * model.noise_scale
    return prior_means + noise, frame_mask


def flow_stage(model: Any, latents: Any, frame_mask: Any, conditioning: Any | None = None) -> Any:
    """The spectrogram ``(rows, bins, frames)``, zero past each row's length."""
    return model.flow(latents, frame_mask, conditioning, reverse=True) * frame_mask


def _reverse_durations(predictor: Any, hidden: Any, padding: Any, noise: Any, conditioning: Any | None) -> Any:
    """The stochastic duration predictor's inverse pass from ``noise`` (``VitsStochasticDurationPredictor``
    with ``reverse=True``, its noise drawn by the caller): each token's log duration ``(rows, 1, tokens)``."""
    import torch

    inputs = predictor.conv_pre(hidden)
    if conditioning is not None:
        inputs = inputs + predictor.cond(conditioning)
    inputs = predictor.conv_dds(inputs, padding)
    inputs = predictor.conv_proj(inputs) * padding
    flows = list(reversed(predictor.flows))
    flows = flows[:-2] + [flows[-1]]  # the model skips its unused volume-preserving flow in this direction
    latents = noise
    for flow in flows:
        latents = torch.flip(latents, [1])
        latents, _ = flow(latents, padding, global_conditioning=inputs, reverse=True)
    return latents[:, :1]
