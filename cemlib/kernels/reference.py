"""PyTorch reference implementations of the operations that cemlib's fused kernels replace.

These functions are the *contract* between the layers (:mod:`cemlib.layers`) and the Triton
kernels (:mod:`cemlib.kernels`): every kernel is tested against the function of the same name here,
and the layers call the dispatching wrappers in :mod:`cemlib.kernels.dispatch`, which fall back to
these functions wherever a kernel is unavailable (CPU, no Triton, unsupported option).

Tied causal attention (the CEM interaction-energy step, book eq. ``eq-cem-grad``; CEM paper
[arXiv] eq. 3 = [ICLR] eq. 2 and Appendix B):

.. math::

    s_{kij} = \\tfrac{1}{\\tau}\\big(\\mathbf q^k_i\\cdot\\mathbf k^k_j + \\mathbf e^q_{(k)i}\\cdot\\mathbf e^k_j\\big)
              - m_k|i-j| + b^{\\rm self}_k[i=j] + b^{\\rm cross}_k[i\\ne j],\\quad j\\le i

    \\mathbf o^k_i = \\sum_{j\\le i}\\operatorname{softmax}_j(s_{kij})\\,\\mathbf k^k_j,\\qquad
    \\ell^k_i = \\log\\sum_{j\\le i}\\exp s_{kij}

The keys are also the values (``K = V`` tying); the energy of head ``k`` at position ``i`` is
``-tau * lse[k, i]``.  The optional "extra" query/key pair carries the diagonal term
``h_j^T D u_i`` of the diagonal-plus-low-rank interaction (CEM eq. 12): ``q_extra = d * u``,
``k_extra = hn``.
"""

from __future__ import annotations


import torch
import torch.nn.functional as F

# The positional biases live with RoPE in cemlib.positional (the energies import them from there);
# they are re-exported here because the kernels' contract includes them.
from cemlib.positional import ALIBI_RECIPES, alibi_slopes, attention_bias, refresh_alibi_buffer  # noqa: F401

__all__ = ["ALIBI_RECIPES", "alibi_slopes", "refresh_alibi_buffer", "attention_bias",
           "dplr_precondition", "tied_attention", "tied_gated_mlp_step"]


def tied_attention(q: torch.Tensor, kv: torch.Tensor, *, scale: float,
                   alibi: torch.Tensor | None = None, self_bias: torch.Tensor | None = None,
                   cross_bias: torch.Tensor | None = None, q_extra: torch.Tensor | None = None,
                   k_extra: torch.Tensor | None = None, extra_values: bool = False,
                   extra_head_sum: bool = False):
    """Causal multi-head attention with tied keys and values; returns ``(o, lse[, o_extra])``.

    Shapes: ``q`` and ``kv`` (B, K, L, D_r); ``alibi``, ``self_bias``, ``cross_bias`` (K,);
    ``q_extra`` (B, L, D_e) shared by all heads or (B, K, L, D_e) per head; ``k_extra`` (B, L, D_e).
    ``scale`` is 1/tau and multiplies both dot products. Output ``o`` (B, K, L, D_r), ``lse``
    (B, K, L) in float32 or the input dtype if wider; with ``extra_values=True`` also
    ``o_extra = sum_j alpha_kij k_extra_j`` of shape (B, K, L, D_e) (the "diagonal value path"),
    or with ``extra_head_sum=True`` its sum over heads ``sum_k o_extra_k`` (B, L, D_e), computed
    as ``(sum_k alpha_k) k_extra`` (K times less work at the extra width).
    """
    B, K, L, _ = q.shape
    s = torch.einsum("bkid,bkjd->bkij", q, kv) * scale
    if q_extra is not None:
        if k_extra is None:
            raise ValueError("q_extra given without k_extra")
        eq = "bid,bjd->bij" if q_extra.dim() == 3 else "bkid,bjd->bkij"
        se = torch.einsum(eq, q_extra, k_extra) * scale
        s = s + (se[:, None] if q_extra.dim() == 3 else se)
    acc = torch.promote_types(s.dtype, torch.float32)
    s = s.to(acc) + attention_bias(L, K, alibi=alibi, self_bias=self_bias, cross_bias=cross_bias,
                                   dtype=acc, device=q.device)
    lse = torch.logsumexp(s, dim=-1)
    p = torch.exp(s - lse[..., None])
    o = torch.einsum("bkij,bkjd->bkid", p.to(kv.dtype), kv)
    if extra_values and extra_head_sum:
        return o, lse, torch.matmul(p.sum(1).to(k_extra.dtype), k_extra)
    if extra_values:
        o_extra = torch.einsum("bkij,bjd->bkid", p.to(k_extra.dtype), k_extra)
        return o, lse, o_extra
    return o, lse


def tied_gated_mlp_step(u: torch.Tensor, V: torch.Tensor, gamma: torch.Tensor) -> torch.Tensor:
    """The element-wise-energy descent direction ``V^T (gamma * SiLU(V u))`` (CEM eq. 10 with
    phi' = SiLU), i.e. ``-grad_x xi`` at x = u. Shapes: ``u`` (..., D_h), ``V`` (D_v, D_h),
    ``gamma`` (..., D_v)."""
    return (gamma * F.silu(u @ V.T)) @ V


def dplr_precondition(g: torch.Tensor, d: torch.Tensor, U: torch.Tensor,
                      V: torch.Tensor) -> torch.Tensor:
    """Apply the diagonal-plus-low-rank preconditioner of CEM eq. 13 to rows ``g`` (..., D_h):
    ``P g = softplus(d) * g + U (V^T g) + V (U^T g)`` with ``d`` (D_h,), ``U, V`` (D_h, R).
    ``P`` is symmetric but not positive definite in general: the ICLR 2026 submission version of CEM
    claims that softplus guarantees ``P > 0`` (eq. 13), and the arXiv version drops that claim."""
    return F.softplus(d) * g + (g @ V) @ U.T + (g @ U) @ V.T
