"""The :class:`RMSNorm` module used by the layers and models.

The normalisation *functions* with their exact Jacobian-transpose products (``rms_norm``,
``rms_norm_vjp``, ``layer_norm``, ``layer_norm_vjp``) live in :mod:`cemlib.normalization`, below
the energies that use them, and are re-exported here.
"""

from __future__ import annotations

import torch
from torch import nn

from cemlib.normalization import layer_norm, layer_norm_vjp, rms_norm, rms_norm_vjp

__all__ = ["rms_norm", "rms_norm_vjp", "layer_norm", "layer_norm_vjp", "RMSNorm"]


class RMSNorm(nn.Module):
    """RMSNorm with a learnable gain (initialised to one), as in Llama and CEM Algorithm 1.

    ``forward(x)`` returns ``g * x / sqrt(mean(x^2) + eps)`` over the last dimension (same shape
    as ``x``); :meth:`vjp` is its exact Jacobian-transpose product.

    :param dim: the width normalised over (the last dimension of ``x``).
    :param eps: added to the mean square, a finite number >= 0.
    :param elementwise_affine: learn the gain ``g`` (else ``g = 1``, no parameter).
    """

    def __init__(self, dim: int, eps: float = 1e-6, elementwise_affine: bool = True):
        super().__init__()
        if isinstance(eps, bool) or not isinstance(eps, (int, float)) or not 0 <= eps < float("inf"):
            raise ValueError(f"eps (norm_eps) must be a finite number >= 0, got {eps!r}")
        self.dim, self.eps = dim, eps
        self.weight = nn.Parameter(torch.ones(dim)) if elementwise_affine else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return rms_norm(x, self.weight, self.eps)

    def vjp(self, x: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        """``J(x)^T v`` for this norm (``cemlib.normalization.rms_norm_vjp``)."""
        return rms_norm_vjp(x, v, self.weight, self.eps)

    def extra_repr(self) -> str:
        return f"{self.dim}, eps={self.eps}"
