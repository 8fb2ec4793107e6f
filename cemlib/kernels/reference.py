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

import math

import torch
import torch.nn.functional as F

__all__ = ["ALIBI_RECIPES", "alibi_slopes", "refresh_alibi_buffer", "attention_bias",
           "dplr_precondition", "tied_attention", "tied_gated_mlp_step"]


ALIBI_RECIPES = ("geometric", "interleaved")


def alibi_slopes(n_heads: int, recipe: str = "geometric") -> torch.Tensor:
    """ALiBi slopes ``m_k`` of heads ``k = 1..K`` as a float64 tensor of shape (K,).

    ``recipe="geometric"`` (cemlib's choice, used by every layer): ``m_k = 2^(-8k/K)`` for every
    ``K``, the geometric sequence that starts at ``2^(-8/K)`` with that same ratio -- the rule the
    ALiBi paper states for any number of heads (Press et al. 2022, section 3) and the "geometric
    sequence" of CEM Appendix B (whose example ``2^-k`` is this rule at ``K = 8`` only).

    ``recipe="interleaved"``: the workaround of the ALiBi reference code (also used by BLOOM and
    MPT) for ``K`` not a power of two: the geometric slopes of the largest power of two
    ``p < K``, followed by every other slope of ``2p`` heads. It equals ``"geometric"`` when ``K``
    is a power of two and differs otherwise (by up to 0.49 at ``K = 6`` and 0.69 at ``K = 12``).
    """
    if isinstance(n_heads, bool) or int(n_heads) != n_heads or n_heads < 1:
        raise ValueError(f"n_heads must be a positive integer, got {n_heads!r}")
    n_heads = int(n_heads)
    if recipe not in ALIBI_RECIPES:
        raise ValueError(f"recipe must be one of {ALIBI_RECIPES}, got {recipe!r}")

    def geometric(n):
        return [2.0 ** (-8.0 * k / n) for k in range(1, n + 1)]

    if recipe == "geometric" or math.log2(n_heads).is_integer():
        s = geometric(n_heads)
    else:
        p = 2 ** math.floor(math.log2(n_heads))
        s = geometric(p) + geometric(2 * p)[0::2][: n_heads - p]
    return torch.tensor(s, dtype=torch.float64)


def refresh_alibi_buffer(module) -> None:
    """Recompute ``module.alibi`` (slopes of ``module.n_heads`` heads) in the buffer's current
    dtype and device, so that a layer converted to float64 holds the float64 slopes, not float32
    slopes widened (which are off by about 1e-8 relative). Layers call it after ``_apply``."""
    buf = getattr(module, "alibi", None)
    if isinstance(buf, torch.Tensor) and buf.is_floating_point() and buf.device.type != "meta":
        module.alibi = alibi_slopes(module.n_heads).to(dtype=buf.dtype, device=buf.device)


def attention_bias(L: int, n_heads: int, *, alibi: torch.Tensor | None = None,
                   self_bias: torch.Tensor | None = None, cross_bias: torch.Tensor | None = None,
                   dtype=torch.float32, device=None) -> torch.Tensor:
    """Additive logit bias of shape (K, L, L), ``-inf`` above the diagonal (causal mask)."""
    i = torch.arange(L, device=device)
    dist = (i[:, None] - i[None, :]).to(dtype)  # i - j >= 0 on the allowed part
    bias = torch.zeros(n_heads, L, L, dtype=dtype, device=device)
    if alibi is not None:
        bias = bias - alibi.to(dtype=dtype, device=device)[:, None, None] * dist.abs()
    eye = torch.eye(L, dtype=torch.bool, device=device)
    if self_bias is not None:
        b_self = self_bias.to(dtype=dtype, device=device)[:, None, None]
        bias = bias + torch.where(eye, b_self, bias.new_zeros(()))
    if cross_bias is not None:
        b_cross = cross_bias.to(dtype=dtype, device=device)[:, None, None]
        bias = bias + torch.where(eye, bias.new_zeros(()), b_cross)
    return bias.masked_fill(dist < 0, float("-inf"))


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
