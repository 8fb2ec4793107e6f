"""Newton attention: second-order steps on the elastic free energy ("Transformers as Intrinsic Optimizers", ICLR 2026 submission, §3-4, App. A.5-A.8).

Single head, ``F*`` of eq. (4) with ``W = W_Q^T W_K``, ``g = grad F* = z - h_bar`` and
``Hess F* = I - (1/T) C``, ``C = sum_i p_i d_i d_i^T`` (eq. 9):

- :class:`Att2nd`, eq. (10): ``z - eta (I - C/T)^{-1} g`` (exact Newton; a descent step only while
  ``lambda_max(C) < T``, i.e. while the Hessian is positive definite).
- :class:`Att2nd1st`, §3 (unnumbered): the first-order Neumann truncation ``z - eta (I + C/T) g``, computed in
  ``O(N d)`` through the scalars ``d_i^T g``. ``I + C/T`` is positive definite, so it is always a
  descent direction; its truncation error against Newton is ``(C/T)^2 (I - C/T)^{-1} g``.

Multi-head, ``F* = (1/H) sum_h F_h*`` with ``F_h*`` the elastic free energy of head ``h``
(``q_h = W_Q,h z``, ``k_ih = W_K,h h_i``, per-head temperature ``T_h``), per-head Hessian eq. (26)
``W_h^T C_h W_h`` with ``C_h = I - Cov_h / T_h`` (singular in ``R^d``, rank ``d_h``):

- :class:`MHA2nd`: per-subspace range-space Newton, eq. (25). Corrected form:
  ``z - (eta/H) sum_h W_h^T (W_h W_h^T)^{-1} C_h^{-1} (q_h - k_bar_h)``, which is
  ``-(eta/H) sum_h pinv(Hess F_h*) grad F_h*``. The paper's eq. (28) has the wrong sign ("+") and,
  from its footnote-9 pseudo-inverse (valid only if ``W W^T = I``), an extra ``W_h W_h^T`` on the
  right (``form="paper"``).
- :class:`MHA2nd1st`: the practical layer of §4 / A.8 (eqs. 30-31): a free output matrix
  ``W_O,h`` (d x d_h) replaces ``eta/H W_Q,h^T`` (so no ``W_V``: 3 d^2 attention parameters
  instead of 4 d^2) and learnable per-head temperatures initialised to ``d_h``.
  ``form="corrected"`` is the first-order truncation of the corrected Newton step,
  ``z - sum_h W_O,h [v_h + Cov_h v_h / T_h]`` with ``v_h = q_h - k_bar_h``; it equals that step
  exactly for ``W_O,h = eta/H W_h^T (W_h W_h^T)^{-1}``.
  ``form="paper"`` is eq. (31) as printed: ``z + sum_h W_O,h [v_h + b_h]``.

The weights ``p_i`` are the Boltzmann weights of the elastic energy (RBF softmax, A.8); a
dot-product softmax would differ by the key-norm bias ``-||k_i||^2 / 2T``.
"""

from __future__ import annotations

import math

import torch
from torch import nn

from cemlib import linalg
from cemlib.energies import helmholtz as fe
from cemlib.layers.base import EnergyLayer, check_step_size
from cemlib.layers.helmholtz import _SingleHeadStep
from cemlib.utils import resolve_head_dim

__all__ = ["Att2nd", "Att2nd1st", "MHA2nd", "MHA2nd1st", "neumann_truncation_error"]


class Att2nd(_SingleHeadStep):
    """Eq. (10): the Newton step on the elastic ``F*`` (``W = W_Q^T W_K``).

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

    def hessian(self, z, h, mask=None):
        """Eq. (9): ``I - (1/T) sum_i p_i d_i d_i^T``, shape ``(..., d, d)``."""
        return fe.elastic_free_energy_hessian(z, h, self.W, self.T, mask)

    def _stats(self, z, h, mask, W=None):
        self._check_width(z, h)
        mask = fe.check_particles(z, h, mask)
        m = h @ (self.W if W is None else W).T
        p = fe.boltzmann(fe.elastic_energies(z, m), self.T, mask)
        hbar = (p.unsqueeze(-1) * m).sum(-2)
        return p, m, hbar, z - hbar

    def direction(self, z, h, mask=None):
        """``(I - C/T)^{-1} g`` by a linear solve."""
        p, m, hbar, g = self._stats(z, h, mask)
        eye = torch.eye(self.d, dtype=z.dtype, device=z.device)
        hess = eye - fe.weighted_mean_and_cov(p, m)[1] / self.T
        return linalg.solve(hess, g.unsqueeze(-1)).squeeze(-1)

    def forward(self, z, h, mask=None):
        return z - self.eta * self.direction(z, h, mask)


class Att2nd1st(Att2nd):
    """§3, Att2nd1st: ``(1 - eta) z + eta h_bar - (eta/T) sum_i p_i d_i d_i^T (z - h_bar)`` in ``O(N d)``.

    ``forward(z, h, mask=None)`` returns the **stepped state** ``z'`` (``z`` plus the step); a
    pre-norm block adds its update, ``x = x + (step(g, g.unsqueeze(-3), causal) - g)`` with
    ``g = norm(x)`` (shapes and the mask: :class:`~cemlib.layers.helmholtz.SoftmaxAttentionStep`).

    The options are :class:`Att2nd`'s (``d``, ``T``, ``eta``).

    bfloat16 / float16 inputs are computed in float32 and the step is returned in the input dtype:
    ``g = z - h_bar`` and the deviations ``d_i`` cancel, and in bfloat16 arithmetic the step was
    2.4 % off (relative, d = 64, on the CPU) against float64 with the same weights and inputs; now
    0.16 %, the rounding of the output to bfloat16."""

    def direction(self, z, h, mask=None, W=None):
        """``(I + C/T) g`` via the scalars ``d_i^T g`` (no ``d x d`` matrix is formed); ``W``
        (default ``W_Q^T W_K``) may be given in another dtype."""
        p, m, hbar, g = self._stats(z, h, mask, W)
        dev = m - hbar.unsqueeze(-2)
        s = (dev * g.unsqueeze(-2)).sum(-1)
        return g + ((p * s).unsqueeze(-1) * dev).sum(-2) / self.T

    def forward(self, z, h, mask=None):
        if z.dtype in (torch.bfloat16, torch.float16):
            W = self.W_Q.float().T @ self.W_K.float()
            z32 = z.float()
            return (z32 - self.eta * self.direction(z32, h.float(), mask, W)).to(z.dtype)
        return super().forward(z, h, mask)


def neumann_truncation_error(A: torch.Tensor, g: torch.Tensor) -> torch.Tensor:
    """Predicted error of the first-order inverse: ``(I-A)^{-1} g - (I+A) g = A^2 (I-A)^{-1} g``."""
    return A @ A @ linalg.solve(torch.eye(A.shape[-1], dtype=A.dtype, device=A.device) - A, g)


class _MultiHeadFreeEnergy(EnergyLayer):
    """Per-head ``W_Q,h, W_K,h`` (H, d_h, d) and temperatures ``T_h = exp(log_T_h)``."""

    def __init__(self, d: int, n_heads: int, T: float | None, learn_temperature: bool):
        super().__init__()
        self.d, self.n_heads = d, n_heads
        self.d_h = resolve_head_dim(d, n_heads, name="d", explicit_ok=False)
        T = float(self.d_h) if T is None else T
        fe.check_temperature(T)
        self.W_Q = nn.Parameter(torch.randn(n_heads, self.d_h, d) / math.sqrt(d))
        self.W_K = nn.Parameter(torch.randn(n_heads, self.d_h, d) / math.sqrt(d))
        self.log_T = nn.Parameter(torch.full((n_heads,), math.log(T)),
                                  requires_grad=learn_temperature)

    @property
    def T(self) -> torch.Tensor:
        return self.log_T.exp()

    def energy(self, z, h=None, mask=None):
        """``F* = (1/H) sum_h F_h*`` per token (§4, Theorem 2)."""
        return fe.multihead_free_energy(z, h, self.W_Q, self.W_K, self.T, mask)

    def energy_grad(self, z, h=None, mask=None):
        return fe.multihead_free_energy_grad(z, h, self.W_Q, self.W_K, self.T, mask)

    def head_hessians(self, z, h, mask=None):
        """Eq. (26), shape ``(..., H, d, d)``."""
        return fe.multihead_head_hessians(z, h, self.W_Q, self.W_K, self.T, mask)

    def _stats(self, z, h, mask):
        q, k, _, p, t, _ = fe.head_statistics(z, h, self.W_Q, self.W_K, self.T, mask)
        kbar = (p.unsqueeze(-1) * k).sum(-2)
        return q, k, p, t, kbar, q - kbar

    @property
    def gram(self) -> torch.Tensor:
        """``W_Q,h W_Q,h^T`` per head, shape ``(H, d_h, d_h)``."""
        return self.W_Q @ self.W_Q.transpose(-1, -2)

    def _check_form(self, form: str) -> str:
        if form not in ("corrected", "paper"):
            raise ValueError(f"form must be 'corrected' or 'paper', got {form!r}")
        return form

    def extra_repr(self) -> str:
        return f"d={self.d}, n_heads={self.n_heads}, form={self.form!r}"


def _cov_times(p, k, kbar, u):
    """``Cov_p(k) u = sum_i p_i k_i (k_i^T u) - k_bar (k_bar^T u)`` (eq. 31), batched over heads."""
    s = (k * u.unsqueeze(-2)).sum(-1)
    return ((p * s).unsqueeze(-1) * k).sum(-2) - kbar * (kbar * u).sum(-1, keepdim=True)


class MHA2nd(_MultiHeadFreeEnergy):
    """Eq. (25)/(28): per-subspace Newton with the range-space pseudo-inverse.

    ``forward(z, h, mask=None)`` returns the **stepped state** ``z'`` (``z`` plus the step); a
    pre-norm block adds its update, ``x = x + (step(g, g.unsqueeze(-3), causal) - g)`` with
    ``g = norm(x)`` (shapes and the mask: :class:`~cemlib.layers.helmholtz.SoftmaxAttentionStep`).

    :param d: the width ``d``.
    :param n_heads: heads ``H`` (``d`` divisible by ``H``; ``d_h = d / H``).
    :param T: the initial per-head temperature (default ``d_h``).
    :param eta: the step size (finite, >= 0).
    :param form: ``"corrected"`` (eq. 25 with the right sign) or ``"paper"`` (eq. 28 as printed).
    :param learn_temperature: learn the per-head temperatures (``T_h = exp(log_T_h)``).
    """

    def __init__(self, d: int, n_heads: int, T: float | None = None, eta: float = 1.0,
                 form: str = "corrected", learn_temperature: bool = False):
        super().__init__(d, n_heads, T, learn_temperature)
        check_step_size(eta, "eta")
        self.eta, self.form = float(eta), self._check_form(form)

    def forward(self, z, h, mask=None):
        q, k, p, t, kbar, v = self._stats(z, h, mask)
        cov = fe.weighted_mean_and_cov(p, k)[1]
        C = torch.eye(self.d_h, dtype=z.dtype, device=z.device) - cov / t.unsqueeze(-1)
        G = self.gram
        if self.form == "corrected":
            y = linalg.solve(G, linalg.solve(C, v.unsqueeze(-1))).squeeze(-1)
            return z - self.eta / self.n_heads * torch.einsum("hcd,...hc->...d", self.W_Q, y)
        Gv = (G @ v.unsqueeze(-1))
        y = linalg.solve(G, linalg.solve(C, Gv)).squeeze(-1)
        return z + self.eta / self.n_heads * torch.einsum("hcd,...hc->...d", self.W_Q, y)


class MHA2nd1st(_MultiHeadFreeEnergy):
    """§4 / A.8 (eqs. 30-31): first-order Newton attention with output matrices ``W_O,h``.

    ``forward(z, h, mask=None)`` returns the **stepped state** ``z'`` (``z`` plus the step); a
    pre-norm block adds its update, ``x = x + (step(g, g.unsqueeze(-3), causal) - g)`` with
    ``g = norm(x)`` (shapes and the mask: :class:`~cemlib.layers.helmholtz.SoftmaxAttentionStep`).
    :class:`~cemlib.models.newton_transformer.NewtonTransformer` does exactly that, with the same
    numbers computed by matrix products (:func:`~cemlib.models.newton_transformer.causal_mha2nd1st_update`).

    :param d: the width ``d``.
    :param n_heads: heads ``H`` (``d`` divisible by ``H``; ``d_h = d / H``).
    :param T: the initial per-head temperature (default ``d_h``).
    :param form: ``"corrected"`` (the first-order truncation of the corrected Newton step) or
        ``"paper"`` (eq. 31 as printed).
    :param learn_temperature: learn the per-head temperatures (the paper's layer; default on).
    """

    def __init__(self, d: int, n_heads: int, T: float | None = None, form: str = "corrected",
                 learn_temperature: bool = True):
        super().__init__(d, n_heads, T, learn_temperature)
        self.form = self._check_form(form)
        self.W_O = nn.Parameter(torch.randn(n_heads, d, self.d_h) / math.sqrt(d))

    def tied_output(self, eta: float) -> torch.Tensor:
        """The ``W_O,h`` that makes ``forward`` the theoretical step:
        ``eta/H W_h^T (W_h W_h^T)^{-1}`` (corrected) or the paper's ``eta/H W_h^T``."""
        Wt = self.W_Q.transpose(-1, -2)
        if self.form == "corrected":
            Wt = Wt @ linalg.inv(self.gram)
        return eta / self.n_heads * Wt

    def forward(self, z, h, mask=None):
        q, k, p, t, kbar, v = self._stats(z, h, mask)
        if self.form == "corrected":
            r = v + _cov_times(p, k, kbar, v) / t
            return z - torch.einsum("hdc,...hc->...d", self.W_O, r)
        G = self.gram
        u = (G @ v.unsqueeze(-1)).squeeze(-1)
        b = linalg.solve(G, (_cov_times(p, k, kbar, u) / t).unsqueeze(-1)).squeeze(-1)
        return z + torch.einsum("hdc,...hc->...d", self.W_O, v + b)
