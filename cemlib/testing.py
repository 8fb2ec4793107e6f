"""The oracles: helpers that tests and chapters use to check a closed-form update or a kernel.

Every layer's closed-form gradient is compared with ``torch.autograd.grad`` of its energy in
float64 (the protocol of :mod:`cemlib.layers.base`): :func:`autograd_grad`,
:func:`assert_grad_matches_autograd`. A fused kernel is trusted when it computes what its
reference computes, forward and backward: :func:`outputs_and_grads` runs a function on fresh leaf
copies of its inputs and returns its outputs and the gradients of a fixed random linear function
of them; :func:`float64_errors` compares a function (the kernel) and the reference in the inputs'
dtype against the reference in float64, and :func:`within_tolerance` reads the result: below
``2e-5`` in float32, and in 16-bit precision FlashAttention's criterion, at most twice the error
of the reference computed in the same dtype (plus ``1e-3`` of slack for tiny shapes). Nothing here
imports a kernel: the functions are passed in.
"""

from __future__ import annotations

from typing import Callable, Mapping

import torch

__all__ = ["autograd_grad", "assert_grad_matches_autograd", "relative_error", "max_relative_error",
           "outputs_and_grads", "float64_errors", "within_tolerance", "FLOAT32_TOLERANCE", "HALF_SLACK"]


def autograd_grad(energy_fn: Callable[[torch.Tensor], torch.Tensor], x: torch.Tensor,
                  create_graph: bool = False) -> torch.Tensor:
    """``grad_x sum(energy_fn(x))`` by autograd (``x`` is detached and cloned first)."""
    x = x.detach().clone().requires_grad_(True)
    with torch.enable_grad():
        (g,) = torch.autograd.grad(energy_fn(x).sum(), x, create_graph=create_graph)
    return g


def relative_error(a: torch.Tensor, b: torch.Tensor) -> float:
    """``||a - b|| / max(||b||, tiny)`` as a Python float (inputs may carry autograd history)."""
    a, b = a.detach(), b.detach()
    return float((a - b).norm() / b.norm().clamp_min(torch.finfo(b.dtype).tiny))


def assert_grad_matches_autograd(energy_fn: Callable[[torch.Tensor], torch.Tensor],
                                 grad_fn: Callable[[torch.Tensor], torch.Tensor], x: torch.Tensor,
                                 rtol: float = 1e-9, atol: float = 1e-10) -> torch.Tensor:
    """Assert ``grad_fn(x) == autograd_grad(energy_fn, x)`` (float64 tolerances by default).

    Returns the autograd gradient so callers can reuse it.
    """
    expected = autograd_grad(energy_fn, x)
    with torch.no_grad():
        got = grad_fn(x.detach())
    torch.testing.assert_close(got, expected, rtol=rtol, atol=atol)
    return expected


#: largest relative error of a float32 kernel against float64
FLOAT32_TOLERANCE = 2e-5
#: the slack added to twice the 16-bit reference's error (tiny shapes)
HALF_SLACK = 1e-3


def max_relative_error(a: torch.Tensor, b: torch.Tensor) -> float:
    """``max |a - b| / max |b|``, in float64 on the CPU: the largest error of any entry, relative
    to the largest entry (the criterion kernels are judged by; :func:`relative_error` is the norm
    ratio)."""
    a, b = a.detach().double().cpu(), b.detach().double().cpu()
    if a.shape != b.shape:
        raise ValueError(f"shapes differ: {tuple(a.shape)} and {tuple(b.shape)}")
    scale = b.abs().max()
    return float((a - b).abs().max() / scale) if scale > 0 else float((a - b).abs().max())


def outputs_and_grads(fn: Callable, inputs: Mapping[str, torch.Tensor], seed: int = 1,
                      **kw) -> list[torch.Tensor]:
    """``fn(**inputs, **kw)``'s outputs, then the gradient of ``sum_o <w_o, o>`` with respect to
    every input (``w_o`` standard normal, drawn from ``seed`` in float64, the same for any dtype),
    in the order of ``inputs``. Inputs are copied into fresh leaves, so the caller's tensors are
    not touched; an input that gets no gradient is an error (the check would miss it)."""
    leaves = {name: t.detach().clone().requires_grad_() for name, t in inputs.items()}
    outs = fn(**leaves, **kw)
    outs = tuple(outs) if isinstance(outs, (tuple, list)) else (outs,)
    g = torch.Generator().manual_seed(seed)
    loss = sum((o.double() * torch.randn(o.shape, generator=g, dtype=torch.float64).to(o.device)).sum()
               for o in outs)
    loss.backward()
    missing = [name for name, t in leaves.items() if t.grad is None]
    if missing:
        raise ValueError(f"no gradient reached {missing}")
    return [*outs] + [t.grad for t in leaves.values()]


def float64_errors(fn: Callable, reference: Callable, inputs: Mapping[str, torch.Tensor],
                   **kw) -> tuple[float, float]:
    """The largest relative error, over every output and gradient, of ``fn`` and of ``reference``
    (both in the inputs' dtype) against ``reference`` in float64: ``(error, reference_error)``."""
    exact = outputs_and_grads(reference, {k: v.double() for k, v in inputs.items()}, **kw)
    got = outputs_and_grads(fn, inputs, **kw)
    ref = outputs_and_grads(reference, inputs, **kw)
    if not len(got) == len(exact) == len(ref):
        raise ValueError(f"fn returns {len(got)} outputs and gradients, the reference {len(exact)}")
    return max(map(max_relative_error, got, exact)), max(map(max_relative_error, ref, exact))


def within_tolerance(error: float, reference_error: float, dtype: torch.dtype) -> bool:
    """Whether a kernel's error passes: below :data:`FLOAT32_TOLERANCE` in float32 (and float64);
    at most ``2 * reference_error + HALF_SLACK`` in float16 or bfloat16."""
    if dtype in (torch.float32, torch.float64):
        return error < FLOAT32_TOLERANCE
    if dtype in (torch.float16, torch.bfloat16):
        return error <= 2 * reference_error + HALF_SLACK
    raise ValueError(f"no tolerance for {dtype}")
