"""Helmholtz free energies of attention ("Transformers as intrinsic optimizers", ICLR 2026 sub.).

Notation of the paper (Anonymous, "Transformers as Intrinsic Optimizers: Forward Inference through
the Energy Principle", ICLR 2026 submission; §2 and App. A), in cemlib's row layout:
the token being updated is ``z`` with shape ``(..., d)``; the attended tokens ("particles") are
``h`` with shape ``(..., N, d)``; ``m_i = W h_i`` are the transformed particles; ``T > 0`` is the
temperature. An optional boolean ``mask`` of shape ``(..., N)`` (broadcastable) selects the
attended particles (``True`` = attended), which gives the causal sets ``H_{<=i}`` of eq. (15).

- eq. (2):  ``F = sum_i p_i E_i + T sum_i p_i log p_i``           (:func:`helmholtz`)
- eq. (3):  ``F* = -T log sum_i exp(-E_i / T)`` at ``p = Boltzmann`` (:func:`free_energy`)
- eq. (4):  elastic energy ``E_i = 1/2 ||z - W h_i||^2``         (:func:`elastic_free_energy`)
- Thm. 1:   inner-product energy ``E_i = -z^T W h_i`` (F~*)      (:func:`inner_free_energy`)
- eq. (14): quadratic global energy ``-T/2 sum_i E_i^2``          (:func:`quadratic_energy`)
- §4:       multi-head average ``(1/H) sum_h F_h*`` of eq. (26)   (:func:`multihead_free_energy`)

Each energy has its closed-form gradient and Hessian here (no autograd), which the layers in
:mod:`cemlib.layers.helmholtz` and :mod:`cemlib.layers.newton` use and the tests check against
``torch.autograd``. Two facts the paper gets wrong are visible in these formulas:
``grad F~* = -sum_i p~_i m_i`` carries no factor ``T`` (so the tying is ``W_V = eta W``, not
``eta T W``), and ``grad F* = z - sum_i p_i m_i`` differs from ``grad F~*`` by ``z`` even on the
sphere (so the residual attention layer is a step on ``F~*``, not on ``F*``).
"""

from __future__ import annotations

import torch

from cemlib.utils import check_tensor

__all__ = [
    "boltzmann", "helmholtz", "free_energy", "elastic_energies", "inner_product_energies",
    "elastic_free_energy", "elastic_free_energy_grad", "elastic_free_energy_hessian",
    "inner_free_energy", "inner_free_energy_grad", "inner_free_energy_hessian",
    "quadratic_energy", "quadratic_energy_grad", "quadratic_energy_hessian",
    "weighted_mean_and_cov", "multihead_head_free_energies", "multihead_free_energy",
    "multihead_free_energy_grad", "multihead_head_hessians", "head_statistics",
    "check_temperature", "check_particles",
]


# ----------------------------------------------------------------------------- input checks
def check_temperature(T, name: str = "T") -> None:
    """Raise unless ``T`` (a number or a tensor) is finite and strictly positive."""
    t = torch.as_tensor(T)
    if not torch.isfinite(t).all() or (t <= 0).any():
        raise ValueError(f"{name} must be finite and > 0, got {T!r}")


def _check_mask(mask, shape) -> torch.Tensor | None:
    if mask is None:
        return None
    if not isinstance(mask, torch.Tensor) or mask.dtype != torch.bool:
        raise TypeError(f"mask must be a bool tensor, got {type(mask).__name__}"
                        + (f" of dtype {mask.dtype}" if isinstance(mask, torch.Tensor) else ""))
    try:
        full = mask.expand(shape)
    except RuntimeError:
        raise ValueError(f"mask of shape {tuple(mask.shape)} does not broadcast to the particle "
                         f"shape {tuple(shape)}") from None
    if not full.any(-1).all():
        raise ValueError("mask leaves a token with no attended particle (log-sum-exp over an "
                         "empty set)")
    return mask


def check_particles(z: torch.Tensor, h: torch.Tensor, mask=None, W: torch.Tensor | None = None):
    """Check ``z (..., d)``, ``h (..., N, d)``, optional square ``W (d, d)`` and bool ``mask``."""
    check_tensor(z, "z")
    check_tensor(h, "h")
    if z.dim() < 1 or h.dim() < 2:
        raise ValueError(f"z must be (..., d) and h (..., N, d); got z {tuple(z.shape)}, "
                         f"h {tuple(h.shape)}")
    d = z.shape[-1]
    if h.shape[-1] != d:
        raise ValueError(f"width mismatch: z has d={d} but h has shape {tuple(h.shape)}")
    if W is not None:
        check_tensor(W, "W", ndim=2)
        if W.shape != (d, d):
            raise ValueError(f"W must be ({d}, {d}), got {tuple(W.shape)}")
    lead = torch.broadcast_shapes(z.shape[:-1], h.shape[:-2])
    return _check_mask(mask, (*lead, h.shape[-2]))


# ----------------------------------------------------------------------------- eqs. (2)-(3)
def _masked(x: torch.Tensor, mask, fill: float) -> torch.Tensor:
    return x if mask is None else x.masked_fill(~mask, fill)


def boltzmann(E: torch.Tensor, T, mask=None) -> torch.Tensor:
    """Boltzmann weights ``p_i = exp(-E_i/T) / Z`` over the last axis (Lemma 1)."""
    check_temperature(T)
    return torch.softmax(_masked(-E / T, mask, float("-inf")), dim=-1)


def helmholtz(p: torch.Tensor, E: torch.Tensor, T) -> torch.Tensor:
    """Eq. (2): ``F(p) = sum_i p_i E_i + T sum_i p_i log p_i`` (with ``0 log 0 = 0``)."""
    check_temperature(T)
    plogp = torch.where(p > 0, p * torch.log(p.clamp_min(torch.finfo(p.dtype).tiny)), 0.0)
    return (p * E).sum(-1) + T * plogp.sum(-1)


def free_energy(E: torch.Tensor, T, mask=None) -> torch.Tensor:
    """Eq. (3): ``F* = -T log sum_i exp(-E_i / T)``, the minimum of eq. (2) over the simplex."""
    check_temperature(T)
    return -T * torch.logsumexp(_masked(-E / T, mask, float("-inf")), dim=-1)


def elastic_energies(z: torch.Tensor, m: torch.Tensor) -> torch.Tensor:
    """Eq. (4): ``E_i = 1/2 ||z - m_i||^2`` with ``m_i = W h_i``; shape ``(..., N)``."""
    return 0.5 * (z.unsqueeze(-2) - m).pow(2).sum(-1)


def inner_product_energies(z: torch.Tensor, m: torch.Tensor) -> torch.Tensor:
    """Theorems 1 and 3: ``E_i = -z^T m_i``; shape ``(..., N)``."""
    return -(z.unsqueeze(-2) * m).sum(-1)


def weighted_mean_and_cov(p: torch.Tensor, m: torch.Tensor):
    """``m_bar = sum_i p_i m_i`` and ``Cov_p = sum_i p_i d_i d_i^T`` with ``d_i = m_i - m_bar``."""
    mbar = (p.unsqueeze(-1) * m).sum(-2)
    dev = m - mbar.unsqueeze(-2)
    cov = torch.einsum("...i,...ia,...ib->...ab", p, dev, dev)
    return mbar, cov


def _eye_like(z: torch.Tensor) -> torch.Tensor:
    return torch.eye(z.shape[-1], dtype=z.dtype, device=z.device)


# ----------------------------------------------------------------------------- elastic F*, eq. (4)
def elastic_free_energy(z, h, W, T, mask=None) -> torch.Tensor:
    """Eq. (4): ``F*(z) = -T log sum_i exp(-||z - W h_i||^2 / 2T)``; shape ``z.shape[:-1]``."""
    mask = check_particles(z, h, mask, W)
    return free_energy(elastic_energies(z, h @ W.T), T, mask)


def elastic_free_energy_grad(z, h, W, T, mask=None) -> torch.Tensor:
    """A.5: ``grad F* = sum_i p_i (z - W h_i) = z - h_bar`` (``p`` = RBF softmax)."""
    mask = check_particles(z, h, mask, W)
    m = h @ W.T
    p = boltzmann(elastic_energies(z, m), T, mask)
    return z - (p.unsqueeze(-1) * m).sum(-2)


def elastic_free_energy_hessian(z, h, W, T, mask=None) -> torch.Tensor:
    """Eq. (9): ``Hess F* = I - (1/T) sum_i p_i d_i d_i^T``; shape ``(..., d, d)``."""
    mask = check_particles(z, h, mask, W)
    m = h @ W.T
    p = boltzmann(elastic_energies(z, m), T, mask)
    return _eye_like(z) - weighted_mean_and_cov(p, m)[1] / T


# ----------------------------------------------------------------------------- inner-product F~*
def inner_free_energy(z, h, W, T, mask=None) -> torch.Tensor:
    """The inner-product free energy of Theorem 1 and its proof (the intrinsic-optimizers paper):
``F~*(z) = -T log sum_i exp(z^T W h_i / T)``.

    On the sphere ``||z|| = ||W h_i|| = rho`` it equals ``F* - rho^2``."""
    mask = check_particles(z, h, mask, W)
    return free_energy(inner_product_energies(z, h @ W.T), T, mask)


def inner_free_energy_grad(z, h, W, T, mask=None) -> torch.Tensor:
    """``grad F~* = -sum_i p~_i W h_i`` (the proof of Theorem 1 has a spurious factor ``T``)."""
    mask = check_particles(z, h, mask, W)
    m = h @ W.T
    p = boltzmann(inner_product_energies(z, m), T, mask)
    return -(p.unsqueeze(-1) * m).sum(-2)


def inner_free_energy_hessian(z, h, W, T, mask=None) -> torch.Tensor:
    """A.5: ``Hess F~* = -(1/T) Cov_p~(W h)``, negative semi-definite (Lemma 2: concave)."""
    mask = check_particles(z, h, mask, W)
    m = h @ W.T
    p = boltzmann(inner_product_energies(z, m), T, mask)
    return -weighted_mean_and_cov(p, m)[1] / T


# ----------------------------------------------------------------------------- linear, eq. (14)
def _mask_weights(z, h, mask):
    """Masked-out particles contribute nothing to the quadratic energy."""
    return None if mask is None else mask.to(z.dtype)


def quadratic_energy(z, h, W, T, mask=None) -> torch.Tensor:
    """Eq. (14) (with its missing ``sum_i``): ``F* = -T/2 sum_i (z^T W h_i)^2`` (concave)."""
    mask = check_particles(z, h, mask, W)
    check_temperature(T)
    s = inner_product_energies(z, h @ W.T).pow(2)
    w = _mask_weights(z, h, mask)
    return -0.5 * T * (s if w is None else s * w).sum(-1)


def quadratic_energy_grad(z, h, W, T, mask=None) -> torch.Tensor:
    """Theorem 3 (its proof, App. A.3, corrected): ``grad F* = -T sum_i (z^T W h_i) W h_i``."""
    mask = check_particles(z, h, mask, W)
    check_temperature(T)
    m = h @ W.T
    s = (z.unsqueeze(-2) * m).sum(-1)
    w = _mask_weights(z, h, mask)
    s = s if w is None else s * w
    return -T * (s.unsqueeze(-1) * m).sum(-2)


def quadratic_energy_hessian(z, h, W, T, mask=None) -> torch.Tensor:
    """``Hess F* = -T sum_i (W h_i)(W h_i)^T`` (constant in ``z``; negative semi-definite)."""
    mask = check_particles(z, h, mask, W)
    check_temperature(T)
    m = h @ W.T
    if mask is None:
        w = torch.ones(m.shape[:-1], dtype=m.dtype, device=m.device)
    else:
        w = mask.to(m.dtype).expand(m.shape[:-1])
    return -T * torch.einsum("...i,...ia,...ib->...ab", w, m, m)


# ----------------------------------------------------------------------------- multi-head, A.8
def _check_heads(z, W1, W2, T):
    check_tensor(W1, "W1", ndim=3)
    check_tensor(W2, "W2", ndim=3)
    if W1.shape != W2.shape:
        raise ValueError(f"W1 {tuple(W1.shape)} and W2 {tuple(W2.shape)} must have the same shape "
                         "(H, d_h, d)")
    if W1.shape[-1] != z.shape[-1]:
        raise ValueError(f"head projections have input width {W1.shape[-1]}, z has {z.shape[-1]}")
    t = torch.as_tensor(T, dtype=z.dtype)
    if t.dim() > 1 or (t.dim() == 1 and t.shape[0] not in (1, W1.shape[0])):
        raise ValueError(f"T must be a scalar or have one entry per head ({W1.shape[0]}), got "
                         f"shape {tuple(t.shape)}")
    check_temperature(t)
    return t.reshape(-1, 1) if t.dim() == 1 else t


def head_statistics(z, h, W1, W2, T, mask):
    """Per head: ``q_h = W1_h z`` (..., H, d_h), ``k_ih = W2_h h_i`` (..., H, N, d_h), energies,
    RBF weights ``p_ih``, temperatures shaped for broadcasting, and the per-head mask."""
    mask = check_particles(z, h, mask)
    t = _check_heads(z, W1, W2, T)
    q = torch.einsum("hcd,...d->...hc", W1, z)
    k = torch.einsum("hcd,...nd->...hnc", W2, h)
    hm = None if mask is None else mask.unsqueeze(-2)
    E = elastic_energies(q, k)                                   # (..., H, N)
    p = torch.softmax(_masked(-E / t, hm, float("-inf")), dim=-1)
    return q, k, E, p, t, hm


def multihead_head_free_energies(z, h, W1, W2, T, mask=None) -> torch.Tensor:
    """``F_h* = -T_h log sum_i exp(-||W1_h z - W2_h h_i||^2 / 2T_h)``; shape ``(..., H)``."""
    _, _, E, _, t, hm = head_statistics(z, h, W1, W2, T, mask)
    return -t.squeeze(-1) * torch.logsumexp(_masked(-E / t, hm, float("-inf")), dim=-1)


def multihead_free_energy(z, h, W1, W2, T, mask=None) -> torch.Tensor:
    """§4 / Theorem 2: the average ``F* = (1/H) sum_h F_h*`` over the head subspaces."""
    return multihead_head_free_energies(z, h, W1, W2, T, mask).mean(-1)


def multihead_free_energy_grad(z, h, W1, W2, T, mask=None) -> torch.Tensor:
    """A.7: ``grad F* = (1/H) sum_h W1_h^T (q_h - k_bar_h)``."""
    q, k, _, p, _, _ = head_statistics(z, h, W1, W2, T, mask)
    kbar = (p.unsqueeze(-1) * k).sum(-2)
    return torch.einsum("hcd,...hc->...d", W1, q - kbar) / W1.shape[0]


def multihead_head_hessians(z, h, W1, W2, T, mask=None) -> torch.Tensor:
    """Eq. (26): ``Hess F_h* = W1_h^T [I - (1/T_h) Cov_p_h(k_h)] W1_h``; ``(..., H, d, d)``."""
    _, k, _, p, t, _ = head_statistics(z, h, W1, W2, T, mask)
    cov = weighted_mean_and_cov(p, k)[1]
    C = torch.eye(W1.shape[1], dtype=z.dtype, device=z.device) - cov / t.unsqueeze(-1)
    return torch.einsum("hcd,...hce,hef->...hdf", W1, C, W1)
