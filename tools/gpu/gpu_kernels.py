"""Every GPU measurement of the kernels issue in one call (under 10 minutes on one H100), stage by
stage, each stage's JSON written as soon as the stage ends.

Stages, in order (``--stage`` picks some), each with a time budget in seconds (``--budget``):

``correctness`` (90)
    bf16 and fp16 against the float64 reference with the FlashAttention criterion (a result's
    error at most twice the same-dtype PyTorch reference's, plus a floor), output and every
    gradient: CEM attention (ALiBi, self/cross biases; and the default layer's call with the
    shared diagonal), the tied MLP step, each attention kernel in its default configuration
    (autotuning off: one compilation per shape, not a space); attention with direct launches
    against attention through Triton's launch path (bit for bit); every configuration of every
    attention autotune space
    (tiles, warps, stages), one kernel at a time (``every_config_v2``); and whether a CEM
    attention and MLP layer's forward+backward makes a synchronising CUDA call
    (``torch.cuda.set_sync_debug_mode``).
``autotune`` (100)
    ``triton.testing.do_bench`` sweeps: every ``triton.autotune`` of the attention module, run
    at each T of the timing table (the configurations' timings as Triton measured them), and the
    MLP element-wise kernels over ``BLOCK`` x ``num_warps`` (15 configurations, with a ``copy_``
    of the same bytes for the bandwidth reference).
``attention`` (110)
    the timing table (``bench_attention.measure``): SDPA untied and with k = v, CEM (``cem_v2``,
    and its atomic-dq backward), and the default layer's call, at T = 512...4096 (B = 8, H = 12,
    d = 64, bf16, causal), forward and forward+backward, with the time ratios.
``profile`` (60)
    ``torch.profiler`` of forward+backward at T = 512...4096: GPU kernel time against wall
    time, kernels and launch calls per call, the longest kernels; and the same call replayed from
    a CUDA graph (no host work per call), with the CEM v2 / SDPA ratios of the three times. Then
    where the host time goes on this GPU's host (``host``: ``host_overhead.py``'s rows with the
    real driver: each call whole, without its launches, its launches alone, against PyTorch's
    attention and an ``autograd.Function`` that only allocates).
``mlp`` (75)
    the tied MLP step against eager (``bench_mlp.measure``), time and peak memory, with the
    v2/eager ratios next to the target (time <= 1, memory <= 0.7) and the CPU prediction
    (``benchmarks/results/mlp_memory_cpu.json``), and v2 with ``dV``'s two products computed apart
    (``v2_separate_dv``: whether the ``addmm_`` accumulation is what D_h = 768 loses on); then
    v2 (both ways) and eager profiled side by side at each width as
    in ``profile`` (wall, kernel and CUDA-graph time; the longest kernels), which says whether a
    width where v2 misses (D_h = 768 on the H100) loses in its kernels or in host time.
``train`` (240)
    train-step tokens/s and MFU of Llama and CEM at T = 1 and T = 2 (``train_step.run``, bf16,
    ``torch.compile``, d = 768, 6 layers, context 256, batch 64), with the CEM/Llama ratios
    against the targets (T = 1: >= 0.9, T = 2: >= 0.55), and each model's GPU time per step by
    kernel family (two profiled steps: cemlib's Triton kernels, cuBLAS, Inductor, ...) and where
    their host time goes (the operators with the most self CPU time, cemlib's custom operators
    with their inclusive CPU time: ``train_step.host_summary``); then the
    three again compiled with CUDA graphs (``mode="reduce-overhead"``), which takes the host out
    of the step: the H100 run of 2026-11-27 found the CEM steps host-bound (CEM T = 1: 15.2 ms of
    GPU kernels in a 22.0 ms step; Llama: 18.1 in 18.8).

Each stage's JSON also records ``triton_cache``: how many kernels the stage compiled into
Triton's cache (a kernel already there, compiled by an earlier stage or carried by
``warm_cache.py``, is not compiled again), and how many the cache holds.

Each stage writes ``<out-dir>/gpu_<stage>_<device>.json`` (default ``tools/gpu/results/``; the
stored runs are in ``benchmarks/results/history/``); ``gpu_summary_<device>.json``
(rewritten after every stage) says what ran, how long it took, and what was skipped and why.
A stage whose file says it is done is skipped (so a call that was cut off resumes; ``--force``
redoes it). A stage starts only if half its budget fits in what is left of ``--total-s``
(default 570 s) and stops its own loops at its budget; what it could not reach is recorded as
skipped, never silently dropped. A stage that raises is recorded as failed, with its traceback,
and the next stage runs.

The CEM attention entry points come from ``benchmarks/bench_attention.py``'s
``IMPLEMENTATIONS`` (``v2``: ``cemlib.kernels.attention.tied_attention``, "not available" if it
cannot be imported). Method and check names keep the labels of the stored runs (``v2``, the
kernels' second generation, the only one since the first was removed).

``--dry-run``: on the CPU, Triton kernels under the interpreter, tiny shapes, a few repetitions
(the tests run it); files go to ``--out-dir`` (default: the temporary directory) and are marked
"dry run (not a result)".

Usage: ``python tools/gpu/gpu_kernels.py [--stage attention mlp] [--force]`` or
``bash tools/gpu/run_gpu.sh``.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
import tempfile
import time
import traceback
import warnings

HERE = os.path.dirname(os.path.abspath(__file__))
REPOSITORY = os.path.dirname(os.path.dirname(HERE))
BENCHMARKS = os.path.join(REPOSITORY, "benchmarks")
sys.path.insert(0, BENCHMARKS)  # bench_attention, bench_mlp, train_step, common
sys.path.insert(0, HERE)
sys.path.insert(0, REPOSITORY)
DRY = "--dry-run" in sys.argv
if DRY:  # before anything imports triton
    os.environ["TRITON_INTERPRET"] = "1"

import common  # noqa: E402

CUDA = common.setup_cpu_interpreter() and not DRY

import torch  # noqa: E402

import bench_attention  # noqa: E402
import bench_mlp  # noqa: E402
import train_step  # noqa: E402
import warm_cache  # noqa: E402
from cemlib.kernels import gated_mlp, reference  # noqa: E402

STAGES = ("correctness", "autotune", "attention", "profile", "mlp", "train")
BUDGET_S = {"correctness": 90, "autotune": 100, "attention": 110, "profile": 60, "mlp": 75,
            "train": 240}
TOTAL_S = 570
MLP_TIME_TARGET, MLP_MEMORY_TARGET = 1.0, bench_mlp.MEMORY_TARGET

#: Shapes and repetitions: the issue's setting on a GPU, tiny ones for the dry run.
SETTINGS = {
    "gpu": dict(
        dtypes=(torch.bfloat16, torch.float16), rep=100,
        attention=dict(B=8, H=12, d=64, Ts=[512, 1024, 2048, 4096], dtype=torch.bfloat16),
        methods=("sdpa_untied", "sdpa_tied", "cem_v2", "cem_v2_atomic", "cem_diag_v2",
                 "cem_diag_v2_atomic"),
        check_attention=[(2, 3, 37, 64), (1, 12, 256, 64), (1, 2, 1000, 48), (2, 1, 129, 128)],
        check_diag=[(2, 4, 200, 64)], check_mlp=[(37, 96, 200), (512, 768, 2048)],
        check_every_config=(2, 4, 200, 64), every_config_limit=None,
        profile_Ts=[512, 1024, 2048, 4096], profile_iters=10,
        sweep_n=8192 * 3072, sweep_blocks=(512, 1024, 2048, 4096), sweep_warps=(1, 2, 4, 8),
        sweep_rep=25,
        mlp=dict(N=bench_mlp.GPU_N, widths=bench_mlp.GPU_WIDTHS),
        train=dict(widths=[768], Ts=[1, 2], layers=6, context=256, head_dim=64, batch=64,
                   warmup=3, iters=20, compile=True, modes=[None, "reduce-overhead"])),
    "dry": dict(
        dtypes=(torch.float16,), rep=2,
        attention=dict(B=1, H=2, d=16, Ts=[16], dtype=torch.float32),
        methods=("sdpa_untied", "sdpa_tied", "cem_v2", "cem_v2_atomic", "cem_diag_v2_atomic"),
        check_attention=[(1, 2, 13, 16)], check_diag=[(1, 2, 9, 16)], check_mlp=[(5, 12, 40)],
        check_every_config=(1, 2, 40, 16), every_config_limit=2,
        profile_Ts=[16], profile_iters=2,
        sweep_n=4096, sweep_blocks=(1024, 4096), sweep_warps=(4,), sweep_rep=2,
        mlp=dict(N=32, widths=[16]),
        train=dict(widths=[32], Ts=[1, 2], layers=1, context=16, head_dim=16, batch=2,
                   warmup=1, iters=2, compile=False, modes=[None])),
}


# ---------------------------------------------------------------- correctness

def _outputs_and_grads(fn, inputs, kwargs, seed=1):
    """Outputs of ``fn(*inputs, **kwargs)`` and the gradients of a random projection of them."""
    leaves = [x.clone().requires_grad_() for x in inputs]
    outs = fn(*leaves, **kwargs)
    outs = outs if isinstance(outs, tuple) else (outs,)
    g = torch.Generator(device=outs[0].device).manual_seed(seed)
    loss = sum((o.double() * torch.randn(o.shape, generator=g, device=o.device,
                                         dtype=torch.float64)).sum() for o in outs)
    loss.backward()
    return list(outs) + [x.grad for x in leaves]


def _rel_err(a, b):
    a, b = a.detach().double(), b.detach().double()
    return ((a - b).abs().max() / b.abs().max().clamp_min(1e-30)).item()


def flash_criterion(fn, ref, inputs, kwargs, dtype, names, floor=1e-3) -> dict:
    """Errors against float64 of ``fn`` and of ``ref`` in ``dtype`` for every output and input
    gradient (``names``), and whether ``fn``'s is at most twice ``ref``'s plus ``floor``."""
    low = [x.to(dtype) for x in inputs]
    got = _outputs_and_grads(fn, low, kwargs)
    exact = _outputs_and_grads(ref, [x.double() for x in low], kwargs)
    same = [_rel_err(r, e) for r, e in zip(_outputs_and_grads(ref, low, kwargs), exact)]
    rows = _criterion_rows(names, got, same, exact, floor)
    return {"passed": all(r["passed"] for r in rows), "floor": floor, "errors": rows}


def _criterion_rows(names, got, reference_errors, exact, floor) -> list[dict]:
    """Per output or gradient: the error of ``got`` against ``exact`` (float64), the same-dtype
    reference's error, and whether the first is at most twice the second plus ``floor``."""
    rows = []
    for name, a, er, e in zip(names, got, reference_errors, exact):
        ea = _rel_err(a, e)
        rows.append(dict(name=name, kernel_error=ea, reference_error=er,
                         passed=ea <= 2 * er + floor))
    return rows


def correctness(s, device, deadline):
    checks, availability = [], {}

    def record(what, shape, dtype, run):
        if time.monotonic() > deadline:
            checks.append(dict(check=what, shape=shape, dtype=str(dtype),
                               skipped="out of the stage's time budget"))
            return
        try:
            checks.append(dict(check=what, shape=shape, dtype=str(dtype), **run()))
        except Exception as err:  # a failing check is a result, not the end of the stage
            checks.append(dict(check=what, shape=shape, dtype=str(dtype), passed=False,
                               error=f"{type(err).__name__}: {err}"))
        print(what, shape, dtype, checks[-1].get("passed", checks[-1].get("skipped")), flush=True)

    shape = direct_launch_shape(s)
    record("direct_launch_v2", list(shape), s["dtypes"][0],
           lambda: direct_launch_check(device, s["dtypes"][0], shape))
    with default_configurations():
        _shape_checks(s, device, record, availability)
    if availability.get("attention_v2", {}).get("available"):
        record("every_config_v2", list(s["check_every_config"]), s["dtypes"][0],
               lambda: every_config_check(device, s["dtypes"][0], s["check_every_config"],
                                          s["every_config_limit"], deadline))
    return {"checks": checks, "implementations": availability,
            "configurations": CHECK_CONFIGURATIONS,
            "passed": all(c.get("passed", True) for c in checks),
            "sync": sync_check(device)}


#: How the shape checks choose the v2 kernels' configurations (recorded in the stage's JSON).
CHECK_CONFIGURATIONS = (
    "shape checks: each v2 kernel's default configuration (autotuning off, as with "
    "CEMLIB_AUTOTUNE=0: the first entry of its space that compiles without spilling); "
    "every_config_v2: every configuration of every space, on one shape")


@contextlib.contextmanager
def default_configurations():
    """The v2 kernels without autotuning, for the shape checks: the autotuner would compile and
    time the whole space of each kernel (19-30 configurations) at every new shape, dtype and head
    width. Counted without a GPU (``benchmarks/results/history/compile_requests_cpu.json``), the
    shape checks asked Triton for 1254 compilations with the autotuner and 102 without; most of
    the first H100 run's 191 s in this stage was compiling. Correctness per configuration is
    :func:`every_config_check`'s (one shape, every configuration); correctness per shape is
    checked here with the default one, which is what ``CEMLIB_AUTOTUNE=0`` runs."""
    try:
        from cemlib.kernels import attention
    except ImportError:  # no Triton: nothing is autotuned
        yield
        return
    tuning = attention.TUNING
    autotune, tuning.autotune = tuning.autotune, False
    try:
        yield
    finally:
        tuning.autotune = autotune


def error_recorder(errors: list):
    """A ``record(what, shape, dtype, run)`` for :func:`_shape_checks` that only runs each check
    and keeps its exception, if any, as a line in ``errors`` (for scripts that replay the checks'
    kernel calls without judging their results: ``warm_cache.py``)."""
    def record(what, shape, dtype, run):
        try:
            run()
        except Exception as err:  # noqa: BLE001 - reported; the other calls still run
            errors.append(f"{what} {shape} {dtype}: {type(err).__name__}: {err}"[:300])
    return record


def _shape_checks(s, device, record, availability):
    """CEM attention and its atomic-dq backward against float64 (the plain call and the default
    layer's), and the tied MLP step, in every dtype of ``s``."""
    for impl in ("v2", "v2_atomic"):
        fn, availability[f"attention_{impl}"] = bench_attention.implementation(impl)
        if fn is None:
            continue
        for dtype in s["dtypes"]:
            for B, K, L, D in s["check_attention"]:
                g = torch.Generator(device=device).manual_seed(0)
                q, kv = torch.randn(2, B, K, L, D, generator=g, device=device, dtype=torch.float64)
                sb, cb = torch.randn(2, K, generator=g, device=device, dtype=torch.float64)
                kw = dict(scale=D ** -0.5, alibi=reference.alibi_slopes(K).to(device))
                record(f"attention_{impl}", [B, K, L, D], dtype, lambda fn=fn: flash_criterion(
                    lambda q, kv, sb, cb, **k: fn(q, kv, self_bias=sb, cross_bias=cb, **k),
                    lambda q, kv, sb, cb, **k: reference.tied_attention(
                        q, kv, self_bias=sb, cross_bias=cb, **k),
                    [q, kv, sb, cb], kw, dtype,
                    ["o", "lse", "dq", "dkv", "dself_bias", "dcross_bias"]))
            for B, K, L, D in s["check_diag"]:  # the default layer: shared diagonal, head sum
                g = torch.Generator(device=device).manual_seed(1)
                q, kv = torch.randn(2, B, K, L, D, generator=g, device=device, dtype=torch.float64)
                qe, ke = 0.3 * torch.randn(2, B, L, K * D, generator=g, device=device,
                                           dtype=torch.float64)
                kw = dict(scale=D ** -0.5, alibi=reference.alibi_slopes(K).to(device),
                          extra_values=True, extra_head_sum=True)
                record(f"attention_diag_{impl}", [B, K, L, D, K * D], dtype,
                       lambda fn=fn: flash_criterion(
                           lambda q, kv, qe, ke, **k: fn(q, kv, q_extra=qe, k_extra=ke, **k),
                           lambda q, kv, qe, ke, **k: reference.tied_attention(
                               q, kv, q_extra=qe, k_extra=ke, **k),
                           [q, kv, qe, ke], kw, dtype,
                           ["o", "lse", "o_extra", "dq", "dkv", "dq_extra", "dk_extra"]))
    for impl, fn in bench_mlp.step_methods(False, ("v2",)).items():
        for dtype in s["dtypes"]:
            for N, Dh, Dv in s["check_mlp"]:
                inputs, _ = bench_mlp.step_inputs(N, Dh, Dv, torch.float64, device, seed=2)
                record(f"mlp_{impl}", [N, Dh, Dv], dtype, lambda fn=fn, inputs=inputs:
                       flash_criterion(fn, reference.tied_gated_mlp_step, inputs, {}, dtype,
                                       ["y", "du", "dV", "dgamma"]))


def every_config_check(device, dtype, shape, limit, deadline, gpu_options=None) -> dict:
    """Every configuration of every v2 autotune space at head width 64 (``GPU_CONFIGS``: tiles,
    warps and stages; the atomic-dq backward's too), one kernel at a time, on the call that
    runs all six kernels (ALiBi, self/cross biases, the shared pair with head-summed values),
    against float64 with the FlashAttention criterion. The interpreter checks every tile size
    (``tests/kernels/test_kernels_attention.py``) but ignores warps and stages, which change the
    compiled code;
    a GPU run otherwise checks only what its autotuner chose. One autotuned call first compiles
    the spaces (in parallel); each configuration then launches from Triton's cache. ``limit``:
    the first configurations of each space only (the dry run). ``gpu_options``: pass warps and
    stages with each configuration (default: on CUDA only; the interpreter ignores them)."""
    from cemlib.kernels import attention as v2
    gpu_options = device.type == "cuda" if gpu_options is None else gpu_options
    B, K, L, D = shape
    g = torch.Generator(device=device).manual_seed(5)
    q, kv = torch.randn(2, B, K, L, D, generator=g, device=device, dtype=torch.float64)
    qe, ke = 0.3 * torch.randn(2, B, L, K * D, generator=g, device=device, dtype=torch.float64)
    sb, cb = torch.randn(2, K, generator=g, device=device, dtype=torch.float64)
    kw = dict(scale=D ** -0.5, alibi=reference.alibi_slopes(K).to(device), extra_values=True,
              extra_head_sum=True)
    names = ["o", "lse", "o_extra", "dq", "dkv", "dq_extra", "dk_extra", "dself", "dcross"]
    inputs = [q, kv, qe, ke, sb, cb]

    def call(fn, atomic=False):
        extra = {"atomic_dq": atomic} if fn is v2.tied_attention else {}
        return lambda q, kv, qe, ke, sb, cb, **k: fn(q, kv, q_extra=qe, k_extra=ke,
                                                    self_bias=sb, cross_bias=cb, **k, **extra)
    low = [x.to(dtype) for x in inputs]
    exact = _outputs_and_grads(call(reference.tied_attention), [x.double() for x in low], kw)
    same = [_rel_err(r, e) for r, e in zip(_outputs_and_grads(
        call(reference.tied_attention), low, kw), exact)]
    _outputs_and_grads(call(v2.tied_attention), low, kw)              # compiles the spaces
    _outputs_and_grads(call(v2.tied_attention, True), low, kw)
    rows = []
    spaces = [(n, n, False) for n in ("fwd", "pre", "bwd", "headsum", "extra_grads")]
    spaces.append(("bwd", "bwd_atomic", True))
    for name, table, atomic in spaces:
        configs = v2.TUNING.configs(table, 64)[:limit]
        for i, cfg in enumerate(configs):
            if time.monotonic() > deadline:
                rows.append(dict(space=table, index=i, skipped="out of the stage's time budget"))
                continue
            cfg = {k: v for k, v in cfg.items() if gpu_options or k.startswith("BLOCK")}
            try:
                with v2.use_configs(**{name: cfg}):
                    got = _outputs_and_grads(call(v2.tied_attention, atomic), low, kw)
                errors = _criterion_rows(names, got, same, exact, 1e-3)
                bad = [e["name"] for e in errors if not e["passed"]]
                rows.append(dict(space=table, index=i, config=cfg, passed=not bad, failed=bad,
                                 worst_error=max(e["kernel_error"] for e in errors)))
            except Exception as err:  # a configuration that fails is a result
                rows.append(dict(space=table, index=i, config=cfg, passed=False,
                                 error=f"{type(err).__name__}: {err}"[:300]))
    checked = [r for r in rows if "passed" in r]
    return {"passed": all(r["passed"] for r in checked), "checked": len(checked),
            "skipped": len(rows) - len(checked), "floor": 1e-3, "configurations": rows}


def direct_launch_shape(s) -> tuple:
    """The shape of :func:`direct_launch_check`'s call: the settings' second attention check (a
    plain call with all heads of the default width), the first where there is one."""
    return s["check_attention"][1 if len(s["check_attention"]) > 1 else 0]


def direct_launch_check(device, dtype, shape) -> dict:
    """Attention forward+backward with direct launches (:func:`cemlib.kernels.runtime.launch`)
    and through Triton's own launch path: the same compiled kernels given the same arguments, so
    outputs and gradients must be equal bit for bit (the default backward has no atomics)."""
    from cemlib.kernels import runtime
    fn, _ = bench_attention.implementation("v2")
    B, K, L, D = shape
    g = torch.Generator(device=device).manual_seed(3)
    q, kv = torch.randn(2, B, K, L, D, generator=g, device=device, dtype=dtype)
    sb, cb = torch.randn(2, K, generator=g, device=device)
    alibi = reference.alibi_slopes(K).to(device)

    def run():
        return _outputs_and_grads(lambda q, kv, sb, cb: fn(q, kv, scale=D ** -0.5, alibi=alibi,
                                                          self_bias=sb, cross_bias=cb),
                                  [q, kv, sb, cb], {})
    previous = runtime._enabled[0]
    try:  # each kernel's default configuration: no tuning here
        with default_configurations():
            runtime._enabled[0] = True
            run()
            direct = run()              # launched from the direct path's cache
            cached = len(runtime._compiled)
            runtime._enabled[0] = False
            through_triton = run()
    finally:
        runtime._enabled[0] = previous
    same = [torch.equal(a, b) for a, b in zip(direct, through_triton)]
    return {"passed": all(same), "bitwise_equal": same, "cached_kernels": cached,
            "direct_used": runtime.enabled() and device.type == "cuda"}


def synchronising_calls(messages) -> list[str]:
    """The warnings of ``torch.cuda.set_sync_debug_mode("warn")`` that report a synchronising call
    ("called a synchronizing CUDA operation"), first 200 characters each. The mode's own notice
    ("Synchronization debug mode is a prototype feature ...", once per process) is not one: the H100
    run of 2026-11-25 counted it, and reported one synchronising call in the CEM attention layer
    (the first layer checked) that the CUDA no-sync tests, in "error" mode, do not find."""
    return [m[:200] for m in messages if "called a synchronizing" in m.lower()]


def sync_check_calls(device):
    """The sync check's calls: ``(name, forward+backward)`` of a default CEM attention and MLP
    layer at d = 768 on 4 x 256 tokens under bf16 autocast (``warm_cache.py`` replays them, so
    that the kernels they compile, autotune spaces included, are carried to the GPU)."""
    from cemlib.layers.cem_attention import CEMAttention
    from cemlib.layers.cem_mlp import CEMMLP
    for name, layer in (("cem_attention", CEMAttention(768, 12)), ("cem_mlp", CEMMLP(768, 2048))):
        layer = layer.to(device)
        x = torch.randn(4, 256, 768, device=device, requires_grad=True)

        def call(layer=layer, x=x):
            with torch.autocast(device.type, dtype=torch.bfloat16):
                y = layer(x)
            y.float().sum().backward()
        yield name, call


def sync_check(device) -> dict:
    """Synchronising CUDA calls in the forward+backward of a default CEM attention and MLP layer
    under bf16 autocast (``torch.cuda.set_sync_debug_mode``: a warning per call)."""
    if device.type != "cuda":
        return {"skipped": "CUDA only"}
    out = {}
    for name, call in sync_check_calls(device):
        call()  # warm-up: compiles the kernels
        torch.cuda.synchronize()
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            torch.cuda.set_sync_debug_mode("warn")
            try:
                call()
            finally:
                torch.cuda.set_sync_debug_mode(0)
        syncs = synchronising_calls(str(w.message) for w in caught)
        out[name] = {"synchronising_calls": len(syncs), "messages": syncs[:5]}
    return out


# ---------------------------------------------------------------- autotune

def _autotuners(module) -> dict:
    """The module's ``triton.autotune`` kernels: module-level ones, and those its
    :class:`cemlib.kernels.runtime.Tuning` (``module.TUNING``) builds at the first call and keeps
    in ``tuners`` (one per kernel and padded head width), named ``kernel`` or ``kernel@key``."""
    from triton.runtime.autotuner import Autotuner
    out = {name: obj for name, obj in vars(module).items() if isinstance(obj, Autotuner)}
    for key, obj in dict(getattr(getattr(module, "TUNING", None), "tuners", None) or {}).items():
        if isinstance(obj, Autotuner):
            out["@".join(map(str, key)) if isinstance(key, tuple) else str(key)] = obj
    return out


def _config(c) -> dict:
    return {"kwargs": dict(c.kwargs), "num_warps": c.num_warps, "num_stages": c.num_stages}


def autotune(s, device, deadline):
    out = {"attention_v2": attention_v2_sweep(s, device, deadline)}
    out["mlp_elementwise"] = mlp_elementwise_sweep(s, device, deadline)
    return out


def attention_v2_sweep(s, device, deadline) -> dict:
    """Run attention v2 forward+backward at each T; read every ``triton.autotune`` of its module:
    the configurations' timings (``do_bench`` medians, ms) and the best, per tuning key."""
    import importlib
    fn, record = bench_attention.implementation("v2")
    if fn is None:
        return record
    a = s["attention"]
    module = importlib.import_module(bench_attention.IMPLEMENTATIONS["v2"][0])
    seen, sweeps = {}, []   # the tuners appear at the module's first call: looked up after each call
    for T in a["Ts"]:
        if time.monotonic() > deadline:
            sweeps.append({"T": T, "skipped": "out of the stage's time budget"})
            continue
        x = bench_attention.attention_inputs(a["B"], a["H"], T, a["d"], a["H"] * a["d"],
                                             a["dtype"], device)
        for name in ("cem_v2", "cem_diag_v2"):
            method, inputs, _ = bench_attention.method(
                name, x, a["d"] ** -0.5,
                reference.alibi_slopes(a["H"]).to(device=device, dtype=torch.float32), T, device)
            calls, _ = bench_attention.fwd_and_fwd_bwd(method, inputs, x["do"], x["doe"])
            t0 = time.monotonic()
            calls["fwd_bwd"]()
            for kernel, tuner in _autotuners(module).items():
                for key in set(tuner.cache) - seen.setdefault(kernel, set()):
                    seen[kernel].add(key)
                    timings = getattr(tuner, "configs_timings", None) or {}
                    sweeps.append(dict(
                        T=T, method=name, kernel=kernel, key=str(key),
                        best=_config(tuner.cache[key]),
                        timings_ms=[dict(config=_config(c), median_ms=(t[0] if isinstance(
                            t, (list, tuple)) else t)) for c, t in timings.items()]))
            print("autotune v2", name, T, f"{time.monotonic() - t0:.1f} s", flush=True)
    if not seen:
        return {**record, "sweeps": sweeps,
                "note": "no triton.autotune kernel ran (the interpreter, CEMLIB_AUTOTUNE=0, or fixed "
                        "configurations: attention.use_configs)"}
    return {**record, "kernels": sorted(seen), "sweeps": sweeps}


def mlp_elementwise_sweep(s, device, deadline) -> dict:
    """The two MLP element-wise kernels over ``BLOCK`` x ``num_warps`` (2 to 64 entries a thread),
    bf16 on a GPU, with a ``copy_`` of the same bytes as the bandwidth reference."""
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float16
    n = s["sweep_n"]
    h, gamma, da, a = (torch.randn(n, device=device, dtype=dtype) for _ in range(4))
    src, dst = torch.empty(3 * n, device=device, dtype=dtype), torch.empty(3 * n, device=device,
                                                                         dtype=dtype)
    copy_ms = common.bench(lambda: dst.copy_(src), device, s["sweep_rep"])["median_ms"]
    bytes_copy = 2 * 3 * n * dtype.itemsize
    rows = []
    for block in s["sweep_blocks"]:
        for warps in s["sweep_warps"]:
            per_thread = block // (32 * warps)
            if not 2 <= per_thread <= 64:
                continue
            cfg = dict(BLOCK=block, num_warps=warps)
            for kernel, fn, nbytes in (
                    ("_silu_gate_kernel", lambda: gated_mlp.silu_gate(h, gamma, a, cfg),
                     3 * n * dtype.itemsize),
                    ("_silu_gate_bwd_kernel",  # overwrites da each call; timing is value-blind
                     lambda: gated_mlp.silu_gate_backward(h, gamma, da, cfg),
                     5 * n * dtype.itemsize)):
                if time.monotonic() > deadline:
                    rows.append(dict(kernel=kernel, **cfg, skipped="out of the stage's budget"))
                    continue
                ms = common.bench(fn, device, s["sweep_rep"])["median_ms"]
                rows.append(dict(kernel=kernel, **cfg, elements_per_thread=per_thread,
                                 median_ms=ms, gb_per_s=nbytes / ms / 1e6,
                                 default=cfg == gated_mlp.ELEMENTWISE))
    best = {}
    for r in rows:
        if "median_ms" in r and (r["kernel"] not in best
                                 or r["median_ms"] < best[r["kernel"]]["median_ms"]):
            best[r["kernel"]] = r
    return {"n": n, "dtype": str(dtype), "copy_reference": dict(
                bytes=bytes_copy, median_ms=copy_ms, gb_per_s=bytes_copy / copy_ms / 1e6),
            "default": dict(gated_mlp.ELEMENTWISE), "rows": rows, "best": best}


# ---------------------------------------------------------------- attention, profile, mlp, train

def attention(s, device, deadline):
    a = s["attention"]
    peak = common.measured_peak_tflops(device)
    results, availability = bench_attention.measure(
        a["Ts"], a["B"], a["H"], a["d"], a["H"] * a["d"], a["dtype"], device, s["rep"],
        peak["tflops"], names=s["methods"], deadline=deadline)
    return {"peak_gemm": peak, "implementations": availability, "results": results,
            "time_ratios": bench_attention.time_ratios(results),
            "target": "cem_v2 / sdpa_untied fwd_bwd <= 1.0 at T >= 1024 (stretch 0.85)"}


def profile(s, device, deadline):
    """GPU kernel time vs wall time of one forward+backward, per method and T."""
    a, iters = s["attention"], s["profile_iters"]
    rows = []
    for T in s["profile_Ts"]:
        x = bench_attention.attention_inputs(a["B"], a["H"], T, a["d"], a["H"] * a["d"],
                                             a["dtype"], device)
        slopes = reference.alibi_slopes(a["H"]).to(device=device, dtype=torch.float32)
        for name in s["methods"]:
            if time.monotonic() > deadline:
                rows.append(dict(method=name, T=T, skipped="out of the stage's time budget"))
                continue
            fn, inputs, record = bench_attention.method(name, x, a["d"] ** -0.5, slopes, T, device)
            if fn is None:
                rows.append(dict(method=name, T=T, **record))
                continue
            calls, _ = bench_attention.fwd_and_fwd_bwd(fn, inputs, x["do"], x["doe"])
            rows.append(dict(method=name, T=T, B=a["B"], H=a["H"], d=a["d"], dtype=str(a["dtype"]),
                             **profiled_call(calls["fwd_bwd"], iters, device,
                                             graphed=name in GRAPHED)))
            _print_profile("profile", name, T, rows[-1])
    return {"iters": iters, "rows": rows, "ratios": profile_ratios(rows),
            "host": host_time(device, deadline)}


#: calls per median and rounds of the host-time measurement on a GPU (``host_overhead.run``):
#: about 15 s on the H100's host
HOST_CALLS, HOST_ROUNDS = 200, 3


def host_time(device, deadline) -> dict:
    """Where a call's host time goes on this GPU's host: ``tools/gpu/host_overhead.py``'s rows
    (PyTorch's attention, CEM v2 plain, atomic and with the shared diagonal, the MLP step; each
    whole, without its launches, its launches alone, and one backward launch taken apart) with
    the real driver, at a tiny shape (a call's time is then its host time). The H100 run of
    2026-11-27 measured the CEM v2 call at 0.51 ms of wall time where the CPU measurement of the
    same path predicted about 0.25 ms: this says which part grows on the GPU's host."""
    if device.type != "cuda":
        return {"skipped": "CUDA only (on the CPU, tools/gpu/host_overhead.py measures the "
                           "same rows with a stand-in driver)"}
    if time.monotonic() > deadline - 15:
        return {"skipped": "out of the stage's time budget"}
    import host_overhead  # here only: it sets TRITON_INTERPRET=0 (never on the CPU's dry run)
    return host_overhead.run(device, n=HOST_CALLS, rounds=HOST_ROUNDS)


def profiled_call(call, iters, device, graphed=False) -> dict:
    """Wall time and GPU kernel time of ``call`` (a forward+backward; already run once), side by
    side: ``wall_ms`` per call of a plain loop, ``kernel_ms`` the GPU kernels' total per call
    under ``torch.profiler`` (their share of the wall time says how long the GPU waited for the
    host), the kernels, launch calls and ``aten`` operators per call, the longest kernels, and
    with ``graphed`` the call replayed from a CUDA graph (no host work per call)."""
    from torch.autograd import DeviceType
    from torch.profiler import ProfilerActivity
    from torch.profiler import profile as torch_profile
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    for _ in range(3):
        call()
    sync()
    t0 = time.perf_counter()
    for _ in range(iters):
        call()
    sync()
    wall_ms = 1e3 * (time.perf_counter() - t0) / iters
    with torch_profile(activities=activities) as prof:
        for _ in range(iters):
            call()
        sync()
    graphed_ms, graph_error = None, None
    if device.type == "cuda" and graphed:
        try:
            graphed_ms = graphed_call_ms(call, iters)
        except Exception as err:  # recorded, not fatal: the other columns stand
            graph_error = f"{type(err).__name__}: {err}"[:300]
    events = prof.events()
    per_kernel, kernels = common.cuda_kernel_times(events)
    kernel_ms = sum(per_kernel.values()) / 1e3 / iters
    return dict(
        wall_ms=wall_ms, kernel_ms=kernel_ms if kernels else None,
        kernel_over_wall=kernel_ms / wall_ms if kernels else None,
        graphed_ms=graphed_ms, **({"graph_error": graph_error} if graph_error else {}),
        kernels_per_call=kernels / iters,
        launch_calls_per_call=sum(1 for e in events if "LaunchKernel" in e.name) / iters,
        cpu_ops_per_call=sum(1 for e in events if e.device_type == DeviceType.CPU
                             and e.name.startswith("aten::")) / iters,
        longest_kernels=[dict(name=k[:120], us_per_call=v / iters) for k, v in sorted(
            per_kernel.items(), key=lambda kv: -kv[1])[:6]])


def _print_profile(stage, name, size, row):
    print(stage, name, size, f"wall {row['wall_ms']:.3f} ms", f"kernels {row['kernel_ms']}",
          f"graphed {row['graphed_ms']}", f"{row['kernels_per_call']} kernels/call",
          row.get("graph_error", ""), flush=True)


#: the methods the profile stage also replays from a CUDA graph (the first version is left out)
GRAPHED = ("sdpa_untied", "sdpa_tied", "cem_v2", "cem_v2_atomic", "cem_diag_v2", "cem_diag_v2_atomic")


def graphed_call_ms(fn, iters):
    """Milliseconds per call of ``fn`` (a forward+backward) replayed from a CUDA graph: the same
    kernels with no host work per call, so that wall and graphed time side by side separate the
    host's share from the GPU's. Warm-up on a side stream (autotuning, allocations) before the
    capture, as PyTorch's whole-network capture does; the gradients accumulate into the leaves'
    ``.grad`` inside the graph as in eager."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(3):
            fn()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fn()
    graph.replay()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(iters):
        graph.replay()
    torch.cuda.synchronize()
    return 1e3 * (time.perf_counter() - t0) / iters


def profile_ratios(rows) -> dict:
    """Per T, CEM v2 (walk and atomic) over SDPA untied: wall time, GPU kernel time, and the
    time of the call replayed from a CUDA graph (where measured)."""
    return _profiled_ratios(rows, "T", "sdpa_untied", lambda m: m.startswith("cem_v2"))


def _profiled_ratios(rows, size, base, compared) -> dict:
    """``{"<method> / <base> <size>=<value>": {"wall": .., "kernel": .., "graphed": ..}}`` for
    the profiled ``rows`` of each method where ``compared(method)``, against the ``base``
    method's row of the same ``size`` (a column only where both rows have it)."""
    out = {}
    by = {(r["method"], r[size]): r for r in rows if "wall_ms" in r}
    for (method, value), r in by.items():
        ref = by.get((base, value))
        if not compared(method) or ref is None:
            continue
        out[f"{method} / {base} {size}={value}"] = {
            col.replace("_ms", ""): r[col] / ref[col] for col in ("wall_ms", "kernel_ms",
                                                                  "graphed_ms")
            if r.get(col) and ref.get(col)}
    return out


def mlp(s, device, deadline):
    peak = common.measured_peak_tflops(device)
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    results = bench_mlp.measure(s["mlp"]["N"], s["mlp"]["widths"], dtype, device, s["rep"],
                                peak["tflops"],
                                bench_mlp.step_methods(False, ("v2", "v2_separate_dv", "eager")),
                                deadline=deadline)
    ratios = bench_mlp.ratios(results)
    verdict = {k: {"time_met": v.get("time", float("inf")) <= MLP_TIME_TARGET,
                   "memory_met": v.get("memory", float("inf")) <= MLP_MEMORY_TARGET}
               for k, v in ratios.items() if k.endswith("fwd_bwd")}
    profiled = mlp_profile(s, device, dtype, deadline)
    predicted = os.path.join(BENCHMARKS, "results", "mlp_memory_cpu.json")
    prediction = None
    if os.path.exists(predicted):
        with open(predicted) as f:
            prediction = json.load(f).get("v2_over_eager_peak")
    return {"peak_gemm": peak, "results": results, "v2_over_eager": ratios,
            "v2_separate_dv_over_eager": bench_mlp.ratios(results, "v2_separate_dv"),
            "targets": {"time": MLP_TIME_TARGET, "memory": MLP_MEMORY_TARGET}, "verdict": verdict,
            "cpu_predicted_memory_ratio": prediction, "profile": profiled}


def mlp_profile(s, device, dtype, deadline) -> dict:
    """The tied MLP step v2 and eager, forward+backward, profiled side by side at every width
    (:func:`profiled_call`): whether a width where v2 misses the time target loses in its
    kernels (a GEMM shape cuBLAS handles worse in v2's layout, an element-wise kernel) or in
    host time (the GPU waiting between launches), and which kernels take the time."""
    m, iters = s["mlp"], s["profile_iters"]
    methods = bench_mlp.step_methods(False, ("v2", "v2_separate_dv", "eager"))
    rows = []
    for Dh in m["widths"]:
        inputs, dy = bench_mlp.step_inputs(m["N"], Dh, bench_mlp.MULT * Dh, dtype, device)
        for name, fn in methods.items():
            if time.monotonic() > deadline:
                rows.append(dict(method=name, D_h=Dh, skipped="out of the stage's time budget"))
                continue
            fns, _ = bench_mlp.calls(fn, inputs, dy)
            rows.append(dict(method=name, N=m["N"], D_h=Dh, D_v=bench_mlp.MULT * Dh,
                             dtype=str(dtype), **profiled_call(fns["fwd_bwd"], iters, device,
                                                               graphed=True)))
            _print_profile("mlp profile", name, Dh, rows[-1])
    return {"iters": iters, "rows": rows,
            "ratios": _profiled_ratios(rows, "D_h", "eager", lambda m: m.startswith("v2"))}


def train(s, device, deadline):
    t = s["train"]
    gpu = device.type == "cuda"
    peak = None
    if gpu:
        from cemlib.train.flops import measure_peak_flops
        peak = measure_peak_flops(device)
    configs = train_step.model_configs(t["widths"], t["Ts"], vocab=65, context=t["context"],
                                       layers=t["layers"], head_dim=t["head_dim"])
    rows = []
    for mode in t["modes"] if t["compile"] and gpu else [None]:
        rows += train_step.run(configs, batch=t["batch"], device=device, bf16=gpu,
                               compile_=t["compile"] and gpu, warmup=t["warmup"],
                               iters=t["iters"], peak=peak, deadline=deadline, profile=gpu,
                               compiled=triton_compiled, compile_mode=mode)
    return {"settings": {k: v for k, v in t.items()}, "peak_flops": peak,
            "peak_source": "measured bf16 8192^3 matmul" if gpu else None,
            "dtype": "bf16-autocast" if gpu else "float32", "rows": rows,
            "cem_over_llama": train_step.ratios_to_llama(rows)}


RUNNERS = {"correctness": correctness, "autotune": autotune, "attention": attention,
           "profile": profile, "mlp": mlp, "train": train}


# ---------------------------------------------------------------- driver

def triton_compiled() -> int | None:
    """Kernels compiled so far into Triton's cache directory (``warm_cache.compiled``), or None
    without Triton or under the interpreter (nothing compiles)."""
    if DRY or not CUDA:
        return None
    try:
        return warm_cache.compiled()
    except ImportError:
        return None


def stage_path(out_dir, stage, slug):
    return os.path.join(out_dir, f"gpu_{stage}_{slug}.json")


def _done(path) -> bool:
    try:
        with open(path) as f:
            return json.load(f).get("status") == "done"
    except (OSError, ValueError):
        return False


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--stage", nargs="+", choices=STAGES, help="run only these stages")
    p.add_argument("--force", action="store_true", help="re-run stages whose JSON says done")
    p.add_argument("--total-s", type=float, default=TOTAL_S, help="time for the whole call")
    p.add_argument("--budget", nargs="+", default=[], metavar="STAGE=S",
                   help="a stage's budget in seconds, e.g. train=240")
    p.add_argument("--rep", type=int, help="do_bench repetition time (ms) / CPU repetitions")
    p.add_argument("--out-dir", help="where the JSON go (default: tools/gpu/results/, dry run: "
                                     "the temporary directory)")
    p.add_argument("--dry-run", action="store_true",
                   help="CPU, interpreter, tiny shapes: checks the script runs (not a result)")
    args = p.parse_args(argv)
    if args.dry_run != DRY:
        sys.exit("--dry-run must be on the command line (it is read before triton is imported)")
    start = time.monotonic()
    if not DRY and not CUDA:
        sys.exit("needs a CUDA GPU; --dry-run runs it on the CPU")
    device = torch.device("cuda" if CUDA else "cpu")
    s = dict(SETTINGS["dry" if DRY else "gpu"])
    if args.rep:
        s["rep"] = args.rep
    budgets = dict(BUDGET_S)
    for item in args.budget:
        stage, _, seconds = item.partition("=")
        if stage not in budgets:
            sys.exit(f"--budget: unknown stage {stage!r}")
        budgets[stage] = float(seconds)
    env = common.environment(device)
    slug = "cpu_dry_run" if DRY else common.device_slug(env["device_name"])
    out_dir = args.out_dir or (os.path.join(tempfile.gettempdir(), "cemlib_gpu_dry_run") if DRY
                               else os.path.join(HERE, "results"))
    os.makedirs(out_dir, exist_ok=True)
    command = " ".join(["python tools/gpu/gpu_kernels.py"] + [
        a for a in (sys.argv[1:] if argv is None else argv)])
    if args.out_dir:  # the recorded command leaves a machine's path out
        command = command.replace(f"--out-dir {args.out_dir}", "--out-dir <dir>")
    summary_path = os.path.join(out_dir, f"gpu_summary_{slug}.json")
    summary = {"stages": {}}
    if os.path.exists(summary_path):
        with open(summary_path) as f:
            summary = json.load(f)
    summary.update(env=env, command=command, mode="dry run (not a result)" if DRY else "gpu",
                   total_s=args.total_s)
    for stage in args.stage or STAGES:
        path = stage_path(out_dir, stage, slug)
        left = args.total_s - (time.monotonic() - start)
        if _done(path) and not args.force:
            note = {"status": "done earlier", "file": os.path.basename(path)}
        elif left < 0.5 * budgets[stage]:
            note = {"status": "skipped", "reason": f"{left:.0f} s left of the call, budget "
                                                   f"{budgets[stage]:.0f} s"}
        else:
            t0 = time.monotonic()
            compiled_before = triton_compiled()
            deadline = t0 + min(budgets[stage], left)
            print(f"== {stage} (budget {min(budgets[stage], left):.0f} s)", flush=True)
            payload = {"benchmark": f"gpu_kernels/{stage}", "env": env, "command": command,
                       "mode": summary["mode"], "budget_s": budgets[stage]}
            try:
                payload.update(RUNNERS[stage](s, device, deadline), status="done")
            except Exception as err:
                payload.update(status="failed", error=f"{type(err).__name__}: {err}",
                               traceback=traceback.format_exc()[-4000:])
                print(payload["traceback"], file=sys.stderr, flush=True)
            payload["elapsed_s"] = round(time.monotonic() - t0, 1)
            if compiled_before is not None:  # found in the cache (a warm one too) or compiled
                payload["triton_cache"] = {"kernels_compiled": triton_compiled() - compiled_before,
                                           "cache_kernels": warm_cache.entries()}
            with open(path, "w") as f:
                json.dump(payload, f, indent=1, default=str)
            note = {"status": payload["status"], "elapsed_s": payload["elapsed_s"],
                    "file": os.path.basename(path)}
            print(f"== {stage}: {payload['status']} in {payload['elapsed_s']} s -> {path}",
                  flush=True)
        summary["stages"][stage] = note
        summary["elapsed_s"] = round(time.monotonic() - start, 1)
        with open(summary_path, "w") as f:
            json.dump(summary, f, indent=1, default=str)
    print(json.dumps(summary["stages"], indent=1))
    return summary


if __name__ == "__main__":
    main()
