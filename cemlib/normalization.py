"""Normalisation functions used inside energy updates, with their exact Jacobian-transpose products.

Several papers apply a gradient computed at ``u = N(x)`` directly to ``x`` (CEM Algorithm 1,
NRGPT eq. 9, Hyper-SET's RMSNorm-as-constraint). The exact gradient of ``E(N(x))`` is
``J_N(x)^T grad_u E``; :func:`rms_norm_vjp` and :func:`layer_norm_vjp` compute that product in
closed form, so layers and tests can state exactly what is dropped.

RMSNorm:  ``N(x) = g * x / r``, ``r = sqrt(mean(x^2) + eps)``,
``J = diag(g) (I/r - x x^T / (D r^3))``.
LayerNorm: ``N(x) = g * (x - mean x) / s + b``, ``s = sqrt(var(x) + eps)``,
``J = diag(g) (1/s) (I - 1 1^T / D - y y^T / D)`` with ``y = (x - mean x)/s``.

The module depends on torch only: the energies (:mod:`cemlib.energies`) import these functions
from here, and :mod:`cemlib.layers.norm` re-exports them next to the :class:`RMSNorm` module.
"""

from __future__ import annotations

import torch

__all__ = ["rms_norm", "rms_norm_vjp", "layer_norm", "layer_norm_vjp"]


def rms_norm(x: torch.Tensor, gain: torch.Tensor | None = None, eps: float = 1e-6) -> torch.Tensor:
    """``gain * x / sqrt(mean(x^2) + eps)`` over the last dimension."""
    y = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps)
    return y if gain is None else y * gain


def rms_norm_vjp(x: torch.Tensor, v: torch.Tensor, gain: torch.Tensor | None = None,
                 eps: float = 1e-6) -> torch.Tensor:
    """``J_RMSNorm(x)^T v``: the exact chain-rule factor that a "gradient at N(x)" update drops."""
    D = x.shape[-1]
    r = torch.sqrt(x.pow(2).mean(-1, keepdim=True) + eps)
    gv = v if gain is None else v * gain
    return gv / r - x * (x * gv).sum(-1, keepdim=True) / (D * r**3)


def layer_norm(x: torch.Tensor, gain: torch.Tensor | None = None, bias: torch.Tensor | None = None,
               eps: float = 1e-5) -> torch.Tensor:
    """``gain * (x - mean) / sqrt(var + eps) + bias`` over the last dimension (biased variance)."""
    mu = x.mean(-1, keepdim=True)
    y = (x - mu) * torch.rsqrt(x.var(-1, unbiased=False, keepdim=True) + eps)
    if gain is not None:
        y = y * gain
    return y if bias is None else y + bias


def layer_norm_vjp(x: torch.Tensor, v: torch.Tensor, gain: torch.Tensor | None = None,
                   eps: float = 1e-5) -> torch.Tensor:
    """``J_LayerNorm(x)^T v`` in closed form (centring and the 1/D factors included)."""
    mu = x.mean(-1, keepdim=True)
    s = torch.sqrt(x.var(-1, unbiased=False, keepdim=True) + eps)
    y = (x - mu) / s
    gv = v if gain is None else v * gain
    return (gv - gv.mean(-1, keepdim=True) - y * (y * gv).mean(-1, keepdim=True)) / s
