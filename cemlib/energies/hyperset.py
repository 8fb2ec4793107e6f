"""Hyper-SET energies on the hypersphere (Hu et al. 2025, arXiv:2502.11646, §4, App. B-C).

Row layout: tokens ``X (..., N, d)``; subspace bases ``W = [W_1 .. W_H]`` stored as one ``(d, H p)``
matrix; projections ``Z_h = X W_h`` (..., N, p); feed-forward directions ``D (d, M)``.
With ``normalize=True`` each projection is replaced by ``RMSNorm`` (unit gain), which puts it on the
sphere of radius ``sqrt(p)`` (resp. ``sqrt(M)``): the constraints of eqs. (4) and (5).

Attention energies (per token ``i``, summed over heads), functions of the projections ``Z``:

- eq. (3):          ``E_i = beta^{-1} log sum_j exp(beta z_i^T z_j)``            ("bisoftmax")
- Table 19 sigmoid: ``E_i = (2 beta)^{-1} sum_j sigma(beta z_i^T z_j)``             ("sigmoid")
- Table 19 linear:  ``E_i = (4 beta)^{-1} sum_j (beta Phi(z_i)^T Phi(z_j))^2``, ``Phi = sigma``
  ("linear")

Feed-forward energies (per token), functions of ``U = D^T x``:

- eq. (5):          ``E = -1/2 sum_m ReLU(u_m)^2``                                 ("relu")
- Table 20 softmax: ``E = -log sum_m exp(u_m)``                                    ("softmax")
- Table 20 gated:   ``E = -1/2 (sum_m Phi(u_m))^2``, ``Phi = sigma``                 ("gated")

``*_grad`` functions give the closed-form gradient of the **summed** energy with respect to the
projections (the attention gradients include the key side: every token is query and key, which
gives the column-softmax term of eq. 7). Table 19 prints ``+grad`` in its ``-grad`` column for the
sigmoid and linear rows; the functions here are the true gradients (the tests check both).
"""

from __future__ import annotations

import math

import torch

from cemlib.normalization import rms_norm, rms_norm_vjp
from cemlib.utils import check_positive_int, check_tensor, merge_heads, split_heads

__all__ = [
    "ATTENTION_KERNELS", "FEEDFORWARD_KERNELS", "split_heads", "merge_heads", "check_tokens",
    "attention_energy", "attention_energy_grad", "ff_energy", "ff_energy_grad",
    "bisoftmax_energy", "bisoftmax_grad", "sigmoid_energy", "sigmoid_grad", "linear_energy",
    "linear_grad", "relu_ff_energy", "relu_ff_grad", "softmax_ff_energy", "softmax_ff_grad",
    "gated_ff_energy", "gated_ff_grad",
]


# ----------------------------------------------------------------------------- shapes and checks
def check_tokens(X: torch.Tensor, d: int, name: str = "X") -> torch.Tensor:
    """``X`` must be ``(..., N, d)``, at least two tokens' worth of dims, finite (checked where
    that is free: :func:`cemlib.utils.finite_check_is_free`)."""
    check_tensor(X, name, last_dim=d, finite="where_free")
    if X.dim() < 2:
        raise ValueError(f"{name} must be (..., N, {d}), got shape {tuple(X.shape)}")
    return X


def _beta(Z: torch.Tensor, beta: float | None) -> float:
    return 1.0 / math.sqrt(Z.shape[-1]) if beta is None else float(beta)


def _gram(Z, beta):
    return beta * Z @ Z.transpose(-1, -2)


# ----------------------------------------------------------------------------- attention kernels
def bisoftmax_energy(Z, beta=None):
    """Eq. (3) per token: ``beta^{-1} LSE_j(beta z_i^T z_j)``; ``Z (..., N, p) -> (..., N)``."""
    b = _beta(Z, beta)
    return torch.logsumexp(_gram(Z, b), dim=-1) / b


def bisoftmax_grad(Z, beta=None):
    """Eq. (7): ``grad_Z sum_i E_i = (softmax_row(G) + softmax_col(G)) Z`` (``G`` symmetric)."""
    G = _gram(Z, _beta(Z, beta))
    return (torch.softmax(G, -1) + torch.softmax(G, -2)) @ Z


def sigmoid_energy(Z, beta=None):
    """Table 19 per token: ``(2 beta)^{-1} sum_j sigma(beta z_i^T z_j)``."""
    b = _beta(Z, beta)
    return torch.sigmoid(_gram(Z, b)).sum(-1) / (2 * b)


def sigmoid_grad(Z, beta=None):
    """``+sigma'(G) Z`` (Table 19 prints this as ``-grad``: the sign there is wrong)."""
    s = torch.sigmoid(_gram(Z, _beta(Z, beta)))
    return (s * (1 - s)) @ Z


def linear_energy(Z, beta=None):
    """Table 19 per token: ``(4 beta)^{-1} sum_j (beta Phi_i^T Phi_j)^2``, ``Phi = sigma(Z)``."""
    b = _beta(Z, beta)
    P = torch.sigmoid(Z)
    return (b * P @ P.transpose(-1, -2)).pow(2).sum(-1) / (4 * b)


def linear_grad(Z, beta=None):
    """``+Phi'(Z) * beta Phi (Phi^T Phi)`` in ``O(N p^2)`` (Table 19 prints it as ``-grad``)."""
    b = _beta(Z, beta)
    P = torch.sigmoid(Z)
    return P * (1 - P) * (b * P @ (P.transpose(-1, -2) @ P))


ATTENTION_KERNELS = {
    "bisoftmax": (bisoftmax_energy, bisoftmax_grad),
    "sigmoid": (sigmoid_energy, sigmoid_grad),
    "linear": (linear_energy, linear_grad),
}


# ----------------------------------------------------------------------------- feed-forward kernels
def relu_ff_energy(U):
    """Eq. (5) per token: ``-1/2 sum_m ReLU(u_m)^2``."""
    return -0.5 * torch.relu(U).pow(2).sum(-1)


def relu_ff_grad(U):
    """Eq. (10): ``grad_U = -ReLU(U)``."""
    return -torch.relu(U)


def softmax_ff_energy(U):
    """Table 20 (the vMF-mixture energy of eq. 15): ``-log sum_m exp(u_m)``."""
    return -torch.logsumexp(U, dim=-1)


def softmax_ff_grad(U):
    return -torch.softmax(U, dim=-1)


def gated_ff_energy(U):
    """Table 20: ``-1/2 (sum_m sigma(u_m))^2``."""
    return -0.5 * torch.sigmoid(U).sum(-1).pow(2)


def gated_ff_grad(U):
    """``-(sum_m Phi_m) Phi'(U)``: one scalar gate per token (Table 20's "column sum")."""
    P = torch.sigmoid(U)
    return -P.sum(-1, keepdim=True) * P * (1 - P)


FEEDFORWARD_KERNELS = {
    "relu": (relu_ff_energy, relu_ff_grad),
    "softmax": (softmax_ff_energy, softmax_ff_grad),
    "gated": (gated_ff_energy, gated_ff_grad),
}


def _kernel(table, kind, what):
    if kind not in table:
        raise ValueError(f"unknown {what} kind {kind!r}; choose from {sorted(table)}")
    return table[kind]


# ----------------------------------------------------------------------------- energies of X
def attention_energy(X, W, n_heads: int, normalize: bool = True, kind: str = "bisoftmax",
                     beta: float | None = None, eps: float = 1e-6) -> torch.Tensor:
    """Eqs. (3)-(4) (or a Table 19 variant): ``sum_h E^h_i`` per token, shape ``X.shape[:-1]``.

    With ``normalize`` the projections are ``RMSNorm(W_h^T x_i)`` (norm ``sqrt(p)``), as in eq. (8).
    """
    check_tokens(X, W.shape[0])
    energy, _ = _kernel(ATTENTION_KERNELS, kind, "attention")
    Z = split_heads(X @ W, n_heads)
    U = rms_norm(Z, eps=eps) if normalize else Z
    return energy(U, beta).sum(-2)


def attention_energy_grad(X, W, n_heads: int, normalize: bool = True, kind: str = "bisoftmax",
                          beta: float | None = None, eps: float = 1e-6) -> torch.Tensor:
    """Exact ``grad_X sum_i E_i``: ``sum_h [J_h^T grad_U E] W_h^T`` (``J_h`` = RMSNorm Jacobian)."""
    check_tokens(X, W.shape[0])
    _, grad = _kernel(ATTENTION_KERNELS, kind, "attention")
    Z = split_heads(X @ W, n_heads)
    if normalize:
        gZ = rms_norm_vjp(Z, grad(rms_norm(Z, eps=eps), beta), eps=eps)
    else:
        gZ = grad(Z, beta)
    return merge_heads(gZ) @ W.T


def ff_energy(X, D, normalize: bool = True, kind: str = "relu", eps: float = 1e-6):
    """Eq. (5) (or a Table 20 variant) per token, at ``U = RMSNorm(D^T x)`` if ``normalize``."""
    check_tokens(X, D.shape[0])
    energy, _ = _kernel(FEEDFORWARD_KERNELS, kind, "feed-forward")
    U = X @ D
    return energy(rms_norm(U, eps=eps) if normalize else U)


def ff_energy_grad(X, D, normalize: bool = True, kind: str = "relu", eps: float = 1e-6):
    """Exact ``grad_X sum_i E_FF``: ``(J^T grad_U E) D^T`` (eq. 10 when not normalised)."""
    check_tokens(X, D.shape[0])
    _, grad = _kernel(FEEDFORWARD_KERNELS, kind, "feed-forward")
    U = X @ D
    gU = rms_norm_vjp(U, grad(rms_norm(U, eps=eps)), eps=eps) if normalize else grad(U)
    return gU @ D.T
