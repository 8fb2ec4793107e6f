"""The protocol every energy layer in cemlib follows (see the library page of the book).

An :class:`EnergyLayer` exposes three things:

- ``energy(x, h=None)``: the scalar energy of each token, shape ``x.shape[:-1]``, written exactly as
  the book writes it (``h`` is the fixed context the energy is conditioned on, if any);
- ``energy_grad(x, h=None)``: the closed-form gradient ``grad_x energy`` (no autograd), same shape as
  ``x``;
- ``forward(...)``: the layer's update, built from ``energy_grad`` (preconditioned, recursed,
  normalised as the paper does), again without autograd inside.

:func:`cemlib.testing.assert_grad_matches_autograd` checks ``energy_grad`` against
``torch.autograd.grad`` of ``energy`` in float64; layers whose update is *not* an exact gradient
step document and test the difference.
"""

from __future__ import annotations

import math

import torch
from torch import nn

__all__ = ["EnergyLayer", "check_step_size", "check_norm_eps"]


def _nonneg_finite(value, what: str) -> float:
    if isinstance(value, bool):
        raise ValueError(f"{what}, got {value!r}")
    try:
        v = float(value)
    except (TypeError, ValueError):
        raise ValueError(f"{what}, got {value!r}") from None
    if not math.isfinite(v) or v < 0:
        raise ValueError(f"{what}, got {value!r}")
    return v


def check_step_size(value, name: str = "eta") -> float:
    """A step size given as an argument: a finite number >= 0 (0 = no step). NaN, Inf and negative
    values (a step *up* the energy) raise ``ValueError`` naming ``name``. Returns ``value`` as float."""
    return _nonneg_finite(value, f"{name} must be a finite step size >= 0")


def check_norm_eps(value, name: str = "norm_eps") -> float:
    """A normalisation epsilon: a finite number >= 0; else ``ValueError`` naming ``name``."""
    return _nonneg_finite(value, f"{name} must be a finite number >= 0")


class EnergyLayer(nn.Module):
    """Base class: an energy, its closed-form gradient, and an update step.

    Subclasses implement :meth:`energy` and :meth:`energy_grad` (and ``forward``, the update built
    from the gradient); :meth:`total_energy` sums the per-token energies. Whether ``forward``
    returns the updated state (input plus update, the CEM, NRGPT and Hyper-SET layers) or only an
    update is said by each subclass.
    """

    def energy(self, x: torch.Tensor, h: torch.Tensor | None = None) -> torch.Tensor:
        """Per-token energy, shape ``x.shape[:-1]``."""
        raise NotImplementedError

    def energy_grad(self, x: torch.Tensor, h: torch.Tensor | None = None) -> torch.Tensor:
        """Closed-form ``grad_x energy(x, h).sum()``, same shape as ``x``."""
        raise NotImplementedError

    def total_energy(self, x: torch.Tensor, h: torch.Tensor | None = None) -> torch.Tensor:
        """Sum of the per-token energies (a scalar)."""
        return self.energy(x, h).sum()
