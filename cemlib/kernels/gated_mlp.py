"""The tied gated-MLP step in Triton: element-wise kernels, launcher, autograd and operators.

Computes :func:`cemlib.kernels.reference.tied_gated_mlp_step`, the element-wise-energy descent
direction of CEM [arXiv] eq. 10 = [ICLR] eq. 10 with phi' = SiLU, tied as in eq. 11:

    y = V^T (gamma * SiLU(V u)),   u (N, D_h), V (D_v, D_h), gamma (N, D_v)

:func:`tied_gated_mlp_step` returns ``y`` (leading dimensions of ``u`` flattened, ``gamma``
broadcast to them). Structure (Liger-Kernel's SwiGLU): the four matrix products of a training step
are cuBLAS GEMMs; Triton fuses the element-wise work, one read of each operand and one write of
each result:

    forward:   h = u V^T,  a = gamma * SiLU(h) (``_silu_gate_kernel``),  y = a V
    backward:  da = dy V^T;  dgamma = da * SiLU(h), dh = da * gamma * SiLU'(h)
               (``_silu_gate_bwd_kernel``, dh over da);  du = dh V,  dV = dh^T u + a^T dy
               (``a`` recomputed into the same buffer)

with ``SiLU'(h) = sigma(h) (1 + h (1 - sigma(h)))``. Saved for backward: the inputs and ``h``; the
backward holds at most three (N, D_v) buffers and writes into no saved tensor. Without autograd
the gate product overwrites ``h``. The measurements behind these choices are in
``benchmarks/NOTES.md`` and ``benchmarks/README.md``.
"""

from __future__ import annotations

import os

import torch
import torch.nn.functional as F
import triton
import triton.language as tl
from torch import Tensor
from torch.autograd.function import once_differentiable

from cemlib.kernels import runtime

INTERPRET = runtime.interpreting()  # read as the kernels below are decorated

#: How the backward forms ``dV = dh^T u + a^T dy``: ``"accumulate"`` (the default) adds the
#: second product into the first's result (``addmm_``: no second (D_v, D_h) buffer);
#: ``"separate"`` computes each apart and adds them, as eager autograd does (cuBLAS may choose
#: differently for the two). ``CEMLIB_MLP_DV`` sets the default; ``dv_products=`` one call's.
DV_PRODUCTS = ("accumulate", "separate")
DEFAULT_DV_PRODUCTS = os.environ.get("CEMLIB_MLP_DV", "accumulate")

__all__ = ["tied_gated_mlp_step", "silu_gate", "silu_gate_backward", "ELEMENTWISE", "DV_PRODUCTS",
           "INTERPRET"]


def _acc(dtype):
    return tl.float64 if dtype == torch.float64 else tl.float32


#: Launch configuration of the two element-wise kernels: ``BLOCK`` entries per program, 8 per
#: thread at 4 warps, one 16-byte load per operand in bf16/fp16 (``tools/gpu/gpu_kernels.py``,
#: stage ``autotune``, times the alternatives).
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
    runtime.launch(kernel, (-(-n // block),), (*args, n), kw, args[0].is_cuda and not INTERPRET)


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
    runtime.check_dtype(h, INTERPRET)
    out = torch.empty_like(h) if out is None else out
    _check_same(h, gamma, out)
    return _gate(h, gamma, out, config)


def silu_gate_backward(h: Tensor, gamma: Tensor, da: Tensor, config=None) -> Tensor:
    """Returns ``dgamma = da * SiLU(h)`` and overwrites ``da`` with ``dh = da * gamma * SiLU'(h)``."""
    runtime.check_dtype(h, INTERPRET)
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
    with runtime.on_device(u):
        h = F.linear(u, V)
        y = torch.mm(_gate(h, gamma, torch.empty_like(h)), V)
    return y, h


def _backward(dy: Tensor, u: Tensor, V: Tensor, gamma: Tensor, h: Tensor,
              dv_products: str = "accumulate"):
    """``(du, dV, dgamma)`` from the saved ``u, V, gamma, h`` (``gamma`` contiguous); writes
    into no saved tensor. ``dv_products``: :data:`DV_PRODUCTS`."""
    with runtime.on_device(u):
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
    with runtime.on_device(u):
        h = F.linear(u, V)
        return torch.mm(_gate(h, gamma, h), V)     # a overwrites h: nothing to save


def _step_fwd_fake(u, V, gamma):
    return u.new_empty(u.shape), u.new_empty((u.shape[0], V.shape[0]))


def _step_bwd_fake(dy, u, V, gamma, h, dv_products="accumulate"):
    return u.new_empty(u.shape), V.new_empty(V.shape), gamma.new_empty(gamma.shape)


# what a compiled graph calls: the forward (y and h = u V^T) and backward operators
# (runtime.define: no autograd layer around them); their derivative is _TiedMLPStep's, which
# dynamo traces into the graph
_step_fwd = runtime.define("tied_mlp_step_fwd", "(Tensor u, Tensor V, Tensor gamma) -> "
                             "(Tensor, Tensor)", _forward, _step_fwd_fake)
_step_bwd = runtime.define(
    "tied_mlp_step_bwd", "(Tensor dy, Tensor u, Tensor V, Tensor gamma, Tensor h, "
    "str dv_products=\"accumulate\") -> (Tensor, Tensor, Tensor)", _backward, _step_bwd_fake)


class _TiedMLPStep(torch.autograd.Function):
    """Autograd of the step. In eager mode forward and backward call the launchers directly
    (less host time than the pair of ``torch.library`` operators, which at small widths the GPU
    waits for); while ``torch.compile`` traces, the operators above (opaque to the compiler),
    which AOTAutograd puts into the forward and backward graphs."""

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
_step_infer = runtime.define("tied_mlp_step_infer", "(Tensor u, Tensor V, Tensor gamma) -> Tensor",
                               _inference, lambda u, V, gamma: u.new_empty(u.shape))


def tied_gated_mlp_step(u: Tensor, V: Tensor, gamma: Tensor,
                        dv_products: str | None = None) -> Tensor:
    """:func:`cemlib.kernels.reference.tied_gated_mlp_step` in Triton (same contract): returns
    ``(gamma * SiLU(u V^T)) V``; leading dimensions of ``u`` are flattened and ``gamma`` is
    broadcast to them. Without autograd (no input requires grad, or grad mode off) the gate
    product overwrites ``h``, so the step holds one (N, D_v) buffer instead of two.
    ``dv_products``: how the backward forms ``dV`` (:data:`DV_PRODUCTS`; default
    :data:`DEFAULT_DV_PRODUCTS`). Shapes are not validated here (:mod:`cemlib.kernels.dispatch`
    does)."""
    dv_products = dv_products or DEFAULT_DV_PRODUCTS
    if dv_products not in DV_PRODUCTS:
        raise ValueError(f"dv_products must be one of {DV_PRODUCTS}, got {dv_products!r}")
    runtime.check_dtype(u, INTERPRET)
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
