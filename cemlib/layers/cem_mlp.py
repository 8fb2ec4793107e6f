"""CEM MLP: T preconditioned gradient steps on the element-wise energy (CEM Algorithm 1, MLP).

Energy (eq. 7) ``xi(x_i | h_i) = -gamma_i^T phi(V x_i)``, ``gamma_i = W RMSNorm(h_i)`` computed once
and held fixed over the recursion; update (eqs. 9, 15, 17):

    u = RMSNorm(x^(t))   (query_norm=True; u = x^(t) otherwise)
    x^(t+1) = x^(t) + eta P_mlp V^T (gamma * phi'(V u))

which at T = 1, P = I, eta = 1 is a gated MLP with the tying of eq. 11: ``W_up = V`` (inside the
nonlinearity; Llama's ``gate_proj``), ``W_down = V^T``, ``W_gate = W`` (linear branch; Llama's
``up_proj``) -- eq. 6 names the branches the other way round from Llama (CEM eq. 6).

With ``query_norm=False`` the update is exactly ``x - eta P grad_x xi``; with the norm it drops the
RMSNorm Jacobian (as in attention; measured in ``tests/layers/test_cem_mlp.py``). ``variant="sign"`` is the
Appendix-C energy ``-|gamma|^T phi(sign(gamma) V x)`` whose update is
``V^T (gamma * phi'(sign(gamma) V u))`` (a different layer; the paper's claim that it is convex is
false). The core uses :func:`cemlib.kernels.dispatch.tied_gated_mlp_step` for phi = ∫SiLU with the
standard variant; GELU / ReLU^2 and the sign variant are computed in this module.
"""

from __future__ import annotations

import torch
from torch import nn

from cemlib.energies.cem import elementwise_energy, sign_variant_energy
from cemlib.energies.phi import get_phi
from cemlib.kernels import dispatch
from cemlib.layers.base import EnergyLayer, check_norm_eps, check_step_size
from cemlib.layers.norm import RMSNorm
from cemlib.layers.precondition import Preconditioner
from cemlib.utils import check_positive_int, check_tensor, finite_check_is_free

__all__ = ["CEMMLP"]

VARIANTS = ("standard", "sign")


class CEMMLP(EnergyLayer):
    """Tied gated MLP from the element-wise energy, T recursive steps, optional ``P_mlp``.

    ``forward(x)`` maps (..., D_h) to ``x^(T)``; ``energy(x, h)`` is ``xi(N(x) | gamma(h))`` per
    token and ``energy_grad(x, h)`` its exact closed-form gradient (``h`` defaults to ``x``).

    .. important::
       ``forward`` returns the **updated stream** ``x^(T) = x + update``, not an update, and it
       normalises its input itself (its own RMSNorm, for ``gamma`` and for the query). It replaces
       a whole pre-norm MLP sublayer ``x + MLP(RMSNorm(x))``:

       - right: ``x = mlp(x)``;
       - wrong: ``x = x + mlp(norm(x))`` (the usual way to call an MLP), which adds the stream
         twice and normalises twice; it runs without an error and trains a different model.

       At T = 1 with ``P = I`` and ``eta = 1`` it equals the pre-norm tied gated MLP
       ``x + V^T (W RMSNorm(x) * SiLU(V RMSNorm(x)))``. For dropout on its update use
       :class:`~cemlib.layers.reuse.IncrementDropout`.

    :param d_model: the width ``D_h`` of the stream.
    :param d_v: the hidden width (rows of ``V`` and ``W``); ``1.5 x`` a SwiGLU's ``d_ff`` matches
        its parameter count.
    :param T: recursion steps (eq. 17); ``gamma`` stays fixed, only the query moves.
    :param eta: the step size (finite, >= 0).
    :param learn_eta: make ``eta`` a learned parameter.
    :param phi: the element-wise potential, ``"silu"``, ``"gelu"`` or ``"relu2"`` (``phi'`` is
        SiLU, the gated MLP, GELU or ReLU; :func:`cemlib.energies.phi.get_phi`).
    :param variant: ``"standard"`` (eq. 7) or ``"sign"`` (Appendix C, a different layer).
    :param query_norm: RMS-normalise the query inside the recursion; ``False`` makes the update an
        exact gradient step.
    :param preconditioner: ``P_mlp``: ``"none"``, ``"diag"`` or ``"dplr"`` (eqs. 13, 15).
    :param precond_rank: rank of the ``"dplr"`` preconditioner.
    :param precond_safeguard: keep ``P_mlp`` positive definite (cemlib's safeguard).
    :param norm_eps: the RMSNorm's epsilon.
    :param init_std: standard deviation of the initial ``V``, ``W``.
    :param check_finite: reject NaN/Inf input with a clear error (one device sync per call).
    """

    def __init__(self, d_model: int, d_v: int, *, T: int = 1, eta: float = 1.0,
                 learn_eta: bool = False, phi: str = "silu", variant: str = "standard",
                 query_norm: bool = True, preconditioner: str = "none", precond_rank: int = 16,
                 precond_safeguard: bool = False, norm_eps: float = 1e-6, init_std: float = 0.02,
                 check_finite: bool = True):
        super().__init__()
        check_positive_int(d_model, "d_model")
        check_positive_int(d_v, "d_v")
        self.T = check_positive_int(T, "T")
        check_step_size(eta, "eta")
        check_norm_eps(norm_eps, "norm_eps")
        get_phi(phi)
        if variant not in VARIANTS:
            raise ValueError(f"variant must be one of {VARIANTS}, got {variant!r}")
        self.d_model, self.d_v, self.phi, self.variant = d_model, d_v, phi, variant
        self.query_norm, self.check_finite = query_norm, check_finite
        self.norm = RMSNorm(d_model, eps=norm_eps)
        self.W = nn.Parameter(torch.randn(d_v, d_model) * init_std)
        self.V = nn.Parameter(torch.randn(d_v, d_model) * init_std)
        self.eta = nn.Parameter(torch.tensor(float(eta))) if learn_eta else float(eta)
        self.P = Preconditioner(d_model, preconditioner, precond_rank, safeguard=precond_safeguard)

    def _check(self, x: torch.Tensor, name: str) -> None:
        """Rank and width; with ``check_finite``, NaN/Inf too where that check is free (CPU
        tensors, eager mode: :func:`cemlib.utils.finite_check_is_free`), so that it never
        synchronises a GPU nor breaks a ``torch.compile`` graph."""
        check_tensor(x, name, last_dim=self.d_model,
                     finite=self.check_finite and finite_check_is_free(x))
        if x.dim() < 2:
            raise ValueError(f"{name} must have at least 2 dimensions (..., D_h), got {tuple(x.shape)}")

    def gamma(self, h: torch.Tensor) -> torch.Tensor:
        """``gamma = W RMSNorm(h)`` (computed once per layer call, Algorithm 1)."""
        return self.norm(h) @ self.W.T

    def query(self, x: torch.Tensor) -> torch.Tensor:
        """``u = RMSNorm(x)`` inside the recursion, or ``x`` if not ``query_norm``."""
        return self.norm(x) if self.query_norm else x

    def neg_grad(self, u: torch.Tensor, gamma: torch.Tensor) -> torch.Tensor:
        """``-grad_u xi = V^T (gamma * phi'(V u))`` (eq. 10; sign variant: ``phi'(sign(gamma) V u)``)."""
        V = self.V.to(gamma.dtype)              # one dtype under autocast (gamma comes from a matmul)
        u = u.to(gamma.dtype)
        if self.variant == "standard" and self.phi == "silu":
            return dispatch.tied_gated_mlp_step(u, V, gamma)
        z = u @ V.T
        if self.variant == "sign":
            z = torch.sign(gamma) * z
        return (gamma * get_phi(self.phi).sigma(z)) @ V

    def forward(self, x: torch.Tensor, return_trajectory: bool = False):
        """``x^(T)``; with ``return_trajectory`` also ``[x^(0), ..., x^(T)]``
        (eq. 17)."""
        self._check(x, "x")
        hn = self.norm(x)
        gamma = hn @ self.W.T  # = self.gamma(x)
        traj = [x]
        for t in range(self.T):
            # at t = 0, x = h: the query RMSNorm(x) is hn (same module), reused
            u = hn if t == 0 and self.query_norm else self.query(x)
            x = x + self.eta * self.P(self.neg_grad(u, gamma))
            traj.append(x)
        return (x, traj) if return_trajectory else x

    def energy(self, x: torch.Tensor, h: torch.Tensor | None = None) -> torch.Tensor:
        """``xi(N(x) | h) = -gamma^T phi(V N(x))`` per token (eq. 7; Appendix C for ``sign``)."""
        h = x if h is None else h
        self._check(x, "x")
        self._check(h, "h")
        fn = elementwise_energy if self.variant == "standard" else sign_variant_energy
        return fn(self.query(x), self.gamma(h), self.V, self.phi)

    def energy_grad(self, x: torch.Tensor, h: torch.Tensor | None = None) -> torch.Tensor:
        """Exact ``grad_x`` of :meth:`energy` (eq. 8, times ``J^T`` of RMSNorm if ``query_norm``)."""
        h = x if h is None else h
        self._check(x, "x")
        self._check(h, "h")
        g = -self.neg_grad(self.query(x), self.gamma(h))
        return self.norm.vjp(x, g) if self.query_norm else g

    def extra_repr(self) -> str:
        return (f"d_model={self.d_model}, d_v={self.d_v}, T={self.T}, phi={self.phi!r}, "
                f"variant={self.variant!r}, query_norm={self.query_norm}")
