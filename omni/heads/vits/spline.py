"""The rational-quadratic spline of VITS's stochastic duration predictor, without host synchronization.

``transformers`` evaluates the spline only on the values inside its tail bound, picked out by boolean
indexing, and checks the inputs' range and the quadratic's discriminant on the host: on a GPU each of
those waits for every kernel queued before it, several times per flow, which makes a short batch's
duration prediction wait on whatever else the GPU runs. Here the spline is evaluated on every value
(clamped into the bound) and the identity is selected outside it: the same arithmetic on the values
that use it, and no synchronization. ``use_sync_free_spline`` puts it into a model's flows.
"""

from __future__ import annotations

import math
import types
from typing import Any


def rational_quadratic_spline(
    inputs: Any,
    width_logits: Any,
    height_logits: Any,
    derivative_logits: Any,
    *,
    reverse: bool,
    tail_bound: float,
    min_bin_width: float = 1e-3,
    min_bin_height: float = 1e-3,
    min_derivative: float = 1e-3,
) -> tuple[Any, Any]:
    """A monotonic piecewise rational-quadratic map of ``[-tail_bound, tail_bound]`` onto itself (the
    identity outside it), with ``bins`` knots from softmaxed widths and heights and softplus slopes
    (``derivative_logits`` has ``bins - 1``: the outer slopes are 1). Returns the mapped values and the
    log of the map's derivative (of its inverse's, with ``reverse``)."""
    import torch
    from torch.nn import functional

    bins = width_logits.shape[-1]
    inside = (inputs >= -tail_bound) & (inputs <= tail_bound)
    x = inputs.clamp(-tail_bound, tail_bound)

    def knots(logits: Any, minimum: float) -> tuple[Any, Any]:
        sizes = minimum + (1 - minimum * bins) * functional.softmax(logits, dim=-1)
        edges = (2 * tail_bound) * functional.pad(torch.cumsum(sizes, dim=-1), (1, 0)) - tail_bound
        edges[..., 0], edges[..., -1] = -tail_bound, tail_bound
        return edges, edges[..., 1:] - edges[..., :-1]

    x_edges, widths = knots(width_logits, min_bin_width)
    y_edges, heights = knots(height_logits, min_bin_height)
    outer = math.log(math.expm1(1 - min_derivative))  # softplus of it is 1 - min_derivative: slope 1 at the bounds
    slopes = min_derivative + functional.softplus(functional.pad(derivative_logits, (1, 1), value=outer))

    locations = (y_edges if reverse else x_edges).clone()
    locations[..., -1] += 1e-6  # the upper bound itself falls in the last bin
    index = (x[..., None] >= locations).sum(dim=-1, keepdim=True) - 1

    def pick(values: Any) -> Any:
        return values.gather(-1, index)[..., 0]

    x0, width, y0, height = pick(x_edges), pick(widths), pick(y_edges), pick(heights)
    slope = height / width
    d0, d1 = pick(slopes), pick(slopes[..., 1:])
    curvature = d0 + d1 - 2 * slope
    if reverse:  # theta solves a quadratic; this root form is the stable one
        offset = x - y0
        a = height * (slope - d0) + offset * curvature
        b = height * d0 - offset * curvature
        c = -slope * offset
        theta = (2 * c) / (-b - torch.sqrt(b.pow(2) - 4 * a * c))
    else:
        theta = (x - x0) / width
    blend = theta * (1 - theta)
    denominator = slope + curvature * blend
    if reverse:
        mapped = theta * width + x0
    else:
        mapped = y0 + height * (slope * theta.pow(2) + d0 * blend) / denominator
    numerator = slope.pow(2) * (d1 * theta.pow(2) + 2 * slope * blend + d0 * (1 - theta).pow(2))
    log_slope = torch.log(numerator) - 2 * torch.log(denominator)
    if reverse:
        log_slope = -log_slope
    return torch.where(inside, mapped, inputs), torch.where(inside, log_slope, torch.zeros_like(log_slope))


def _conv_flow_forward(
    flow: Any, inputs: Any, padding_mask: Any, global_conditioning: Any = None, reverse: bool = False
) -> tuple[Any, Any]:
    """``VitsConvFlow.forward`` with the spline above."""
    import torch

    first_half, second_half = torch.split(inputs, [flow.half_channels] * 2, dim=1)
    hidden = flow.conv_pre(first_half)
    hidden = flow.conv_dds(hidden, padding_mask, global_conditioning)
    hidden = flow.conv_proj(hidden) * padding_mask
    batch, channels, length = first_half.shape
    hidden = hidden.reshape(batch, channels, -1, length).permute(0, 1, 3, 2)
    bins, scale = flow.num_bins, math.sqrt(flow.filter_channels)
    second_half, log_slope = rational_quadratic_spline(
        second_half,
        hidden[..., :bins] / scale,
        hidden[..., bins : 2 * bins] / scale,
        hidden[..., 2 * bins :],
        reverse=reverse,
        tail_bound=flow.tail_bound,
    )
    outputs = torch.cat([first_half, second_half], dim=1) * padding_mask
    if reverse:
        return outputs, None
    return outputs, torch.sum(log_slope * padding_mask, [1, 2])


def use_sync_free_spline(model: Any) -> int:
    """Give each ``VitsConvFlow`` of ``model`` the spline above; returns how many flows it changed."""
    from transformers.models.vits.modeling_vits import VitsConvFlow

    flows = [m for m in model.modules() if isinstance(m, VitsConvFlow)]
    for flow in flows:
        flow.forward = types.MethodType(_conv_flow_forward, flow)
    return len(flows)
