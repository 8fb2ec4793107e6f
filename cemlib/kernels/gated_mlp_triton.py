"""Triton kernels for the tied gated-MLP step and the diagonal-plus-low-rank preconditioner.

Tied gated-MLP step (CEM [arXiv] eq. 10 = [ICLR] eq. 10 with phi' = SiLU, tied as in eq. 11):

    y = V^T (gamma * SiLU(V u)),   u (N, D_h), V (D_v, D_h), gamma (N, D_v)

**v2 (what :mod:`cemlib.kernels.dispatch` uses), Liger-Kernel style.** The four matrix
products of a training step stay cuBLAS GEMMs (``torch.mm``, ``F.linear``); Triton fuses only the
element-wise work, one read of each operand and one write of each result:

    forward:   h = u V^T (GEMM),  a = gamma * SiLU(h) (``_silu_gate_kernel``),  y = a V (GEMM)
    backward:  da = dy V^T (GEMM)
               dgamma = da * SiLU(h),  dh = da * gamma * SiLU'(h)   (``_silu_gate_bwd_kernel``,
                                                                     dh overwrites da)
               du = dh V,  dV = dh^T u (GEMMs)
               a = gamma * SiLU(h) recomputed into the same buffer, dV += a^T dy (GEMM;
               added into dV's buffer, or computed apart and added: ``DV_PRODUCTS``)

with ``SiLU'(h) = sigma(h) (1 + h (1 - sigma(h)))``. Saved for backward: the inputs and ``h``,
one (N, D_v) tensor (eager autograd keeps three: ``h``, ``SiLU(h)`` and ``a``); the gate
product ``a`` and ``SiLU(h)`` are recomputed. The backward never holds more than three (N, D_v)
buffers (``h``, ``da``/``dh``/``a``, ``dgamma``) and never writes into a saved tensor, so a
retained graph can be differentiated again and ``torch.compile`` sees no mutation. Without
autograd the gate product overwrites ``h``: one (N, D_v) buffer, where eager holds two at a time.
Element-wise traffic per step, in (N, D_v) passes: 3 forward + 8 backward, against eager's 5 + 9.
:func:`tied_gated_mlp_step` is the entry point: in eager mode one ``torch.autograd.Function``
(cheaper on the host than custom operators), compiled as opaque ``torch.library`` operators (all
registered directly: :mod:`cemlib.kernels.operators`, joined by an ``autograd.Function``); launches
skip Triton's per-call specialization on CUDA (:mod:`cemlib.kernels.direct_launch`).

**v1 (kept for comparison; :func:`cemlib.kernels.ops.tied_gated_mlp_step`).** The forward
kernel computes the gate product ``a = gamma * SiLU(u V^T)`` in the epilogue of the ``u V^T``
tile product, so neither ``h = u V^T`` nor ``SiLU(h)`` is ever written to memory; ``a``
is consumed at once by ``y = a V`` and freed. Nothing but the inputs is saved for backward: the
backward kernel recomputes ``h`` while it computes ``da = dy V^T`` from the *same* ``V`` tiles
(V plays both the inner and the outer role), and emits in its epilogue

    dgamma = da * SiLU(h),   dh = da * gamma * SiLU'(h),   a = gamma * SiLU(h)

after which ``du = dh V`` and ``dV = a^T dy + dh^T u`` (V's outer and inner roles) are two GEMMs.
On the H100 it was 1.2-1.7x slower than eager (``benchmarks/RESULTS_H100.md``): its Triton GEMMs
lose to cuBLAS, which is why v2 leaves the products to cuBLAS.

RMSNorm is not fused into these kernels. At T = 1 (the default) the layer normalises ``h`` once
and uses ``hn`` both for ``gamma = W hn`` (a cuBLAS GEMM) and as the step-0 query
(:class:`cemlib.layers.cem_mlp.CEMMLP` reuses it; tested), so there is no separate query norm
left to fuse. At T >= 2 each further step normalises ``x^(t)``: a memory-bound pass over (N, D_h)
and one saved activation, (N, D_h) being D_v / D_h times smaller than the passes fused here.
Whether fusing it pays has not been measured on a GPU, so it is not done.

Preconditioner (CEM eq. 13): ``P g = softplus(d) * g + U (V^T g) + V (U^T g)`` for rows g, with
``U, V`` of shape (D_h, R). One program per row block: a first pass over D_h reduces
``g V`` and ``g U`` (rank R), a second pass writes the output. ``P`` is symmetric, so the
gradient with respect to ``g`` is the same kernel applied to the output gradient.
"""

from __future__ import annotations

import os

import torch
import torch.nn.functional as F
import triton
import triton.language as tl
from torch import Tensor
from torch.autograd.function import once_differentiable

from cemlib.kernels import direct_launch
from cemlib.kernels import operators  # the compiled path's operators
from cemlib.kernels.ops import _on_device  # Triton launches on the current CUDA device

INTERPRET = os.environ.get("TRITON_INTERPRET", "0") == "1"

#: How the backward forms ``dV = dh^T u + a^T dy``, two GEMMs whose reduction runs over the N
#: rows into one (D_v, D_h) result: ``"accumulate"`` (the default) adds the second into the
#: first's result (``addmm_``, beta = 1: no second (D_v, D_h) buffer); ``"separate"`` computes
#: each into its own buffer and adds them, as eager autograd does (one more (D_v, D_h) buffer and
#: a small addition). cuBLAS may choose differently for the two at a given shape (e.g. splitting
#: the long reduction); the GPU script's mlp stage times both (``benchmarks/NOTES.md`` step 22).
#: ``CEMLIB_MLP_DV`` sets the default; ``tied_gated_mlp_step(..., dv_products=...)`` one call's.
DV_PRODUCTS = ("accumulate", "separate")
DEFAULT_DV_PRODUCTS = os.environ.get("CEMLIB_MLP_DV", "accumulate")

__all__ = ["tied_gated_mlp_step", "silu_gate", "silu_gate_backward", "ELEMENTWISE", "DV_PRODUCTS",
           "gate_forward", "gate_backward", "dplr_apply", "INTERPRET"]


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


# ---------------------------------------------------------------- v2: cuBLAS GEMMs, fused element-wise work

#: Launch configuration of the two element-wise kernels: ``BLOCK`` entries per program (8 per
#: thread at 4 warps: one 16-byte load per operand in bf16/fp16). Chosen, not timed: the GPU
#: script (``benchmarks/gpu_kernels.py``, stage ``autotune``) times the alternatives.
ELEMENTWISE = dict(BLOCK=1024, num_warps=4)


@triton.jit
def _silu_gate_kernel(H, G, A, n, ACC: tl.constexpr, BLOCK: tl.constexpr):
    """``a = gamma * SiLU(h)`` over ``n`` contiguous entries (computed in ``ACC``)."""
    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    ok = offs < n
    h = tl.load(H + offs, mask=ok, other=0.0).to(ACC)
    gamma = tl.load(G + offs, mask=ok, other=0.0).to(ACC)
    sig = 1.0 / (1.0 + tl.exp(-h))
    tl.store(A + offs, (gamma * (h * sig)).to(A.dtype.element_ty), mask=ok)


@triton.jit
def _silu_gate_bwd_kernel(H, G, DA, DG, n, ACC: tl.constexpr, BLOCK: tl.constexpr):
    """From ``da``: ``dgamma = da * SiLU(h)`` into ``DG`` and ``dh = da * gamma * SiLU'(h)``
    into ``DA`` (in place; each program reads its ``da`` entries before it writes them)."""
    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    ok = offs < n
    h = tl.load(H + offs, mask=ok, other=0.0).to(ACC)
    gamma = tl.load(G + offs, mask=ok, other=0.0).to(ACC)
    da = tl.load(DA + offs, mask=ok, other=0.0).to(ACC)
    sig = 1.0 / (1.0 + tl.exp(-h))
    tl.store(DG + offs, (da * (h * sig)).to(DG.dtype.element_ty), mask=ok)
    tl.store(DA + offs, (da * gamma * (sig * (1.0 + h * (1.0 - sig)))).to(DA.dtype.element_ty),
             mask=ok)


def _elementwise(kernel, n, *args, dtype, config=None):
    """Launch an element-wise kernel over ``n`` entries with ``config`` (default
    :data:`ELEMENTWISE`); ``num_warps`` is left out under the interpreter."""
    if n == 0:
        return
    block, kw = _launch_options(dtype) if config is None else _options(dtype, config)
    direct_launch.launch(kernel, (-(-n // block),), (*args, n), kw,
                         args[0].is_cuda and not INTERPRET)


def _options(dtype, config) -> tuple[int, dict]:
    """``(BLOCK, the launch's keyword arguments)`` for ``config`` in ``dtype``."""
    kw = dict(config, ACC=_acc(dtype))
    if INTERPRET:
        kw.pop("num_warps", None)
    return kw["BLOCK"], kw


_default_options: dict = {}  # dtype -> _options(dtype, ELEMENTWISE), built once per dtype


def _launch_options(dtype) -> tuple[int, dict]:
    """:func:`_options` of :data:`ELEMENTWISE`, kept per dtype (the step launches three times a
    call; a fresh dictionary each time is host time at small widths). The dictionary is passed
    to every launch and never modified."""
    options = _default_options.get(dtype)
    if options is None:
        options = _default_options[dtype] = _options(dtype, ELEMENTWISE)
    return options


def _check_same(*ts):
    for t in ts:
        if t.shape != ts[0].shape or t.dtype != ts[0].dtype or not t.is_contiguous():
            raise ValueError(f"element-wise operands must be contiguous, of one shape and dtype; "
                             f"got {[(tuple(x.shape), x.dtype, x.is_contiguous()) for x in ts]}")


def silu_gate(h: Tensor, gamma: Tensor, out: Tensor | None = None, config=None) -> Tensor:
    """``gamma * SiLU(h)`` for contiguous tensors of one shape, written into ``out`` (may be a
    fresh tensor or an operand-sized buffer to reuse)."""
    _check_interpreter_dtype(h)
    out = torch.empty_like(h) if out is None else out
    _check_same(h, gamma, out)
    return _gate(h, gamma, out, config)


def silu_gate_backward(h: Tensor, gamma: Tensor, da: Tensor, config=None) -> Tensor:
    """Returns ``dgamma = da * SiLU(h)`` and overwrites ``da`` with ``dh = da * gamma * SiLU'(h)``."""
    _check_interpreter_dtype(h)
    dgamma = torch.empty_like(h)
    _check_same(h, gamma, da, dgamma)
    return _gate_backward(h, gamma, da, dgamma, config)


# The launches behind silu_gate and silu_gate_backward, without their checks: inside the step the
# element-wise operands are contiguous and of one shape and dtype by construction (``h``, ``da``
# and the outputs come from ``torch.mm`` and ``empty_like``, ``gamma`` is made contiguous
# (N, D_v) by the entry point, which also refuses bf16 under the interpreter).

def _gate(h: Tensor, gamma: Tensor, out: Tensor, config=None) -> Tensor:
    _elementwise(_silu_gate_kernel, h.numel(), h, gamma, out, dtype=h.dtype, config=config)
    return out


def _gate_backward(h: Tensor, gamma: Tensor, da: Tensor, dgamma: Tensor, config=None) -> Tensor:
    _elementwise(_silu_gate_bwd_kernel, h.numel(), h, gamma, da, dgamma, dtype=h.dtype,
                 config=config)
    return dgamma


def _forward(u: Tensor, V: Tensor, gamma: Tensor) -> tuple[Tensor, Tensor]:
    """``(y, h)``: the step and ``h = u V^T``, kept for the backward; ``gamma`` contiguous."""
    with _on_device(u):
        h = F.linear(u, V)
        y = torch.mm(_gate(h, gamma, torch.empty_like(h)), V)
    return y, h


def _backward(dy: Tensor, u: Tensor, V: Tensor, gamma: Tensor, h: Tensor,
              dv_products: str = "accumulate"):
    """``(du, dV, dgamma)`` from the saved ``u, V, gamma, h`` (``gamma`` contiguous); writes
    into no saved tensor. ``dv_products``: :data:`DV_PRODUCTS`."""
    with _on_device(u):
        d = F.linear(dy, V)                         # da; becomes dh, then a
        dgamma = _gate_backward(h, gamma, d, torch.empty_like(h))  # d becomes dh
        du = torch.mm(d, V)
        dt = d.t()
        dV = torch.mm(dt, u)
        _gate(h, gamma, d)                          # a = gamma * SiLU(h), recomputed
        if dv_products == "separate":
            dV += torch.mm(dt, dy)
        else:
            dV.addmm_(dt, dy)
    return du, dV, dgamma


def _inference(u: Tensor, V: Tensor, gamma: Tensor) -> Tensor:
    with _on_device(u):
        h = F.linear(u, V)
        return torch.mm(_gate(h, gamma, h), V)     # a overwrites h: nothing to save


def _step_fwd_fake(u, V, gamma):
    return u.new_empty(u.shape), u.new_empty((u.shape[0], V.shape[0]))


def _step_bwd_fake(dy, u, V, gamma, h, dv_products="accumulate"):
    return u.new_empty(u.shape), V.new_empty(V.shape), gamma.new_empty(gamma.shape)


# what a compiled graph calls: the forward (y and h = u V^T) and backward operators, registered
# without custom_op's layers (cemlib.kernels.operators); their derivative is
# _TiedMLPStep's, which dynamo traces into the graph
_step_fwd = operators.define("tied_mlp_step_fwd", "(Tensor u, Tensor V, Tensor gamma) -> "
                             "(Tensor, Tensor)", _forward, _step_fwd_fake)
_step_bwd = operators.define(
    "tied_mlp_step_bwd", "(Tensor dy, Tensor u, Tensor V, Tensor gamma, Tensor h, "
    "str dv_products=\"accumulate\") -> (Tensor, Tensor, Tensor)", _backward, _step_bwd_fake)


class _TiedMLPStep(torch.autograd.Function):
    """Autograd of the step. In eager mode forward and backward call the launchers directly,
    which costs the host less than the pair of ``torch.library`` operators
    (``benchmarks/host_overhead.py``, row ``mlp_v2``; at small widths, D_h = 768 on the H100,
    host time is time the GPU waits for); while ``torch.compile`` traces, the operators above
    (opaque to the compiler), which AOTAutograd puts into the forward and backward graphs."""

    @staticmethod
    def forward(ctx, u, V, gamma, dv_products):
        y, h = _step_fwd(u, V, gamma) if torch.compiler.is_compiling() else _forward(u, V, gamma)
        ctx.save_for_backward(u, V, gamma, h)
        ctx.dv_products = dv_products
        return y

    @staticmethod
    @once_differentiable
    def backward(ctx, dy):
        step = _step_bwd if torch.compiler.is_compiling() else _backward
        return *step(dy, *ctx.saved_tensors, ctx.dv_products), None


# inference only (no input requires grad, or grad mode off): no derivative, no custom_op layers
_step_infer = operators.define("tied_mlp_step_infer", "(Tensor u, Tensor V, Tensor gamma) -> Tensor",
                               _inference, lambda u, V, gamma: u.new_empty(u.shape))


def tied_gated_mlp_step(u: Tensor, V: Tensor, gamma: Tensor,
                        dv_products: str | None = None) -> Tensor:
    """v2 of :func:`cemlib.kernels.reference.tied_gated_mlp_step` (same contract): returns
    ``(gamma * SiLU(u V^T)) V``; leading dimensions of ``u`` are flattened and ``gamma`` is
    broadcast to them. Without autograd (no input requires grad, or grad mode off) the gate
    product overwrites ``h``, so the step holds one (N, D_v) buffer instead of two.
    ``dv_products``: how the backward forms ``dV`` (:data:`DV_PRODUCTS`; default
    :data:`DEFAULT_DV_PRODUCTS`). Shapes are not validated here (:mod:`cemlib.kernels.dispatch`
    does)."""
    dv_products = dv_products or DEFAULT_DV_PRODUCTS
    if dv_products not in DV_PRODUCTS:
        raise ValueError(f"dv_products must be one of {DV_PRODUCTS}, got {dv_products!r}")
    _check_interpreter_dtype(u)
    lead, Dh, Dv = u.shape[:-1], u.shape[-1], V.shape[0]
    if gamma.shape[:-1] != lead:
        gamma = gamma.expand(*lead, Dv)
    if u.dim() != 2:  # (2-D operands pass as they are: a reshape is an operator of host time)
        gamma, u = gamma.reshape(-1, Dv), u.reshape(-1, Dh)
    gamma = gamma.contiguous()
    grad = torch.is_grad_enabled() and (u.requires_grad or V.requires_grad or gamma.requires_grad)
    if grad:
        y = _TiedMLPStep.apply(u, V, gamma, dv_products)
    else:  # compiling: an opaque operator (no graph break, no tracing into Triton)
        y = (_step_infer if torch.compiler.is_compiling() else _inference)(u, V, gamma)
    return y if len(lead) == 1 else y.reshape(*lead, Dh)
