"""Host time of one CEM attention call, measured without a GPU: the CPU work before each launch.

At T <= 1024 the v2 kernels take less GPU time than SDPA's, yet a forward+backward call took 2.5x
SDPA's wall time on the H100 (``RESULTS_H100.md``: 0.214 ms of kernels against 0.240 ms at
T = 1024, wall 0.653 ms against 0.259 ms): the GPU waits for the host. This script times that host
path on the CPU. cemlib's launchers run on CPU tensors with the GPU configurations (autotuning
included), Triton compiles each kernel for ``sm_90`` with its bundled ``ptxas``, and a stand-in
driver takes the launch: its launcher does nothing and no module is loaded. What is timed is the
work between the call and the driver's launch: ``torch.autograd``, cemlib's argument
preparation and allocations, the autotuner's lookup, Triton's argument binder and kernel-cache
lookup. Not included: the driver call itself, CUDA's device guard and caching allocator (the CPU
allocator stands in), and anything on the GPU. Host time does not depend on the sequence length,
so the tensors are tiny (T = 16, and D_e = 16 for the shared pair): torch's own operations in the
call (allocations, the shared diagonal's three GEMMs, the atomic path's conversion of ``dq``) then
cost the CPU little arithmetic, where on a GPU each would be one launch, a few microseconds of host
time. (At the layers' D_e = 768 the CPU's bf16 GEMMs alone took about 60 us of the default
layer's call: arithmetic a GPU does not do on the host; the runs recorded at commits up to
7d7c607 used it.)

Rows, per method (``cem_v2``: ALiBi and self/cross biases, every gradient, the call the kernel
benchmarks time; ``cem_v2_atomic``; ``cem_diag_v2``: the default CEM layer's call; ``mlp_v2``:
the tied gated-MLP step v2, 16 tokens, D_h = 16, D_v = 64, float32) and per path:

- ``cemlib``: as shipped; the autotuner is consulted once per call signature
  (``attention.TUNING.launch``, :class:`cemlib.kernels.runtime.Tuning`), and the compiled kernel
  is launched without Triton's per-call specialization (:func:`cemlib.kernels.runtime.launch`);
- ``without_direct_launch``: the same through Triton's ``JITFunction.run`` at every launch
  (``CEMLIB_DIRECT_LAUNCH=0``);
- ``through_autotuner``: every launch through ``triton.autotune``'s ``run``, as before either
  change;
- ``operators``: what a graph compiled with ``torch.compile`` calls, the forward and backward
  ``torch.library`` operators (attention: ``attention._fwd_op``, ``_bwd_op``; the MLP
  step: ``gated_mlp._step_fwd``, ``_step_bwd``), without autograd (in a compiled graph
  AOTAutograd runs the derivative: no autograd layer around either operator);
- ``custom_ops`` (the MLP step; rows in ``results/host_overhead_cpu.json``, of 03d0078): its
  forward as a ``torch.library.custom_op`` with its derivative, called in eager mode, and every
  launch through Triton's path, as before the step got an ``autograd.Function`` for eager mode;
- ``eager_reference`` (the MLP step): PyTorch's own operators, the eager baseline the step is
  timed against on a GPU (``cemlib.kernels.reference.tied_gated_mlp_step``; no Triton launch).

Columns (each the smallest of :data:`ROUNDS` rounds' medians, rounds spread over the run): median
microseconds of one forward+backward (``full_us``), the same with every Triton
launch skipped (``without_launches_us``: torch and cemlib only), the recorded launches replayed
alone (``launches_us``), and the launches per call. ``bwd_launch_layers_us`` takes one backward
launch apart: through the autotuner, with the cached choice through ``JITFunction.run`` and
through the direct launch, ``JITFunction.run`` and :func:`runtime.launch` alone with the
configuration given, the binder alone, the compiled launcher alone (a no-op here). ``floor_us``: a
``torch.autograd.Function`` with the same inputs whose forward and backward only allocate their
outputs, the least any custom autograd call costs.

On a GPU's host (below) also a row ``sdpa_untied`` / ``torch``: PyTorch's own attention
(``scaled_dot_product_attention``, causal, untied), forward+backward on the same inputs, the
baseline of the GPU timing table, and each row's ratio to it (``ratios_to_sdpa``). Not on the
CPU, where that call is arithmetic, not host time.

``--device cuda`` measures the same rows on a GPU's host with the real driver: CUDA tensors, the
kernels launched (tiny shapes: the GPU finishes each call before the host has issued the next, so
a call's time is its host time), cemlib's dispatch as on any CUDA call. What the CPU run leaves
out (the driver's launch, CUDA's device guard and caching allocator, autograd's device thread) is
then in the numbers; ``bwd_launch_layers_us.compiled_launcher`` is a real launch there. The H100
run of 2026-11-27 measured a CEM v2 forward+backward at 0.51 ms of wall time where this CPU
measurement predicted about 0.25 ms (``NOTES.md``, step 24): this mode says where the difference
goes. ``gpu_kernels.py``'s profile stage runs it (:func:`run`).

Usage: ``python tools/gpu/host_overhead.py [--quick] [--device cuda] [--out FILE | --replace]``
(writes ``tools/gpu/results/host_overhead_cpu.json``, or ``host_overhead_<GPU>.json``; the stored
runs are in ``benchmarks/results/history/``). The CPU's speed sets the scale: compare rows of
one run.
Relies on Triton internals (``triton.runtime.driver``, ``Autotuner._bench``, the binder in
``JITFunction.device_caches``), checked on Triton 3.6 and 3.9.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import platform
import statistics
import sys
import time
from pathlib import Path

os.environ["TRITON_INTERPRET"] = "0"  # compiled kernels (for sm_90), never the interpreter

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
import triton  # noqa: E402
from triton.runtime import driver  # noqa: E402
from triton.runtime.autotuner import Autotuner  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
REPOSITORY = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, os.path.join(REPOSITORY, "benchmarks"))
sys.path.insert(0, HERE)
sys.path.insert(0, REPOSITORY)
from cemlib.kernels import attention as attn  # noqa: E402
from cemlib.kernels import dplr, reference, runtime  # noqa: E402
from cemlib.kernels import gated_mlp as gm  # noqa: E402
from cemlib.train.results import environment_info, git_commit  # noqa: E402
from compile_kernels import _TargetDriver  # noqa: E402
from common import device_slug  # noqa: E402
from outputs import announce, command_line, write_json  # noqa: E402

#: where the GPU tools write their results (the book reads ``benchmarks/results/``)
RESULTS = Path(HERE) / "results"
METHODS = ("sdpa_untied", "cem_v2", "cem_v2_atomic", "cem_diag_v2", "mlp_v2")
TUNING = attn.TUNING
PARALLEL_COMPILE = TUNING.parallel_compile


class _Utils:
    def load_binary(self, name, kernel, shared, device):
        return (1, 1, 0, 0, 1024)  # module, function, registers, spills, max threads

    def get_device_properties(self, device):
        return {"max_shared_mem": 227 * 1024, "multiprocessor_count": 132}


class NullDriver(_TargetDriver):
    """Stands in for the CUDA driver (``compile_kernels._TargetDriver``: the H100 as target,
    device and stream 0) and takes launches too: no module is loaded, and the launcher does
    nothing, so everything before the driver's launch runs, and nothing after."""

    def __init__(self, arch: int = 90):
        super().__init__(arch)
        self.utils = _Utils()

    def launcher_cls(self, src, metadata):
        return lambda *args: None


def gpu_paths():
    """Make cemlib take its GPU path on CPU tensors: every launch as if on CUDA (GPU
    configurations, the autotuner, direct launches; the DPLR preconditioner with its GPU tiles,
    which it chooses from the tensors' device), the autotuner's timing runs replaced by equal
    times (it keeps its first, default, configuration)."""
    launch, cuda = TUNING.launch, torch.device("cuda")
    TUNING.launch = lambda name, kernel, grid, args, meta, block_d, device, length, table=None: \
        launch(name, kernel, grid, args, meta, block_d, cuda, length, table)
    attn.INTERPRET = gm.INTERPRET = dplr.INTERPRET = TUNING.interpret = False
    blocks = dplr._blocks
    dplr._blocks = lambda R, device: blocks(R, cuda)
    direct = runtime.launch  # the MLP's element-wise launches and the fold: as on CUDA tensors
    runtime.launch = lambda kernel, grid, args, kw, cuda=True: direct(kernel, grid, args, kw, True)
    Autotuner._bench = lambda self, *args, config, **kw: [1.0, 1.0, 1.0]
    for f in (*vars(attn).values(), *vars(gm).values(), *vars(dplr).values()):
        if isinstance(f, triton.runtime.jit.JITFunction):
            f.device_caches.clear()  # binders cache the target per device
    driver.set_active(NullDriver())


class _NoCache(dict):
    """cemlib's cache of autotuner choices, disabled: every launch consults the autotuner."""

    def __setitem__(self, key, value):
        pass


def median_us(fn, n, reset=()):
    times = []
    for _ in range(n):
        for t in reset:
            t.grad = None
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times) * 1e6


def call_of(name, B=1, H=12, T=16, d=64, De=16, dtype=torch.bfloat16, path="cemlib",
            device="cpu"):
    """``(call, leaves)``: one forward+backward of ``name`` as the kernel benchmarks make it
    (``path="operators"``: the forward and backward operators a compiled graph calls, without
    autograd; the tied MLP step's ``"eager_reference"``: PyTorch's operators), on ``device``
    (the inputs drawn on the CPU, then moved)."""
    g = torch.Generator().manual_seed(0)

    def randn(*shape, dtype=torch.float32):
        return torch.randn(*shape, generator=g, dtype=dtype).to(device)
    if name == "mlp_v2":  # float32 on the CPU: its bf16 GEMMs would add arithmetic, even this
        # small; bf16 on a GPU, the dtype the GPU measurements (and the carried kernels) use
        mdt = torch.bfloat16 if torch.device(device).type == "cuda" else torch.float32
        u, dy = (randn(T, 16, dtype=mdt) for _ in range(2))
        V = randn(64, 16, dtype=mdt)
        gamma = randn(T, 64, dtype=mdt)
        leaves = [t.clone().requires_grad_() for t in (u, V, gamma)]
        if path == "operators":
            def call():
                with torch.no_grad():
                    _, h = gm._step_fwd(u, V, gamma)
                    gm._step_bwd(dy, u, V, gamma, h)
            return call, leaves
        step = {"eager_reference": reference.tied_gated_mlp_step}.get(path, gm.tied_gated_mlp_step)

        def call():
            step(*leaves).backward(dy)
        return call, leaves
    q, kv, do = (randn(B, H, T, d, dtype=dtype) for _ in range(3))
    slopes = reference.alibi_slopes(H).float().to(device)
    if name == "sdpa_untied":  # the GPU table's baseline: k and v apart, no bias
        leaves = [t.clone().requires_grad_() for t in (q, kv, randn(B, H, T, d, dtype=dtype))]

        def call():
            F.scaled_dot_product_attention(*leaves, is_causal=True, scale=d ** -0.5).backward(do)
        return call, leaves
    if name == "cem_diag_v2":
        qe, ke, doe = (0.1 * randn(B, T, De, dtype=dtype) for _ in range(3))
        leaves = [t.clone().requires_grad_() for t in (q, kv, qe, ke)]
        if path == "operators":  # the default layer's call in a compiled graph
            needs = [True, True, False, False, False, True, True]

            def call():
                with torch.no_grad():
                    o, lse, _, e2, a = attn._fwd_op(q, kv, d ** -0.5, slopes, None, None, qe,
                                                    ke, True)
                    attn._bwd_op(do, None, doe, q, kv, o, lse, d ** -0.5, slopes, None, None, qe,
                                 ke, e2, a, needs, -1)
            return call, leaves

        def call():
            o, _, oe = attn.tied_attention(leaves[0], leaves[1], scale=d ** -0.5, alibi=slopes,
                                           q_extra=leaves[2], k_extra=leaves[3],
                                           extra_values=True, extra_head_sum=True)
            torch.autograd.backward((o, oe), (do, doe))
        return call, leaves
    leaves = [t.clone().requires_grad_() for t in (q, kv, torch.zeros(H, device=device),
                                                   torch.zeros(H, device=device))]
    atomic = name == "cem_v2_atomic"
    if path == "operators":  # what a compiled graph calls: the forward and backward operators
        needs = [True, True, False, True, True, False, False]

        def call():
            with torch.no_grad():
                o, lse, *_ = attn._fwd_op(q, kv, d ** -0.5, slopes, leaves[2], leaves[3], None,
                                          None, False)
                attn._bwd_op(do, None, None, q, kv, o, lse, d ** -0.5, slopes, leaves[2],
                             leaves[3], None, None, None, None, needs, int(atomic))
        return call, leaves

    def call():
        o = attn.tied_attention(leaves[0], leaves[1], scale=d ** -0.5, alibi=slopes,
                                self_bias=leaves[2], cross_bias=leaves[3], atomic_dq=atomic)[0]
        o.backward(do)
    return call, leaves


def floor_us(n, B=1, H=12, T=16, d=64, device="cpu"):
    """An autograd function with the inputs of ``cem_v2`` that only allocates its outputs."""
    from torch.autograd.function import once_differentiable

    class Allocate(torch.autograd.Function):
        @staticmethod
        def forward(ctx, q, kv, scale, alibi, self_bias, cross_bias):
            o, lse = torch.empty_like(q), q.new_empty(q.shape[:3], dtype=torch.float32)
            ctx.save_for_backward(q, kv, o, lse, alibi, self_bias, cross_bias)
            ctx.set_materialize_grads(False)
            return o, lse

        @staticmethod
        @once_differentiable
        def backward(ctx, do, dlse):
            q, kv, _, _, _, sb, cb = ctx.saved_tensors
            return (torch.empty_like(q), torch.empty_like(kv), None, None, torch.empty_like(sb),
                    torch.empty_like(cb))

    q, kv, do = (torch.randn(B, H, T, d, dtype=torch.bfloat16, device=device) for _ in range(3))
    leaves = [t.requires_grad_() for t in (q, kv, torch.zeros(H, device=device),
                                           torch.zeros(H, device=device))]
    slopes = reference.alibi_slopes(H).float().to(device)

    def call():
        Allocate.apply(leaves[0], leaves[1], 0.125, slopes, leaves[2], leaves[3])[0].backward(do)
    for _ in range(20):
        call()
    return median_us(call, n, leaves)


PATHS = {"attention": ("cemlib", "without_direct_launch", "through_autotuner", "operators"),
         "mlp": ("cemlib", "operators", "eager_reference"), "sdpa": ("torch",)}


def paths(name: str) -> tuple:
    """The paths measured for method ``name``."""
    return PATHS["mlp" if name.startswith("mlp") else "sdpa" if name.startswith("sdpa")
                 else "attention"]


def measure(name, path, n, device="cpu", B=1):
    """One row: ``name`` through ``path`` (:data:`PATHS`), on ``device``, batch ``B``."""
    if path == "torch":  # no cemlib launch to take apart
        call, leaves = call_of(name, B=B, path=path, device=device)
        for _ in range(20):
            call()
        return dict(method=name, path=path, full_us=round(median_us(call, n, leaves), 1))
    TUNING.tuned = _NoCache() if path == "through_autotuner" else {}
    TUNING.choices = _NoCache() if path == "through_autotuner" else {}
    # (the warm-up that compiles a space in parallel runs where no choice is cached: at every
    # launch on that path, which predates it)
    TUNING.parallel_compile = path != "through_autotuner" and PARALLEL_COMPILE
    runtime._enabled[0] = path in ("cemlib", "operators")  # as shipped
    runtime.clear()
    call, leaves = call_of(name, B=B, path=path, device=device)
    call()  # compiles, autotunes
    for _ in range(20):
        call()
    full = median_us(call, n, leaves)
    # every launcher of the call: the MLP's element-wise launches; the attention's autotuned
    # launches and its fold of the bias gradients (a fixed configuration, launched directly)
    launchers = [(gm, "_elementwise")] if name.startswith("mlp") else [(TUNING, "launch"),
                                                                       (attn, "_fold")]
    originals = {attr: getattr(module, attr) for module, attr in launchers}
    recorded = []

    def recorder(attr):
        def record(*args, **kw):
            recorded.append((attr, args, kw))
            return originals[attr](*args, **kw)
        return record
    for module, attr in launchers:
        setattr(module, attr, recorder(attr))
    for t in leaves:
        t.grad = None
    try:
        call()
        for module, attr in launchers:
            setattr(module, attr, lambda *args, **kw: None)
        without = median_us(call, n, leaves)
    finally:
        for module, attr in launchers:
            setattr(module, attr, originals[attr])

    def replay():
        for attr, args, kw in recorded:
            originals[attr](*args, **kw)
    row = dict(method=name, path=path, full_us=round(full, 1),
               without_launches_us=round(without, 1),
               launches_us=round(median_us(replay, n), 1), launches_per_call=len(recorded))
    if path == "cemlib" and name == "cem_v2":
        row["bwd_launch_layers_us"] = launch_layers(
            [(args, kw) for attr, args, kw in recorded if attr == "launch"], n)
    return row


def launch_layers(recorded, n):
    """One backward launch taken apart (the recorded arguments of the ``bwd`` kernel; on the
    device of the recorded call: with the stand-in driver the launcher does nothing, on a GPU it
    launches)."""
    (name, kernel, grid, args, meta, block_d, device, length, *rest), _ = next(
        r for r in recorded if r[0][0] == "bwd")
    table = rest[0] if rest else name
    tuner = TUNING.tuner(name, kernel, table, block_d)
    best = dict(tuner.best_config.all_kwargs())
    g = grid(best)
    kw = dict(meta, **best)
    compiled = kernel[g](*args, **kw)
    binder = kernel.device_caches[0][4]
    bound = list(binder(*args, **kw)[0].values())
    run = compiled.run
    grid3 = (tuple(g) + (1, 1))[:3]
    stream = driver.active.get_current_stream(driver.active.get_current_device())
    n = 4 * n

    def cached_choice(direct):
        runtime._enabled[0] = direct
        TUNING.launch(name, kernel, grid, args, meta, block_d, device, length, table)  # caches
        return round(median_us(
            lambda: TUNING.launch(name, kernel, grid, args, meta, block_d, device, length, table),
            n), 1)
    try:
        row = dict(autotuner_and_jit=round(median_us(lambda: tuner[grid](*args, **meta), n), 1),
                   cached_choice_and_jit=cached_choice(False),
                   cached_choice_and_direct=cached_choice(True))
    finally:
        runtime._enabled[0] = True
    return dict(
        row,
        jit_run=round(median_us(lambda: kernel[g](*args, **kw), n), 1),
        direct_launch=round(median_us(lambda: runtime.launch(kernel, g, args, kw), n), 1),
        binder=round(median_us(lambda: binder(*args, **kw), n), 1),
        **{"compiled_launcher" if torch.device(device).type == "cuda" else
           "compiled_launcher_noop": round(median_us(
               lambda: run(*grid3, stream, compiled.function, compiled.packed_metadata, None,
                           None, None, *bound), n), 1)},
        positional_args=len(args), meta_parameters=len(meta))


#: rounds of the whole measurement; each number is the smallest of its rounds' medians
ROUNDS = 5


def smallest(rounds: list[list[dict]]) -> list[dict]:
    """Rows of several rounds (same rows, same order) combined: every number the smallest of its
    rounds' values (nested dictionaries of numbers too). Host time has a floor and no ceiling:
    what the machine adds (another process, a frequency change) only ever adds time, and this
    CPU's bursts last seconds, longer than a row's 400 calls."""
    def merge(values):
        first = values[0]
        if isinstance(first, dict):
            return {k: merge([v[k] for v in values]) for k in first}
        if isinstance(first, float):
            return min(values)
        return first
    return [merge(list(same)) for same in zip(*rounds)]


def run_env(**extra) -> dict:
    """What a run of this CPU-side measurement depends on: Python, torch, Triton, the CPU, the
    commit and the date (``extra``: anything else, such as the thread count)."""
    return dict(python=platform.python_version(), torch=torch.__version__,
                triton=triton.__version__, cpu=environment_info(torch.device("cpu"))[0]["name"],
                **extra, git_commit=git_commit(),
                date_utc=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()))


#: the batch of the calls timed on a GPU's host: 2, not the CPU run's 1, because Triton
#: specializes an integer argument equal to 1 (the backward kernel's batch count), and the kernels
#: carried to the GPU (``warm_cache.py``) were compiled for batches above 1; host time does not
#: depend on the batch
CUDA_BATCH = 2


def run(device="cpu", quick=False, argv=None, n=None, rounds=None) -> dict:
    """The measurement as a result (without writing it): on the CPU with the stand-in driver
    (:func:`gpu_paths`; this process then launches nothing for real), or with ``device="cuda"``
    on the GPU's host. cemlib's launch caches and switches are restored afterwards, and torch's
    thread count, so that a GPU script can go on after it."""
    device = torch.device(device)
    cuda = device.type == "cuda"
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    env = run_env(torch_threads=1, **({"device": torch.cuda.get_device_name(device)}
                                      if cuda else {}))
    saved = (TUNING.tuned, TUNING.choices, TUNING.parallel_compile, runtime._enabled[0])
    if not cuda:
        gpu_paths()
    n = n or (30 if quick else 400)
    rounds = rounds or (1 if quick else ROUNDS)
    B = CUDA_BATCH if cuda else 1
    # PyTorch's attention only on a GPU: on the CPU its call is arithmetic, not host time (at
    # T = 16 in bf16 it took 0.9 ms on this project's 2-core CPU, eight times the CEM call)
    methods = ("cem_v2",) if quick else METHODS if cuda else METHODS[1:]
    measured = []  # one list of rows per round
    try:
        with torch.cuda.device(device) if cuda else contextlib.nullcontext():
            for r in range(rounds):
                measured.append([measure(name, path, n, device, B) for name in methods
                                 for path in paths(name)])
                print(f"round {r + 1} of {rounds} done", flush=True)
            floor = min(round(floor_us(n, B=B, device=device), 1) for _ in range(rounds))
    finally:
        TUNING.tuned, TUNING.choices, TUNING.parallel_compile, runtime._enabled[0] = saved
        runtime.clear()
        torch.set_num_threads(threads)
    rows = smallest(measured)
    for row in rows:
        print(f"{row['method']:14s} {row['path']:21s} fwd+bwd {row['full_us']:7.1f} us"
              + ("" if "launches_us" not in row else
                 f"  without launches {row['without_launches_us']:7.1f}  launches "
                 f"{row['launches_us']:7.1f} ({row['launches_per_call']})"), flush=True)
    print(f"floor (an autograd.Function that only allocates): {floor} us")
    layers = next(r["bwd_launch_layers_us"] for r in rows if "bwd_launch_layers_us" in r)
    print("one bwd launch, us:", layers)
    where = ("the GPU's host, the real driver, CUDA tensors (launched; tiny shapes, so that a "
             "call's time is its host time)" if cuda else
             "kernels compiled for sm_90, a no-op launcher, CPU tensors")
    return dict(
        benchmark="host_overhead", env=env, command=command_line(__file__, argv),
        note=(f"host (CPU) time of one attention forward+backward, "
              + ("with the driver's launch: " if cuda else "up to the driver's launch: ")
              + f"{where} (B={B}, H=12, T=16, d=64, bf16); one torch thread; "
              + ("medians of %d calls; quick run: not a result" % n if quick else
                 "each number the smallest of %d rounds' medians of %d calls (the rounds spread "
                 "over the run: a burst of load on the machine raises one round, not the result)"
                 % (rounds, n))),
        device=str(device), quick=quick, rows=rows, floor_us=floor,
        ratios_to_sdpa=ratios_to_sdpa(rows, floor))


def ratios_to_sdpa(rows, floor) -> dict:
    """Each cemlib row's full time, and the floor, over PyTorch's attention (``sdpa_untied``)
    in the same run (empty when that row is absent)."""
    base = next((r["full_us"] for r in rows if r["method"] == "sdpa_untied"), None)
    if not base:
        return {}
    out = {f"{r['method']} {r['path']}": round(r["full_us"] / base, 3) for r in rows
           if r["method"] != "sdpa_untied"}
    out["floor"] = round(floor / base, 3)
    return out


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="cem_v2 only, few repetitions (a check "
                                                        "that the script runs, not a result)")
    p.add_argument("--device", default="cpu", choices=("cpu", "cuda"),
                   help="cpu: the stand-in driver (default); cuda: a GPU's host, real launches")
    p.add_argument("--out", help="JSON path (default: tools/gpu/results/host_overhead_cpu.json, "
                                 "or host_overhead_<GPU>.json; an existing one is kept unless "
                                 "--replace)")
    p.add_argument("--replace", action="store_true")
    args = p.parse_args(argv)
    if args.device == "cuda" and not torch.cuda.is_available():
        sys.exit("--device cuda: no CUDA device")
    default = RESULTS / ("host_overhead_cpu.json" if args.device == "cpu" else
                         f"host_overhead_{device_slug(torch.cuda.get_device_name())}.json")
    announce(default, args.out, args.replace)
    payload = run(args.device, args.quick, argv)
    write_json(payload, default, args.out, args.replace)
    return payload


if __name__ == "__main__":
    main()
