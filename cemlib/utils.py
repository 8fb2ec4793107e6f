"""Small helpers shared by every part of cemlib: seeding, device choice, input checks."""

from __future__ import annotations

import os
import random

import numpy as np
import torch

__all__ = ["seed_everything", "default_device", "check_tensor", "finite_check_is_free",
           "check_positive_int", "check_token_ids", "resolve_head_dim", "split_heads", "merge_heads"]


def seed_everything(seed: int = 0, deterministic: bool = False) -> torch.Generator:
    """Seed Python, NumPy and PyTorch (CPU and CUDA); return a ``torch.Generator`` seeded alike.

    With ``deterministic=True`` also ask PyTorch for deterministic algorithms (CPU results are
    deterministic anyway; on CUDA this trades speed for run-to-run reproducibility).
    """
    if not isinstance(seed, int) or seed < 0:
        raise ValueError(f"seed must be a non-negative int, got {seed!r}")
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)
    if deterministic:
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
        torch.use_deterministic_algorithms(True, warn_only=True)
    g = torch.Generator()
    g.manual_seed(seed)
    return g


def default_device(override: str | torch.device | None = None) -> torch.device:
    """The device chapters and the trainer use: ``override`` if given (or ``$CEMLIB_DEVICE``),
    else CUDA when available, else CPU."""
    choice = override if override is not None else os.environ.get("CEMLIB_DEVICE")
    if choice is not None:
        dev = torch.device(choice)
        if dev.type == "cuda" and not torch.cuda.is_available():
            raise RuntimeError(f"device {str(dev)!r} requested but CUDA is not available")
        return dev
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


def check_tensor(x: torch.Tensor, name: str, ndim: int | None = None, last_dim: int | None = None,
                 finite: bool | str = True) -> torch.Tensor:
    """Raise a clear error if ``x`` has the wrong rank or width, or holds NaN/Inf. ``finite``:
    whether to look for NaN/Inf; ``"where_free"`` looks only where that costs no host
    synchronisation and no graph break (:func:`finite_check_is_free`: code that runs inside a
    layer at every call, on any device, compiled or not)."""
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(x).__name__}")
    if finite == "where_free":
        finite = finite_check_is_free(x)
    elif not isinstance(finite, bool):
        raise ValueError(f"finite must be True, False or 'where_free', got {finite!r}")
    if ndim is not None and x.dim() != ndim:
        raise ValueError(f"{name} must have {ndim} dimensions, got shape {tuple(x.shape)}")
    if last_dim is not None and x.shape[-1] != last_dim:
        raise ValueError(f"{name} must have last dimension {last_dim}, got shape {tuple(x.shape)}")
    if finite and x.is_floating_point() and not torch.isfinite(x).all():
        bad = (~torch.isfinite(x)).sum().item()
        raise ValueError(f"{name} contains {bad} NaN/Inf value(s) (shape {tuple(x.shape)})")
    return x


def finite_check_is_free(x: torch.Tensor) -> bool:
    """Whether a NaN/Inf check of ``x`` costs no host synchronisation and no ``torch.compile``
    graph break: ``x`` is a CPU tensor and the code runs eagerly (not traced by
    ``torch.compile``). On a GPU the check's ``bool`` waits for every queued kernel, once per
    call; in a compiled graph it is data-dependent control flow that splits the graph. Layers
    with ``check_finite`` check only where it is free; elsewhere the trainer's per-step check of
    the loss and gradient norm (one synchronisation it makes anyway) catches NaN/Inf."""
    return x.device.type == "cpu" and not torch.compiler.is_compiling()


def check_token_ids(idx: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """Raise ``ValueError`` naming the range unless every id of the integer tensor ``idx`` lies in
    ``[0, vocab_size)`` (an embedding lookup would fail with an index error, or on CUDA a device
    assert, far from the cause). Skipped while ``torch.compile`` traces (it would break the graph)."""
    if torch.compiler.is_compiling():
        return idx
    if idx.is_floating_point() or idx.is_complex():
        raise ValueError(f"token ids must be an integer tensor, got {idx.dtype}")
    if idx.numel() and (idx.min() < 0 or idx.max() >= vocab_size):
        raise ValueError(f"token ids must be in [0, {vocab_size}), got range [{int(idx.min())}, {int(idx.max())}]")
    return idx


def check_positive_int(value, name: str) -> int:
    """Return ``value`` if it is a positive int, else raise naming it."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{name} must be a positive integer, got {value!r}")
    return value


def resolve_head_dim(width: int, n_heads: int, head_dim: int | None = None, *, name: str = "d_model",
                     explicit_ok: bool = True) -> int:
    """Check ``width`` and ``n_heads``; return ``head_dim`` if given, else ``width // n_heads``
    (raising, with the offending values, when ``width`` is not divisible by ``n_heads``).
    ``explicit_ok`` says whether the caller accepts an explicit ``head_dim`` (named in the error)."""
    check_positive_int(width, name)
    check_positive_int(n_heads, "n_heads")
    if head_dim is None:
        if width % n_heads:
            hint = "; pass head_dim explicitly" if explicit_ok else ""
            raise ValueError(f"{name}={width} is not divisible by n_heads={n_heads}{hint}")
        head_dim = width // n_heads
    return check_positive_int(head_dim, "head_dim")


def split_heads(Z: torch.Tensor, n_heads: int) -> torch.Tensor:
    """``(..., N, H p) -> (..., H, N, p)``: the per-head view of a projection (a view, no copy)."""
    check_positive_int(n_heads, "n_heads")
    if Z.shape[-1] % n_heads:
        raise ValueError(f"width {Z.shape[-1]} is not divisible by n_heads={n_heads}")
    return Z.unflatten(-1, (n_heads, Z.shape[-1] // n_heads)).transpose(-2, -3)


def merge_heads(Z: torch.Tensor) -> torch.Tensor:
    """``(..., H, N, p) -> (..., N, H p)``."""
    return Z.transpose(-2, -3).flatten(-2)
