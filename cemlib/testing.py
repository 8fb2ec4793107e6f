"""The autograd oracle: helpers that tests and chapters use to check closed-form updates.

Every layer's closed-form gradient is compared with ``torch.autograd.grad`` of its energy in
float64 (the protocol of :mod:`cemlib.layers.base`).
"""

from __future__ import annotations

from typing import Callable

import torch

__all__ = ["autograd_grad", "assert_grad_matches_autograd", "relative_error"]


def autograd_grad(energy_fn: Callable[[torch.Tensor], torch.Tensor], x: torch.Tensor,
                  create_graph: bool = False) -> torch.Tensor:
    """``grad_x sum(energy_fn(x))`` by autograd (``x`` is detached and cloned first)."""
    x = x.detach().clone().requires_grad_(True)
    with torch.enable_grad():
        (g,) = torch.autograd.grad(energy_fn(x).sum(), x, create_graph=create_graph)
    return g


def relative_error(a: torch.Tensor, b: torch.Tensor) -> float:
    """``||a - b|| / max(||b||, tiny)`` as a Python float (inputs may carry autograd history)."""
    a, b = a.detach(), b.detach()
    return float((a - b).norm() / b.norm().clamp_min(torch.finfo(b.dtype).tiny))


def assert_grad_matches_autograd(energy_fn: Callable[[torch.Tensor], torch.Tensor],
                                 grad_fn: Callable[[torch.Tensor], torch.Tensor], x: torch.Tensor,
                                 rtol: float = 1e-9, atol: float = 1e-10) -> torch.Tensor:
    """Assert ``grad_fn(x) == autograd_grad(energy_fn, x)`` (float64 tolerances by default).

    Returns the autograd gradient so callers can reuse it.
    """
    expected = autograd_grad(energy_fn, x)
    with torch.no_grad():
        got = grad_fn(x.detach())
    torch.testing.assert_close(got, expected, rtol=rtol, atol=atol)
    return expected
