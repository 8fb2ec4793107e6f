"""What the Triton ops of :mod:`cemlib.kernels` share: device guard, interpreter checks, operator
registration, a launch cache, and an autotune helper; and which attention calls the kernel takes.

- :func:`on_device`, :func:`interpreting`, :func:`check_dtype`, :func:`acc_dtype`: small helpers
  every launcher needs.
- :func:`define`: a ``torch.library`` operator registered directly (schema, CPU and CUDA kernel,
  fake kernel), the opaque node a compiled graph calls; each op's ``autograd.Function`` calls the
  launchers in eager mode and these operators while ``torch.compile`` traces it.
- :func:`launch`: ``kernel[grid](*args, **kw)`` that, on CUDA, looks the compiled kernel up under
  a key of its own after the first launch instead of running Triton's per-call binder
  (``JITFunction.run``): host time the GPU waits for at short sequences.
- :class:`Tuning`: an op's launch configurations as data (one per kernel under the interpreter;
  an autotune space per kernel and head width on a GPU), Triton's autotuner consulted once per
  call signature, and with autotuning off the first configuration that loads without spilling.
- :func:`attention_covers`: the calls :mod:`cemlib.kernels.attention` computes, asked by the
  dispatcher without importing Triton.

Importing this module does not import Triton (:mod:`cemlib.kernels.dispatch` imports it); the
functions that need Triton import it when called.
"""

from __future__ import annotations

import contextlib
import inspect
import json
import os
from pathlib import Path
from typing import Callable

import torch
from torch import Tensor

__all__ = ["on_device", "interpreting", "check_dtype", "acc_dtype", "define", "launch", "bind",
           "run_bound", "Bound", "enabled", "supported", "clear", "specialization_key",
           "Tuning", "length_bucket", "spills", "attention_covers", "ATTENTION_MAX_HEAD_DIM"]


# ------------------------------------------------------------------------------ small helpers

def on_device(t: Tensor):
    """Launch on ``t``'s GPU (Triton launches on the current CUDA device)."""
    return torch.cuda.device(t.device) if t.is_cuda else contextlib.nullcontext()


def interpreting() -> bool:
    """Whether ``TRITON_INTERPRET=1`` is set; each kernel module reads it once, when its kernels
    are decorated (Triton decides then whether to interpret them)."""
    return os.environ.get("TRITON_INTERPRET", "0") == "1"


def check_dtype(t: Tensor, interpret: bool) -> None:
    """Refuse bfloat16 under the interpreter, which silently mis-computes it."""
    if interpret and t.dtype == torch.bfloat16:
        raise TypeError("bfloat16 is not supported under TRITON_INTERPRET=1 (the interpreter "
                        "silently mis-computes it); use float16 or float32 on CPU")


def acc_dtype(dtype: torch.dtype) -> torch.dtype:
    """The accumulation dtype of a kernel on ``dtype`` inputs: float64 for float64, else float32."""
    return torch.float64 if dtype == torch.float64 else torch.float32


# ------------------------------------------------------------------------------ attention's scope

#: the widest head the attention kernel takes (its autotune spaces are pruned for widths 64, 128)
ATTENTION_MAX_HEAD_DIM = 128


def attention_covers(q, q_extra=None, extra_values: bool = False,
                     extra_head_sum: bool = False) -> bool:
    """Whether :func:`cemlib.kernels.attention.tied_attention` computes the call: head width
    (``q.shape[-1]``) at most :data:`ATTENTION_MAX_HEAD_DIM`, and no extra pair, or a head-shared
    one (``q_extra`` of shape (B, L, D_e), any width) without extra values or with head-summed
    ones (the default CEM layer's call). Per-head pairs, per-head extra values and wider heads go
    to the PyTorch path (:mod:`cemlib.kernels.dispatch`)."""
    return q.shape[-1] <= ATTENTION_MAX_HEAD_DIM and (
        q_extra is None or (q_extra.dim() == 3 and (not extra_values or extra_head_sum)))


# ------------------------------------------------------------------------------ operators

_library: list = []  # the ``cemlib`` fragment, made at the first definition


def define(name: str, schema: str, kernel: Callable, fake: Callable):
    """Define ``cemlib::<name>``: ``schema`` its arguments and returns as ``torch.library`` writes
    them (``"(Tensor x, float s) -> Tensor[]"``), ``kernel`` its implementation for CPU and CUDA
    tensors, ``fake`` its fake (meta) implementation for tracing. Returns the operator
    (``torch.ops.cemlib.<name>.default``).

    Unlike ``torch.library.custom_op`` no autograd layer, alias check or guard runs around the
    kernel at each call (about 10 us of host time per call saved: ``benchmarks/NOTES.md``); the
    kernels return new tensors (``tests/kernels/test_kernels_runtime.py`` checks each operator),
    and the derivative is the calling ``autograd.Function``'s. An operator that exists already
    is returned as it is (a module imported a second time keeps the first definition: the
    dispatcher refuses a second one of one name)."""
    existing = getattr(torch.ops.cemlib, name, None)
    if existing is not None:
        return existing.default
    if not _library:
        _library.append(torch.library.Library("cemlib", "FRAGMENT"))
    lib = _library[0]
    lib.define(name + schema, tags=(torch.Tag.pt2_compliant_tag,))
    for key in ("CPU", "CUDA"):
        lib.impl(name, kernel, key)
    torch.library.register_fake(f"cemlib::{name}", fake, lib=lib)
    return getattr(torch.ops.cemlib, name).default


# ------------------------------------------------------------------------------ launch cache
#
# ``kernel[grid](*args, **kw)`` derives the kernel's specialization at every launch (the dtype and
# 16-byte alignment of each pointer, whether each integer is 1, divisible by 16 or wider than 32
# bits), builds a cache key and looks the compiled kernel up: about 19 us of host time for the
# attention kernels' ~45 arguments. :func:`launch` looks the compiled kernel up under a key at
# least as fine as that specialization (the device, every non-tensor argument and keyword by
# value, every tensor by dtype and address modulo 16: Triton specializes a pointer on nothing
# else), filled on a miss by one launch through Triton's path, and hands the launcher what
# ``JITFunction.run`` would (``tests/kernels/direct_launch_check.py`` compares both). It does so
# on CUDA tensors, with no pre-run hooks, where the installed Triton still launches the way it
# copies (:func:`supported`) and unless ``CEMLIB_DIRECT_LAUNCH=0``.

# the end of JITFunction.run that launch() reproduces (whitespace-insensitive)
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


_supported: list = []  # [whether the installed Triton launches as launch() copies], asked once
_enabled = [os.environ.get("CEMLIB_DIRECT_LAUNCH", "1") != "0"]
#: keys remembered before the cache starts over (each holds ~50 small objects; the compiled
#: kernels stay in Triton's own cache, so starting over costs one slow launch per key)
MAX_ENTRIES = 4096
_compiled: dict = {}    # key -> Bound (the compiled kernel, its keyword arguments laid out)
_signatures: dict = {}  # JITFunction -> (parameter names, defaults)


def supported() -> bool:
    """Whether the installed Triton's ``JITFunction.run`` ends with the launch :func:`launch`
    copies (read once from its source)."""
    if not _supported:
        _supported.append(_launch_convention_matches())
    return _supported[0]


def enabled() -> bool:
    """Whether CUDA launches skip Triton's per-call specialization (:func:`supported` and not
    ``CEMLIB_DIRECT_LAUNCH=0``)."""
    return _enabled[0] and supported()


def clear() -> None:
    """Forget every compiled kernel looked up so far."""
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
    defaults after the positional arguments, in the kernel's parameter order)."""

    __slots__ = ("compiled", "tail")

    def __init__(self, compiled, tail: tuple):
        self.compiled, self.tail = compiled, tail


def bind(compiled, kernel, args: tuple, kw: dict) -> Bound:
    """``compiled`` (what Triton compiled for ``kernel`` called with ``args``/``kw``) with ``kw``
    laid out once, for :func:`run_bound` with arguments of the same specialization and ``kw``."""
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
    """Launch ``bound`` on the current device and stream as the end of ``JITFunction.run`` does;
    where neither launch hook would do anything (as unless a profiler adds one), the launcher
    gets ``None`` for both and for the launch metadata, which only the hooks read (about 1 us of
    host time per launch less)."""
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


# ------------------------------------------------------------------------------ autotuning

def length_bucket(L: int) -> int:
    """The power of two at or above ``L`` (at least 16): lengths in one bucket share one
    autotuned configuration."""
    return max(16, 1 << (max(int(L), 1) - 1).bit_length())


def spills(kernel, grid, args, kw) -> int:
    """Compile ``kernel`` for this launch and load it on the current GPU without launching it:
    the registers it spills (``OutOfResources`` where it does not load)."""
    compiled = kernel.warmup(*args, grid=grid, **kw)
    if hasattr(compiled, "result"):  # compiled in parallel earlier: Triton keeps the future
        compiled = compiled.result()
    compiled._init_handles()
    return compiled.n_spills


def _env_flag(name: str, default: str = "1") -> bool:
    return os.environ.get(name, default) != "0"


class Tuning:
    """The launch configurations of one op's kernels, read from a JSON file:

    ``{"interpreter": {kernel: {meta-parameters}}, "gpu": {space: {padded head width: [configs]}}}``

    (width ``"0"``: any width; a GPU configuration also holds ``num_warps`` and ``num_stages``).
    Under the interpreter or off CUDA each kernel runs its one interpreter configuration; on a GPU
    Triton's autotuner times the space of the launch's head width at the first call of each
    power-of-two bucket of the sequence length (:func:`length_bucket`), consulted once per call
    signature (its own ``run`` rebuilds its key from every argument at every call). With
    ``CEMLIB_AUTOTUNE=0`` the first entry that the GPU loads without spilling runs instead
    (entries are ordered for the H100, the first its default). :meth:`use` forces
    configurations. ``CEMLIB_AUTOTUNE``, ``CEMLIB_AUTOTUNE_REP_MS`` (milliseconds each
    configuration is timed, default 25) and ``CEMLIB_PARALLEL_COMPILE`` are read when the op's
    module makes its :class:`Tuning`.

    ``tune_keys``: the kernels' arguments the autotuner keys on (those a kernel has);
    ``validate(name, config)``: raises for a configuration the op cannot run;
    ``reset_to_zero``: per space, the arguments the autotuner zeroes before each timed run."""

    def __init__(self, path, *, interpret: bool, tune_keys=(), validate=None,
                 reset_to_zero=None):
        data = json.loads(Path(path).read_text())
        self.interpreter: dict[str, dict] = data["interpreter"]
        self.gpu: dict[str, dict[int, list[dict]]] = {
            name: {int(width): configs for width, configs in table.items()}
            for name, table in data["gpu"].items()}
        self.interpret = interpret
        self.autotune = _env_flag("CEMLIB_AUTOTUNE")
        self.parallel_compile = _env_flag("CEMLIB_PARALLEL_COMPILE")
        self.rep_ms = float(os.environ.get("CEMLIB_AUTOTUNE_REP_MS", "25"))
        self.tune_keys = tuple(tune_keys)
        self.validate = validate
        self.reset_to_zero = dict(reset_to_zero or {})
        self.override: dict[str, dict] = {}
        self.tuners: dict = {}    # (space, padded head width) -> triton.autotune of its kernel
        self.tuned: dict = {}     # tuned_key -> [configuration, Bound or None]
        self.choices: dict = {}   # (space, width, device, length bucket, meta, dtypes) -> config
        self.fitting: dict = {}   # (space, width, device) -> index launched without autotuning

    def configs(self, table: str, block_d: int) -> list[dict]:
        """The GPU space ``table`` for the padded head width ``block_d`` (the narrowest table
        width at or above it, else the widest)."""
        spaces = self.gpu[table]
        width = min((w for w in spaces if w >= block_d), default=max(spaces))
        return spaces[width]

    @contextlib.contextmanager
    def use(self, **configs):
        """Run the named kernels with the given meta-parameters (tile sizes, and on a GPU
        ``num_warps``/``num_stages``) instead of the interpreter's or the autotuned ones:
        ``with tuning.use(fwd=dict(BLOCK_M=16, BLOCK_N=32)):``."""
        for name, cfg in configs.items():
            if name not in self.interpreter:
                raise ValueError(f"unknown kernel {name!r}; one of {sorted(self.interpreter)}")
            if self.validate is not None:
                self.validate(name, cfg)
        previous = dict(self.override)
        self.override.update(configs)
        try:
            yield
        finally:
            self.override.clear()
            self.override.update(previous)

    def select(self, name: str, device: torch.device, block_d: int, table: str):
        """The configuration to launch with, or ``None`` on a GPU (the autotuner, or without
        autotuning :meth:`first_fitting`)."""
        if name in self.override:
            return dict(self.override[name])
        if self.interpret or device.type != "cuda":
            return dict(self.interpreter[name])
        return None

    def launch(self, name, kernel, grid, args, meta, block_d, device, length, table=None):
        """Launch ``kernel`` (``grid``: a function of the meta-parameters) with the selected
        configuration, or through the autotuner over space ``table`` (default ``name``);
        ``length``: the call's sequence length."""
        table = table or name
        cfg = self.select(name, device, block_d, table)
        cuda = device.type == "cuda" and not self.interpret
        if cfg is not None:
            launch(kernel, grid(cfg), args, {**meta, **cfg}, cuda)
            return
        if not self.autotune:
            self.first_fitting(kernel, grid, args, meta, table, block_d, device)
            return
        key = self.tuned_key(table, block_d, device, args, meta)
        entry = self.tuned.get(key)
        if entry is None:
            if len(self.tuned) >= MAX_ENTRIES:  # e.g. generation, one length after another
                self.tuned.clear()  # (the choices stay: starting over re-tunes nothing)
            choice = (table, block_d, device, length_bucket(length), *meta.items(),
                      *(a.dtype for a in args if isinstance(a, Tensor)))
            best = self.choices.get(choice)
            if best is None:
                tuner = self.tuner(name, kernel, table, block_d)
                if cuda:
                    self.precompile(kernel, grid, args, meta, tuner.configs)
                tuner[grid](*args, **meta)
                self.choices[choice] = best = dict(tuner.best_config.all_kwargs())
                self.tuned[key] = [best, None]
                return
            entry = self.tuned[key] = [best, None]
        best, bound = entry
        if bound is not None and enabled():
            run_bound(bound, grid(best), args)
            return
        # Triton's launch path; the compiled kernel it returns is kept, bound to ``kw``, for the
        # next launches of this key
        kw = {**meta, **best}
        compiled = kernel[grid(best)](*args, **kw)
        if cuda and enabled() and not kernel.pre_run_hooks:
            entry[1] = bind(compiled, kernel, args, kw)

    def tuned_key(self, table, block_d, device, args, meta) -> tuple:
        """What the autotuner's choice and Triton's specialization for a launch may depend on, at
        least as fine as either (a finer key only costs an extra, cached, consultation)."""
        return (table, block_d, device, *meta.values(), *specialization_key(args))

    def first_fitting(self, kernel, grid, args, meta, table, block_d, device):
        """Launch with the first entry of space ``table`` that ``device`` loads without spilling
        (chosen once per space, width and device): another GPU than the H100 may refuse an entry
        (``OutOfResources``: less shared memory per block) or spill it (its compiler allocates
        registers differently). Each entry is compiled and loaded without a launch until one
        fits; where none loads without spilling, the first that loads runs."""
        from triton.runtime.errors import OutOfResources
        key = (table, block_d, device)
        configs = self.configs(table, block_d)
        index = self.fitting.get(key)
        if index is None:
            error = None
            for i, cfg in enumerate(configs):
                try:
                    n = spills(kernel, grid(cfg), args, {**meta, **cfg})
                except OutOfResources as e:
                    error = error or e
                    continue
                if index is None:
                    index = i  # the first that loads: the fallback
                if n == 0:
                    index = i
                    break
            if index is None:
                raise error
            self.fitting[key] = index
        cfg = dict(configs[index])
        launch(kernel, grid(cfg), args, {**meta, **cfg}, True)

    def precompile(self, kernel, grid, args, meta, configs: list) -> None:
        """Compile ``kernel`` for every configuration of its space at once, in threads (Triton's
        ``AsyncCompileMode``: most of a compilation runs without the GIL), so that the autotuner,
        which compiles them one after another before timing each, finds them compiled. A
        configuration that fails is left to the autotuner, which meets the same error. Off with
        ``CEMLIB_PARALLEL_COMPILE=0``, on one core, and with a Triton older than 3.4."""
        workers = min(len(configs), os.cpu_count() or 1, 16)
        if not self.parallel_compile or workers < 2:
            return
        from concurrent.futures import ThreadPoolExecutor
        try:
            from triton.runtime._async_compile import AsyncCompileMode, active_mode
        except ImportError:
            return
        if active_mode.get() is not None:  # inside someone else's asynchronous compilation
            return
        with ThreadPoolExecutor(workers) as pool, AsyncCompileMode(pool, ignore_errors=True):
            for config in configs:  # the autotuner's triton.Config objects
                kw = config.all_kwargs()  # exactly what its launch passes: the same cache key
                try:
                    kernel.warmup(*args, grid=grid(kw), **meta, **kw)
                except Exception:  # noqa: BLE001 - the autotuner meets it again, and reports it
                    pass

    def tuner(self, name, kernel, table, block_d):
        """The ``triton.autotune`` of ``kernel`` over space ``table``, built once."""
        import triton
        key = (table, block_d)
        if key not in self.tuners:
            configs = []
            for c in self.configs(table, block_d):
                c = dict(c)
                warps, stages = c.pop("num_warps"), c.pop("num_stages")
                configs.append(triton.Config(c, num_warps=warps, num_stages=stages))
            names = kernel.arg_names
            self.tuners[key] = triton.autotune(
                configs, key=[k for k in self.tune_keys if k in names],
                reset_to_zero=self.reset_to_zero.get(name), **self.bench_option())(kernel)
        return self.tuners[key]

    def timed(self, kernel_call, quantiles):
        """The autotuner's timing of one configuration: ``triton.testing.do_bench`` for
        :attr:`rep_ms` (a fifth of that of warm-up; Triton's default of 100 ms spends about 3 s
        per kernel on a space of 26, while these kernels run 0.02-1 ms)."""
        import triton.testing
        return triton.testing.do_bench(kernel_call, warmup=max(1.0, self.rep_ms / 5),
                                       rep=self.rep_ms, quantiles=quantiles)

    def bench_option(self) -> dict:
        """``triton.autotune``'s keyword for :meth:`timed`: ``do_bench`` where this Triton takes
        one (3.6 and 3.9 do), else its older ``warmup``/``rep``."""
        import triton
        if "do_bench" in inspect.signature(triton.autotune).parameters:
            return {"do_bench": self.timed}
        return {"warmup": max(1, round(self.rep_ms / 5)), "rep": max(1, round(self.rep_ms))}
