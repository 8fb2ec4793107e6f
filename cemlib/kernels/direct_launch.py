"""Launching a compiled Triton kernel without deriving its specialization again at every call.

``kernel[grid](*args, **kw)`` (Triton's ``JITFunction.run``) does, at every launch: read a few
knobs, find the device and stream, run the *binder* over every argument (the dtype and 16-byte
alignment of each pointer; whether each integer is 1, divisible by 16, or wider than 32 bits),
turn that and the options into a cache key, look the compiled kernel up, check the kernel's
global values, and call the compiled kernel's launcher. For the attention kernels' ~45 arguments
that is about 19 us of host time per launch (Triton 3.6, one Xeon thread:
``benchmarks/host_overhead.py``), as long as a short kernel runs on the GPU.

:func:`launch` keeps the last step and replaces the others: the compiled kernel is looked up under
a key of cemlib's own that is at least as fine as Triton's specialization (the device, every
non-tensor argument and every keyword by value, every tensor by dtype and its address modulo 16:
Triton specializes a pointer on nothing else, ``BaseBackend.get_tensor_specialization``), filled
on a miss by one launch through Triton's own path, which compiles if needed and returns the
compiled kernel. The launcher then receives exactly what ``JITFunction.run`` would give it: the grid, the
current stream, the compiled function and metadata, the launch metadata and hooks, and the
arguments in the kernel's parameter order (``tests/test_direct_launch.py`` records both paths at
the launcher and compares them, for aligned and misaligned inputs, with and without a launch
hook), except that hooks which would do nothing are passed as ``None`` (:func:`run_bound`).

It is used only where that copy is faithful: on CUDA tensors, when the installed Triton's
``JITFunction.run`` still ends with the launch this module copies (:data:`SUPPORTED`, checked
once against its source), when the kernel has no pre-run hooks, and unless
``CEMLIB_DIRECT_LAUNCH=0``; otherwise :func:`launch` is ``kernel[grid](*args, **kw)``. Knobs that
Triton reads at launch time (``TRITON_DEBUG``, the instrumentation mode) are those of the first
launch under each key.
"""

from __future__ import annotations

import inspect
import os

from torch import Tensor

__all__ = ["launch", "bind", "run_bound", "Bound", "enabled", "SUPPORTED", "clear",
           "specialization_key"]

# the end of JITFunction.run that launch() reproduces (whitespace-insensitive); if the installed
# Triton launches differently, SUPPORTED is False and every launch goes through Triton's path
_LAUNCH_LINES = (
    "launch_metadata = kernel.launch_metadata(grid, stream, *bound_args.values())",
    "kernel.run(grid_0, grid_1, grid_2, stream, kernel.function, kernel.packed_metadata, "
    "launch_metadata, knobs.runtime.launch_enter_hook, knobs.runtime.launch_exit_hook, "
    "*bound_args.values())",
)


def _flat(text: str) -> str:
    return "".join(text.split())


def _launch_convention_matches() -> bool:
    try:
        from triton.runtime.jit import JITFunction
        source = _flat(inspect.getsource(JITFunction.run))
    except (ImportError, OSError, TypeError):
        return False
    return all(_flat(line) in source for line in _LAUNCH_LINES)


#: whether the installed Triton launches the way :func:`launch` copies
SUPPORTED = _launch_convention_matches()
_enabled = [os.environ.get("CEMLIB_DIRECT_LAUNCH", "1") != "0"]
#: keys remembered before the cache starts over (each holds ~50 small objects; the compiled
#: kernels themselves stay in Triton's own cache, so starting over only costs one slow launch)
MAX_ENTRIES = 4096
_compiled: dict = {}    # key -> Bound (the compiled kernel, its keyword arguments laid out)
_signatures: dict = {}  # JITFunction -> (parameter names, defaults)


def enabled() -> bool:
    """Whether CUDA launches skip Triton's per-call specialization (:data:`SUPPORTED` and not
    ``CEMLIB_DIRECT_LAUNCH=0``)."""
    return SUPPORTED and _enabled[0]


def clear() -> None:
    """Forget every compiled kernel looked up so far (the next launch of each key goes through
    Triton's path again)."""
    _compiled.clear()


# argument types that decide Triton's specialization by value (and are their own key)
_BY_VALUE = frozenset({int, float, bool, str, type(None)})


def specialization_key(args) -> list:
    """The arguments as they decide Triton's specialization, or finer: non-tensors by value,
    tensors by dtype and address modulo 16."""
    return [a if type(a) in _BY_VALUE else
            (a.dtype, a.data_ptr() & 15) if isinstance(a, Tensor) else a for a in args]


def _key(device, kernel, args, kw) -> tuple:
    return (device, kernel, *specialization_key(args), *kw.items())


def _bound_values(kernel, args, kw) -> list:
    """The arguments in the kernel's parameter order, defaults filled in: ``bound_args.values()``
    of Triton's binder."""
    if kernel not in _signatures:
        params = inspect.signature(kernel.fn).parameters
        _signatures[kernel] = (list(params), {n: p.default for n, p in params.items()
                                              if p.default is not inspect.Parameter.empty})
    names, defaults = _signatures[kernel]
    values = list(args)
    for name in names[len(args):]:
        values.append(kw[name] if name in kw else defaults[name])
    return values


class Bound:
    """A compiled kernel with the keyword part of its arguments laid out (the meta-parameters and
    defaults after the positional arguments, in the kernel's parameter order): what a launch of
    one key needs besides the positional arguments and the grid."""

    __slots__ = ("compiled", "tail")

    def __init__(self, compiled, tail: tuple):
        self.compiled, self.tail = compiled, tail


def bind(compiled, kernel, args: tuple, kw: dict) -> Bound:
    """``compiled`` (the kernel Triton compiled for ``kernel`` called with ``args``/``kw``) with
    ``kw`` laid out once, for :func:`run_bound` with positional arguments of the same
    specialization and the same ``kw``."""
    return Bound(compiled, tuple(_bound_values(kernel, args, kw)[len(args):]))


_triton: list = []  # [triton.knobs, triton.runtime.driver, HookChain], imported at the first launch


def _modules():
    if not _triton:
        from triton import knobs
        from triton.runtime import driver
        _triton.extend((knobs, driver, getattr(knobs, "HookChain", None)))
    return _triton


def _idle(hook, chain) -> bool:
    """Whether a launch hook would do nothing: none, or an empty ``HookChain`` (``chain``; how
    Triton 3.6 and 3.9 keep their launch hooks when nobody has added one)."""
    return hook is None or (type(hook) is chain and not hook.calls)


def run_bound(bound: Bound, grid: tuple, args: tuple) -> None:
    """Launch ``bound`` on the current device and stream as the end of ``JITFunction.run`` does.
    One difference, where it changes nothing: when neither launch hook would do anything (both
    absent, or empty ``HookChain``s, as they are unless a profiler adds one), the launcher is
    given ``None`` for both hooks and for the launch metadata, which only the hooks read. The
    launcher then calls no hook, and the metadata (a ``LazyDict`` per launch) is not built:
    about 1 us of host time per launch on the CPU (``benchmarks/NOTES.md``, step 18), which
    the GPU waits for at short sequences. With a hook
    set, the launch is Triton's exactly (``tests/test_direct_launch.py`` records both)."""
    knobs, driver, chain = _modules()
    active = driver.active
    stream = active.get_current_stream(active.get_current_device())
    compiled, runtime = bound.compiled, knobs.runtime
    enter, leave = runtime.launch_enter_hook, runtime.launch_exit_hook
    if _idle(enter, chain) and _idle(leave, chain):
        enter = leave = metadata = None
    else:  # CompiledKernel.launch_metadata is None without an enter hook; asked only then
        metadata = None if enter is None else compiled.launch_metadata(grid, stream, *args,
                                                                       *bound.tail)
    n = len(grid)
    compiled.run(grid[0], grid[1] if n > 1 else 1, grid[2] if n > 2 else 1, stream,
                 compiled.function, compiled.packed_metadata, metadata, enter, leave, *args,
                 *bound.tail)


def launch(kernel, grid: tuple, args: tuple, kw: dict, cuda: bool = True):
    """``kernel[grid](*args, **kw)``; on CUDA (``cuda``) and where :func:`enabled`, without
    Triton's per-call binder and cache-key work after the first launch of a key."""
    if not (cuda and enabled()) or kernel.pre_run_hooks:
        return kernel[grid](*args, **kw)
    driver = _modules()[1]
    device = driver.active.get_current_device()
    key = _key(device, kernel, args, kw)
    bound = _compiled.get(key)
    if bound is None:  # Triton's path: compiles if needed, returns the compiled kernel
        compiled = kernel[grid](*args, **kw)
        if len(_compiled) >= MAX_ENTRIES:  # e.g. generation, one length after another
            _compiled.clear()
        _compiled[key] = bind(compiled, kernel, args, kw)
        return compiled
    run_bound(bound, grid, args)
    return bound.compiled
