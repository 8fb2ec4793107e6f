"""The diagonal-plus-low-rank (DPLR) preconditioner in Triton: kernel, launcher, autograd, operator.

Computes :func:`cemlib.kernels.reference.dplr_precondition`, CEM eq. 13 applied to rows ``g``:

    P g = softplus(d) * g + U (V^T g) + V (U^T g),   g (N, D_h), d (D_h,), U, V (D_h, R)

:func:`dplr_precondition` returns ``P g`` (leading dimensions of ``g`` flattened). One program per
block of rows: a first pass over ``D_h`` reduces ``g V`` and ``g U`` (rank ``R``), a second writes
the output. ``P`` is symmetric, so the gradient with respect to ``g`` is the same operation on the
output gradient (through the autograd function again: second derivatives stay exact).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from torch import Tensor

from cemlib.kernels import runtime

INTERPRET = runtime.interpreting()  # read as the kernel below is decorated

__all__ = ["dplr_precondition", "dplr_apply", "INTERPRET"]


@triton.jit
def _dplr_kernel(G, D, U, V, OUT, N, DHID, R, ACC: tl.constexpr, BLOCK_M: tl.constexpr,
                 BLOCK_K: tl.constexpr, BLOCK_R: tl.constexpr):
    pid_m = tl.program_id(0)
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_k = tl.arange(0, BLOCK_K)
    offs_r = tl.arange(0, BLOCK_R)
    row_ok = offs_m < N
    gv = tl.zeros([BLOCK_M, BLOCK_R], ACC)  # rows of (V^T g)
    gu = tl.zeros([BLOCK_M, BLOCK_R], ACC)  # rows of (U^T g)
    for k0 in range(0, DHID, BLOCK_K):
        kk = k0 + offs_k
        g = tl.load(G + offs_m[:, None] * DHID + kk[None, :],
                    mask=row_ok[:, None] & (kk[None, :] < DHID), other=0.0).to(ACC)
        fmask = (kk[:, None] < DHID) & (offs_r[None, :] < R)
        u = tl.load(U + kk[:, None] * R + offs_r[None, :], mask=fmask, other=0.0).to(ACC)
        v = tl.load(V + kk[:, None] * R + offs_r[None, :], mask=fmask, other=0.0).to(ACC)
        gv += tl.dot(g, v, out_dtype=ACC, input_precision="ieee")
        gu += tl.dot(g, u, out_dtype=ACC, input_precision="ieee")
    for k0 in range(0, DHID, BLOCK_K):
        kk = k0 + offs_k
        gmask = row_ok[:, None] & (kk[None, :] < DHID)
        g = tl.load(G + offs_m[:, None] * DHID + kk[None, :], mask=gmask, other=0.0).to(ACC)
        d = tl.load(D + kk, mask=kk < DHID, other=0.0).to(ACC)
        softplus = tl.maximum(d, 0.0) + tl.log(1.0 + tl.exp(-tl.abs(d)))
        fmask = (kk[:, None] < DHID) & (offs_r[None, :] < R)
        u = tl.load(U + kk[:, None] * R + offs_r[None, :], mask=fmask, other=0.0).to(ACC)
        v = tl.load(V + kk[:, None] * R + offs_r[None, :], mask=fmask, other=0.0).to(ACC)
        out = softplus[None, :] * g
        out += tl.dot(gv, tl.trans(u), out_dtype=ACC, input_precision="ieee")
        out += tl.dot(gu, tl.trans(v), out_dtype=ACC, input_precision="ieee")
        tl.store(OUT + offs_m[:, None] * DHID + kk[None, :], out.to(OUT.dtype.element_ty),
                 mask=gmask)


def _acc(dtype):
    return tl.float64 if dtype == torch.float64 else tl.float32


def _blocks(R, device):
    """Tiles that compile without register spills on sm_80 and sm_90 at R <= 16
    (``benchmarks/compile_kernels.py``; 64 x 128 spills); not timed on a GPU."""
    small = INTERPRET or device.type != "cuda"
    return dict(BLOCK_M=16 if small else 32, BLOCK_K=32 if small else 128,
                BLOCK_R=max(16, triton.next_power_of_2(R)))


def dplr_apply(g, d, U, V):
    """``softplus(d) * g + (g V) U^T + (g U) V^T`` for 2-D ``g`` (N, D_h), ``U, V`` (D_h, R)."""
    runtime.check_dtype(g, INTERPRET)
    g, d, U, V = g.contiguous(), d.contiguous(), U.contiguous(), V.contiguous()
    N, Dh = g.shape
    R = U.shape[1]
    out = torch.empty_like(g)
    blocks = _blocks(R, g.device)
    _dplr_kernel[(triton.cdiv(N, blocks["BLOCK_M"]),)](g, d, U, V, out, N, Dh, R,
                                                       ACC=_acc(g.dtype), **blocks)
    return out


def _apply_on_device(g: Tensor, d: Tensor, U: Tensor, V: Tensor) -> Tensor:
    with runtime.on_device(g):
        return dplr_apply(g, d, U, V)


# what a compiled graph calls (runtime.define: no autograd layer around it); its derivative is
# _DPLRPrecondition's, which dynamo traces into the graph
_dplr = runtime.define("dplr_precondition", "(Tensor g, Tensor d, Tensor U, Tensor V) -> Tensor",
                       _apply_on_device, lambda g, d, U, V: g.new_empty(g.shape))


class _DPLRPrecondition(torch.autograd.Function):
    """``P g`` and its derivative. In eager mode the forward calls the launcher directly; while
    ``torch.compile`` traces, the operator :data:`_dplr` (opaque to the compiler). The
    backward's ``dg = P dout`` goes through this function again, so a second derivative stays
    exact."""

    @staticmethod
    def forward(ctx, g, d, U, V):
        ctx.save_for_backward(g, d, U, V)
        return (_dplr(g, d, U, V) if torch.compiler.is_compiling()
                else _apply_on_device(g, d, U, V))

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
    """:func:`cemlib.kernels.reference.dplr_precondition` in Triton (same contract); shapes are
    not validated here (:mod:`cemlib.kernels.dispatch` does)."""
    lead, Dh = g.shape[:-1], g.shape[-1]
    return _DPLRPrecondition.apply(g.reshape(-1, Dh), d, U, V).reshape(*lead, Dh)
