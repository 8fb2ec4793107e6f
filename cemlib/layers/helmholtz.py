"""Attention as one gradient step on a free energy ("Transformers as Intrinsic Optimizers", ICLR 2026 submission).

Three single-head steps, each with its energy from :mod:`cemlib.energies.helmholtz`:

- :class:`SoftmaxAttentionStep`: standard attention, eq. (1),
  ``z + W_V H softmax(H^T W_K^T W_Q z / T)``.
  With ``W = W_Q^T W_K`` it is exactly ``z - eta grad F~*(z)`` (inner-product free energy, proof of Theorem 1)
  when ``W_V = eta W`` (``tying="corrected"``). Theorem 1 prints ``W_V = eta T W``
  (``tying="paper"``); that step is ``z - eta T grad F~*``, off by the factor ``T`` (the tests show
  it). Theorem 1 also names the elastic ``F*`` of eq. (4); its gradient is ``z - h_bar``, which
  differs from ``grad F~*`` by ``z`` even on the sphere, so the residual layer is a step on ``F~*``.
- :class:`MeanShiftAttentionStep`: the actual GD step on the elastic ``F*``, eq. (8):
  ``(1 - eta) z + eta h_bar`` (RBF weights); at ``eta = 1`` it is Gaussian mean-shift.
- :class:`LinearAttentionStep`: eq. (13) = one GD step on the quadratic energy eq. (14) with
  ``W_V = eta T W`` (Theorem 3; here the paper's ``T`` is right).

Shapes: ``z (..., d)`` updated tokens, ``h (..., N, d)`` attended tokens, optional bool
``mask (..., N)``; for a causal sequence ``X (B, L, d)`` pass ``z=X, h=X.unsqueeze(-3)`` and
``mask=torch.ones(L, L, dtype=torch.bool).tril()``.
"""

from __future__ import annotations

import math

import torch
from torch import nn

from cemlib.energies import helmholtz as fe
from cemlib.layers.base import EnergyLayer, check_step_size
from cemlib.utils import check_positive_int

__all__ = ["SoftmaxAttentionStep", "MeanShiftAttentionStep", "LinearAttentionStep",
           "value_matrix"]


def value_matrix(W: torch.Tensor, eta: float, T: float, tying: str = "corrected") -> torch.Tensor:
    """The value matrix that makes eq. (1) a GD step on ``F~*``: ``eta W`` (corrected) or the
    paper's ``eta T W`` (Theorem 1 as printed)."""
    if tying == "corrected":
        return eta * W
    if tying == "paper":
        return eta * T * W
    raise ValueError(f"tying must be 'corrected' or 'paper', got {tying!r}")


class _SingleHeadStep(EnergyLayer):
    """Shared parameters: ``W_Q, W_K`` (so ``W = W_Q^T W_K``), temperature ``T``, step ``eta``."""

    def __init__(self, d: int, T: float = 1.0, eta: float = 1.0):
        super().__init__()
        check_positive_int(d, "d")
        fe.check_temperature(T)
        check_step_size(eta, "eta")  # finite and >= 0: a negative step climbs the energy
        self.d, self.T, self.eta = d, float(T), float(eta)
        self.W_Q = nn.Parameter(torch.randn(d, d) / math.sqrt(d))
        self.W_K = nn.Parameter(torch.randn(d, d) / math.sqrt(d))

    @property
    def W(self) -> torch.Tensor:
        """The energy matrix ``W = W_Q^T W_K`` (Theorem 1)."""
        return self.W_Q.T @ self.W_K

    def extra_repr(self) -> str:
        return f"d={self.d}, T={self.T}, eta={self.eta}"

    def _check_width(self, z, h) -> None:
        """A clear error for tokens of the wrong width (before any matrix product fails)."""
        for name, t in (("z", z), ("h", h)):
            if isinstance(t, torch.Tensor) and t.dim() and t.shape[-1] != self.d:
                raise ValueError(f"width mismatch: {type(self).__name__} has d={self.d}, but {name} "
                                 f"has shape {tuple(t.shape)} (last dimension must be {self.d})")


class SoftmaxAttentionStep(_SingleHeadStep):
    """Eq. (1) with tied ``W_V``: one GD step on ``F~*`` (Theorem 1 corrected: ``W_V = eta W``).

    ``forward(z, h, mask=None)`` returns the **stepped state** ``z'`` (same shape as ``z``: ``z``
    plus the step), for tokens ``z`` (..., d) attending to ``h`` (..., N, d) where ``mask``
    (bool, (..., N)) allows it; a causal sequence ``X`` (B, L, d) is ``step(X, X.unsqueeze(-3),
    causal)`` with ``causal = torch.ones(L, L, dtype=torch.bool).tril()``. In a standard pre-norm
    block add its *update*, not its output:
    ``g = norm(x); x = x + (step(g, g.unsqueeze(-3), causal) - g)``.

    :param d: the width ``d``.
    :param T: the temperature ``T`` (> 0).
    :param eta: the step size (finite, >= 0).
    :param tying: ``"corrected"`` (``W_V = eta W``) or ``"paper"`` (Theorem 1 as printed,
        ``W_V = eta T W``: a step off by the factor ``T``).
    """

    def __init__(self, d: int, T: float = 1.0, eta: float = 1.0, tying: str = "corrected"):
        super().__init__(d, T, eta)
        if tying not in ("corrected", "paper"):
            raise ValueError(f"tying must be 'corrected' or 'paper', got {tying!r}")
        self.tying = tying

    @property
    def W_V(self) -> torch.Tensor:
        return value_matrix(self.W, self.eta, self.T, self.tying)

    def energy(self, z, h=None, mask=None):
        """``F~*(z) = -T log sum_i exp(z^T W h_i / T)`` per token (proof of Theorem 1)."""
        return fe.inner_free_energy(z, h, self.W, self.T, mask)

    def energy_grad(self, z, h=None, mask=None):
        return fe.inner_free_energy_grad(z, h, self.W, self.T, mask)

    def elastic_energy(self, z, h, mask=None):
        """The elastic ``F*`` of eq. (4) with the same ``W`` (what Theorem 1 names)."""
        return fe.elastic_free_energy(z, h, self.W, self.T, mask)

    def forward(self, z, h, mask=None):
        """Eq. (1): ``z + sum_i softmax_i(q^T k_i / T) W_V h_i``, ``q = W_Q z``, ``k = W_K h``."""
        self._check_width(z, h)
        mask = fe.check_particles(z, h, mask)
        s = (z @ self.W_Q.T).unsqueeze(-2).mul(h @ self.W_K.T).sum(-1) / self.T
        if mask is not None:
            s = s.masked_fill(~mask, float("-inf"))
        p = torch.softmax(s, dim=-1)
        return z + (p.unsqueeze(-1) * (h @ self.W_V.T)).sum(-2)


class MeanShiftAttentionStep(_SingleHeadStep):
    """Eq. (8): GD on the elastic ``F*``, ``z - eta (z - h_bar) = (1 - eta) z + eta h_bar``.

    ``forward(z, h, mask=None)`` returns the **stepped state** ``z'`` (``z`` plus the step); a
    pre-norm block adds its update, ``x = x + (step(g, g.unsqueeze(-3), causal) - g)`` with
    ``g = norm(x)`` (shapes and the mask: :class:`~cemlib.layers.helmholtz.SoftmaxAttentionStep`).

    Options ``d`` (width), ``T`` (temperature > 0) and ``eta`` (step size >= 0), as
    :class:`~cemlib.layers.helmholtz.SoftmaxAttentionStep`'s.
    """

    def energy(self, z, h=None, mask=None):
        return fe.elastic_free_energy(z, h, self.W, self.T, mask)

    def energy_grad(self, z, h=None, mask=None):
        return fe.elastic_free_energy_grad(z, h, self.W, self.T, mask)

    def forward(self, z, h, mask=None):
        self._check_width(z, h)
        mask = fe.check_particles(z, h, mask)
        m = h @ self.W.T
        p = fe.boltzmann(fe.elastic_energies(z, m), self.T, mask)
        return (1.0 - self.eta) * z + self.eta * (p.unsqueeze(-1) * m).sum(-2)


class LinearAttentionStep(_SingleHeadStep):
    """Eq. (13) = one GD step on eq. (14) with ``W_V = eta T W`` (Theorem 3, correct as printed).

    The energy is a concave quadratic (unbounded below), so only the single step is meaningful;
    iterating it makes ``||z||`` grow without bound.

    ``forward(z, h, mask=None)`` returns the **stepped state** ``z'`` (``z`` plus the step); a
    pre-norm block adds its update, ``x = x + (step(g, g.unsqueeze(-3), causal) - g)`` with
    ``g = norm(x)`` (shapes and the mask: :class:`~cemlib.layers.helmholtz.SoftmaxAttentionStep`).

    Options ``d`` (width), ``T`` (temperature > 0) and ``eta`` (step size >= 0), as
    :class:`~cemlib.layers.helmholtz.SoftmaxAttentionStep`'s.
    """

    @property
    def W_V(self) -> torch.Tensor:
        return self.eta * self.T * self.W

    def energy(self, z, h=None, mask=None):
        return fe.quadratic_energy(z, h, self.W, self.T, mask)

    def energy_grad(self, z, h=None, mask=None):
        return fe.quadratic_energy_grad(z, h, self.W, self.T, mask)

    def forward(self, z, h, mask=None):
        """Eq. (13): ``z + sum_i (z^T W_Q^T W_K h_i) W_V h_i`` (no softmax)."""
        self._check_width(z, h)
        mask = fe.check_particles(z, h, mask)
        s = (z @ self.W_Q.T).unsqueeze(-2).mul(h @ self.W_K.T).sum(-1)
        if mask is not None:
            s = s * mask.to(s.dtype)
        return z + (s.unsqueeze(-1) * (h @ self.W_V.T)).sum(-2)
