"""Dispatch between the Triton kernels, the closed-form PyTorch attention and the reference.

The layers call :func:`tied_attention`, :func:`tied_gated_mlp_step` and
:func:`dplr_precondition` from here; all inputs are validated here, for every backend. The
backend is, in order of precedence: the value given to :func:`set_backend` (or
:func:`use_backend` inside a ``with`` block); the environment variable ``CEMLIB_KERNELS``, read at
each call; ``"auto"``.

- ``"auto"`` uses the Triton kernels on CUDA where Triton is installed, in fp16/bf16, for a call
  the kernel takes (attention: :func:`attention_covers`; the preconditioner: rank <= 64). The
  kernels built on matrix products (attention, the preconditioner) also need compute capability
  8.0 or higher (:func:`dots_on_tensor_cores`; below it Triton computes ``tl.dot`` on the FMA
  units and cuBLAS through the reference is faster, said once per GPU in a ``UserWarning``).
  Attention on the CPU in float32/float64 runs the closed-form path
  (:mod:`cemlib.kernels.attention_torch`), everything else the reference. fp32 on CUDA goes to
  the reference (cuBLAS): the kernels' exact fp32 products spill registers.
- ``"triton"`` uses the kernels for every call they take, and raises a clear error where they
  cannot run (no Triton; CPU tensors without ``TRITON_INTERPRET=1``, under which Triton's
  interpreter runs them on the CPU, slowly, for testing).
- ``"torch"`` uses the closed-form attention on any device (a clear error for a dtype it does not
  take); the MLP and the preconditioner have no such path and use the reference.
- ``"reference"`` always uses :mod:`cemlib.kernels.reference`, autograd of plain PyTorch
  operations (what a second derivative needs).

An attention call the kernel does not take (a per-head extra pair, per-head extra values, a head
wider than 128) goes to the PyTorch path under ``"auto"`` and ``"triton"`` alike: the closed form
on the CPU where it applies, else the reference.
"""

from __future__ import annotations

import contextlib
import importlib.util
import math
import os
import sys
import warnings

import torch

from cemlib.kernels import attention_torch, reference
from cemlib.kernels.runtime import attention_covers

__all__ = ["BACKENDS", "set_backend", "get_backend", "use_backend", "triton_available",
           "dots_on_tensor_cores", "TENSOR_CORE_DOTS_FROM", "attention_covers", "attention_fused",
           "tied_attention", "tied_gated_mlp_step", "dplr_precondition"]

BACKENDS = ("auto", "triton", "torch", "reference")
ENV_VAR = "CEMLIB_KERNELS"
_backend: str | None = None
_AUTO_DTYPES = (torch.float16, torch.bfloat16)  # what "auto" sends to the kernels


def _check_backend(name, source):
    if name not in BACKENDS:
        raise ValueError(f"{source} must be one of {BACKENDS}, got {name!r}")
    return name


def set_backend(name: str | None) -> None:
    """Force a backend (one of :data:`BACKENDS`); ``None`` returns control to the
    ``CEMLIB_KERNELS`` environment variable."""
    global _backend
    _backend = None if name is None else _check_backend(name, "backend")


def get_backend() -> str:
    """The backend in effect (see the module docstring for the precedence)."""
    if _backend is not None:
        return _backend
    return _check_backend(os.environ.get(ENV_VAR, "auto").strip().lower() or "auto",
                          f"environment variable {ENV_VAR}")


@contextlib.contextmanager
def use_backend(name: str):
    """Context manager: ``with use_backend("reference"): ...``."""
    global _backend
    previous = _backend
    set_backend(name)
    try:
        yield
    finally:
        _backend = previous


#: whether ``triton`` is installed, looked up once, when this module is imported: the layers ask
#: at every call, and ``importlib.util.find_spec`` is a function ``torch.compile`` may refuse to
#: trace (torch 2.11 broke a compiled CEM model's graph there at every attention and MLP call)
_TRITON_INSTALLED = importlib.util.find_spec("triton") is not None


def triton_available() -> bool:
    """Whether the ``triton`` package is installed (it is not imported here; looked up once, at
    the import of this module)."""
    return _TRITON_INSTALLED


#: the compute capability from which Triton's ``tl.dot`` runs on the tensor cores (``mma.sync``
#: from 8.0, ``wgmma`` on 9.0); below it Triton 3.2 and later compute every dot with FMA
#: instructions (triton-lang/triton pull request 5066; ``tests/kernels/test_kernels_compile.py``
#: checks it on the installed Triton)
TENSOR_CORE_DOTS_FROM = (8, 0)
_dots_on_tensor_cores: dict[int, bool] = {}  # device index -> answer, asked once per device


def dots_on_tensor_cores(device: torch.device) -> bool:
    """Whether Triton's matrix products run on the tensor cores of this CUDA ``device``:
    compute capability at least :data:`TENSOR_CORE_DOTS_FROM`. Asked once per device (a constant
    to ``torch.compile``, which traces the layers' calls without a graph break)."""
    index = device.index if device.index is not None else torch.cuda.current_device()
    known = _dots_on_tensor_cores.get(index)
    if known is None:
        props = torch.cuda.get_device_properties(index)
        known = _dots_on_tensor_cores[index] = (props.major, props.minor) >= TENSOR_CORE_DOTS_FROM
        if not known:  # once per device: why "auto" leaves the fused attention unused here
            warnings.warn(
                f"cemlib: {getattr(props, 'name', 'this GPU')} (compute capability "
                f"{props.major}.{props.minor}) runs attention and the DPLR preconditioner on the "
                f"PyTorch path (cuBLAS, tensor cores): below compute capability "
                f"{TENSOR_CORE_DOTS_FROM[0]}.{TENSOR_CORE_DOTS_FROM[1]} Triton computes matrix "
                f"products on the FMA units, several times slower; the MLP step's kernel still "
                f"runs. CEMLIB_KERNELS=triton forces the kernels.", stacklevel=2)
    return known


# torch.compiler.assume_constant_result(dots_on_tensor_cores), without the import of
# torch._dynamo that the public decorator makes (it imports triton, and importing cemlib must
# not: tests/test_imports.py). The decorator sets this attribute and nothing else (torch 2.11
# and 2.13); tests/kernels/test_kernels_dispatch.py fails (a graph break) if it stops meaning it.
dots_on_tensor_cores._dynamo_marked_constant = True


def _use_triton(x: torch.Tensor, supported: bool, dots: bool = True) -> bool:
    """Whether this call runs a Triton kernel; ``dots``: the kernel is built on ``tl.dot``
    (which ``"auto"`` leaves to cuBLAS on a GPU without tensor-core dots)."""
    backend = get_backend()
    if backend in ("reference", "torch"):
        return False
    if backend == "auto":
        return (x.is_cuda and supported and triton_available()
                and (not dots or dots_on_tensor_cores(x.device)))
    if not triton_available():
        raise RuntimeError(f"kernel backend {backend!r} was forced but triton is not installed")
    if not x.is_cuda and os.environ.get("TRITON_INTERPRET") != "1":
        raise RuntimeError(f"kernel backend {backend!r} was forced for tensors on {x.device}; "
                           "on CPU set TRITON_INTERPRET=1 before triton is first imported")
    if not x.is_cuda and not torch.compiler.is_compiling():  # (a diagnostic, not traced)
        late = [name for name in ("cemlib.kernels.attention", "cemlib.kernels.gated_mlp",
                                  "cemlib.kernels.dplr")
                if name in sys.modules and not getattr(sys.modules[name], "INTERPRET", True)]
        if late:
            raise RuntimeError(f"kernel backend 'triton' on {x.device} tensors runs in Triton's interpreter, but "
                               f"{late[0]} was imported before TRITON_INTERPRET=1 was set (Triton reads it "
                               f"when a kernel is first imported); set TRITON_INTERPRET=1 in the environment "
                               f"before Python starts")
    return True


def attention_fused(q, q_extra=None, extra_values=False, extra_head_sum=False) -> bool:
    """Whether ``"auto"`` sends this attention call to the kernel (on CUDA): fp16/bf16 and a
    call the kernel takes (:func:`attention_covers`)."""
    return q.dtype in _AUTO_DTYPES and attention_covers(q, q_extra, extra_values, extra_head_sum)


def _shape(t):
    return tuple(t.shape)


def _check_attention(q, kv, scale, alibi, self_bias, cross_bias, q_extra, k_extra, extra_values,
                     extra_head_sum):
    for name, t in (("q", q), ("kv", kv)):
        if not isinstance(t, torch.Tensor) or t.dim() != 4:
            raise ValueError(f"{name} must be a 4-D tensor (B, K, L, D_r), got "
                             f"{_shape(t) if isinstance(t, torch.Tensor) else type(t).__name__}")
    if q.shape != kv.shape:
        raise ValueError(f"q and kv must have the same shape, got {_shape(q)} and {_shape(kv)}")
    if q.dtype != kv.dtype:
        raise ValueError(f"q and kv must have the same dtype, got {q.dtype} and {kv.dtype}")
    if not isinstance(scale, (int, float)) or not math.isfinite(scale) or scale <= 0:
        raise ValueError(f"scale (1/tau) must be a finite positive number, got {scale!r}")
    B, K, L, _ = q.shape
    if L < 1:
        raise ValueError(f"sequence length must be at least 1, got q of shape {_shape(q)}")
    for name, t in (("alibi", alibi), ("self_bias", self_bias), ("cross_bias", cross_bias)):
        if t is not None and _shape(t) != (K,):
            raise ValueError(f"{name} must have shape ({K},) (one value per head), got {_shape(t)}")
    if (q_extra is None) != (k_extra is None):
        raise ValueError("q_extra and k_extra must be given together")
    if extra_values and k_extra is None:
        raise ValueError("extra_values=True needs q_extra and k_extra")
    if extra_head_sum and not extra_values:
        raise ValueError("extra_head_sum=True needs extra_values=True")
    if q_extra is not None:
        if _shape(k_extra)[:2] != (B, L) or k_extra.dim() != 3:
            raise ValueError(f"k_extra must have shape ({B}, {L}, D_e), got {_shape(k_extra)}")
        De = k_extra.shape[-1]
        if _shape(q_extra) not in ((B, L, De), (B, K, L, De)):
            raise ValueError(f"q_extra must have shape ({B}, {L}, {De}) or ({B}, {K}, {L}, {De}), "
                             f"got {_shape(q_extra)}")
        if q_extra.dtype != q.dtype or k_extra.dtype != q.dtype:
            raise ValueError(f"q_extra/k_extra dtypes ({q_extra.dtype}, {k_extra.dtype}) must "
                             f"match q ({q.dtype})")


def tied_attention(q, kv, *, scale, alibi=None, self_bias=None, cross_bias=None, q_extra=None,
                   k_extra=None, extra_values=False, extra_head_sum=False):
    """Tied causal attention; see :func:`cemlib.kernels.reference.tied_attention`."""
    _check_attention(q, kv, scale, alibi, self_bias, cross_bias, q_extra, k_extra, extra_values,
                     extra_head_sum)
    kw = dict(scale=scale, alibi=alibi, self_bias=self_bias, cross_bias=cross_bias,
              q_extra=q_extra, k_extra=k_extra, extra_values=extra_values,
              extra_head_sum=extra_head_sum)
    covered = attention_covers(q, q_extra, extra_values, extra_head_sum)
    if covered and _use_triton(q, q.dtype in _AUTO_DTYPES):
        from cemlib.kernels import attention  # imports triton: only at the first kernel call
        return attention.tied_attention(q, kv, **kw)
    backend, closed_form = get_backend(), attention_torch.supported(q, alibi)
    if backend == "torch" and not closed_form:
        raise ValueError(f"kernel backend 'torch' takes float32/float64 attention with fixed "
                         f"ALiBi slopes, got {q.dtype}"
                         + (" and slopes that require grad" if q.dtype in
                            attention_torch.DTYPES else ""))
    if backend == "torch" or (backend != "reference" and q.device.type == "cpu" and closed_form):
        return attention_torch.tied_attention(q, kv, **kw)
    return reference.tied_attention(q, kv, **kw)


def tied_gated_mlp_step(u, V, gamma):
    """``V^T (gamma * SiLU(V u))``; see :func:`cemlib.kernels.reference.tied_gated_mlp_step`.
    The kernel path: :func:`cemlib.kernels.gated_mlp.tied_gated_mlp_step`."""
    if u.dim() < 1 or V.dim() != 2 or V.shape[1] != u.shape[-1]:
        raise ValueError(f"V must have shape (D_v, {u.shape[-1] if u.dim() else '?'}) "
                         f"matching u (..., D_h), got V {_shape(V)} and u {_shape(u)}")
    if gamma.shape[-1:] != V.shape[:1]:
        raise ValueError(f"gamma must have last dimension D_v = {V.shape[0]}, got {_shape(gamma)}")
    try:
        torch.broadcast_shapes(gamma.shape[:-1], u.shape[:-1])
    except RuntimeError:
        raise ValueError(f"gamma {_shape(gamma)} does not broadcast against u {_shape(u)}") \
            from None
    if not (u.dtype == V.dtype == gamma.dtype):
        raise ValueError(f"u, V, gamma must share a dtype, got {u.dtype}, {V.dtype}, {gamma.dtype}")
    if _use_triton(u, u.dtype in _AUTO_DTYPES and gamma.shape[:-1] == u.shape[:-1], dots=False):
        from cemlib.kernels import gated_mlp  # imports triton: only at the first kernel call
        return gated_mlp.tied_gated_mlp_step(u, V, gamma)
    return reference.tied_gated_mlp_step(u, V, gamma)


def dplr_precondition(g, d, U, V):
    """``softplus(d) * g + U (V^T g) + V (U^T g)`` (CEM eq. 13); see
    :func:`cemlib.kernels.reference.dplr_precondition`."""
    Dh = g.shape[-1]
    if _shape(d) != (Dh,) or U.dim() != 2 or U.shape[0] != Dh or _shape(V) != _shape(U):
        raise ValueError(f"need d ({Dh},) and U, V of equal shape ({Dh}, R); got d {_shape(d)}, "
                         f"U {_shape(U)}, V {_shape(V)}")
    if not (g.dtype == d.dtype == U.dtype == V.dtype):
        raise ValueError(f"g, d, U, V must share a dtype, got {g.dtype}, {d.dtype}, {U.dtype}, "
                         f"{V.dtype}")
    if _use_triton(g, g.dtype in _AUTO_DTYPES and U.shape[1] <= 64):
        from cemlib.kernels import dplr  # imports triton: only at the first kernel call
        return dplr.dplr_precondition(g, d, U, V)
    return reference.dplr_precondition(g, d, U, V)
