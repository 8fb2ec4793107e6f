"""Triton kernels for tied causal attention (K = V), first version: forward with saved log-sum-exp, and backward.

The dispatcher (:mod:`cemlib.kernels.dispatch`) uses the second version,
:mod:`cemlib.kernels.tied_attention_v2`, for every call that one covers, and this one for the
rest (per-head extra pairs and per-head extra values, the ``"tile"`` path below); the backend
``"triton_v1"`` (or :func:`cemlib.kernels.ops.tied_attention`) runs this version for every call,
for comparison. ``benchmarks/NOTES.md`` compares the two.

Computes exactly :func:`cemlib.kernels.reference.tied_attention` (CEM [arXiv] eq. 3 = [ICLR]
eq. 2, with the Appendix B biases and the eq. 12 diagonal term as an "extra" query/key pair):

    s_kij = scale (q_ki . kv_kj + qe_(k)i . ke_j) - m_k (i - j) + b_self_k [i=j] + b_cross_k [i!=j]
    o_ki = sum_{j<=i} softmax_j(s_kij) kv_kj,   lse_ki = log sum_{j<=i} exp s_kij

FlashAttention-2 structure: one program per (query block, batch*head) in the forward, with an
online softmax; each key/value tile ``kv`` is loaded once and serves both as key (in ``q kv^T``)
and as value (in ``p kv``). The backward recomputes ``p`` from the saved ``lse``:

    dS = P o (dP - Delta),  dP = do kv^T (+ do_e ke^T),  Delta_i = o_i.do_i (+ oe_i.doe_i) - dlse_i

and ``d kv`` is the sum of its value role ``P^T do`` and its key role ``scale * dS^T q``,
accumulated in one register tile (one program per key block). ``dq`` comes from a second kernel
(one program per query block), which also reduces the row sums needed for the bias gradients.

The extra pair takes one of two paths (:func:`cemlib.kernels.paths.extra_path`):

- ``"tile"``: ``qe``/``ke`` sit in register tiles next to ``q``/``kv`` (one tile of width
  ``D_e``, padded to a power of two), as above; efficient for ``D_e <= 128``.
- ``"logits"``: a head-shared pair wider than that, the default CEM layer's eq. 12 diagonal with
  ``D_e = D_h`` (768 at GPT-2 width). Its logits ``E = scale qe ke^T`` are the same for every
  head, so they are one batched GEMM (B, L, L) that the kernels add tile by tile
  (``HAS_BIAS``), and the layer only needs the head-summed diagonal values
  ``sum_k P_k ke = A ke`` with ``A = sum_k P_k``, a second GEMM. ``_headsum_kernel`` (one
  program per (query block, key block, batch), looping over heads) forms ``A`` from the saved
  lse, and in the backward ``dE = sum_k dS_k``; the gradient ``dA = doe ke^T`` enters every
  head's ``dP`` (``HAS_DPB``) and its ``Delta`` through ``_rowdot_kernel``
  (``sum_j P_kij dA_ij``). Then ``dqe = scale dE ke``, ``dke = scale dE^T qe + A^T doe``
  (``dE`` the gradient of the unscaled logits): GEMMs. Memory is
  O(B L^2) (the reference's is O(B K L^2)), and no per-head work runs at the width ``D_e``.

Tiles: the head width ``D`` is held in one register tile (padded to a power of two, at least
16), so the kernels suit ``D <= 256``. Tile sizes are fixed, not autotuned (autotuning cannot run
under the interpreter).

``INTERPRET`` records whether Triton runs in interpreter mode (``TRITON_INTERPRET=1``, read when
the kernels below are decorated); under it bfloat16 is refused, as the interpreter silently
mis-computes it.
"""

from __future__ import annotations

import os

import torch
import triton
import triton.language as tl

from cemlib.kernels.paths import extra_path

INTERPRET = os.environ.get("TRITON_INTERPRET", "0") == "1"

__all__ = ["attention_forward", "attention_backward", "INTERPRET"]


@triton.jit
def _rows(X, offs, ok, offs_c, C):
    """Rows ``offs`` (where ``ok``) and columns ``offs_c`` (< C) of the row-major (., C) block
    at ``X``; 0 outside."""
    return tl.load(X + offs[:, None] * C + offs_c[None, :],
                   mask=ok[:, None] & (offs_c[None, :] < C), other=0.0)


@triton.jit
def _shared_tile(X, b, offs_m, offs_n, L):
    """Tile (offs_m, offs_n) of batch ``b`` of a head-shared (B, L, L) matrix, 0 outside."""
    ptr = X + b.to(tl.int64) * L * L + offs_m[:, None] * L + offs_n[None, :]
    return tl.load(ptr, mask=(offs_m[:, None] < L) & (offs_n[None, :] < L), other=0.0)


@triton.jit
def _head_biases(SLOPE, SELF, CROSS, k, HAS_ALIBI: tl.constexpr, HAS_SELF: tl.constexpr,
                 HAS_CROSS: tl.constexpr):
    """Head ``k``'s ALiBi slope and self/cross biases (0 where absent)."""
    slope = 0.0
    b_self = 0.0
    b_cross = 0.0
    if HAS_ALIBI:
        slope = tl.load(SLOPE + k)
    if HAS_SELF:
        b_self = tl.load(SELF + k)
    if HAS_CROSS:
        b_cross = tl.load(CROSS + k)
    return slope, b_self, b_cross


@triton.jit
def _scores(q, kv, qe, ke, EB, b, offs_m, offs_n, L, scale, slope, b_self, b_cross,
            HAS_ALIBI: tl.constexpr, HAS_SELF: tl.constexpr, HAS_CROSS: tl.constexpr,
            HAS_EXTRA: tl.constexpr, HAS_BIAS: tl.constexpr, ACC: tl.constexpr,
            PREC: tl.constexpr):
    """Masked logits s[i, j] of one (BLOCK_M, BLOCK_N) tile; -inf where j > i or j >= L.
    ``HAS_BIAS``: add the tile of ``EB`` (B, L, L), the precomputed scaled extra-pair logits."""
    s = tl.dot(q, tl.trans(kv), out_dtype=ACC, input_precision=PREC)
    if HAS_EXTRA:
        s += tl.dot(qe, tl.trans(ke), out_dtype=ACC, input_precision=PREC)
    s = s * scale
    if HAS_BIAS:
        s += _shared_tile(EB, b, offs_m, offs_n, L).to(ACC)
    dist = (offs_m[:, None] - offs_n[None, :]).to(ACC)
    if HAS_ALIBI:
        s = s - slope * dist
    if HAS_SELF:
        s = tl.where(dist == 0, s + b_self, s)
    if HAS_CROSS:
        s = tl.where(dist != 0, s + b_cross, s)
    valid = (dist >= 0) & (offs_n[None, :] < L)
    return tl.where(valid, s, float("-inf"))


@triton.jit
def _fwd_kernel(Q, KV, QE, KE, SLOPE, SELF, CROSS, EB, O, OE, LSE,
                n_heads, L, D, DE, stride_qe_b, stride_qe_k, scale,
                HAS_ALIBI: tl.constexpr, HAS_SELF: tl.constexpr, HAS_CROSS: tl.constexpr,
                HAS_EXTRA: tl.constexpr, HAS_BIAS: tl.constexpr, EXTRA_VALUES: tl.constexpr,
                ACC: tl.constexpr, PREC: tl.constexpr, BLOCK_M: tl.constexpr,
                BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_DE: tl.constexpr):
    pid_m = tl.program_id(0)
    bh = tl.program_id(1)
    b = bh // n_heads
    k = bh % n_heads
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, BLOCK_D)
    offs_e = tl.arange(0, BLOCK_DE)
    row_ok = offs_m < L
    q = _rows(Q + bh * L * D, offs_m, row_ok, offs_d, D)
    qe = q
    if HAS_EXTRA:
        qe = _rows(QE + b * stride_qe_b + k * stride_qe_k, offs_m, row_ok, offs_e, DE)
    slope, b_self, b_cross = _head_biases(SLOPE, SELF, CROSS, k, HAS_ALIBI, HAS_SELF, HAS_CROSS)
    m_i = tl.full([BLOCK_M], float("-inf"), ACC)
    l_i = tl.zeros([BLOCK_M], ACC)
    acc = tl.zeros([BLOCK_M, BLOCK_D], ACC)
    acc_e = tl.zeros([BLOCK_M, BLOCK_DE], ACC)
    hi = tl.minimum((pid_m + 1) * BLOCK_M, L)
    for start_n in range(0, hi, BLOCK_N):
        offs_n = start_n + tl.arange(0, BLOCK_N)
        col_ok = offs_n < L
        kv = _rows(KV + bh * L * D, offs_n, col_ok, offs_d, D)  # key AND value
        ke = kv
        if HAS_EXTRA:
            ke = _rows(KE + b * L * DE, offs_n, col_ok, offs_e, DE)
        s = _scores(q, kv, qe, ke, EB, b, offs_m, offs_n, L, scale, slope, b_self, b_cross,
                    HAS_ALIBI, HAS_SELF, HAS_CROSS, HAS_EXTRA, HAS_BIAS, ACC, PREC)
        m_new = tl.maximum(m_i, tl.max(s, 1))
        alpha = tl.exp(m_i - m_new)
        p = tl.exp(s - m_new[:, None])
        l_i = l_i * alpha + tl.sum(p, 1)
        acc = acc * alpha[:, None] + tl.dot(p.to(kv.dtype), kv, out_dtype=ACC,
                                            input_precision=PREC)
        if EXTRA_VALUES:
            acc_e = acc_e * alpha[:, None] + tl.dot(p.to(ke.dtype), ke, out_dtype=ACC,
                                                    input_precision=PREC)
        m_i = m_new
    o = acc / l_i[:, None]
    tl.store(O + bh * L * D + offs_m[:, None] * D + offs_d[None, :], o.to(O.dtype.element_ty),
             mask=row_ok[:, None] & (offs_d[None, :] < D))
    tl.store(LSE + bh * L + offs_m, m_i + tl.log(l_i), mask=row_ok)
    if EXTRA_VALUES:
        oe = acc_e / l_i[:, None]
        tl.store(OE + bh * L * DE + offs_m[:, None] * DE + offs_e[None, :],
                 oe.to(OE.dtype.element_ty), mask=row_ok[:, None] & (offs_e[None, :] < DE))


@triton.jit
def _query_side(Q, DO, QE, DOE, LSE, DELTA, b, k, bh, offs_m, row_ok, offs_d, offs_e, L, D, DE,
                stride_qe_b, stride_qe_k, HAS_EXTRA: tl.constexpr, EXTRA_VALUES: tl.constexpr):
    """The backward kernels' query-side rows: ``q, do, qe, doe, lse, Delta`` (``qe``/``doe``
    alias ``q``/``do`` where absent)."""
    q = _rows(Q + bh * L * D, offs_m, row_ok, offs_d, D)
    do = _rows(DO + bh * L * D, offs_m, row_ok, offs_d, D)
    qe = q
    doe = do
    if HAS_EXTRA:
        qe = _rows(QE + b * stride_qe_b + k * stride_qe_k, offs_m, row_ok, offs_e, DE)
    if EXTRA_VALUES:
        doe = _rows(DOE + bh * L * DE, offs_m, row_ok, offs_e, DE)
    lse = tl.load(LSE + bh * L + offs_m, mask=row_ok, other=0.0)
    delta = tl.load(DELTA + bh * L + offs_m, mask=row_ok, other=0.0)
    return q, do, qe, doe, lse, delta


@triton.jit
def _bwd_dkv_kernel(Q, KV, QE, KE, SLOPE, SELF, CROSS, EB, DO, DOE, DPB, LSE, DELTA, DKV, DKE,
                    n_heads, L, D, DE, stride_qe_b, stride_qe_k, scale,
                    HAS_ALIBI: tl.constexpr, HAS_SELF: tl.constexpr, HAS_CROSS: tl.constexpr,
                    HAS_EXTRA: tl.constexpr, HAS_BIAS: tl.constexpr, EXTRA_VALUES: tl.constexpr,
                    HAS_DPB: tl.constexpr, ACC: tl.constexpr, PREC: tl.constexpr,
                    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr,
                    BLOCK_DE: tl.constexpr):
    """One program per key block: d kv = P^T do (value role) + scale dS^T q (key role)."""
    pid_n = tl.program_id(0)
    bh = tl.program_id(1)
    b = bh // n_heads
    k = bh % n_heads
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, BLOCK_D)
    offs_e = tl.arange(0, BLOCK_DE)
    col_ok = offs_n < L
    kv = _rows(KV + bh * L * D, offs_n, col_ok, offs_d, D)
    ke = kv
    if HAS_EXTRA:
        ke = _rows(KE + b * L * DE, offs_n, col_ok, offs_e, DE)
    slope, b_self, b_cross = _head_biases(SLOPE, SELF, CROSS, k, HAS_ALIBI, HAS_SELF, HAS_CROSS)
    dkv = tl.zeros([BLOCK_N, BLOCK_D], ACC)
    dke = tl.zeros([BLOCK_N, BLOCK_DE], ACC)
    lo = (pid_n * BLOCK_N // BLOCK_M) * BLOCK_M
    for start_m in range(lo, L, BLOCK_M):
        offs_m = start_m + tl.arange(0, BLOCK_M)
        row_ok = offs_m < L
        q, do, qe, doe, lse, delta = _query_side(
            Q, DO, QE, DOE, LSE, DELTA, b, k, bh, offs_m, row_ok, offs_d, offs_e, L, D, DE,
            stride_qe_b, stride_qe_k, HAS_EXTRA, EXTRA_VALUES)
        s = _scores(q, kv, qe, ke, EB, b, offs_m, offs_n, L, scale, slope, b_self, b_cross,
                    HAS_ALIBI, HAS_SELF, HAS_CROSS, HAS_EXTRA, HAS_BIAS, ACC, PREC)
        p = tl.where(row_ok[:, None], tl.exp(s - lse[:, None]), 0.0)
        dp = tl.dot(do, tl.trans(kv), out_dtype=ACC, input_precision=PREC)
        if EXTRA_VALUES:
            dp += tl.dot(doe, tl.trans(ke), out_dtype=ACC, input_precision=PREC)
        if HAS_DPB:
            dp += _shared_tile(DPB, b, offs_m, offs_n, L).to(ACC)
        ds = p * (dp - delta[:, None])
        pt = tl.trans(p).to(kv.dtype)
        dst = tl.trans(ds).to(kv.dtype)
        dkv += tl.dot(pt, do, out_dtype=ACC, input_precision=PREC)  # value role
        dkv += scale * tl.dot(dst, q, out_dtype=ACC, input_precision=PREC)  # key role
        if HAS_EXTRA:
            dke += scale * tl.dot(dst.to(ke.dtype), qe, out_dtype=ACC, input_precision=PREC)
        if EXTRA_VALUES:
            dke += tl.dot(pt.to(ke.dtype), doe, out_dtype=ACC, input_precision=PREC)
    tl.store(DKV + bh * L * D + offs_n[:, None] * D + offs_d[None, :], dkv.to(DKV.dtype.element_ty),
             mask=col_ok[:, None] & (offs_d[None, :] < D))
    if HAS_EXTRA:
        tl.store(DKE + bh * L * DE + offs_n[:, None] * DE + offs_e[None, :],
                 dke.to(DKE.dtype.element_ty), mask=col_ok[:, None] & (offs_e[None, :] < DE))


@triton.jit
def _bwd_dq_kernel(Q, KV, QE, KE, SLOPE, SELF, CROSS, EB, DO, DOE, DPB, LSE, DELTA, DQ, DQE,
                   DSDIAG, DSDIST, n_heads, L, D, DE, stride_qe_b, stride_qe_k, scale,
                   HAS_ALIBI: tl.constexpr, HAS_SELF: tl.constexpr, HAS_CROSS: tl.constexpr,
                   HAS_EXTRA: tl.constexpr, HAS_BIAS: tl.constexpr, EXTRA_VALUES: tl.constexpr,
                   HAS_DPB: tl.constexpr, ACC: tl.constexpr, PREC: tl.constexpr,
                   BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr,
                   BLOCK_DE: tl.constexpr):
    """One program per query block: dq = scale dS kv, dqe = scale dS ke, and per-row sums
    dS_ii and sum_j dS_ij (i - j) for the self-bias and ALiBi-slope gradients."""
    pid_m = tl.program_id(0)
    bh = tl.program_id(1)
    b = bh // n_heads
    k = bh % n_heads
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, BLOCK_D)
    offs_e = tl.arange(0, BLOCK_DE)
    row_ok = offs_m < L
    q, do, qe, doe, lse, delta = _query_side(
        Q, DO, QE, DOE, LSE, DELTA, b, k, bh, offs_m, row_ok, offs_d, offs_e, L, D, DE,
        stride_qe_b, stride_qe_k, HAS_EXTRA, EXTRA_VALUES)
    slope, b_self, b_cross = _head_biases(SLOPE, SELF, CROSS, k, HAS_ALIBI, HAS_SELF, HAS_CROSS)
    dq = tl.zeros([BLOCK_M, BLOCK_D], ACC)
    dqe = tl.zeros([BLOCK_M, BLOCK_DE], ACC)
    ds_diag = tl.zeros([BLOCK_M], ACC)
    ds_dist = tl.zeros([BLOCK_M], ACC)
    hi = tl.minimum((pid_m + 1) * BLOCK_M, L)
    for start_n in range(0, hi, BLOCK_N):
        offs_n = start_n + tl.arange(0, BLOCK_N)
        col_ok = offs_n < L
        kv = _rows(KV + bh * L * D, offs_n, col_ok, offs_d, D)
        ke = kv
        if HAS_EXTRA:
            ke = _rows(KE + b * L * DE, offs_n, col_ok, offs_e, DE)
        s = _scores(q, kv, qe, ke, EB, b, offs_m, offs_n, L, scale, slope, b_self, b_cross,
                    HAS_ALIBI, HAS_SELF, HAS_CROSS, HAS_EXTRA, HAS_BIAS, ACC, PREC)
        p = tl.where(row_ok[:, None], tl.exp(s - lse[:, None]), 0.0)
        dp = tl.dot(do, tl.trans(kv), out_dtype=ACC, input_precision=PREC)
        if EXTRA_VALUES:
            dp += tl.dot(doe, tl.trans(ke), out_dtype=ACC, input_precision=PREC)
        if HAS_DPB:
            dp += _shared_tile(DPB, b, offs_m, offs_n, L).to(ACC)
        ds = p * (dp - delta[:, None])
        dq += tl.dot(ds.to(kv.dtype), kv, out_dtype=ACC, input_precision=PREC)
        if HAS_EXTRA:
            dqe += tl.dot(ds.to(ke.dtype), ke, out_dtype=ACC, input_precision=PREC)
        dist = (offs_m[:, None] - offs_n[None, :]).to(ACC)
        if HAS_SELF or HAS_CROSS:
            ds_diag += tl.sum(tl.where(dist == 0, ds, 0.0), 1)
        if HAS_ALIBI:
            ds_dist += tl.sum(ds * dist, 1)
    tl.store(DQ + bh * L * D + offs_m[:, None] * D + offs_d[None, :],
             (dq * scale).to(DQ.dtype.element_ty), mask=row_ok[:, None] & (offs_d[None, :] < D))
    if HAS_EXTRA:
        tl.store(DQE + bh * L * DE + offs_m[:, None] * DE + offs_e[None, :],
                 (dqe * scale).to(DQE.dtype.element_ty),
                 mask=row_ok[:, None] & (offs_e[None, :] < DE))
    tl.store(DSDIAG + bh * L + offs_m, ds_diag, mask=row_ok)
    tl.store(DSDIST + bh * L + offs_m, ds_dist, mask=row_ok)


@triton.jit
def _headsum_kernel(Q, KV, SLOPE, SELF, CROSS, EB, DO, DPB, LSE, DELTA, OUT, n_heads, L, D, scale,
                    HAS_ALIBI: tl.constexpr, HAS_SELF: tl.constexpr, HAS_CROSS: tl.constexpr,
                    HAS_BIAS: tl.constexpr, GRAD: tl.constexpr, HAS_DPB: tl.constexpr,
                    ACC: tl.constexpr, PREC: tl.constexpr, BLOCK_M: tl.constexpr,
                    BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr):
    """One program per (query block, key block, batch), looping over the heads: the tile of
    ``sum_k P_k`` (``GRAD=False``; P recomputed from the saved lse) or of ``sum_k dS_k``
    (``GRAD=True``), both (B, L, L). Tiles wholly above the diagonal are written as zeros."""
    pid_m = tl.program_id(0)
    pid_n = tl.program_id(1)
    b = tl.program_id(2)
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, BLOCK_D)
    row_ok = offs_m < L
    col_ok = offs_n < L
    acc = tl.zeros([BLOCK_M, BLOCK_N], ACC)
    if pid_n * BLOCK_N < (pid_m + 1) * BLOCK_M:
        for k in range(0, n_heads):
            bh = b * n_heads + k
            q = _rows(Q + bh * L * D, offs_m, row_ok, offs_d, D)
            kv = _rows(KV + bh * L * D, offs_n, col_ok, offs_d, D)
            slope, b_self, b_cross = _head_biases(SLOPE, SELF, CROSS, k, HAS_ALIBI, HAS_SELF,
                                                  HAS_CROSS)
            s = _scores(q, kv, q, kv, EB, b, offs_m, offs_n, L, scale, slope, b_self, b_cross,
                        HAS_ALIBI, HAS_SELF, HAS_CROSS, False, HAS_BIAS, ACC, PREC)
            lse = tl.load(LSE + bh * L + offs_m, mask=row_ok, other=0.0)
            p = tl.where(row_ok[:, None], tl.exp(s - lse[:, None]), 0.0)
            if GRAD:
                do = _rows(DO + bh * L * D, offs_m, row_ok, offs_d, D)
                delta = tl.load(DELTA + bh * L + offs_m, mask=row_ok, other=0.0)
                dp = tl.dot(do, tl.trans(kv), out_dtype=ACC, input_precision=PREC)
                if HAS_DPB:
                    dp += _shared_tile(DPB, b, offs_m, offs_n, L).to(ACC)
                acc += p * (dp - delta[:, None])
            else:
                acc += p
    tl.store(OUT + b.to(tl.int64) * L * L + offs_m[:, None] * L + offs_n[None, :],
             acc.to(OUT.dtype.element_ty), mask=row_ok[:, None] & col_ok[None, :])


@triton.jit
def _rowdot_kernel(Q, KV, SLOPE, SELF, CROSS, EB, DPB, LSE, OUT, n_heads, L, D, scale,
                   HAS_ALIBI: tl.constexpr, HAS_SELF: tl.constexpr, HAS_CROSS: tl.constexpr,
                   HAS_BIAS: tl.constexpr, ACC: tl.constexpr, PREC: tl.constexpr,
                   BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr):
    """One program per (query block, batch*head): ``OUT_ki = sum_j P_kij DPB_ij``, the part of
    ``Delta`` that a gradient ``DPB`` of the head-summed probabilities contributes."""
    pid_m = tl.program_id(0)
    bh = tl.program_id(1)
    b = bh // n_heads
    k = bh % n_heads
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, BLOCK_D)
    row_ok = offs_m < L
    q = _rows(Q + bh * L * D, offs_m, row_ok, offs_d, D)
    slope, b_self, b_cross = _head_biases(SLOPE, SELF, CROSS, k, HAS_ALIBI, HAS_SELF, HAS_CROSS)
    lse = tl.load(LSE + bh * L + offs_m, mask=row_ok, other=0.0)
    acc = tl.zeros([BLOCK_M], ACC)
    hi = tl.minimum((pid_m + 1) * BLOCK_M, L)
    for start_n in range(0, hi, BLOCK_N):
        offs_n = start_n + tl.arange(0, BLOCK_N)
        kv = _rows(KV + bh * L * D, offs_n, offs_n < L, offs_d, D)
        s = _scores(q, kv, q, kv, EB, b, offs_m, offs_n, L, scale, slope, b_self, b_cross,
                    HAS_ALIBI, HAS_SELF, HAS_CROSS, False, HAS_BIAS, ACC, PREC)
        p = tl.where(row_ok[:, None], tl.exp(s - lse[:, None]), 0.0)
        acc += tl.sum(p * _shared_tile(DPB, b, offs_m, offs_n, L).to(ACC), 1)
    tl.store(OUT + bh * L + offs_m, acc, mask=row_ok)


def _acc_dtype(dtype: torch.dtype) -> torch.dtype:
    return torch.float64 if dtype == torch.float64 else torch.float32


# GPU tiles (BLOCK_M, BLOCK_N) per kernel family, for narrow (D [+ D_e] <= 128) and wide rows.
# Chosen so that no kernel spills registers on sm_90 in fp16/bf16 at D = 64 or 128, with or
# without an extra pair (checked by benchmarks/compile_kernels.py, which compiles without a GPU);
# not autotuned, and never timed on a GPU. In fp32 the kernels' exact (ieee) dot products spill
# at any tile size, which is why "auto" dispatch leaves fp32 to the reference.
GPU_TILES = {"fwd": {False: (64, 64), True: (64, 32)},
             "bwd": {False: (32, 64), True: (32, 32)}}


def _blocks(L: int, D: int, DE: int, device: torch.device, kind: str = "fwd"):
    """Tile sizes for the forward (``kind="fwd"``) or the backward and head-sum kernels
    (``"bwd"``): small under the interpreter (its cost grows with program count and tile size
    alike), :data:`GPU_TILES` on a GPU."""
    bd = max(16, triton.next_power_of_2(D))
    bde = max(16, triton.next_power_of_2(DE))
    if INTERPRET or device.type != "cuda":
        return dict(BLOCK_M=16, BLOCK_N=16, BLOCK_D=bd, BLOCK_DE=bde), {}
    bm, bn = GPU_TILES[kind][bd + (bde if DE else 0) > 128]
    return dict(BLOCK_M=bm, BLOCK_N=bn, BLOCK_D=bd, BLOCK_DE=bde), dict(num_warps=4, num_stages=2)


def _check_interpreter_dtype(t: torch.Tensor) -> None:
    """The Triton interpreter silently computes garbage in bfloat16; refuse it."""
    if INTERPRET and t.dtype == torch.bfloat16:
        raise TypeError("bfloat16 is not supported under TRITON_INTERPRET=1 (the interpreter "
                        "silently mis-computes it); use float16 or float32 on CPU")


class _Launch:
    """Everything the kernels of one call share: contiguous operands (dummies for absent ones),
    the per-head parameters in the accumulation dtype, sizes, flags and tile sizes.

    ``q_extra``/``k_extra`` are the in-tile extra pair (``None`` on the shared-logits path, where
    ``logits`` is the precomputed head-shared (B, L, L) extra logits instead)."""

    def __init__(self, q, kv, scale, alibi, self_bias, cross_bias, q_extra, k_extra, logits):
        _check_interpreter_dtype(q)
        self.B, self.K, self.L, self.D = q.shape
        self.acc = _acc_dtype(q.dtype)
        self.scale = float(scale)
        self.q, self.kv = q.contiguous(), kv.contiguous()
        vec = [None if t is None else t.detach().to(device=q.device, dtype=self.acc).contiguous()
               for t in (alibi, self_bias, cross_bias)]
        self.vec = [t if t is not None else self.q for t in vec]
        if q_extra is not None:
            self.qe, self.ke = q_extra.contiguous(), k_extra.contiguous()
            self.DE = q_extra.shape[-1]
            self.sqe = (self.qe.stride(0), self.qe.stride(1) if q_extra.dim() == 4 else 0)
        else:
            self.qe = self.ke = self.q
            self.DE, self.sqe = 0, (0, 0)
        self.logits = logits.contiguous() if logits is not None else self.q
        self.flags = dict(HAS_ALIBI=alibi is not None, HAS_SELF=self_bias is not None,
                          HAS_CROSS=cross_bias is not None, HAS_BIAS=logits is not None,
                          ACC=tl.float64 if self.acc == torch.float64 else tl.float32,
                          # tf32 is ignored for 16-bit inputs
                          PREC="ieee" if self.acc == q.dtype else "tf32")
        self.tiles = {kind: _blocks(self.L, self.D, self.DE, q.device, kind)
                      for kind in ("fwd", "bwd")}
        self.has_extra = q_extra is not None

    def grid(self, kind, block):
        return (triton.cdiv(self.L, self.tiles[kind][0][block]), self.B * self.K)

    def tile_args(self):
        return [self.q, self.kv, self.qe, self.ke, *self.vec, self.logits]

    def forward(self, extra_values):
        B, K, L, D, DE = self.B, self.K, self.L, self.D, self.DE
        o = torch.empty((B, K, L, D), dtype=self.q.dtype, device=self.q.device)
        lse = torch.empty((B, K, L), dtype=self.acc, device=self.q.device)
        oe = (torch.empty((B, K, L, DE), dtype=self.ke.dtype, device=self.q.device)
              if extra_values else self.q.new_empty(0))
        blocks, launch = self.tiles["fwd"]
        _fwd_kernel[self.grid("fwd", "BLOCK_M")](
            *self.tile_args(), o, oe if extra_values else o, lse, K, L, D, DE, *self.sqe,
            self.scale, HAS_EXTRA=self.has_extra, EXTRA_VALUES=bool(extra_values), **self.flags,
            **blocks, **launch)
        return o, lse, oe

    def backward(self, lse, do, doe, dpb, delta, extra_values):
        """``(dq, dkv, dqe, dke, ds_diag, ds_dist)``; ``dqe``/``dke`` per head (in-tile pair)."""
        B, K, L, D, DE = self.B, self.K, self.L, self.D, self.DE
        common = dict(HAS_EXTRA=self.has_extra, EXTRA_VALUES=bool(extra_values),
                      HAS_DPB=dpb is not None, **self.flags, **self.tiles["bwd"][0],
                      **self.tiles["bwd"][1])
        doe = doe if extra_values else do
        dpb = dpb.contiguous() if dpb is not None else self.q
        dkv = torch.empty_like(self.kv)
        dke = torch.empty((B, K, L, DE), dtype=self.acc, device=do.device) if DE else dkv
        _bwd_dkv_kernel[self.grid("bwd", "BLOCK_N")](
            *self.tile_args(), do, doe, dpb, lse, delta, dkv, dke, K, L, D, DE, *self.sqe,
            self.scale, **common)
        dq = torch.empty_like(self.q)
        dqe = torch.empty((B, K, L, DE), dtype=self.acc, device=do.device) if DE else dq
        ds_diag = torch.empty((B, K, L), dtype=self.acc, device=do.device)
        ds_dist = torch.empty_like(ds_diag)
        _bwd_dq_kernel[self.grid("bwd", "BLOCK_M")](
            *self.tile_args(), do, doe, dpb, lse, delta, dq, dqe, ds_diag, ds_dist, K, L, D,
            DE, *self.sqe, self.scale, **common)
        return dq, dkv, dqe, dke, ds_diag, ds_dist

    def head_sum(self, lse, do=None, dpb=None, delta=None):
        """``sum_k P_k`` (B, L, L), or with ``do`` and ``delta`` given ``sum_k dS_k``."""
        out = torch.empty((self.B, self.L, self.L), dtype=self.acc, device=self.q.device)
        blocks, launch = self.tiles["bwd"]
        bm, bn = blocks["BLOCK_M"], blocks["BLOCK_N"]
        grid = (triton.cdiv(self.L, bm), triton.cdiv(self.L, bn), self.B)
        grad = do is not None
        _headsum_kernel[grid](
            self.q, self.kv, *self.vec, self.logits, do if grad else self.q,
            dpb.contiguous() if dpb is not None else self.q, lse, delta if grad else lse, out,
            self.K, self.L, self.D, self.scale, GRAD=grad, HAS_DPB=dpb is not None,
            **self.flags, BLOCK_M=bm, BLOCK_N=bn, BLOCK_D=blocks["BLOCK_D"], **launch)
        return out

    def row_dot(self, lse, dpb):
        """``sum_j P_kij dpb_ij`` (B, K, L)."""
        out = torch.empty((self.B, self.K, self.L), dtype=self.acc, device=self.q.device)
        blocks, launch = self.tiles["bwd"]
        _rowdot_kernel[self.grid("bwd", "BLOCK_M")](
            self.q, self.kv, *self.vec, self.logits, dpb.contiguous(), lse, out, self.K, self.L,
            self.D, self.scale, **self.flags, BLOCK_M=blocks["BLOCK_M"],
            BLOCK_N=blocks["BLOCK_N"], BLOCK_D=blocks["BLOCK_D"], **launch)
        return out


def _shared_logits(q_extra, k_extra, scale):
    """The head-shared extra logits ``scale * q_extra k_extra^T`` (B, L, L), one batched GEMM
    (in the input dtype, as the reference computes them)."""
    return torch.matmul(q_extra, k_extra.transpose(-1, -2)) * scale


def attention_forward(q, kv, scale, alibi, self_bias, cross_bias, q_extra, k_extra,
                      extra_values, extra_head_sum=False):
    """Launch the forward; returns ``(o, lse, o_extra, o_extra_heads)``. ``o_extra`` is empty
    unless ``extra_values``, and summed over heads if ``extra_head_sum``; ``o_extra_heads`` is
    the per-head ``o_extra`` that the backward needs on the in-tile path with
    ``extra_head_sum`` (empty otherwise). Inputs are assumed validated (see
    :mod:`cemlib.kernels.ops`); the path is :func:`cemlib.kernels.paths.extra_path`."""
    if extra_path(q_extra, extra_values, extra_head_sum) == "logits":
        run = _Launch(q, kv, scale, alibi, self_bias, cross_bias, None, None,
                      _shared_logits(q_extra, k_extra, scale))
        o, lse, _ = run.forward(False)
        oe = q.new_empty(0)
        if extra_values:
            oe = torch.matmul(run.head_sum(lse).to(k_extra.dtype), k_extra)
        return o, lse, oe, q.new_empty(0)  # distinct empties: custom-op outputs may not alias
    run = _Launch(q, kv, scale, alibi, self_bias, cross_bias, q_extra, k_extra, None)
    o, lse, oe = run.forward(extra_values)
    if extra_head_sum:
        return o, lse, oe.sum(1), oe
    return o, lse, oe, q.new_empty(0)


def attention_backward(do, dlse, doe, q, kv, o, lse, oe, scale, alibi, self_bias, cross_bias,
                       q_extra, k_extra, extra_values, extra_head_sum=False):
    """Gradients ``(dq, dkv, dq_extra, dk_extra, dalibi, dself, dcross)``; ``None`` for absent
    inputs. ``dlse`` and ``doe`` may be ``None`` (treated as zero). ``oe`` is the per-head
    ``o_extra`` (in-tile path; ignored on the shared-logits path)."""
    acc = _acc_dtype(q.dtype)
    do, lse = do.contiguous(), lse.contiguous()
    delta = (o.to(acc) * do.to(acc)).sum(-1)
    if dlse is not None:
        delta = delta - dlse.to(acc)
    logits = extra_path(q_extra, extra_values, extra_head_sum) == "logits"
    dq_extra = dk_extra = None
    if logits:
        run = _Launch(q, kv, scale, alibi, self_bias, cross_bias, None, None,
                      _shared_logits(q_extra, k_extra, scale))
        dpb = None
        if extra_values and doe is not None:
            # o_extra = A k_extra with A = sum_k P_k: dA = doe k_extra^T reaches every head's dP
            dpb = torch.matmul(doe, k_extra.transpose(-1, -2))
            delta = delta + run.row_dot(lse, dpb)
        delta = delta.contiguous()
        dq, dkv, _, _, ds_diag, ds_dist = run.backward(lse, do, None, dpb, delta, False)
        d_logits = (run.head_sum(lse, do, dpb, delta) * run.scale).to(q_extra.dtype)
        dq_extra = torch.matmul(d_logits, k_extra)
        dk_extra = torch.matmul(d_logits.transpose(-1, -2), q_extra)
        if dpb is not None:
            A = run.head_sum(lse).to(k_extra.dtype)
            dk_extra = dk_extra + torch.matmul(A.transpose(-1, -2), doe)
    else:
        run = _Launch(q, kv, scale, alibi, self_bias, cross_bias, q_extra, k_extra, None)
        if extra_values:
            if doe is None:
                doe = torch.zeros_like(oe)
            elif extra_head_sum:
                doe = doe[:, None].expand_as(oe)
            doe = doe.contiguous()
            delta = delta + (oe.to(acc) * doe.to(acc)).sum(-1)
        dq, dkv, dqe, dke, ds_diag, ds_dist = run.backward(lse, do, doe, None,
                                                           delta.contiguous(), extra_values)
        if q_extra is not None:
            dq_extra = (dqe.sum(1) if q_extra.dim() == 3 else dqe).to(q_extra.dtype)
            dk_extra = dke.sum(1).to(k_extra.dtype)
    # sum_j dS_ij = dlse_i exactly (sum_j P_ij = 1, sum_j P_ij dP_ij = Delta_i + dlse_i), so
    # the off-diagonal sum that the cross bias needs is dlse_i - dS_ii.
    rowsum = dlse.to(acc) if dlse is not None else torch.zeros_like(ds_diag)
    dalibi = None if alibi is None else (-ds_dist.sum((0, 2))).to(alibi.dtype)
    dself = None if self_bias is None else ds_diag.sum((0, 2)).to(self_bias.dtype)
    dcross = None if cross_bias is None else (rowsum - ds_diag).sum((0, 2)).to(cross_bias.dtype)
    return dq, dkv, dq_extra, dk_extra, dalibi, dself, dcross
