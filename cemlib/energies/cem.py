"""CEM energies as plain functions: interaction energy, element-wise energy, Appendix-C variants.

Equation numbers: "[arXiv] eq. N = [ICLR] eq. M" where the two versions of the CEM paper differ
([arXiv]: Xu et al. 2026, arXiv:2605.07588v1; [ICLR]: its ICLR 2026 submission version, "Recasting
Transformer Layers as Energy Models"). Shapes: state ``x`` (B, L, D_h); context ``h`` (B, L, D_h);
per-head projections ``W_Q, W_K`` (K, D_r, D_h); a token's energy is conditioned on ``h_{1:i}``.

Interaction energy ([arXiv] eq. 2 = [ICLR] eq. 1, with eq. 12 and Appendix B):

    eps(x_i | h_{1:i}) = -tau sum_k log sum_{j<=i} exp(s_kij),
    s_kij = (k_j^k . W_Q^k x_i + h_j . (d_k * x_i)) / tau - m_k |i-j| + b_self_k [i=j] + b_cross_k [i!=j]

with ``k_j^k = W_K^k h_j`` (so ``beta_kj = A_k h_j``, ``A_k = diag(d_k) + W_Q^kT W_K^k``).
Its exact gradient ([arXiv] eq. 3 = [ICLR] eq. 2, extended to eq. 12) is

    grad eps = -sum_k [ W_Q^kT sum_j alpha_kij k_j^k  +  d_k * sum_j alpha_kij h_j ];

the second ("diagonal value") term is absent from Algorithm 1 (see ``diag_value_term``).

Element-wise energy (eq. 7) ``xi(x_i | h_i) = -gamma_i^T phi(V x_i)``, ``gamma_i = W h_i``, with
gradient (eq. 8) ``-V^T (gamma_i * phi'(V x_i))``; the Appendix-C "sign" variant
``-|gamma|^T phi(sign(gamma) * V x)``, which the paper calls convex and which is concave for
convex phi (:func:`elementwise_hessian` shows it); and the Hopfield energies of Appendix C.

RoPE (Appendix B, ``A_k = W_Q^kT R(i)^T R(j) W_K^k``; ``rope=True``): the paper rejects it because
the "value projection becomes query-dependent"; the gradient
``-W_Q^kT R(i)^T sum_j alpha_kij R(j) k_j^k`` shows that the aggregated values are the rotated keys,
which do not depend on i (our reading of Appendix B, where the paper rejects RoPE because "the value
projection effectively becomes query-dependent"; tested in ``tests/energies/test_cem_energies.py``).
"""

from __future__ import annotations

import torch

from cemlib.energies.phi import get_phi
from cemlib.positional import apply_rope, attention_bias, rope_angles

__all__ = ["interaction_logits", "interaction_energy", "interaction_energy_grad",
           "elementwise_energy", "elementwise_energy_grad", "sign_variant_energy",
           "sign_variant_energy_grad", "elementwise_hessian", "hopfield_energy",
           "classical_hopfield_energy"]


def _diag_query(x: torch.Tensor, d: torch.Tensor | None, K: int) -> torch.Tensor | None:
    """``d_k * x`` as (B, K, L, D_h), or None without a diagonal."""
    if d is None:
        return None
    if d.dim() == 1:
        return (d * x)[:, None].expand(-1, K, -1, -1)
    if d.dim() == 2 and d.shape[0] == K:
        return d[None, :, None, :] * x[:, None]
    raise ValueError(f"d must have shape (D_h,) or (K={K}, D_h), got {tuple(d.shape)}")


def _check(x, h, W_Q, W_K):
    if x.dim() != 3 or h.shape != x.shape:
        raise ValueError(f"x and h must both be (B, L, D_h); got {tuple(x.shape)} and {tuple(h.shape)}")
    if W_Q.dim() != 3 or W_K.shape != W_Q.shape or W_Q.shape[-1] != x.shape[-1]:
        raise ValueError(f"W_Q and W_K must both be (K, D_r, D_h={x.shape[-1]}); got "
                         f"{tuple(W_Q.shape)} and {tuple(W_K.shape)}")


def _keys(h, W_K, rope: bool):
    """``k_j^k = W_K^k h_j`` (B, K, L, D_r), rotated by ``R(j)`` with ``rope``."""
    k = torch.einsum("krh,blh->bklr", W_K, h)
    if rope:
        k = apply_rope(k, *rope_angles(h.shape[1], k.shape[-1], device=h.device, dtype=h.dtype))
    return k


def interaction_logits(x, h, W_Q, W_K, *, tau, d=None, alibi=None, self_bias=None,
                       cross_bias=None, rope: bool = False) -> torch.Tensor:
    """Logits ``s_kij`` of (B, K, L, L), ``-inf`` for j > i (Appendix B "interaction energy with
    bias"; ALiBi with the [arXiv] sign ``-m_k|i-j|``, the [ICLR] ``+`` sign is wrong)."""
    _check(x, h, W_Q, W_K)
    K, L = W_Q.shape[0], x.shape[1]
    q = _keys(x, W_Q, rope)                      # R(i) W_Q x_i
    s = torch.einsum("bkir,bkjr->bkij", q, _keys(h, W_K, rope))
    qd = _diag_query(x, d, K)
    if qd is not None:
        s = s + torch.einsum("bkih,bjh->bkij", qd, h)
    bias = attention_bias(L, K, alibi=alibi, self_bias=self_bias, cross_bias=cross_bias,
                          dtype=s.dtype, device=s.device)
    return s / tau + bias


def interaction_energy(x, h, W_Q, W_K, *, tau, d=None, alibi=None, self_bias=None,
                       cross_bias=None, rope: bool = False, per_head: bool = False) -> torch.Tensor:
    """``eps(x_i | h_{1:i})`` per token, shape (B, L) ([arXiv] eq. 2 = [ICLR] eq. 1, eq. 12,
    Appendix B); with ``per_head=True`` the per-head terms ``-tau lse_k`` of shape (B, K, L)."""
    s = interaction_logits(x, h, W_Q, W_K, tau=tau, d=d, alibi=alibi, self_bias=self_bias,
                           cross_bias=cross_bias, rope=rope)
    e = -tau * torch.logsumexp(s, dim=-1)
    return e if per_head else e.sum(1)


def interaction_energy_grad(x, h, W_Q, W_K, *, tau, d=None, alibi=None, self_bias=None,
                            cross_bias=None, rope: bool = False, diag_value_term: bool = True,
                            per_head: bool = False) -> torch.Tensor:
    """Closed-form ``grad_x eps`` ([arXiv] eq. 3 = [ICLR] eq. 2, with eq. 12), shape of ``x``, or
    (B, K, L, D_h) per head. ``diag_value_term=False`` gives Algorithm 1's form, which drops
    ``d_k * sum_j alpha_kij h_j`` and is then *not* the gradient (unless ``d`` is None)."""
    s = interaction_logits(x, h, W_Q, W_K, tau=tau, d=d, alibi=alibi, self_bias=self_bias,
                           cross_bias=cross_bias, rope=rope)
    alpha = torch.softmax(s, dim=-1)
    o = torch.einsum("bkij,bkjr->bkir", alpha, _keys(h, W_K, rope))  # values: (rotated) keys
    if rope:                                                          # R(i)^T after aggregation
        cos, sin = rope_angles(x.shape[1], o.shape[-1], device=x.device, dtype=x.dtype)
        o = apply_rope(o, cos, -sin)
    g = -torch.einsum("bkir,krh->bkih", o, W_Q)
    if d is not None and diag_value_term:
        dk = d[None, None, None, :] if d.dim() == 1 else d[None, :, None, :]
        g = g - dk * torch.einsum("bkij,bjh->bkih", alpha, h)
    return g if per_head else g.sum(1)


def _check_elementwise(x, gamma, V):
    if V.dim() != 2 or x.shape[-1] != V.shape[1] or gamma.shape[-1] != V.shape[0]:
        raise ValueError(f"need x (..., D_h), gamma (..., D_v), V (D_v, D_h); got x "
                         f"{tuple(x.shape)}, gamma {tuple(gamma.shape)}, V {tuple(V.shape)}")


def elementwise_energy(x, gamma, V, phi: str = "silu") -> torch.Tensor:
    """``xi(x_i | h_i) = -gamma_i^T phi(V x_i)`` per token (CEM eq. 7); ``gamma = W h``."""
    _check_elementwise(x, gamma, V)
    return -(gamma * get_phi(phi).phi(x @ V.T)).sum(-1)


def elementwise_energy_grad(x, gamma, V, phi: str = "silu") -> torch.Tensor:
    """``grad_x xi = -V^T (gamma * phi'(V x))`` (CEM eq. 8; eq. 10 at x = h)."""
    _check_elementwise(x, gamma, V)
    return -(gamma * get_phi(phi).sigma(x @ V.T)) @ V


def sign_variant_energy(x, gamma, V, phi: str = "silu") -> torch.Tensor:
    """Appendix C "sign-corrected" energy ``-|gamma|^T phi(sign(gamma) * V x)`` per token.

    The paper calls it convex for convex phi; it is concave (a non-negative combination of
    ``-phi``); see :func:`elementwise_hessian`. Kept for the book to show why.
    """
    _check_elementwise(x, gamma, V)
    return -(gamma.abs() * get_phi(phi).phi(torch.sign(gamma) * (x @ V.T))).sum(-1)


def sign_variant_energy_grad(x, gamma, V, phi: str = "silu") -> torch.Tensor:
    """``-V^T (gamma * phi'(sign(gamma) * V x))`` (Appendix C; uses sign(g)|g| = g)."""
    _check_elementwise(x, gamma, V)
    return -(gamma * get_phi(phi).sigma(torch.sign(gamma) * (x @ V.T))) @ V


def elementwise_hessian(x, gamma, V, phi: str = "silu", variant: str = "standard") -> torch.Tensor:
    """Hessian ``d^2 xi / dx^2`` of one token, shape (..., D_h, D_h).

    standard: ``-V^T diag(gamma * phi''(V x)) V`` (indefinite in general);
    sign:     ``-V^T diag(|gamma| * phi''(sign(gamma) V x)) V``, negative semi-definite whenever
    ``phi'' >= 0`` -- the Appendix-C variant is concave, not convex.
    """
    _check_elementwise(x, gamma, V)
    d2 = get_phi(phi).d2
    if variant == "standard":
        w = gamma * d2(x @ V.T)
    elif variant == "sign":
        w = gamma.abs() * d2(torch.sign(gamma) * (x @ V.T))
    else:
        raise ValueError(f"variant must be 'standard' or 'sign', got {variant!r}")
    return -torch.einsum("mh,...m,mg->...hg", V, w, V)


def hopfield_energy(x, H, *, tau: float = 1.0, quadratic: bool = True) -> torch.Tensor:
    """Modern Hopfield energy of Appendix C, ``-tau log sum_j exp(h_j^T x / tau)`` (+ ``|x|^2/2``
    with ``quadratic``, Ramsauer et al.'s form that CCCP needs; CEM drops it, which is what yields
    the residual connection). ``x`` (..., D), ``H`` (J, D); returns shape ``x.shape[:-1]``."""
    e = -tau * torch.logsumexp(x @ H.T / tau, dim=-1)
    return e + 0.5 * (x * x).sum(-1) if quadratic else e


def classical_hopfield_energy(x, H) -> torch.Tensor:
    """Classical Hopfield energy of Appendix C, ``-1/2 sum_j (h_j^T x)^2``; ``H`` (J, D)."""
    return -0.5 * ((x @ H.T) ** 2).sum(-1)
