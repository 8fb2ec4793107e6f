"""Tied causal attention (K = V) in Triton: kernels, launcher, autograd and compiled-path operators.

Computes :func:`cemlib.kernels.reference.tied_attention`, the CEM interaction-energy step (CEM
[arXiv] eq. 3 = [ICLR] eq. 2 with the Appendix B biases, and eq. 12's diagonal as a head-shared
extra query/key pair with head-summed values): :func:`tied_attention` returns ``(o, lse[,
o_extra])`` with the reference's arguments, for the calls
:func:`cemlib.kernels.runtime.attention_covers` accepts (head width up to 128; no extra pair, or a
head-shared one); the dispatcher sends every other call to the PyTorch path.

Structure (FlashAttention-2, as Triton's fused-attention tutorial): the forward (``_fwd_kernel``)
runs an online softmax in base 2 over key tiles, the ``kv`` tile serving as key and value; the
backward is a preprocessing kernel (``_pre_kernel``: row terms ``Delta_i``) and one kernel
(``_bwd_kernel``) whose program ``n`` accumulates ``d kv`` of key block ``n`` (value and key role in
one register tile) and then ``dq`` of query block ``n``; ``_fold_kernel`` sums the self/cross bias
gradients per head. The shared extra pair enters as precomputed logits ``E = (log2 e / tau) q_e
k_e^T`` (B, L, L), with the head sums ``A = sum_k P_k`` and ``G = (1/tau) sum_k dS_k``
(``_headsum_kernel``) and their products with ``q_e``, ``k_e`` (``_extra_grads_kernel``). Biases
enter as row and column vectors, masks only on the diagonal band. First order only. The design,
its predictions and measurements are in ``benchmarks/NOTES.md``; the launch configurations are
data, ``attention_configs.json`` (:class:`cemlib.kernels.runtime.Tuning`).
"""

from __future__ import annotations

import contextlib
import functools
import os
from pathlib import Path
from typing import Optional

import torch
import triton
import triton.language as tl
from torch import Tensor
from torch.autograd.function import once_differentiable

from cemlib.kernels import runtime

INTERPRET = runtime.interpreting()  # read as the kernels below are decorated
_atomic_dq = [os.environ.get("CEMLIB_ATOMIC_DQ", "0") == "1"]

__all__ = ["tied_attention", "covers", "forward", "backward", "GPU_CONFIGS",
           "INTERPRETER_CONFIGS", "TUNING", "use_configs", "use_atomic_dq", "atomic_dq_enabled",
           "INTERPRET"]

LOG2E = tl.constexpr(1.4426950408889634)
LN2 = tl.constexpr(0.6931471805599453)


# ------------------------------------------------------------------------------------ helpers

@triton.jit
def _load_rows(ptr, offs, ok, offs_d, stride, D: tl.constexpr, BLOCK_D: tl.constexpr,
               MASK_ROWS: tl.constexpr):
    """Rows ``offs`` of a (., D) block at ``ptr`` (row stride ``stride``, unit column stride),
    zero outside; row bounds checked only if ``MASK_ROWS``, columns only if ``BLOCK_D > D``."""
    p = ptr + offs[:, None] * stride + offs_d[None, :]
    if MASK_ROWS:
        if BLOCK_D == D:
            x = tl.load(p, mask=ok[:, None], other=0.0)
        else:
            x = tl.load(p, mask=ok[:, None] & (offs_d[None, :] < D), other=0.0)
    else:
        if BLOCK_D == D:
            x = tl.load(p)
        else:
            x = tl.load(p, mask=offs_d[None, :] < D, other=0.0)
    return x


@triton.jit
def _store_rows(ptr, x, offs, ok, offs_d, stride, D: tl.constexpr, BLOCK_D: tl.constexpr):
    p = ptr + offs[:, None] * stride + offs_d[None, :]
    if BLOCK_D == D:
        tl.store(p, x.to(ptr.dtype.element_ty), mask=ok[:, None])
    else:
        tl.store(p, x.to(ptr.dtype.element_ty), mask=ok[:, None] & (offs_d[None, :] < D))


@triton.jit
def _square_tile(X, offs_m, offs_n, L, BAND: tl.constexpr):
    """Tile (offs_m, offs_n) of one (L, L) row-major matrix, zero outside. Below the diagonal
    band the columns are known to be in bounds (``j < i``), so only rows are checked."""
    p = X + offs_m[:, None] * L + offs_n[None, :]
    if BAND:
        return tl.load(p, mask=(offs_m[:, None] < L) & (offs_n[None, :] < L), other=0.0)
    return tl.load(p, mask=offs_m[:, None] < L, other=0.0)


@triton.jit
def _head_params(SLOPE, SELF, CROSS, k, HAS_ALIBI: tl.constexpr, HAS_SELF: tl.constexpr,
                 HAS_CROSS: tl.constexpr, ACC: tl.constexpr):
    """Head ``k``'s biases in log2 units: ALiBi slope, the diagonal's bias relative to the
    off-diagonal ones (``b_self - b_cross``), and ``b_cross`` (which only enters the lse)."""
    slope2 = 0.0
    diag2 = 0.0
    cross2 = 0.0
    if HAS_ALIBI:
        slope2 = tl.load(SLOPE + k).to(ACC) * LOG2E
    if HAS_SELF:
        diag2 = tl.load(SELF + k).to(ACC) * LOG2E
    if HAS_CROSS:
        cross2 = tl.load(CROSS + k).to(ACC) * LOG2E
        diag2 = diag2 - cross2
    return slope2, diag2, cross2


@triton.jit
def _exponent(s, e, offs_m, offs_n, col, r, c, diag2, BAND: tl.constexpr, HAS_BIAS: tl.constexpr,
              HAS_DIAG: tl.constexpr):
    """``log2 p`` of a (BLOCK_M, BLOCK_N) tile (queries as rows) from the raw products
    ``s = q kv^T``: ``c s + col_j + e_ij - r_i`` (``col`` the ALiBi column term, ``e`` the extra
    logits if ``HAS_BIAS``, ``r`` the row offsets; ``col``/``r`` may be ``None``); on the
    diagonal band also the diagonal bias and the causal mask (``-inf`` where ``j > i``)."""
    x = s * c
    if col is not None:
        x += col[None, :]
    if HAS_BIAS:
        x += e.to(x.dtype)
    if r is not None:
        x = x - r[:, None]
    if BAND:
        if HAS_DIAG:
            x = tl.where(offs_m[:, None] == offs_n[None, :], x + diag2, x)
        x = tl.where(offs_n[None, :] <= offs_m[:, None], x, float("-inf"))
    return x


@triton.jit
def _alibi_ramp(slope2, N: tl.constexpr, HAS_ALIBI: tl.constexpr):
    """``slope2 * [0, 1, ..., N-1]`` (the ALiBi term of the columns of a tile relative to its
    first column, hoisted out of the loops), or ``None`` without ALiBi."""
    ramp = None
    if HAS_ALIBI:
        ramp = slope2 * tl.arange(0, N).to(tl.float32)
    return ramp


# ------------------------------------------------------------------------------------ forward

@triton.jit
def _fwd_step(acc, l_i, m_i, q, ramp, KVb, eb, start_n, start_m, offs_m, offs_d, sl, L, c,
              slope2, diag2, BAND: tl.constexpr, D: tl.constexpr, HAS_ALIBI: tl.constexpr,
              HAS_BIAS: tl.constexpr, HAS_DIAG: tl.constexpr, ACC: tl.constexpr,
              PREC: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr):
    """One key tile of the online softmax in the log2 domain; ``kv`` is key and value. The
    exponent is ``x + sigma`` with ``x = c s + ramp_j`` and the tile's ALiBi offset
    ``sigma = slope2 (start_n - start_m)``, which only shifts the row maximum."""
    offs_n = start_n + tl.arange(0, BLOCK_N)
    kv = _load_rows(KVb, offs_n, offs_n < L, offs_d, sl, D, BLOCK_D, BAND)
    s = tl.dot(q, tl.trans(kv), out_dtype=ACC, input_precision=PREC)
    if HAS_ALIBI or HAS_BIAS or BAND:
        e = s
        if HAS_BIAS:
            e = _square_tile(eb, offs_m, offs_n, L, BAND)
        x = _exponent(s, e, offs_m, offs_n, ramp, None, c, diag2, BAND, HAS_BIAS, HAS_DIAG)
        sigma = slope2 * (start_n - start_m)
        m_new = tl.maximum(m_i, tl.max(x, 1) + sigma)
        p = tl.math.exp2(x - (m_new - sigma)[:, None])
    else:  # plain tile below the diagonal: max of the raw products, then one FFMA per element
        m_new = tl.maximum(m_i, tl.max(s, 1) * c)
        p = tl.math.exp2(s * c - m_new[:, None])
    alpha = tl.math.exp2(m_i - m_new)
    l_i = l_i * alpha + tl.sum(p, 1)
    acc = acc * alpha[:, None]
    acc = tl.dot(p.to(kv.dtype), kv, acc, out_dtype=ACC, input_precision=PREC)
    return acc, l_i, m_new


@triton.jit
def _fwd_kernel(Q, KV, O, LSE, SLOPE, SELF, CROSS, EB, sb, sk, sl, n_heads, L, c,
                D: tl.constexpr, HAS_ALIBI: tl.constexpr, HAS_SELF: tl.constexpr,
                HAS_CROSS: tl.constexpr, HAS_BIAS: tl.constexpr, ACC: tl.constexpr,
                PREC: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                BLOCK_D: tl.constexpr):
    """One program per (query block, batch*head), longest rows first: ``o`` and ``lse``."""
    start_m = (tl.num_programs(0) - 1 - tl.program_id(0)) * BLOCK_M
    bh = tl.program_id(1)
    b = bh // n_heads
    k = bh % n_heads
    base = b.to(tl.int64) * sb + k.to(tl.int64) * sk
    offs_m = start_m + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, BLOCK_D)
    row_ok = offs_m < L
    q = _load_rows(Q + base, offs_m, row_ok, offs_d, sl, D, BLOCK_D, True)
    slope2, diag2, cross2 = _head_params(SLOPE, SELF, CROSS, k, HAS_ALIBI, HAS_SELF, HAS_CROSS,
                                         ACC)
    ramp = _alibi_ramp(slope2, BLOCK_N, HAS_ALIBI)
    eb = EB + b.to(tl.int64) * L * L
    m_i = tl.full([BLOCK_M], float("-inf"), ACC)
    l_i = tl.zeros([BLOCK_M], ACC)
    acc = tl.zeros([BLOCK_M, BLOCK_D], ACC)
    band = start_m // BLOCK_N * BLOCK_N  # key tiles before it lie wholly below the diagonal
    for start_n in range(0, band, BLOCK_N):
        acc, l_i, m_i = _fwd_step(acc, l_i, m_i, q, ramp, KV + base, eb, start_n, start_m,
                                  offs_m, offs_d, sl, L, c, slope2, diag2, False, D, HAS_ALIBI,
                                  HAS_BIAS, HAS_SELF or HAS_CROSS, ACC, PREC, BLOCK_N, BLOCK_D)
    for start_n in range(band, tl.minimum(start_m + BLOCK_M, L), BLOCK_N):
        acc, l_i, m_i = _fwd_step(acc, l_i, m_i, q, ramp, KV + base, eb, start_n, start_m,
                                  offs_m, offs_d, sl, L, c, slope2, diag2, True, D, HAS_ALIBI,
                                  HAS_BIAS, HAS_SELF or HAS_CROSS, ACC, PREC, BLOCK_N, BLOCK_D)
    _store_rows(O + base, acc / l_i[:, None], offs_m, row_ok, offs_d, sl, D, BLOCK_D)
    # the row terms dropped from the exponents: -slope (i - start_m) and b_cross
    lse2 = m_i + tl.math.log2(l_i) - slope2 * (offs_m - start_m).to(tl.float32) + cross2
    tl.store(LSE + bh.to(tl.int64) * L + offs_m, lse2 * LN2, mask=row_ok)


# ------------------------------------------------------------------------------------ backward

@triton.jit
def _rowdot_step(rho, q, r, ramp, KVb, eb, dpb, start_n, start_m, offs_m, offs_d, sl, L, c,
                 slope2, diag2, BAND: tl.constexpr, D: tl.constexpr, HAS_ALIBI: tl.constexpr,
                 HAS_BIAS: tl.constexpr, HAS_DIAG: tl.constexpr, ACC: tl.constexpr,
                 PREC: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr):
    """``rho_i += sum_j P_ij DPB_ij`` over one key tile (the row pass of _pre_kernel)."""
    offs_n = start_n + tl.arange(0, BLOCK_N)
    kv = _load_rows(KVb, offs_n, offs_n < L, offs_d, sl, D, BLOCK_D, BAND)
    s = tl.dot(q, tl.trans(kv), out_dtype=ACC, input_precision=PREC)
    e = _square_tile(eb, offs_m, offs_n, L, BAND) if HAS_BIAS else s
    if HAS_ALIBI:
        r = r - slope2 * (start_n - start_m)
    p = tl.math.exp2(_exponent(s, e, offs_m, offs_n, ramp, r, c, diag2, BAND, HAS_BIAS,
                               HAS_DIAG))
    return rho + tl.sum(p * _square_tile(dpb, offs_m, offs_n, L, BAND).to(ACC), 1)

#
# The backward reads two row vectors per (batch, head), both written by _pre_kernel and padded
# by ROW_PAD rows (so that no query tile needs a bounds check on them): the row offsets
# R_i = lse_i log2(e) - b_cross log2(e) (+inf on padding rows: p = 0 there), and
# DELTA_i = scale (o_i.do_i - dlse_i [+ sum_j P_ij dPB_ij]) (0 on padding rows).

@triton.jit
def _pre_kernel(Q, KV, O, DO, LSE, DLSE, R, DELTA, DSII, DQA, SLOPE, SELF, CROSS, EB, DPB,
                sb, sk, sl, dob, dok, dol, n_heads, L, Lp, c, scale,
                D: tl.constexpr, HAS_DLSE: tl.constexpr, BIAS_GRAD: tl.constexpr,
                ZERO_DQ: tl.constexpr,
                HAS_ALIBI: tl.constexpr, HAS_SELF: tl.constexpr, HAS_CROSS: tl.constexpr,
                HAS_BIAS: tl.constexpr, HAS_DPB: tl.constexpr, ACC: tl.constexpr,
                PREC: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                BLOCK_D: tl.constexpr):
    """One program per (row block of the padded length ``Lp``, batch*head): ``R`` and
    ``DELTA`` (the ``sum_j P_ij dPB_ij`` term, a row pass, for a gradient ``DPB`` of the
    head-summed probabilities); with ``BIAS_GRAD`` also ``DSII_i = dS_ii``; with ``ZERO_DQ``
    it zeroes its rows of the ``dq`` buffer ``DQA`` that the main kernel's atomic adds fill."""
    start_m = tl.program_id(0) * BLOCK_M
    bh = tl.program_id(1)
    b = bh // n_heads
    k = bh % n_heads
    base = b.to(tl.int64) * sb + k.to(tl.int64) * sk
    dbase = b.to(tl.int64) * dob + k.to(tl.int64) * dok
    offs_m = start_m + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, BLOCK_D)
    row_ok = offs_m < L
    pad_ok = offs_m < Lp
    rows = bh.to(tl.int64) * L + offs_m
    prow = bh.to(tl.int64) * Lp + offs_m
    slope2, diag2, cross2 = _head_params(SLOPE, SELF, CROSS, k, HAS_ALIBI, HAS_SELF, HAS_CROSS,
                                         ACC)
    lse = tl.load(LSE + rows, mask=row_ok, other=float("inf"))
    rr = lse * LOG2E - cross2
    tl.store(R + prow, rr, mask=pad_ok)
    if ZERO_DQ:
        _store_rows(DQA + base, tl.zeros([BLOCK_M, BLOCK_D], ACC), offs_m, row_ok, offs_d, sl, D,
                    BLOCK_D)
    do = _load_rows(DO + dbase, offs_m, row_ok, offs_d, dol, D, BLOCK_D, True).to(ACC)
    o = _load_rows(O + base, offs_m, row_ok, offs_d, sl, D, BLOCK_D, True).to(ACC)
    delta = tl.sum(o * do, 1)
    if HAS_DLSE:
        delta -= tl.load(DLSE + rows, mask=row_ok, other=0.0).to(ACC)
    eb = EB + b.to(tl.int64) * L * L
    dpb = DPB + b.to(tl.int64) * L * L
    if HAS_DPB:
        if start_m < L:
            q = _load_rows(Q + base, offs_m, row_ok, offs_d, sl, D, BLOCK_D, True)
            ramp = _alibi_ramp(slope2, BLOCK_N, HAS_ALIBI)
            r = rr
            if HAS_ALIBI:
                r = rr + slope2 * tl.arange(0, BLOCK_M).to(tl.float32)
            rho = tl.zeros([BLOCK_M], ACC)
            band = start_m // BLOCK_N * BLOCK_N
            for start_n in range(0, band, BLOCK_N):
                rho = _rowdot_step(rho, q, r, ramp, KV + base, eb, dpb, start_n, start_m, offs_m,
                                   offs_d, sl, L, c, slope2, diag2, False, D, HAS_ALIBI,
                                   HAS_BIAS, HAS_SELF or HAS_CROSS, ACC, PREC, BLOCK_N, BLOCK_D)
            for start_n in range(band, tl.minimum(start_m + BLOCK_M, L), BLOCK_N):
                rho = _rowdot_step(rho, q, r, ramp, KV + base, eb, dpb, start_n, start_m, offs_m,
                                   offs_d, sl, L, c, slope2, diag2, True, D, HAS_ALIBI,
                                   HAS_BIAS, HAS_SELF or HAS_CROSS, ACC, PREC, BLOCK_N, BLOCK_D)
            delta += rho
    tl.store(DELTA + prow, delta * scale, mask=pad_ok)
    if BIAS_GRAD:
        # dS_ii = P_ii (dP_ii - Delta_i): the diagonal logit s_ii = scale q_i.kv_i [+ E_ii] + b_self
        q = _load_rows(Q + base, offs_m, row_ok, offs_d, sl, D, BLOCK_D, True).to(ACC)
        kv = _load_rows(KV + base, offs_m, row_ok, offs_d, sl, D, BLOCK_D, True).to(ACC)
        s2 = tl.sum(q * kv, 1) * c
        dp = tl.sum(do * kv, 1)
        if HAS_BIAS:
            s2 += tl.load(eb + offs_m * (L + 1), mask=row_ok, other=0.0).to(ACC)
        if HAS_DPB:
            dp += tl.load(dpb + offs_m * (L + 1), mask=row_ok, other=0.0).to(ACC)
        if HAS_SELF:
            s2 += tl.load(SELF + k).to(ACC) * LOG2E
        p_ii = tl.math.exp2(s2 - tl.where(row_ok, lse, 0.0) * LOG2E)
        tl.store(DSII + rows, p_ii * (dp - delta), mask=row_ok)


@triton.jit
def _dkv_step(dkv, kv, keyterm, ramp_m, Qb, DOb, DQAb, eb, dpb, R, DELTA, prow0, start_m,
              start_n, offs_n, col_ok, offs_d, sl, dol, L, c, scale, slope2, diag2,
              BAND: tl.constexpr, D: tl.constexpr, HAS_ALIBI: tl.constexpr,
              HAS_BIAS: tl.constexpr, HAS_DIAG: tl.constexpr, HAS_DPB: tl.constexpr,
              ATOMIC_DQ: tl.constexpr, ACC: tl.constexpr, PREC: tl.constexpr,
              BLOCK_M: tl.constexpr, BLOCK_D: tl.constexpr):
    """One query tile of ``d kv`` for a fixed key block, in the transposed orientation (keys as
    rows, so that ``P^T`` is the left operand straight from registers):
    ``d kv += P^T do + (scale dS)^T q``, both products into the same accumulator. The ALiBi
    term ``slope2 (j - i)`` is ``keyterm_j - sigma - ramp_m_i`` with the loop-invariant
    ``keyterm = slope2 (j - start_n)``, ``ramp_m = slope2 (i - start_m)`` and the tile offset
    ``sigma = slope2 (start_m - start_n)``. With ``ATOMIC_DQ`` the tile's share of ``dq``,
    ``(scale dS) kv``, is added to the accumulation-dtype buffer at ``DQAb`` with atomic adds
    (FlashAttention-2's backward: no second walk recomputing ``P`` and ``dP``)."""
    offs_m = start_m + tl.arange(0, BLOCK_M)
    row_ok = offs_m < L
    q = _load_rows(Qb, offs_m, row_ok, offs_d, sl, D, BLOCK_D, True)
    do = _load_rows(DOb, offs_m, row_ok, offs_d, dol, D, BLOCK_D, True)
    r = tl.load(R + prow0 + offs_m)  # padded: no bounds check
    dlt = tl.load(DELTA + prow0 + offs_m)
    st = tl.dot(kv, tl.trans(q), out_dtype=ACC, input_precision=PREC)  # (keys, queries)
    if HAS_ALIBI:
        x = st * c + (keyterm - slope2 * (start_m - start_n))[:, None]
        r = r + ramp_m
    else:
        x = st * c
    if HAS_BIAS:
        x += _square_tile(eb, offs_m, offs_n, L, BAND).to(ACC).T
    x = x - r[None, :]
    if BAND:
        if HAS_DIAG:
            x = tl.where(offs_n[:, None] == offs_m[None, :], x + diag2, x)
        x = tl.where(offs_n[:, None] <= offs_m[None, :], x, float("-inf"))
    pt = tl.math.exp2(x)
    dpt = tl.dot(kv, tl.trans(do), out_dtype=ACC, input_precision=PREC)
    if HAS_DPB:
        dpt += _square_tile(dpb, offs_m, offs_n, L, BAND).to(ACC).T
    dst = pt * (dpt * scale - dlt[None, :])
    dkv = tl.dot(pt.to(do.dtype), do, dkv, out_dtype=ACC, input_precision=PREC)  # value role
    dst = dst.to(q.dtype)
    dkv = tl.dot(dst, q, dkv, out_dtype=ACC, input_precision=PREC)  # key role
    if ATOMIC_DQ:
        dq = tl.dot(tl.trans(dst), kv, out_dtype=ACC, input_precision=PREC)  # (queries, D)
        p = DQAb + offs_m[:, None] * sl + offs_d[None, :]
        if BLOCK_D == D:
            tl.atomic_add(p, dq, mask=row_ok[:, None], sem="relaxed")
        else:
            tl.atomic_add(p, dq, mask=row_ok[:, None] & (offs_d[None, :] < D), sem="relaxed")
    return dkv


@triton.jit
def _dq_step(dq, sd, rs, pii, dpii, q, do, r, dlt, ramp, KVb, eb, dpb, start, start_n, offs_m,
             offs_d, sl, L, c, scale, slope2, diag2, BAND: tl.constexpr, D: tl.constexpr,
             HAS_ALIBI: tl.constexpr, HAS_BIAS: tl.constexpr, HAS_DIAG: tl.constexpr,
             HAS_DPB: tl.constexpr, SLOPE_GRAD: tl.constexpr, BIAS_GRAD: tl.constexpr,
             ACC: tl.constexpr, PREC: tl.constexpr, BLOCK_N: tl.constexpr,
             BLOCK_D: tl.constexpr):
    """One key tile of ``dq = (scale dS) kv`` for a fixed query block; ``kv`` serves as the key
    of ``q kv^T``, the value of ``do kv^T`` and the right factor of ``dq``. With ``BIAS_GRAD``
    also the row sums ``rs_i += sum_j P_ij dP_ij`` (``Delta_i + dlse_i`` in float32 from the
    probabilities themselves, not from the output as stored) and, on the band, the diagonal
    ``P_ii`` and ``dP_ii``."""
    offs_n = start_n + tl.arange(0, BLOCK_N)
    kv = _load_rows(KVb, offs_n, offs_n < L, offs_d, sl, D, BLOCK_D, BAND)
    s = tl.dot(q, tl.trans(kv), out_dtype=ACC, input_precision=PREC)
    e = _square_tile(eb, offs_m, offs_n, L, BAND) if HAS_BIAS else s
    if HAS_ALIBI:
        r = r - slope2 * (start_n - start)
    p = tl.math.exp2(_exponent(s, e, offs_m, offs_n, ramp, r, c, diag2, BAND, HAS_BIAS,
                               HAS_DIAG))
    dp = tl.dot(do, tl.trans(kv), out_dtype=ACC, input_precision=PREC)
    if HAS_DPB:
        dp += _square_tile(dpb, offs_m, offs_n, L, BAND).to(ACC)
    ds = p * (dp * scale - dlt[:, None])
    dq = tl.dot(ds.to(kv.dtype), kv, dq, out_dtype=ACC, input_precision=PREC)
    if SLOPE_GRAD:
        sd += tl.sum(ds * (offs_m[:, None] - offs_n[None, :]).to(ACC), 1)
    if BIAS_GRAD:
        rs += tl.sum(p * dp, 1)
        if BAND:
            on = offs_m[:, None] == offs_n[None, :]
            pii += tl.sum(tl.where(on, p, 0.0), 1)
            dpii += tl.sum(tl.where(on, dp, 0.0), 1)
    return dq, sd, rs, pii, dpii


@triton.jit
def _bwd_kernel(Q, KV, DO, DQ, DQA, DKV, R, DELTA, DSII, DLSE, DSELF, DCROSS, DSDIST, SLOPE,
                SELF, CROSS, EB, DPB, sb, sk, sl, dob, dok, dol, n_heads, n_batch, L, Lp, c,
                scale, D: tl.constexpr, HAS_ALIBI: tl.constexpr, HAS_SELF: tl.constexpr,
                HAS_CROSS: tl.constexpr, HAS_BIAS: tl.constexpr, HAS_DPB: tl.constexpr,
                HAS_DLSE: tl.constexpr, SELF_GRAD: tl.constexpr, CROSS_GRAD: tl.constexpr,
                SLOPE_GRAD: tl.constexpr, ATOMIC_DQ: tl.constexpr, ACC: tl.constexpr,
                PREC: tl.constexpr, BLOCK_M1: tl.constexpr, BLOCK_N1: tl.constexpr,
                BLOCK_N2: tl.constexpr, BLOCK_D: tl.constexpr):
    """One program per (block n, batch*head): ``d kv`` of key block n (query tiles of
    ``BLOCK_M1``), then ``dq`` of query block n (key tiles of ``BLOCK_N2``); both blocks are
    ``BLOCK_N1`` long. With ``ATOMIC_DQ`` (never with ``SLOPE_GRAD``) there is no ``dq`` walk:
    the ``d kv`` walk adds each tile's share of ``dq`` to ``DQA`` (zeroed by the preprocess
    kernel), and program 0 of head k folds the preprocess kernel's rows ``DSII`` into the self
    and cross bias gradients of head k. Otherwise the ``dq`` walk writes ``DSII_i = dS_ii`` of
    its rows with ``Delta_i`` from its own row sums (:func:`_dq_step`), and a later launch folds
    them (:func:`_fold_kernel`, or :func:`_extra_grads_kernel` in the default layer's call)."""
    pid = tl.program_id(0)
    bh = tl.program_id(1)
    b = bh // n_heads
    k = bh % n_heads
    base = b.to(tl.int64) * sb + k.to(tl.int64) * sk
    dbase = b.to(tl.int64) * dob + k.to(tl.int64) * dok
    prow0 = bh.to(tl.int64) * Lp
    eb = EB + b.to(tl.int64) * L * L
    dpb = DPB + b.to(tl.int64) * L * L
    start = pid * BLOCK_N1
    offs_d = tl.arange(0, BLOCK_D)
    slope2, diag2, cross2 = _head_params(SLOPE, SELF, CROSS, k, HAS_ALIBI, HAS_SELF, HAS_CROSS,
                                         ACC)
    HAS_DIAG: tl.constexpr = HAS_SELF or HAS_CROSS
    BIAS_GRAD: tl.constexpr = SELF_GRAD or CROSS_GRAD

    # d kv of keys [start, start + BLOCK_N1): query tiles from the diagonal down
    offs_n = start + tl.arange(0, BLOCK_N1)
    col_ok = offs_n < L
    kv = _load_rows(KV + base, offs_n, col_ok, offs_d, sl, D, BLOCK_D, True)
    keyterm = slope2 * tl.arange(0, BLOCK_N1).to(tl.float32)
    ramp_m = slope2 * tl.arange(0, BLOCK_M1).to(tl.float32)
    dkv = tl.zeros([BLOCK_N1, BLOCK_D], ACC)
    for start_m in range(start, tl.minimum(start + BLOCK_N1, L), BLOCK_M1):
        dkv = _dkv_step(dkv, kv, keyterm, ramp_m, Q + base, DO + dbase, DQA + base, eb, dpb, R,
                        DELTA, prow0, start_m, start, offs_n, col_ok, offs_d, sl, dol, L, c,
                        scale, slope2, diag2, True, D, HAS_ALIBI, HAS_BIAS, HAS_DIAG, HAS_DPB,
                        ATOMIC_DQ, ACC, PREC, BLOCK_M1, BLOCK_D)
    below = start + (BLOCK_N1 + BLOCK_M1 - 1) // BLOCK_M1 * BLOCK_M1
    for start_m in range(below, L, BLOCK_M1):
        dkv = _dkv_step(dkv, kv, keyterm, ramp_m, Q + base, DO + dbase, DQA + base, eb, dpb, R,
                        DELTA, prow0, start_m, start, offs_n, col_ok, offs_d, sl, dol, L, c,
                        scale, slope2, diag2, False, D, HAS_ALIBI, HAS_BIAS, HAS_DIAG, HAS_DPB,
                        ATOMIC_DQ, ACC, PREC, BLOCK_M1, BLOCK_D)
    _store_rows(DKV + base, dkv, offs_n, col_ok, offs_d, sl, D, BLOCK_D)

    # dq of queries [start, start + BLOCK_N1): key tiles from the left, the band last
    if not ATOMIC_DQ:
        offs_m = offs_n
        row_ok = col_ok
        q = _load_rows(Q + base, offs_m, row_ok, offs_d, sl, D, BLOCK_D, True)
        do = _load_rows(DO + dbase, offs_m, row_ok, offs_d, dol, D, BLOCK_D, True)
        r = tl.load(R + prow0 + offs_m)
        if HAS_ALIBI:
            r = r + keyterm  # slope2 (i - start)
        dlt = tl.load(DELTA + prow0 + offs_m)
        ramp = _alibi_ramp(slope2, BLOCK_N2, HAS_ALIBI)
        dq = tl.zeros([BLOCK_N1, BLOCK_D], ACC)
        sd = tl.zeros([BLOCK_N1], ACC)
        rs = tl.zeros([BLOCK_N1], ACC)
        pii = tl.zeros([BLOCK_N1], ACC)
        dpii = tl.zeros([BLOCK_N1], ACC)
        band = start // BLOCK_N2 * BLOCK_N2
        for start_n in range(0, band, BLOCK_N2):
            dq, sd, rs, pii, dpii = _dq_step(
                dq, sd, rs, pii, dpii, q, do, r, dlt, ramp, KV + base, eb, dpb, start, start_n,
                offs_m, offs_d, sl, L, c, scale, slope2, diag2, False, D, HAS_ALIBI, HAS_BIAS,
                HAS_DIAG, HAS_DPB, SLOPE_GRAD, BIAS_GRAD, ACC, PREC, BLOCK_N2, BLOCK_D)
        for start_n in range(band, tl.minimum(start + BLOCK_N1, L), BLOCK_N2):
            dq, sd, rs, pii, dpii = _dq_step(
                dq, sd, rs, pii, dpii, q, do, r, dlt, ramp, KV + base, eb, dpb, start, start_n,
                offs_m, offs_d, sl, L, c, scale, slope2, diag2, True, D, HAS_ALIBI, HAS_BIAS,
                HAS_DIAG, HAS_DPB, SLOPE_GRAD, BIAS_GRAD, ACC, PREC, BLOCK_N2, BLOCK_D)
        _store_rows(DQ + base, dq, offs_m, row_ok, offs_d, sl, D, BLOCK_D)
        if SLOPE_GRAD:
            tl.store(DSDIST + bh.to(tl.int64) * L + offs_m, sd, mask=row_ok)
        if BIAS_GRAD:  # dS_ii = P_ii (dP_ii - Delta_i), Delta_i = sum_j P_ij dP_ij - dlse_i
            rows = bh.to(tl.int64) * L + offs_m
            if HAS_DLSE:
                rs -= tl.load(DLSE + rows, mask=row_ok, other=0.0).to(ACC)
            tl.store(DSII + rows, pii * (dpii - rs), mask=row_ok)
    else:
        if BIAS_GRAD:
            if (pid == 0) & (bh < n_heads):  # fold head k's rows of the preprocess kernel
                _fold_rows(DSII, DLSE, DSELF, DCROSS, k, n_heads, n_batch, L, HAS_DLSE,
                           SELF_GRAD, CROSS_GRAD, ACC, BLOCK_N1)


@triton.jit
def _fold_rows(DSII, DLSE, DSELF, DCROSS, k, n_heads, n_batch, L, HAS_DLSE: tl.constexpr,
               SELF_GRAD: tl.constexpr, CROSS_GRAD: tl.constexpr, ACC: tl.constexpr,
               BLOCK: tl.constexpr):
    """The self and cross bias gradients of head k from its rows of ``DSII`` (``dS_ii``) and
    ``DLSE``, summed in a fixed order (deterministic, no atomics): ``d b_self = sum dS_ii`` and,
    since the rows of dS sum to dlse, ``d b_cross = sum dlse - d b_self``."""
    offs = tl.arange(0, BLOCK)
    ds_sum = tl.zeros([BLOCK], ACC)
    dlse_sum = tl.zeros([BLOCK], ACC)
    for bb in range(0, n_batch):
        rows = (bb * n_heads + k).to(tl.int64) * L
        for i0 in range(0, L, BLOCK):
            ok = i0 + offs < L
            ds_sum += tl.load(DSII + rows + i0 + offs, mask=ok, other=0.0)
            if HAS_DLSE:
                dlse_sum += tl.load(DLSE + rows + i0 + offs, mask=ok, other=0.0).to(ACC)
    dself = tl.sum(ds_sum, 0)
    if SELF_GRAD:
        tl.store(DSELF + k, dself.to(DSELF.dtype.element_ty))
    if CROSS_GRAD:
        tl.store(DCROSS + k, (tl.sum(dlse_sum, 0) - dself).to(DCROSS.dtype.element_ty))


@triton.jit
def _fold_kernel(DSII, DLSE, DSELF, DCROSS, n_heads, n_batch, L, HAS_DLSE: tl.constexpr,
                 SELF_GRAD: tl.constexpr, CROSS_GRAD: tl.constexpr, ACC: tl.constexpr,
                 BLOCK: tl.constexpr):
    """One program per head: :func:`_fold_rows` after the backward kernel's ``dq`` walks have
    written every row of ``DSII``."""
    _fold_rows(DSII, DLSE, DSELF, DCROSS, tl.program_id(0), n_heads, n_batch, L, HAS_DLSE,
               SELF_GRAD, CROSS_GRAD, ACC, BLOCK)


# ------------------------------------------------------------------------------------ head sums

@triton.jit
def _headsum_tile(Q, KV, DO, LSE, R, DELTA, SLOPE, SELF, CROSS, e, dpb, b, offs_m, offs_n, row_ok,
                  col_ok, offs_d, sb, sk, sl, dob, dok, dol, n_heads, L, Lp, c, scale, start_m,
                  BAND: tl.constexpr, GRAD: tl.constexpr, D: tl.constexpr,
                  HAS_ALIBI: tl.constexpr, HAS_SELF: tl.constexpr, HAS_CROSS: tl.constexpr,
                  HAS_BIAS: tl.constexpr, HAS_DPB: tl.constexpr, ACC: tl.constexpr,
                  PREC: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                  BLOCK_D: tl.constexpr):
    acc = tl.zeros([BLOCK_M, BLOCK_N], ACC)
    for k in range(0, n_heads):
        bh = b * n_heads + k
        kk = (b * 0 + k).to(tl.int64)
        base = b.to(tl.int64) * sb + kk * sk
        q = _load_rows(Q + base, offs_m, row_ok, offs_d, sl, D, BLOCK_D, True)
        kv = _load_rows(KV + base, offs_n, col_ok, offs_d, sl, D, BLOCK_D, True)
        slope2, diag2, cross2 = _head_params(SLOPE, SELF, CROSS, k, HAS_ALIBI, HAS_SELF,
                                             HAS_CROSS, ACC)
        if GRAD:  # the padded row offsets of _pre_kernel
            r = tl.load(R + bh.to(tl.int64) * Lp + offs_m)
        else:
            lse = tl.load(LSE + bh.to(tl.int64) * L + offs_m, mask=row_ok, other=float("inf"))
            r = lse * LOG2E - cross2
        col = None
        if HAS_ALIBI:
            col = slope2 * (offs_n - start_m).to(tl.float32)
            r = r + slope2 * (offs_m - start_m).to(tl.float32)
        s = tl.dot(q, tl.trans(kv), out_dtype=ACC, input_precision=PREC)
        p = tl.math.exp2(_exponent(s, e, offs_m, offs_n, col, r, c, diag2, BAND, HAS_BIAS,
                                   HAS_SELF or HAS_CROSS))
        if GRAD:
            do = _load_rows(DO + b.to(tl.int64) * dob + kk * dok, offs_m, row_ok, offs_d, dol, D,
                            BLOCK_D, True)
            dlt = tl.load(DELTA + bh.to(tl.int64) * Lp + offs_m)
            dp = tl.dot(do, tl.trans(kv), out_dtype=ACC, input_precision=PREC)
            if HAS_DPB:
                dp += dpb
            acc += p * (dp * scale - dlt[:, None])
        else:
            acc += p
    return acc


@triton.jit
def _headsum_kernel(Q, KV, DO, LSE, R, DELTA, SLOPE, SELF, CROSS, EB, DPB, OUT,
                    sb, sk, sl, dob, dok, dol, n_heads, L, Lp, c, scale,
                    GRAD: tl.constexpr, D: tl.constexpr, HAS_ALIBI: tl.constexpr,
                    HAS_SELF: tl.constexpr, HAS_CROSS: tl.constexpr, HAS_BIAS: tl.constexpr,
                    HAS_DPB: tl.constexpr, ACC: tl.constexpr, PREC: tl.constexpr,
                    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr):
    """One program per (query block, key block, batch), looping over the heads: the tile of
    ``A = sum_k P_k`` (``GRAD=False``, from the lse) or of ``G = scale sum_k dS_k``
    (``GRAD=True``, from the rows of _pre_kernel), both (B, L, L) and zero above the
    diagonal."""
    start_m = tl.program_id(0) * BLOCK_M
    start_n = tl.program_id(1) * BLOCK_N
    b = tl.program_id(2)
    offs_m = start_m + tl.arange(0, BLOCK_M)
    offs_n = start_n + tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, BLOCK_D)
    row_ok = offs_m < L
    col_ok = offs_n < L
    out = OUT + b.to(tl.int64) * L * L + offs_m[:, None] * L + offs_n[None, :]
    mask = row_ok[:, None] & col_ok[None, :]
    if start_n >= start_m + BLOCK_M:  # wholly above the diagonal
        tl.store(out, tl.zeros([BLOCK_M, BLOCK_N], ACC).to(OUT.dtype.element_ty), mask=mask)
    else:
        e = tl.zeros([BLOCK_M, BLOCK_N], ACC)
        if HAS_BIAS:
            e = _square_tile(EB + b.to(tl.int64) * L * L, offs_m, offs_n, L, True).to(ACC)
        dpb = e
        if HAS_DPB:
            dpb = _square_tile(DPB + b.to(tl.int64) * L * L, offs_m, offs_n, L, True).to(ACC)
        if start_n + BLOCK_N <= start_m:
            acc = _headsum_tile(Q, KV, DO, LSE, R, DELTA, SLOPE, SELF, CROSS, e, dpb, b, offs_m,
                                offs_n, row_ok, col_ok, offs_d, sb, sk, sl, dob, dok, dol,
                                n_heads, L, Lp, c, scale, start_m, False, GRAD, D, HAS_ALIBI,
                                HAS_SELF, HAS_CROSS, HAS_BIAS, HAS_DPB, ACC, PREC, BLOCK_M,
                                BLOCK_N, BLOCK_D)
        else:
            acc = _headsum_tile(Q, KV, DO, LSE, R, DELTA, SLOPE, SELF, CROSS, e, dpb, b, offs_m,
                                offs_n, row_ok, col_ok, offs_d, sb, sk, sl, dob, dok, dol,
                                n_heads, L, Lp, c, scale, start_m, True, GRAD, D, HAS_ALIBI,
                                HAS_SELF, HAS_CROSS, HAS_BIAS, HAS_DPB, ACC, PREC, BLOCK_M,
                                BLOCK_N, BLOCK_D)
        tl.store(out, acc.to(OUT.dtype.element_ty), mask=mask)


@triton.jit
def _extra_grads_kernel(G, A, QE, KE, DOE, DQE, DKE, L, DE, sqb, sql, skb, skl, sdb, sdl,
                        DSII, DLSE, DSELF, DCROSS, n_heads, n_batch,
                        HAS_A: tl.constexpr, FOLD: tl.constexpr, HAS_DLSE: tl.constexpr,
                        SELF_GRAD: tl.constexpr, CROSS_GRAD: tl.constexpr, ACC: tl.constexpr,
                        PREC: tl.constexpr, FOLD_BLOCK: tl.constexpr, BLOCK_M: tl.constexpr,
                        BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    """Both gradients of the shared extra pair, in one launch (grid axis 2: batch x 2 jobs),
    skipping the zero triangle of the lower-triangular ``G`` and ``A`` (B, L, L):
    job 0 ``dq_e[i] = sum_{j<=i} G_ij k_e[j]``; job 1 ``dk_e[j] = sum_{i>=j} G_ij q_e[i]
    + A_ij do_e[i]``. Outputs (B, L, DE) contiguous. With ``FOLD`` the first programs also fold
    the bias gradients of one head each (:func:`_fold_rows`), the work of :func:`_fold_kernel`
    in a launch that follows the backward kernel anyway."""
    start_m = tl.program_id(0) * BLOCK_M
    offs_n = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    b = tl.program_id(2) // 2
    job = tl.program_id(2) % 2
    offs_m = start_m + tl.arange(0, BLOCK_M)
    row_ok = offs_m < L
    col_ok = offs_n < DE
    sq = G + b.to(tl.int64) * L * L
    acc = tl.zeros([BLOCK_M, BLOCK_N], ACC)
    if job == 0:
        for k0 in range(0, tl.minimum(start_m + BLOCK_M, L), BLOCK_K):
            offs_k = k0 + tl.arange(0, BLOCK_K)
            k_ok = offs_k < L
            g = tl.load(sq + offs_m[:, None] * L + offs_k[None, :],
                        mask=row_ok[:, None] & k_ok[None, :], other=0.0)
            ke = tl.load(KE + b.to(tl.int64) * skb + offs_k[:, None] * skl + offs_n[None, :],
                         mask=k_ok[:, None] & col_ok[None, :], other=0.0)
            acc = tl.dot(g, ke, acc, out_dtype=ACC, input_precision=PREC)
        out = DQE
    else:
        for k0 in range(start_m // BLOCK_K * BLOCK_K, L, BLOCK_K):
            offs_k = k0 + tl.arange(0, BLOCK_K)
            k_ok = offs_k < L
            tmask = row_ok[:, None] & k_ok[None, :]
            gt = tl.load(sq + offs_k[None, :] * L + offs_m[:, None], mask=tmask, other=0.0)
            qe = tl.load(QE + b.to(tl.int64) * sqb + offs_k[:, None] * sql + offs_n[None, :],
                         mask=k_ok[:, None] & col_ok[None, :], other=0.0)
            acc = tl.dot(gt, qe, acc, out_dtype=ACC, input_precision=PREC)
            if HAS_A:
                at = tl.load(A + b.to(tl.int64) * L * L + offs_k[None, :] * L + offs_m[:, None],
                             mask=tmask, other=0.0)
                doe = tl.load(DOE + b.to(tl.int64) * sdb + offs_k[:, None] * sdl + offs_n[None, :],
                              mask=k_ok[:, None] & col_ok[None, :], other=0.0)
                acc = tl.dot(at, doe, acc, out_dtype=ACC, input_precision=PREC)
        out = DKE
    tl.store(out + b.to(tl.int64) * L * DE + offs_m[:, None] * DE + offs_n[None, :],
             acc.to(out.dtype.element_ty), mask=row_ok[:, None] & col_ok[None, :])
    if FOLD:
        n0 = tl.num_programs(0)
        n1 = tl.num_programs(1)
        flat = (tl.program_id(2) * n1 + tl.program_id(1)) * n0 + tl.program_id(0)
        for k in range(flat, n_heads, n0 * n1 * tl.num_programs(2)):
            _fold_rows(DSII, DLSE, DSELF, DCROSS, k, n_heads, n_batch, L, HAS_DLSE, SELF_GRAD,
                       CROSS_GRAD, ACC, FOLD_BLOCK)


# ------------------------------------------------------------------------------- configurations

ROW_PAD = 128  # padding of the backward's row vectors: the longest query tile


def _check_pad(name: str, cfg: dict) -> None:
    """The backward's row vectors are padded by ROW_PAD rows: no query tile may be longer."""
    tiles = [v for k, v in cfg.items() if k.startswith("BLOCK")]
    if name in ("bwd", "headsum") and max(tiles) > ROW_PAD:
        raise ValueError(f"{name} tiles longer than ROW_PAD = {ROW_PAD}: {cfg}")


#: the kernels' launch configurations (``attention_configs.json``): one per kernel under the
#: interpreter (unequal query and key tiles, so that the band logic runs with both orders), and
#: on a GPU an autotune space per kernel and padded head width; "bwd_atomic" is the backward
#: specialised for the atomic-dq accumulation (no dq walk: BLOCK_N2 unused)
TUNING = runtime.Tuning(
    Path(__file__).with_name("attention_configs.json"), interpret=INTERPRET, validate=_check_pad,
    tune_keys=("L", "D", "HAS_ALIBI", "HAS_SELF", "HAS_CROSS", "HAS_BIAS", "HAS_DPB", "HAS_DLSE",
               "SELF_GRAD", "CROSS_GRAD", "SLOPE_GRAD", "BIAS_GRAD", "GRAD", "HAS_A", "DE",
               "ATOMIC_DQ", "ZERO_DQ"),
    # the atomic-dq backward accumulates into DQA: zeroed before every timed run (in the walk
    # variant DQA is dq itself, overwritten anyway)
    reset_to_zero={"bwd": ["DQA"]})
GPU_CONFIGS = TUNING.gpu
INTERPRETER_CONFIGS = TUNING.interpreter
use_configs = TUNING.use


def atomic_dq_enabled() -> bool:
    """Whether the backward accumulates ``dq`` with atomic adds in the ``d kv`` walk (5 matrix
    products and one exponential pass per score element, as FlashAttention-2) instead of a
    second walk over key tiles (7 products, two passes; deterministic). Off by default (no faster
    on the H100: ``benchmarks/RESULTS_H100.md``); ``CEMLIB_ATOMIC_DQ=1`` (read at import) or
    :func:`use_atomic_dq` turns it on. Calls that need the ALiBi-slope gradient always walk."""
    return _atomic_dq[0]


@contextlib.contextmanager
def use_atomic_dq(enabled: bool = True):
    """Run the backward with (or without) the atomic ``dq`` accumulation inside the block."""
    previous = _atomic_dq[0]
    _atomic_dq[0] = bool(enabled)
    try:
        yield
    finally:
        _atomic_dq[0] = previous


# ------------------------------------------------------------------------------------ host code

def covers(q, q_extra, extra_values: bool, extra_head_sum: bool) -> bool:
    """Whether this module computes the call (:func:`cemlib.kernels.runtime.attention_covers`)."""
    return runtime.attention_covers(q, q_extra, extra_values, extra_head_sum)


def _unit_rows(t: Tensor) -> Tensor:
    """``t`` with a contiguous last dimension (a copy only if it is not)."""
    return t if t.stride(-1) == 1 else t.contiguous()


def _same_layout(q: Tensor, kv: Tensor):
    """``q`` and ``kv`` with one set of strides and a contiguous head dimension: the layers'
    head-split views pass unchanged; anything else is made contiguous."""
    if q.stride() == kv.stride() and q.stride(-1) == 1:
        return q, kv
    return q.contiguous(), kv.contiguous()


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)  # (triton.cdiv is a constexpr function: ten times slower on the host)


def _tl_acc(acc: torch.dtype):
    return tl.float64 if acc == torch.float64 else tl.float32


@functools.lru_cache(maxsize=None)
def _call_constants(D: int, dtype: torch.dtype, has_alibi: bool, has_self: bool,
                    has_cross: bool, extra: bool):
    """``(block_d, acc dtype, flags)`` of a call: the meta-parameters every kernel of it shares
    (computed once per kind of call: host time is what the GPU waits for at T <= 1024)."""
    block_d = max(16, 1 << (D - 1).bit_length())
    acc = runtime.acc_dtype(dtype)
    flags = dict(D=D, HAS_ALIBI=has_alibi, HAS_SELF=has_self, HAS_CROSS=has_cross,
                 HAS_BIAS=extra, ACC=_tl_acc(acc), PREC="ieee" if acc == dtype else "tf32",
                 BLOCK_D=block_d)
    return block_d, acc, flags


class _Call:
    """The sizes, flags and operands that every kernel of one call shares."""

    def __init__(self, q, kv, scale, alibi, self_bias, cross_bias, extra):
        runtime.check_dtype(q, INTERPRET)
        self.q, self.kv = _same_layout(q, kv)
        self.B, self.K, self.L, self.D = q.shape
        self.block_d, self.acc, self.flags = _call_constants(
            self.D, q.dtype, alibi is not None, self_bias is not None, cross_bias is not None,
            bool(extra))
        self.device = q.device
        self.scale = float(scale)
        self.c = self.scale * LOG2E.value
        self.alibi, self.self_bias, self.cross_bias = alibi, self_bias, cross_bias
        # (passed as they are: a kernel reads the memory; a detach() per operand would add an
        # operator, a few microseconds of host time on a GPU, and change nothing)
        self.vec = [t if t is not None else self.q for t in (alibi, self_bias, cross_bias)]
        self.strides = self.q.stride()[:3]

    def blocks(self, cfg_key):
        return lambda cfg: _cdiv(self.L, cfg[cfg_key])

    def launch(self, name, kernel, grid, args, table=None, **meta):
        TUNING.launch(name, kernel, grid, args, {**self.flags, **meta}, self.block_d, self.device,
                      self.L, table)

    def forward(self, e2):
        """``(o, lse)``; ``e2`` the extra logits (B, L, L) in log2 units, or ``None``."""
        o = torch.empty_like(self.q)
        lse = torch.empty((self.B, self.K, self.L), dtype=self.acc, device=self.device)
        n = self.blocks("BLOCK_M")
        self.launch("fwd", _fwd_kernel, lambda cfg: (n(cfg), self.B * self.K),
                    (self.q, self.kv, o, lse, *self.vec, e2 if e2 is not None else self.q,
                     *self.strides, self.K, self.L, self.c))
        return o, lse

    def head_sum(self, lse, e2, do=None, rows=None, dpb=None):
        """``A = sum_k P_k`` or, with ``do`` and the padded ``rows = (R, DELTA)`` of the
        backward, ``G = scale sum_k dS_k``: (B, L, L) in the input dtype, zero above the
        diagonal."""
        out = torch.empty((self.B, self.L, self.L), dtype=self.q.dtype, device=self.device)
        grad = do is not None
        r, delta = rows if grad else (lse, lse)
        do = do if grad else self.q
        m, n = self.blocks("BLOCK_M"), self.blocks("BLOCK_N")
        self.launch("headsum", _headsum_kernel, lambda cfg: (m(cfg), n(cfg), self.B),
                    (self.q, self.kv, do, lse, r, delta, *self.vec, e2,
                     dpb if dpb is not None else e2, out, *self.strides, *do.stride()[:3],
                     self.K, self.L, self.L + ROW_PAD, self.c, self.scale),
                    GRAD=grad, HAS_DPB=dpb is not None)
        return out

    def backward(self, o, lse, do, dlse, e2, dpb, need_self, need_cross, need_slope,
                 atomic_dq=None, fold_later=False):
        """``(dq, dkv, dalibi, dself, dcross, rows, fold)``: gradients not needed are ``None``;
        ``rows = (R, DELTA)``, the padded row vectors of :func:`_pre_kernel`; ``atomic_dq``:
        see :func:`tied_attention` (``None``: :func:`atomic_dq_enabled`). ``fold``: the
        arguments of the bias-gradient fold (:func:`_fold`) when ``fold_later`` leaves it to a
        later launch (:func:`_extra_grads`), else ``None``."""
        B, K, L = self.B, self.K, self.L
        Lp = L + ROW_PAD
        dstr = do.stride()[:3]
        r = torch.empty((B, K, Lp), dtype=self.acc, device=self.device)
        delta = torch.empty_like(r)
        bias_grad = need_self or need_cross
        dsii = torch.empty((B, K, L), dtype=self.acc, device=self.device) if bias_grad else r
        common = (*self.vec, e2 if e2 is not None else self.q, dpb if dpb is not None else self.q)
        dlse_arg = dlse if dlse is not None else lse
        dq, dkv = torch.empty_like(self.q), torch.empty_like(self.kv)
        atomic = (atomic_dq_enabled() if atomic_dq is None else bool(atomic_dq)) and not need_slope
        # the atomic adds' buffer: dq itself in the accumulation dtype (float32, float64), else a
        # float32 copy laid out like q (same strides), converted at the end
        dqa = (dq if dq.dtype == self.acc else torch.empty_like(self.q, dtype=self.acc)) if atomic else dq
        self.launch("pre", _pre_kernel, lambda cfg: (_cdiv(Lp, cfg["BLOCK_M"]), B * K),
                    (self.q, self.kv, o, do, lse, dlse_arg, r, delta, dsii, dqa, *common,
                     *self.strides, *dstr, K, L, Lp, self.c, self.scale),
                    HAS_DLSE=dlse is not None, BIAS_GRAD=bias_grad and atomic,
                    HAS_DPB=dpb is not None, ZERO_DQ=atomic)
        dself = torch.empty_like(self.self_bias) if need_self else r
        dcross = torch.empty_like(self.cross_bias) if need_cross else r
        dsdist = torch.empty((B, K, L), dtype=self.acc, device=self.device) if need_slope else r
        n = self.blocks("BLOCK_N1")
        self.launch("bwd", _bwd_kernel, lambda cfg: (n(cfg), B * K),
                    (self.q, self.kv, do, dq, dqa, dkv, r, delta, dsii, dlse_arg, dself, dcross,
                     dsdist, *common, *self.strides, *dstr, K, B, L, Lp, self.c, self.scale),
                    HAS_DPB=dpb is not None, HAS_DLSE=dlse is not None, SELF_GRAD=need_self,
                    CROSS_GRAD=need_cross, SLOPE_GRAD=need_slope, ATOMIC_DQ=atomic,
                    table="bwd_atomic" if atomic else "bwd")
        fold = None
        if bias_grad and not atomic:  # the dq walks wrote every row of dS_ii: fold them
            fold = (dsii, dlse_arg, dself, dcross, dlse is not None, need_self, need_cross)
            if not fold_later:
                _fold(*fold, self.flags["ACC"])
                fold = None
        if dqa is not dq:
            dq.copy_(dqa)
        dalibi = None
        if need_slope:  # d s_ij / d m = -(i - j); the kernel summed (scale dS_ij)(i - j)
            dalibi = (dsdist.sum((0, 2)) * (-1.0 / self.scale)).to(self.alibi.dtype)
        return (dq, dkv, dalibi, dself if need_self else None, dcross if need_cross else None,
                (r, delta), fold)


#: rows per step of the bias-gradient fold (:func:`_fold_kernel`; one program per head, 4 warps)
FOLD_BLOCK = 128


def _fold(dsii, dlse, dself, dcross, has_dlse, need_self, need_cross, acc):
    """Launch :func:`_fold_kernel`: the self and cross bias gradients from the rows ``dsii``
    (B, K, L) that the backward kernel wrote; ``dself``/``dcross`` are filled."""
    B, K, L = dsii.shape
    cuda = dsii.is_cuda and not INTERPRET
    kw = dict(HAS_DLSE=has_dlse, SELF_GRAD=need_self, CROSS_GRAD=need_cross, ACC=acc,
              BLOCK=FOLD_BLOCK)
    if not INTERPRET:
        kw["num_warps"] = 4
    runtime.launch(_fold_kernel, (K,), (dsii, dlse, dself, dcross, K, B, L), kw, cuda)


def _extra_grads(g, a, q_extra, k_extra, doe, fold=None):
    """``(dq_e, dk_e)`` of the shared pair from ``G`` (and ``A``, ``do_e``): one launch, which
    also folds the bias gradients (``fold``: the arguments of :func:`_fold`) when given."""
    B, L, DE = q_extra.shape
    q_extra, k_extra = _unit_rows(q_extra), _unit_rows(k_extra)
    dqe = torch.empty((B, L, DE), dtype=q_extra.dtype, device=q_extra.device)
    dke = torch.empty((B, L, DE), dtype=k_extra.dtype, device=k_extra.device)
    has_a = doe is not None
    doe = _unit_rows(doe) if has_a else k_extra
    acc = runtime.acc_dtype(q_extra.dtype)
    if fold is None:  # placeholders: FOLD is off
        rows, n_heads, has_dlse, need_self, need_cross = (g, g, g, g), 0, False, False, False
    else:
        dsii, dlse, dself, dcross, has_dlse, need_self, need_cross = fold
        rows, n_heads = (dsii, dlse, dself, dcross), dsii.shape[1]
    TUNING.launch("extra_grads", _extra_grads_kernel,
                  lambda cfg: (_cdiv(L, cfg["BLOCK_M"]), _cdiv(DE, cfg["BLOCK_N"]), 2 * B),
                  (g, a if has_a else g, q_extra, k_extra, doe, dqe, dke, L, DE,
                   q_extra.stride(0), q_extra.stride(1), k_extra.stride(0), k_extra.stride(1),
                   doe.stride(0), doe.stride(1), *rows, n_heads, B),
                  dict(HAS_A=has_a, FOLD=fold is not None, HAS_DLSE=has_dlse,
                       SELF_GRAD=need_self, CROSS_GRAD=need_cross, ACC=_tl_acc(acc),
                       PREC="ieee" if acc == q_extra.dtype else "tf32", FOLD_BLOCK=FOLD_BLOCK),
                  0, q_extra.device, L)
    return dqe, dke


def forward(q, kv, scale, alibi=None, self_bias=None, cross_bias=None, q_extra=None,
            k_extra=None, extra_values=False):
    """``(o, lse, o_extra, e2, A)``: the outputs, and the extra logits ``e2`` (in log2 units)
    and head-summed probabilities ``A`` that the backward reuses (``None`` where absent).
    ``o_extra = A k_extra`` (B, L, D_e) with ``extra_values`` (head-summed). Inputs are
    assumed validated (:mod:`cemlib.kernels.dispatch`) and covered (:func:`covers`)."""
    run = _Call(q, kv, scale, alibi, self_bias, cross_bias, q_extra is not None)
    e2 = oe = a = None
    if q_extra is not None:  # one GEMM, scaled to log2 units on the way
        e2 = torch.baddbmm(q_extra.new_empty(run.B, run.L, run.L), q_extra,
                           k_extra.transpose(1, 2), beta=0.0, alpha=run.c)
    o, lse = run.forward(e2)
    if extra_values:
        a = run.head_sum(lse, e2)
        oe = torch.bmm(a, k_extra)
    return o, lse, oe, e2, a


def backward(do, dlse, doe, q, kv, o, lse, scale, alibi, self_bias, cross_bias, q_extra,
             k_extra, e2, a, needs, atomic_dq=None):
    """Gradients ``(dq, dkv, dalibi, dself, dcross, dq_extra, dk_extra)`` (``None`` where not
    needed); ``needs``: which of ``(q, kv, alibi, self_bias, cross_bias, q_extra, k_extra)``
    need one (q and kv always get theirs). ``dlse``/``doe`` may be ``None`` (zero);
    ``atomic_dq``: see :func:`tied_attention`."""
    run = _Call(q, kv, scale, alibi, self_bias, cross_bias, q_extra is not None)
    do = _unit_rows(do) if do is not None else torch.zeros_like(o)
    if dlse is not None:
        dlse = dlse.contiguous()
    dpb = None
    if doe is not None and a is not None:  # o_extra = A k_e: dA = do_e k_e^T reaches every dP_k
        dpb = torch.bmm(doe, k_extra.transpose(1, 2))
    need_slope = bool(needs[2])
    extra_grads = q_extra is not None and bool(needs[5] or needs[6])
    dq, dkv, dalibi, dself, dcross, rows, fold = run.backward(
        o, lse, do, dlse, e2, dpb, bool(needs[3]), bool(needs[4]), need_slope, atomic_dq,
        fold_later=extra_grads)
    dqe = dke = None
    if extra_grads:  # its launch also folds the bias gradients (no launch more for them)
        g = run.head_sum(lse, e2, do, rows, dpb)
        dqe, dke = _extra_grads(g, a, q_extra, k_extra, doe if dpb is not None else None, fold)
    return (dq, dkv, dalibi, dself, dcross, dqe if needs[5] else None,
            dke if needs[6] else None)


# ------------------------------------------------------------------------------------ autograd

def _empty(t: Tensor) -> Tensor:
    return t.new_empty(0)


def _fwd_kernel_op(q: Tensor, kv: Tensor, scale: float, alibi: Optional[Tensor],
                   self_bias: Optional[Tensor], cross_bias: Optional[Tensor],
                   q_extra: Optional[Tensor], k_extra: Optional[Tensor], extra_values: bool
                   ) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor]:
    with runtime.on_device(q):
        out = forward(q, kv, scale, alibi, self_bias, cross_bias, q_extra, k_extra, extra_values)
    return tuple(t if t is not None else _empty(q) for t in out)


def _fwd_fake(q, kv, scale, alibi, self_bias, cross_bias, q_extra, k_extra, extra_values):
    B, K, L, _ = q.shape
    acc = runtime.acc_dtype(q.dtype)
    square = q.new_empty((B, L, L)) if q_extra is not None else _empty(q)
    return (torch.empty_like(_same_layout(q, kv)[0]), q.new_empty((B, K, L), dtype=acc),
            k_extra.new_empty((B, L, k_extra.shape[-1])) if extra_values else _empty(q),
            square, q.new_empty((B, L, L)) if extra_values else _empty(q))


# what a compiled graph calls: the forward and backward operators (runtime.define: no
# autograd layer around them); their derivative is _TiedAttention's, which dynamo traces
_fwd_op = runtime.define(
    "tied_attention_fwd",
    "(Tensor q, Tensor kv, float scale, Tensor? alibi, Tensor? self_bias, Tensor? cross_bias, "
    "Tensor? q_extra, Tensor? k_extra, bool extra_values) -> (Tensor, Tensor, Tensor, Tensor, "
    "Tensor)", _fwd_kernel_op, _fwd_fake)


def _bwd_kernel_op(do, dlse, doe, q, kv, o, lse, scale, alibi, self_bias, cross_bias, q_extra,
                   k_extra, e2, a, needs, atomic_dq):
    with runtime.on_device(q):
        grads = backward(do, dlse, doe, q, kv, o, lse, scale, alibi, self_bias, cross_bias,
                         q_extra, k_extra, e2, a, needs, None if atomic_dq < 0 else bool(atomic_dq))
    return [g if g is not None else _empty(q) for g in grads]


def _bwd_fake(do, dlse, doe, q, kv, o, lse, scale, alibi, self_bias, cross_bias, q_extra, k_extra,
              e2, a, needs, atomic_dq):
    like = [q, kv, alibi, self_bias, cross_bias, q_extra, k_extra]
    flags = [True, True, *needs[2:]]
    out = []
    for t, need in zip(like, flags):
        out.append(torch.empty_like(t) if t is not None and need else _empty(q))
    return out


_bwd_op = runtime.define(
    "tied_attention_bwd",
    "(Tensor? do, Tensor? dlse, Tensor? doe, Tensor q, Tensor kv, Tensor o, Tensor lse, "
    "float scale, Tensor? alibi, Tensor? self_bias, Tensor? cross_bias, Tensor? q_extra, "
    "Tensor? k_extra, Tensor? e2, Tensor? a, bool[] needs, SymInt atomic_dq) -> Tensor[]",
    _bwd_kernel_op, _bwd_fake)


class _TiedAttention(torch.autograd.Function):
    """Autograd of a call. In eager mode forward and backward call the launchers directly; while
    ``torch.compile`` traces, the operators :data:`_fwd_op` and :data:`_bwd_op` (opaque to the
    compiler), which AOTAutograd puts into the forward and backward graphs."""

    @staticmethod
    def forward(ctx, q, kv, scale, alibi, self_bias, cross_bias, q_extra, k_extra, extra_values,
                atomic_dq):
        if torch.compiler.is_compiling():  # (the operator returns empty tensors for None)
            o, lse, oe, e2, a = _fwd_op(q, kv, scale, alibi, self_bias, cross_bias, q_extra,
                                        k_extra, extra_values)
            e2, a = e2 if q_extra is not None else None, a if extra_values else None
        else:
            o, lse, oe, e2, a = forward(q, kv, scale, alibi, self_bias, cross_bias, q_extra,
                                        k_extra, extra_values)
        ctx.save_for_backward(q, kv, o, lse, alibi, self_bias, cross_bias, q_extra, k_extra, e2, a)
        ctx.scale, ctx.atomic_dq = scale, atomic_dq
        ctx.set_materialize_grads(False)  # unused outputs (lse, in the layers) cost nothing
        return (o, lse, oe) if extra_values else (o, lse)

    @staticmethod
    @once_differentiable
    def backward(ctx, do, dlse, doe=None):
        q, kv, o, lse, alibi, self_bias, cross_bias, q_extra, k_extra, e2, a = ctx.saved_tensors
        n = ctx.needs_input_grad
        needs = [n[0], n[1], n[3], n[4], n[5], n[6], n[7]]
        if torch.compiler.is_compiling():  # (the operator returns empty tensors for None)
            atomic = -1 if ctx.atomic_dq is None else int(ctx.atomic_dq)
            g = _bwd_op(do, dlse, doe, q, kv, o, lse, ctx.scale, alibi, self_bias, cross_bias,
                        q_extra, k_extra, e2, a, needs, atomic)
            g = [gi if need else None for gi, need in zip(g, [True, True, *needs[2:]])]
        else:
            g = backward(do, dlse, doe, q, kv, o, lse, ctx.scale, alibi, self_bias, cross_bias,
                         q_extra, k_extra, e2, a, needs, ctx.atomic_dq)
        dq, dkv, dalibi, dself, dcross, dqe, dke = g
        return dq, dkv, None, dalibi, dself, dcross, dqe, dke, None, None


def tied_attention(q, kv, *, scale, alibi=None, self_bias=None, cross_bias=None, q_extra=None,
                   k_extra=None, extra_values=False, extra_head_sum=False, atomic_dq=None):
    """The kernels with the contract of :func:`cemlib.kernels.reference.tied_attention`;
    returns ``(o, lse[, o_extra])`` (``o_extra`` head-summed, (B, L, D_e)). Takes the calls
    :func:`covers` accepts (a ``ValueError`` otherwise); inputs are not validated further
    (:func:`cemlib.kernels.dispatch.tied_attention` does that). ``atomic_dq``: whether this
    call's backward adds ``dq`` atomically inside the ``d kv`` walk (``None``: the module's
    setting, :func:`atomic_dq_enabled`, read when the backward runs)."""
    if not covers(q, q_extra, extra_values, extra_head_sum):
        raise ValueError("the attention kernel takes head widths up to 128 and no extra pair or "
                         "a head-shared one (B, L, D_e) with head-summed extra values; "
                         "cemlib.kernels.dispatch.tied_attention sends per-head pairs or values "
                         "and wider heads to the PyTorch path")
    extra_values = bool(extra_values)
    # (while compiling, the operators launch on q's device themselves)
    with contextlib.nullcontext() if torch.compiler.is_compiling() else runtime.on_device(q):
        return _TiedAttention.apply(q, kv, float(scale), alibi, self_bias, cross_bias, q_extra,
                                    k_extra, extra_values, atomic_dq)
