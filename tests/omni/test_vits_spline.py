"""The sync-free duration spline against the one in transformers."""

from __future__ import annotations

import pytest
from omni_gateway.omni.heads.vits.spline import rational_quadratic_spline

torch = pytest.importorskip("torch")


@pytest.mark.parametrize("reverse", [False, True])
def test_the_spline_matches_transformers_inside_and_outside_its_bound(reverse: bool) -> None:
    from transformers.models.vits import modeling_vits

    torch.manual_seed(0)
    bins, bound = 10, 5.0
    inputs = torch.randn(3, 2, 40) * 4  # about a fifth of them past the bound
    inputs[0, 0, :3] = torch.tensor([-bound, bound, 0.0])
    widths, heights = torch.randn(3, 2, 40, bins), torch.randn(3, 2, 40, bins)
    slopes = torch.randn(3, 2, 40, bins - 1)
    expected = modeling_vits._unconstrained_rational_quadratic_spline(
        inputs, widths, heights, slopes.clone(), reverse=reverse, tail_bound=bound
    )
    got = rational_quadratic_spline(inputs, widths, heights, slopes, reverse=reverse, tail_bound=bound)
    outside = inputs.abs() > bound
    assert 0 < int(outside.sum()) < inputs.numel()
    for g, e in zip(got, expected):
        torch.testing.assert_close(g, e, atol=1e-5, rtol=1e-5)
    assert torch.equal(got[0][outside], inputs[outside]) and torch.count_nonzero(got[1][outside]) == 0
    assert not torch.equal(got[0][~outside], inputs[~outside])


def test_forward_then_reverse_gives_back_the_input() -> None:
    torch.manual_seed(1)
    inputs = torch.rand(2, 1, 30) * 10 - 5
    knots = [torch.randn(2, 1, 30, 8), torch.randn(2, 1, 30, 8), torch.randn(2, 1, 30, 7)]
    mapped, log_slope = rational_quadratic_spline(inputs, *knots, reverse=False, tail_bound=5.0)
    back, log_inverse = rational_quadratic_spline(mapped, *knots, reverse=True, tail_bound=5.0)
    torch.testing.assert_close(back, inputs, atol=1e-4, rtol=0)
    torch.testing.assert_close(log_inverse, -log_slope, atol=1e-4, rtol=0)
