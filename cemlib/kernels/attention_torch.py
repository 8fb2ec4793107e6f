"""Tied causal attention in PyTorch operations with a closed-form backward: the CPU path.

The same function as :func:`cemlib.kernels.reference.tied_attention` (that module's docstring has
the formulas), written as one ``torch.autograd.Function`` whose backward is derived by hand
instead of recorded op by op: the forward is one batched GEMM that adds the bias (``baddbmm``)
and one fused softmax, the backward one fused softmax backward. Autograd of the reference keeps
the logits, their bias sum, ``exp`` and ``logsumexp`` as separate (B, K, L, L) passes, and
``exp``/``logsumexp`` take a slow path on the masked ``-inf`` logits; this path is what makes CEM
attention cheap enough to train on a CPU (``benchmarks/cpu_speed.py``).

With ``s = scale (q kv^T + q_e k_e^T) + bias`` (bias: ALiBi, self/cross, causal ``-inf``),
``p = softmax(s)``, ``o = p kv``, ``lse = logsumexp(s)`` and ``o_e = p k_e`` (per head) or
``(sum_k p_k) k_e`` (``extra_head_sum``), and upstream gradients ``do, dlse, do_e``:

.. math::

    \\bar p = do\\,kv^\\top + do_e\\,k_e^\\top,\\qquad
    \\bar s = p\\odot\\big(\\bar p - \\textstyle\\sum_j p_{\\cdot j}\\bar p_{\\cdot j}\\big)
              + p\\odot dlse

    \\bar q = \\text{scale}\\;\\bar s\\,kv,\\qquad
    \\overline{kv} = p^\\top do + \\text{scale}\\;\\bar s^\\top q,\\qquad
    \\bar q_e = \\text{scale}\\;\\bar s\\,k_e\\ \\big(\\text{shared } q_e:\\ \\textstyle\\sum_k \\bar s_k\\big),

    \\bar k_e = \\textstyle\\sum_k\\big(\\text{scale}\\;\\bar s_k^\\top q_e + p_k^\\top do_{e}\\big),\\qquad
    \\bar b^{\\rm self}_k = \\textstyle\\sum_{b,i}\\bar s_{kii},\\qquad
    \\bar b^{\\rm cross}_k = \\textstyle\\sum_{b,i\\ne j}\\bar s_{kij}
                         = \\textstyle\\sum_{b,i} dlse_{ki} - \\bar b^{\\rm self}_k

(the last because each row of ``s̄`` sums to its ``dlse``; the ALiBi slopes are fixed: no
gradient). That difference loses relative accuracy when the diagonal dominates every row (in
float64, 1.5e-4 relative at a self-cross bias gap of 30, no correct digit at 300, where the
reference stays exact); it is kept because the stored runs were trained with it (another
summation would change their rounding): where that regime matters, use the reference backend.
``lse`` is read off the diagonal, which is never masked (:func:`_lse`).

First order only (``once_differentiable``; ``use_backend("reference")`` gives second
derivatives); float32 and float64 only (the dispatcher sends other dtypes to the reference).
"""

from __future__ import annotations

import torch
from torch.autograd.function import once_differentiable

from cemlib.positional import attention_bias

__all__ = ["DTYPES", "supported", "tied_attention"]

DTYPES = (torch.float32, torch.float64)


def supported(q: torch.Tensor, alibi: torch.Tensor | None) -> bool:
    """Whether this path computes the call: float32/float64, and ALiBi slopes that need no
    gradient (they are a buffer in every cemlib layer)."""
    return q.dtype in DTYPES and not (alibi is not None and alibi.requires_grad)


def _bmm_t(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """``a @ b^T`` over the last two dimensions."""
    return torch.matmul(a, b.transpose(-1, -2))


def _lse(s: torch.Tensor, p: torch.Tensor) -> torch.Tensor:
    """``logsumexp`` of the rows of ``s`` from their softmax ``p``, read off the diagonal (never
    masked): ``lse_i = s_ii - log p_ii``, exact to the rounding of ``p_ii``. Where some ``p_ii``
    is below the smallest normal number (a diagonal far below its row's maximum) the whole
    result is taken from the log-softmax instead, which is exact there too."""
    s_ii, p_ii = s.diagonal(dim1=-2, dim2=-1), p.diagonal(dim1=-2, dim2=-1)
    if bool((p_ii < torch.finfo(p.dtype).tiny).any()):
        return s_ii - torch.log_softmax(s, dim=-1).diagonal(dim1=-2, dim2=-1)
    return s_ii - torch.log(p_ii)


class _TiedAttention(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, kv, scale, alibi, self_bias, cross_bias, q_extra, k_extra, extra_values,
                extra_head_sum):
        B, K, L, R = q.shape
        # one copy each of a permuted q / kv (the layers' head split) instead of one per product
        q, kv = q.contiguous(), kv.contiguous()
        bias = attention_bias(L, K, alibi=alibi, self_bias=self_bias, cross_bias=cross_bias,
                              dtype=q.dtype, device=q.device)
        if q_extra is None:
            base = bias.expand(B, K, L, L)
        elif q_extra.dim() == 3:   # one extra pair for all heads: (B, L, L) logits, shared
            base = torch.add(bias, _bmm_t(q_extra, k_extra).unsqueeze(1), alpha=scale)
        else:
            base = torch.add(bias, _bmm_t(q_extra, k_extra.unsqueeze(1)), alpha=scale)
        s = torch.baddbmm(base.reshape(B * K, L, L), q.reshape(B * K, L, R),
                          kv.reshape(B * K, L, R).transpose(1, 2), alpha=scale).view(B, K, L, L)
        p = torch.softmax(s, dim=-1)
        lse = _lse(s, p)
        del s, base
        o = torch.matmul(p, kv)
        p_sum = None
        if extra_values and extra_head_sum:
            p_sum = p.sum(1)
            o_extra = torch.matmul(p_sum, k_extra)
        elif extra_values:
            o_extra = torch.matmul(p, k_extra.unsqueeze(1))
        ctx.save_for_backward(q, kv, q_extra, k_extra, p, p_sum)
        ctx.scale = scale
        ctx.extra = (extra_values, extra_head_sum)
        ctx.set_materialize_grads(False)   # unused outputs (lse in the layers' forward): no work
        return (o, lse, o_extra) if extra_values else (o, lse)

    @staticmethod
    @once_differentiable
    def backward(ctx, do, dlse, do_extra=None):
        q, kv, q_extra, k_extra, p, p_sum = ctx.saved_tensors
        scale = ctx.scale
        extra_values, extra_head_sum = ctx.extra
        do = do.contiguous() if do is not None else None
        dp = _bmm_t(do, kv) if do is not None else torch.zeros_like(p)
        dk_extra = None
        if extra_values and do_extra is not None:
            if extra_head_sum:
                dp.add_(_bmm_t(do_extra, k_extra).unsqueeze(1))
                dk_extra = torch.matmul(p_sum.transpose(-1, -2), do_extra)
            else:
                dp.add_(_bmm_t(do_extra, k_extra.unsqueeze(1)))
                dk_extra = torch.matmul(p.transpose(-1, -2), do_extra).sum(1)
        ds = torch._softmax_backward_data(dp, p, -1, p.dtype)
        del dp
        if dlse is not None:
            ds.addcmul_(p, dlse.unsqueeze(-1))
        dq = torch.matmul(ds, kv).mul_(scale)
        dkv = torch.matmul(ds.transpose(-1, -2), q).mul_(scale)
        if do is not None:
            dkv.add_(torch.matmul(p.transpose(-1, -2), do))
        dq_extra = None
        if q_extra is not None:
            if q_extra.dim() == 3:
                ds_sum = ds.sum(1)
                dq_extra = torch.matmul(ds_sum, k_extra).mul_(scale)
                dke = torch.matmul(ds_sum.transpose(-1, -2), q_extra).mul_(scale)
            else:
                dq_extra = torch.matmul(ds, k_extra.unsqueeze(1)).mul_(scale)
                dke = torch.matmul(ds.transpose(-1, -2), q_extra).sum(1).mul_(scale)
            dk_extra = dke if dk_extra is None else dk_extra.add_(dke)
        d_self = d_cross = None
        need_self, need_cross = ctx.needs_input_grad[4:6]
        if need_self or need_cross:
            diag = ds.diagonal(dim1=-2, dim2=-1).sum((0, 2))
            d_self = diag if need_self else None
            if need_cross:   # each row of ds sums to its dlse (softmax is shift-invariant)
                d_cross = -diag if dlse is None else dlse.sum((0, 2)) - diag
        return dq, dkv, None, None, d_self, d_cross, dq_extra, dk_extra, None, None


def tied_attention(q, kv, *, scale, alibi=None, self_bias=None, cross_bias=None, q_extra=None,
                   k_extra=None, extra_values=False, extra_head_sum=False):
    """Tied causal attention with the closed-form backward; the arguments and outputs of
    :func:`cemlib.kernels.reference.tied_attention` (inputs already validated by
    :func:`cemlib.kernels.dispatch.tied_attention`)."""
    return _TiedAttention.apply(q, kv, float(scale), alibi, self_bias, cross_bias, q_extra,
                                k_extra, bool(extra_values), bool(extra_head_sum))
