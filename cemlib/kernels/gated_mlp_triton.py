"""Triton kernels for the tied gated-MLP step and the diagonal-plus-low-rank preconditioner.

Tied gated-MLP step (CEM [arXiv] eq. 10 = [ICLR] eq. 10 with phi' = SiLU, tied as in eq. 11):

    y = V^T (gamma * SiLU(V u)),   u (N, D_h), V (D_v, D_h), gamma (N, D_v)

The forward kernel computes the gate product ``a = gamma * SiLU(u V^T)`` in the epilogue of the
``u V^T`` tile product, so neither ``h = u V^T`` nor ``SiLU(h)`` is ever written to memory; ``a``
is consumed at once by ``y = a V`` and freed. Nothing but the inputs is saved for backward: the
backward kernel recomputes ``h`` while it computes ``da = dy V^T`` from the *same* ``V`` tiles
(V plays both the inner and the outer role), and emits in its epilogue

    dgamma = da * SiLU(h),   dh = da * gamma * SiLU'(h),   a = gamma * SiLU(h)

after which ``du = dh V`` and ``dV = a^T dy + dh^T u`` (V's outer and inner roles) are two GEMMs.

RMSNorm is not fused into these kernels. At T = 1 (the default) the layer normalises ``h`` once
and uses ``hn`` both for ``gamma = W hn`` (a cuBLAS GEMM) and as the step-0 query
(:class:`cemlib.layers.cem_mlp.CEMMLP` reuses it; tested), so there is no separate query norm
left to fuse. At T >= 2 each further step normalises ``x^(t)``: a memory-bound pass over (N, D_h)
and one saved activation that a prologue fusion into ``_gate_kernel`` could remove. Whether that
pays has not been measured on a GPU, so it is not done.

Preconditioner (CEM eq. 13): ``P g = softplus(d) * g + U (V^T g) + V (U^T g)`` for rows g, with
``U, V`` of shape (D_h, R). One program per row block: a first pass over D_h reduces
``g V`` and ``g U`` (rank R), a second pass writes the output. ``P`` is symmetric, so the
gradient with respect to ``g`` is the same kernel applied to the output gradient.
"""

from __future__ import annotations

import os

import torch
import triton
import triton.language as tl

INTERPRET = os.environ.get("TRITON_INTERPRET", "0") == "1"

__all__ = ["gate_forward", "gate_backward", "dplr_apply", "INTERPRET"]


@triton.jit
def _gate_kernel(U, V, G, DY, A, DG, DH, N, DV, DHID,
                 BACKWARD: tl.constexpr, ACC: tl.constexpr, PREC: tl.constexpr,
                 BLOCK_M: tl.constexpr, BLOCK_V: tl.constexpr, BLOCK_K: tl.constexpr):
    """Tile (BLOCK_M rows, BLOCK_V gate units) of h = u V^T (and da = dy V^T), then the epilogue."""
    pid_m = tl.program_id(0)
    pid_v = tl.program_id(1)
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_v = pid_v * BLOCK_V + tl.arange(0, BLOCK_V)
    offs_k = tl.arange(0, BLOCK_K)
    row_ok = offs_m < N
    unit_ok = offs_v < DV
    h = tl.zeros([BLOCK_M, BLOCK_V], ACC)
    da = tl.zeros([BLOCK_M, BLOCK_V], ACC)
    for k0 in range(0, DHID, BLOCK_K):
        kk = k0 + offs_k
        u = tl.load(U + offs_m[:, None] * DHID + kk[None, :],
                    mask=row_ok[:, None] & (kk[None, :] < DHID), other=0.0)
        v = tl.load(V + offs_v[:, None] * DHID + kk[None, :],
                    mask=unit_ok[:, None] & (kk[None, :] < DHID), other=0.0)
        h += tl.dot(u, tl.trans(v), out_dtype=ACC, input_precision=PREC)
        if BACKWARD:
            dy = tl.load(DY + offs_m[:, None] * DHID + kk[None, :],
                         mask=row_ok[:, None] & (kk[None, :] < DHID), other=0.0)
            da += tl.dot(dy, tl.trans(v), out_dtype=ACC, input_precision=PREC)
    tile = offs_m[:, None] * DV + offs_v[None, :]
    ok = row_ok[:, None] & unit_ok[None, :]
    gamma = tl.load(G + tile, mask=ok, other=0.0).to(ACC)
    sig = 1.0 / (1.0 + tl.exp(-h))
    silu = h * sig
    tl.store(A + tile, (gamma * silu).to(A.dtype.element_ty), mask=ok)
    if BACKWARD:
        tl.store(DG + tile, (da * silu).to(DG.dtype.element_ty), mask=ok)
        dsilu = sig * (1.0 + h * (1.0 - sig))
        tl.store(DH + tile, (da * gamma * dsilu).to(DH.dtype.element_ty), mask=ok)


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


def _gate_blocks(device):
    if INTERPRET or device.type != "cuda":
        return dict(BLOCK_M=16, BLOCK_V=32, BLOCK_K=32), {}
    return dict(BLOCK_M=64, BLOCK_V=64, BLOCK_K=64), dict(num_warps=4, num_stages=3)


def _dplr_blocks(R, device):
    """GPU tiles chosen to compile without register spills on sm_80 and sm_90 at R <= 16
    (benchmarks/compile_kernels.py; 64 x 128 spills); not timed on a GPU."""
    small = INTERPRET or device.type != "cuda"
    return dict(BLOCK_M=16 if small else 32, BLOCK_K=32 if small else 128,
                BLOCK_R=max(16, triton.next_power_of_2(R)))


def _check_interpreter_dtype(t):
    if INTERPRET and t.dtype == torch.bfloat16:
        raise TypeError("bfloat16 is not supported under TRITON_INTERPRET=1 (the interpreter "
                        "silently mis-computes it); use float16 or float32 on CPU")


def _launch_gate(u, V, gamma, dy):
    _check_interpreter_dtype(u)
    N, Dh = u.shape
    Dv = V.shape[0]
    a = torch.empty((N, Dv), dtype=u.dtype, device=u.device)
    dg = torch.empty_like(a) if dy is not None else a
    dh = torch.empty_like(a) if dy is not None else a
    blocks, launch = _gate_blocks(u.device)
    grid = (triton.cdiv(N, blocks["BLOCK_M"]), triton.cdiv(Dv, blocks["BLOCK_V"]))
    _gate_kernel[grid](u, V, gamma, dy if dy is not None else u, a, dg, dh, N, Dv, Dh,
                       BACKWARD=dy is not None, ACC=_acc(u.dtype),
                       PREC="ieee" if u.dtype in (torch.float32, torch.float64) else "tf32",
                       **blocks, **launch)
    return a, dg, dh


def gate_forward(u, V, gamma):
    """``y = (gamma * SiLU(u V^T)) V`` for 2-D ``u`` (N, D_h), ``gamma`` (N, D_v)."""
    u, V, gamma = u.contiguous(), V.contiguous(), gamma.contiguous()
    a, _, _ = _launch_gate(u, V, gamma, None)
    return a @ V


def gate_backward(dy, u, V, gamma):
    """``(du, dV, dgamma)`` of the step, recomputing ``h = u V^T`` in the fused kernel."""
    u, V, gamma, dy = u.contiguous(), V.contiguous(), gamma.contiguous(), dy.contiguous()
    a, dgamma, dh = _launch_gate(u, V, gamma, dy)
    du = dh @ V
    dV = a.T @ dy + dh.T @ u
    return du, dV, dgamma


def dplr_apply(g, d, U, V):
    """``softplus(d) * g + (g V) U^T + (g U) V^T`` for 2-D ``g`` (N, D_h), ``U, V`` (D_h, R)."""
    _check_interpreter_dtype(g)
    g, d, U, V = g.contiguous(), d.contiguous(), U.contiguous(), V.contiguous()
    N, Dh = g.shape
    R = U.shape[1]
    out = torch.empty_like(g)
    blocks = _dplr_blocks(R, g.device)
    _dplr_kernel[(triton.cdiv(N, blocks["BLOCK_M"]),)](g, d, U, V, out, N, Dh, R,
                                                       ACC=_acc(g.dtype), **blocks)
    return out
