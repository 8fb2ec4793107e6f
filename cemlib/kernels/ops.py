"""``torch.library`` operators around the first version's Triton kernels, with their autograd
formulas.

The tied attention (v1) and the tied gated-MLP step (v1) are registered as opaque custom ops
(``cemlib::...``) with a fake (meta) implementation, so ``torch.compile`` can trace through a
model that calls them (the op stays a single node in the graph) and ``torch.autograd``
differentiates them with the backward kernels; their backward passes are custom ops too, so
compiled training graphs stay traceable. The DPLR preconditioner, which every GPU run with a
``"dplr"`` preconditioner calls, goes the leaner way of the second version's kernels: an
``autograd.Function`` that calls the launcher in eager mode and, while compiling, an operator
registered without custom_op's layers (:mod:`cemlib.kernels.operators`).

The kernel modules are imported lazily, at the first call: ``triton.jit`` reads
``TRITON_INTERPRET`` when a kernel is decorated, so importing this module (or
:mod:`cemlib.kernels.dispatch`) never fixes the interpreter mode.

Public functions take the same arguments as :mod:`cemlib.kernels.reference`; they do not
validate shapes (:mod:`cemlib.kernels.dispatch` does).
"""

from __future__ import annotations

import contextlib
from typing import Optional

import torch
from torch import Tensor
from torch.library import custom_op

from cemlib.kernels import operators

__all__ = ["tied_attention", "tied_gated_mlp_step", "dplr_precondition"]


def _on_device(t: Tensor):
    """Launch on ``t``'s GPU (Triton launches on the current CUDA device)."""
    return torch.cuda.device(t.device) if t.is_cuda else contextlib.nullcontext()


def _attn_kernels():
    from cemlib.kernels import tied_attention_triton
    return tied_attention_triton


def _mlp_kernels():
    from cemlib.kernels import gated_mlp_triton
    return gated_mlp_triton


def _lse_dtype(dtype):
    return torch.float64 if dtype == torch.float64 else torch.float32


# ---------------------------------------------------------------- tied attention

@custom_op("cemlib::tied_attention_fwd", mutates_args=())
def _attention_fwd(q: Tensor, kv: Tensor, scale: float, alibi: Optional[Tensor],
                   self_bias: Optional[Tensor], cross_bias: Optional[Tensor],
                   q_extra: Optional[Tensor], k_extra: Optional[Tensor], extra_values: bool,
                   extra_head_sum: bool) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    with _on_device(q):
        return _attn_kernels().attention_forward(q, kv, scale, alibi, self_bias, cross_bias,
                                                 q_extra, k_extra, extra_values, extra_head_sum)


def _keeps_head_extras(q_extra, extra_values, extra_head_sum):
    """Whether the forward also returns the per-head extra values (for the backward)."""
    from cemlib.kernels.paths import extra_path
    return extra_head_sum and extra_path(q_extra, extra_values, extra_head_sum) == "tile"


@_attention_fwd.register_fake
def _(q, kv, scale, alibi, self_bias, cross_bias, q_extra, k_extra, extra_values,
      extra_head_sum):
    B, K, L, _ = q.shape
    De = k_extra.shape[-1] if k_extra is not None else 0
    heads = k_extra.new_empty((B, K, L, De)) if extra_values else q.new_empty(0)
    oe = k_extra.new_empty((B, L, De)) if extra_head_sum else heads
    kept = (heads if _keeps_head_extras(q_extra, extra_values, extra_head_sum)
            else q.new_empty(0))
    return q.new_empty(q.shape), q.new_empty((B, K, L), dtype=_lse_dtype(q.dtype)), oe, kept


@custom_op("cemlib::tied_attention_bwd", mutates_args=())
def _attention_bwd(do: Tensor, dlse: Tensor, doe: Tensor, q: Tensor, kv: Tensor, o: Tensor,
                   lse: Tensor, oe: Tensor, scale: float, alibi: Optional[Tensor],
                   self_bias: Optional[Tensor], cross_bias: Optional[Tensor],
                   q_extra: Optional[Tensor], k_extra: Optional[Tensor],
                   extra_values: bool, extra_head_sum: bool) -> list[Tensor]:
    with _on_device(q):
        grads = _attn_kernels().attention_backward(
            do, dlse, doe if extra_values else None, q, kv, o, lse, oe, scale, alibi, self_bias,
            cross_bias, q_extra, k_extra, extra_values, extra_head_sum)
    return [g if g is not None else q.new_empty(0) for g in grads]


@_attention_bwd.register_fake
def _(do, dlse, doe, q, kv, o, lse, oe, scale, alibi, self_bias, cross_bias, q_extra, k_extra,
      extra_values, extra_head_sum):
    like = [q, kv, q_extra, k_extra, alibi, self_bias, cross_bias]
    return [t.new_empty(t.shape) if t is not None else q.new_empty(0) for t in like]


def _attention_setup(ctx, inputs, output):
    q, kv, scale, alibi, self_bias, cross_bias, q_extra, k_extra, extra_values, head_sum = inputs
    o, lse, oe, oe_heads = output
    # the per-head extra values the backward's Delta needs (empty on the shared-logits path)
    saved_oe = oe_heads if _keeps_head_extras(q_extra, extra_values, head_sum) else oe
    ctx.save_for_backward(q, kv, o, lse, saved_oe, alibi, self_bias, cross_bias, q_extra, k_extra)
    ctx.scale, ctx.extra_values, ctx.extra_head_sum = scale, extra_values, head_sum


def _attention_backward(ctx, do, dlse, doe, _doe_heads):
    q, kv, o, lse, oe, alibi, self_bias, cross_bias, q_extra, k_extra = ctx.saved_tensors
    do = torch.zeros_like(o) if do is None else do
    dlse = torch.zeros_like(lse) if dlse is None else dlse
    if doe is None and ctx.extra_values:
        B, K, L, _ = q.shape
        shape = (B, L, k_extra.shape[-1]) if ctx.extra_head_sum else (B, K, L, k_extra.shape[-1])
        doe = k_extra.new_zeros(shape)
    elif doe is None:
        doe = q.new_empty(0)
    g = _attention_bwd(do, dlse, doe, q, kv, o, lse, oe, ctx.scale, alibi, self_bias, cross_bias,
                       q_extra, k_extra, ctx.extra_values, ctx.extra_head_sum)
    dq, dkv, dqe, dke, dalibi, dself, dcross = [
        gi if t is not None else None
        for gi, t in zip(g, [q, kv, q_extra, k_extra, alibi, self_bias, cross_bias])]
    return dq, dkv, None, dalibi, dself, dcross, dqe, dke, None, None


_attention_fwd.register_autograd(_attention_backward, setup_context=_attention_setup)


def tied_attention(q, kv, *, scale, alibi=None, self_bias=None, cross_bias=None, q_extra=None,
                   k_extra=None, extra_values=False, extra_head_sum=False):
    """Triton version of :func:`cemlib.kernels.reference.tied_attention` (same contract)."""
    o, lse, oe, _ = _attention_fwd(q, kv, float(scale), alibi, self_bias, cross_bias, q_extra,
                                   k_extra, bool(extra_values), bool(extra_head_sum))
    return (o, lse, oe) if extra_values else (o, lse)


# ---------------------------------------------------------------- tied gated-MLP step

@custom_op("cemlib::tied_gated_mlp_step", mutates_args=())
def _gate_fwd(u: Tensor, V: Tensor, gamma: Tensor) -> Tensor:
    with _on_device(u):
        return _mlp_kernels().gate_forward(u, V, gamma)


@_gate_fwd.register_fake
def _(u, V, gamma):
    return u.new_empty(u.shape)


@custom_op("cemlib::tied_gated_mlp_step_bwd", mutates_args=())
def _gate_bwd(dy: Tensor, u: Tensor, V: Tensor, gamma: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    with _on_device(u):
        return _mlp_kernels().gate_backward(dy, u, V, gamma)


@_gate_bwd.register_fake
def _(dy, u, V, gamma):
    return u.new_empty(u.shape), V.new_empty(V.shape), gamma.new_empty(gamma.shape)


def _gate_setup(ctx, inputs, output):
    ctx.save_for_backward(*inputs)  # only the inputs: the gate product is recomputed


def _gate_backward(ctx, dy):
    return _gate_bwd(dy, *ctx.saved_tensors)


_gate_fwd.register_autograd(_gate_backward, setup_context=_gate_setup)


def tied_gated_mlp_step(u, V, gamma):
    """Triton version of :func:`cemlib.kernels.reference.tied_gated_mlp_step`; leading
    dimensions of ``u`` are flattened and ``gamma`` is broadcast to them."""
    lead, Dh = u.shape[:-1], u.shape[-1]
    gamma = gamma.expand(*lead, V.shape[0])
    y = _gate_fwd(u.reshape(-1, Dh), V, gamma.reshape(-1, V.shape[0]))
    return y.reshape(*lead, Dh)


# ---------------------------------------------------------------- DPLR preconditioner

def _dplr_kernel(g: Tensor, d: Tensor, U: Tensor, V: Tensor) -> Tensor:
    with _on_device(g):
        return _mlp_kernels().dplr_apply(g, d, U, V)


# what a compiled graph calls: registered without custom_op's layers (cemlib.kernels.operators);
# its derivative is _DPLRPrecondition's, which dynamo traces into the graph
_dplr = operators.define("dplr_precondition", "(Tensor g, Tensor d, Tensor U, Tensor V) -> Tensor",
                         _dplr_kernel, lambda g, d, U, V: g.new_empty(g.shape))


class _DPLRPrecondition(torch.autograd.Function):
    """``P g`` with ``P = diag(softplus d) + U V^T + V U^T`` (CEM eq. 13) and its derivative.
    In eager mode the forward calls the kernel's launcher directly (no operator dispatch); while
    ``torch.compile`` traces, the operator :data:`_dplr` (opaque to the compiler). The backward's
    ``dg = P dout`` (``P`` is symmetric) goes through this function again, so a second
    derivative stays exact."""

    @staticmethod
    def forward(ctx, g, d, U, V):
        ctx.save_for_backward(g, d, U, V)
        return _dplr(g, d, U, V) if torch.compiler.is_compiling() else _dplr_kernel(g, d, U, V)

    @staticmethod
    def backward(ctx, dout):
        g, d, U, V = ctx.saved_tensors
        dg = _DPLRPrecondition.apply(dout, d, U, V)
        dd = (dout * g).sum(0) * torch.sigmoid(d)
        gV, gU, oV, oU = g @ V, g @ U, dout @ V, dout @ U
        dU = dout.T @ gV + g.T @ oV
        dV = dout.T @ gU + g.T @ oU
        return dg, dd, dU, dV


def dplr_precondition(g, d, U, V):
    """Triton version of :func:`cemlib.kernels.reference.dplr_precondition`."""
    lead, Dh = g.shape[:-1], g.shape[-1]
    return _DPLRPrecondition.apply(g.reshape(-1, Dh), d, U, V).reshape(*lead, Dh)
