"""Count the kernel launches a piece of host code would make on a GPU, and the ATen operators it
dispatches, on any machine.

:func:`count_operators` counts every ATen operator ``fn()`` dispatches (views and in-place
updates included: each costs a dispatch on the host). Two kinds are counted inside
:func:`count_launches`:

- **Triton launches**: every ``kernel[grid](...)`` that runs (compiled, or under Triton's
  interpreter with ``TRITON_INTERPRET=1``), by kernel name;
- **PyTorch operators that launch a kernel**: every ATen operator dispatched on a tensor
  (recorded with a ``TorchDispatchMode``), except views and metadata operations (no kernel) and
  allocations (``empty`` and friends: the caching allocator, no kernel). A factory such as
  ``zeros`` counts once, for its fill. Operators called inside a ``torch.library`` custom op are
  not seen (the op is counted once, under its own name), so the count is exact for code built
  from ATen operators and Triton kernels, as :mod:`cemlib.kernels.attention` is.

On a CPU the PyTorch operators run on the CPU; the count is what the same code issues on CUDA,
where each of these operators is one kernel launch (cuBLAS GEMMs included). It is a count, not a
timing: launches cost a few microseconds of host time each, which is what matters for short
sequences (``benchmarks/NOTES.md``).
"""

from __future__ import annotations

import collections
import contextlib
from dataclasses import dataclass, field

import torch
from torch.utils._python_dispatch import TorchDispatchMode

__all__ = ["Launches", "count_launches", "count_operators", "OperatorCounter", "NO_KERNEL"]

# ATen operators that allocate or only describe a tensor: no kernel on a GPU
NO_KERNEL = frozenset({
    "empty", "empty_like", "empty_strided", "new_empty", "new_empty_strided", "detach", "alias",
    "lift_fresh", "set_", "resize_", "is_same_size", "_reshape_alias", "_unsafe_view", "sym_size",
    "sym_stride",
    "sym_numel", "sym_storage_offset", "is_contiguous", "is_non_overlapping_and_dense",
})


@dataclass
class Launches:
    """What :func:`count_launches` recorded: Triton launches and kernel-launching PyTorch
    operators, each by name."""
    triton: collections.Counter = field(default_factory=collections.Counter)
    torch: collections.Counter = field(default_factory=collections.Counter)

    @property
    def total(self) -> int:
        return sum(self.triton.values()) + sum(self.torch.values())

    def __str__(self) -> str:
        def fmt(c):
            return ", ".join(f"{n} x{k}" if k > 1 else n for n, k in sorted(c.items())) or "none"
        return (f"{self.total} launches: {sum(self.triton.values())} Triton ({fmt(self.triton)}), "
                f"{sum(self.torch.values())} PyTorch ({fmt(self.torch)})")


class OperatorCounter(TorchDispatchMode):
    """A dispatch mode that counts, by name, the operators dispatched inside it into
    :attr:`counter`: every operator (``kernels_only=False``: each is a dispatch on the host), or
    only those that launch a kernel on a GPU (``kernels_only=True``: no views, no allocations
    or metadata operations (:data:`NO_KERNEL`), nothing inside a Triton launch)."""

    def __init__(self, counter: collections.Counter | None = None, kernels_only: bool = False):
        super().__init__()
        self.counter = collections.Counter() if counter is None else counter
        self.kernels_only = kernels_only
        self.in_triton = 0  # > 0 inside a Triton launch (the interpreter copies its arguments)

    @property
    def total(self) -> int:
        return sum(self.counter.values())

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if not self.kernels_only:
            self.counter[func.__name__] += 1
        else:
            name = func.overloadpacket.__name__
            if not (self.in_triton or func.is_view or name in NO_KERNEL):
                self.counter[name if func.namespace == "aten" else f"{func.namespace}::{name}"] += 1
        return func(*args, **(kwargs or {}))


def count_operators(fn) -> int:
    """The number of ATen operators ``fn()`` dispatches, views and in-place updates included
    (each costs a dispatch on the host): what a step asks of the host, beside its kernels."""
    with OperatorCounter() as counter:
        fn()
    return counter.total


def _kernel_classes():
    """The classes whose ``run`` a ``kernel[grid](...)`` call goes through (compiled, and the
    interpreter's, whichever is loaded)."""
    from triton.runtime.jit import JITFunction
    classes = [JITFunction]
    try:
        from triton.runtime.interpreter import InterpretedFunction
        classes.append(InterpretedFunction)
    except ImportError:  # pragma: no cover - older Triton
        pass
    return classes


@contextlib.contextmanager
def count_launches(operators: bool = True):
    """``with count_launches() as n: ...`` records the launches of the block into ``n``
    (a :class:`Launches`). Triton is imported only if it is installed. ``operators=False``
    records Triton launches only (``n.torch`` stays empty): then the block may run code compiled
    by ``torch.compile``, which refuses to trace under the operator-recording dispatch mode."""
    result = Launches()
    mode = OperatorCounter(result.torch, kernels_only=True)
    patched = []
    try:
        import triton  # noqa: F401
    except ImportError:  # no Triton: only PyTorch operators
        classes = []
    else:
        classes = _kernel_classes()
    for cls in classes:
        run = cls.run

        def counting(self, *args, _run=run, **kwargs):
            if not kwargs.get("warmup", False):
                result.triton[getattr(self, "__name__", None) or self.fn.__name__] += 1
            mode.in_triton += 1
            try:
                return _run(self, *args, **kwargs)
            finally:
                mode.in_triton -= 1
        cls.run = counting
        patched.append((cls, run))
    try:
        with mode if operators else contextlib.nullcontext():
            yield result
    finally:
        for cls, run in patched:
            cls.run = run
