"""Batched linear solves that stay correct on a multi-threaded CPU.

PyTorch's CPU LU factorization of a **batch** of matrices (``torch.linalg.solve``,
``torch.linalg.inv``, ``torch.linalg.lu_factor``) hands the batch's matrices to several threads at
once whenever torch runs with more than one thread (its grain size rounds to zero above rank 14),
and oneMKL's ``getrf`` is not safe to call so for larger matrices: PyTorch issues 142815 and 141358
(open), fix proposed in pull request 181570 (open). Measured here with torch 2.13.0 (CPU build,
oneMKL), two threads, a batch of 4 well-conditioned float32 matrices ``I + N(0, 1/n)``: correct
up to ``n = 149``; from ``n = 150`` oneMKL prints "Parameter 6 was incorrect on entry to SLASWP" and
the solve raises "Pivots given to lu_solve must all be greater or equal to 1", or returns wrong
numbers without an error (a batch of 2 at ``n = 256``: ``max |A x - b| = 17.5`` instead of
``2e-4``), or never returns. One thread is always correct; Cholesky and ``lu_solve`` (with a
correct factorization) are not affected; CUDA is not affected.

:func:`solve` and :func:`inv` are ``torch.linalg.solve`` and ``torch.linalg.inv`` with the CPU
factorization of such a batch run on one thread (``torch.set_num_threads(1)`` for the call,
restored after; oneMKL still uses its own threads inside each factorization, which is safe). Their
backward is PyTorch's (it reuses the factorization: ``lu_solve``). Every batched solve in cemlib
goes through them: the Newton layers' ``d x d`` Hessians (``cemlib.layers.newton``) reach the
failing sizes at widths of 150 and more. While ``torch.compile`` traces, the plain functions are
called (changing the thread count is not traceable)."""

from __future__ import annotations

import contextlib
import math

import torch

__all__ = ["solve", "inv", "needs_one_thread", "ONE_THREAD_FROM"]

#: the matrix size from which a batched CPU factorization runs on one thread: below the failing
#: sizes measured (150 with torch 2.13.0 and oneMKL), with a margin for other oneMKL versions
#: and processors, which switch ``getrf``'s algorithm elsewhere
ONE_THREAD_FROM = 64


def needs_one_thread(A: torch.Tensor, B: torch.Tensor | None = None) -> bool:
    """Whether factorizing ``A`` (shape ``(*, n, n)``; for a solve, broadcast against the batch
    of ``B``, shape ``(*, n, k)``) with PyTorch could run two oneMKL factorizations at once on the
    CPU: more than one matrix of size at least :data:`ONE_THREAD_FROM`, on the CPU, with torch
    using more than one thread."""
    if A.device.type != "cpu" or A.dim() < 2 or A.shape[-1] < ONE_THREAD_FROM:
        return False
    if torch.compiler.is_compiling() or torch.get_num_threads() == 1:
        return False
    shape = A.shape[:-2]
    if B is not None and B.dim() > 2:
        shape = torch.broadcast_shapes(shape, B.shape[:-2])
    return math.prod(shape) > 1


@contextlib.contextmanager
def _threads_for(A: torch.Tensor, B: torch.Tensor | None = None):
    """One thread for the factorization of ``A`` where :func:`needs_one_thread` says so (the
    thread count restored after, also when the call raises); otherwise nothing changes."""
    if not needs_one_thread(A, B):
        yield
        return
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def solve(A: torch.Tensor, B: torch.Tensor) -> torch.Tensor:
    """``torch.linalg.solve(A, B)``: ``X`` with ``A X = B``, ``B`` of shape ``(*, n, k)`` (same
    broadcasting), the factorization of a batch on the CPU on one thread
    (:func:`needs_one_thread`)."""
    with _threads_for(A, B):
        return torch.linalg.solve(A, B)


def inv(A: torch.Tensor) -> torch.Tensor:
    """``torch.linalg.inv(A)``, the factorization of a batch on the CPU on one thread
    (:func:`needs_one_thread`)."""
    with _threads_for(A):
        return torch.linalg.inv(A)
