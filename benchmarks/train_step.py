"""Training-step time, tokens/s and MFU of cemlib's Llama and full-CEM language models, measured
the same way.

One step = forward + backward + AdamW update on a batch of random token ids (the timing does not
depend on the data). Every model is built from the same :class:`cemlib.models.lm.LMConfig`
defaults (``check_finite`` on: since the finite checks never look at values on a GPU nor under
``torch.compile``, no model synchronises or breaks its graph for them), timed by the same loop,
and, with ``--compile``, compiled the same way; the number of ``torch.compile`` graph breaks of
each model is recorded (``torch._dynamo`` counters). ``--compile-mode reduce-overhead`` compiles
with CUDA graphs (each model alike: the step then costs no host time per kernel; the H100 run of
2026-11-27 found the CEM models' compiled steps host-bound and Llama's not), and records how
many graphs Inductor ran without them (``cudagraph_skips``; ``TORCH_LOGS=cudagraphs`` says why).
On CUDA the step runs under bf16 autocast at mid-size widths; on CPU in float32 at small
widths. Reports the median and 10/90 % quantiles of the step time, tokens/s, forward FLOPs per
token (``cemlib.models.params.flops_per_token``), MFU against a stated or measured bf16 peak,
peak GPU memory, and each CEM model's tokens/s over Llama's at the same width and compile mode
next to the issue's targets (T = 1: >= 0.9, T = 2: >= 0.55)::

    python benchmarks/train_step.py --out bench_cpu.json                   # CPU, small
    python benchmarks/train_step.py --device cuda --compile --measure-peak --T 1 2 --out bench_gpu.json
    python benchmarks/train_step.py --device cuda --compile --compile-mode reduce-overhead \
        --out bench_gpu_graphs.json
"""

from __future__ import annotations

import argparse
import contextlib
import json
import shlex
import statistics
import sys
import time

import torch
import torch.nn.functional as F

from cemlib.models.lm import LanguageModel, LMConfig
from cemlib.models.params import flops_per_token
from cemlib.train.config import OptimConfig, uses_cuda_graphs
from cemlib.train.flops import measure_peak_flops, mfu, stated_peak_tflops
from cemlib.train.optim import make_optimizer
from cemlib.train.results import environment_info, git_commit
from cemlib.utils import default_device

#: CEM tokens/s over Llama's at the same width (issue "GPU kernels v2", on one H100)
TARGETS = {1: 0.9, 2: 0.55}


def _graph_breaks() -> tuple[int, list]:
    """``(breaks, reasons)``: the ``torch.compile`` graph breaks counted since the counters were
    cleared, and the five most frequent reasons with their counts (dynamo's own words)."""
    from torch._dynamo.utils import counters
    reasons = counters["graph_break"].most_common(5)
    return (sum(counters["graph_break"].values()),
            [{"reason": str(r)[:300], "count": n} for r, n in reasons])


#: kernel families of a training step's GPU time, by kernel name (first match)
KERNEL_FAMILIES = (
    ("cemlib attention (Triton)", ("_fwd_kernel", "_bwd_kernel", "_pre_kernel", "_headsum_kernel",
                                   "_extra_grads_kernel", "_fold_kernel", "_bwd_dkv_kernel",
                                   "_bwd_dq_kernel", "_rowdot_kernel")),
    ("cemlib MLP (Triton)", ("_gate_kernel", "_silu_gate_bwd_kernel", "_dplr_kernel")),
    ("attention (SDPA, cuDNN / flash)", ("flash", "fmha", "sdpa", "cudnn")),
    ("matrix products (cuBLAS)", ("gemm", "sm90_xmma", "cutlass", "nvjet", "ampere_", "sm80_xmma")),
    ("fused element-wise (Inductor)", ("triton_",)),
    ("element-wise / reductions (eager)", ("elementwise", "reduce_kernel", "at::native")),
)


def kernel_families(per_kernel_us: dict, steps: int) -> dict:
    """GPU time per step by :data:`KERNEL_FAMILIES` (``other`` for the rest), in ms, from
    ``{kernel name: total microseconds over steps}``, and the ten longest kernels."""
    out = {}
    for name, us in per_kernel_us.items():
        family = next((f for f, keys in KERNEL_FAMILIES if any(k in name for k in keys)), "other")
        out[family] = out.get(family, 0.0) + us / 1e3 / steps
    longest = sorted(per_kernel_us.items(), key=lambda kv: -kv[1])[:10]
    return {"ms_per_step": dict(sorted(out.items(), key=lambda kv: -kv[1])),
            "total_ms_per_step": sum(per_kernel_us.values()) / 1e3 / steps,
            "longest": [{"name": n[:120], "ms_per_step": us / 1e3 / steps} for n, us in longest]}


def host_summary(averages, steps: int, prefix: str = "cemlib::", top: int = 12) -> dict:
    """Where a profiled step spends its host (CPU) time, from ``torch.profiler``'s
    ``key_averages()``: the operators with the most self CPU time (ms per step, calls per step),
    and every operator named ``prefix...`` (cemlib's custom operators, which a compiled graph
    calls into Python) with its inclusive CPU time. The H100 run of 2026-11-27 found the compiled
    CEM steps host-bound; this says on which operators."""
    rows = [a for a in averages if a.device_type.name == "CPU"]
    per_step = lambda us: us / 1e3 / steps  # noqa: E731
    mine = sorted((a for a in rows if a.key.startswith(prefix)), key=lambda a: -a.cpu_time_total)
    return {
        "self_cpu_ms_per_step": per_step(sum(a.self_cpu_time_total for a in rows)),
        "top_self_cpu": [{"name": a.key[:100], "self_ms_per_step": per_step(a.self_cpu_time_total),
                          "calls_per_step": a.count / steps}
                         for a in sorted(rows, key=lambda a: -a.self_cpu_time_total)[:top]],
        "custom_ops": [{"name": a.key, "cpu_ms_per_step": per_step(a.cpu_time_total),
                        "calls_per_step": a.count / steps} for a in mine]}


def profile_steps(step, device: torch.device, steps: int = 2) -> dict | None:
    """``torch.profiler`` over ``steps`` training steps (CUDA only): :func:`kernel_families` of
    their GPU kernels, the kernels launched per step, the profiled wall time per step, and where
    the host time goes (:func:`host_summary`)."""
    if device.type != "cuda":
        return None
    from torch.profiler import ProfilerActivity, profile

    from common import cuda_kernel_times

    torch.cuda.synchronize(device)
    t0 = time.perf_counter()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for _ in range(steps):
            step()
        torch.cuda.synchronize(device)
    wall = (time.perf_counter() - t0) / steps
    per_kernel, n = cuda_kernel_times(prof.events())
    return {**kernel_families(per_kernel, steps), "kernels_per_step": n / steps,
            "profiled_wall_ms_per_step": 1e3 * wall,
            "host": host_summary(prof.key_averages(), steps)}


def _cudagraph_skips() -> int:
    """How many graphs Inductor ran without CUDA graphs since the counters were cleared (its
    ``cudagraph_skips`` counter; ``TORCH_LOGS=cudagraphs`` prints the reasons)."""
    from torch._dynamo.utils import counters
    return int(counters["inductor"]["cudagraph_skips"])


def bench_one(cfg: LMConfig, batch: int, device: torch.device, bf16: bool, compile_: bool,
              warmup: int, iters: int, profile: bool = False,
              compile_mode: str | None = None) -> dict:
    """Time ``warmup + iters`` training steps of ``LanguageModel(cfg)``; the median and quantiles
    of the last ``iters``; with ``profile`` (CUDA), where two more steps spend their GPU time
    (:func:`profile_steps`). ``compile_mode``: ``torch.compile``'s ``mode`` (``None``: its
    default); with CUDA graphs (``"reduce-overhead"``) each step first marks a new step for
    Inductor's graph trees, as a training loop must."""
    torch.manual_seed(0)
    model = LanguageModel(cfg).to(device)
    opt = make_optimizer(model, OptimConfig())
    if compile_:
        torch._dynamo.reset()
        from torch._dynamo.utils import counters
        counters.clear()
    step_model = torch.compile(model, mode=compile_mode) if compile_ else model
    graphs = compile_ and uses_cuda_graphs(compile_mode or "default")
    x = torch.randint(0, cfg.vocab_size, (batch, cfg.context_length), device=device)
    ctx = (lambda: torch.autocast(device.type, dtype=torch.bfloat16)) if bf16 else contextlib.nullcontext
    sync = (lambda: torch.cuda.synchronize(device)) if device.type == "cuda" else (lambda: None)
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)

    def step():
        if graphs:
            torch.compiler.cudagraph_mark_step_begin()
        with ctx():
            logits = step_model(x)
        loss = F.cross_entropy(logits.float().reshape(-1, cfg.vocab_size), x.reshape(-1))
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    times = []
    for i in range(warmup + iters):
        sync()
        t0 = time.perf_counter()
        step()
        sync()
        if i >= warmup:
            times.append(time.perf_counter() - t0)
    breaks = _graph_breaks() if compile_ else None
    skips = _cudagraph_skips() if graphs else None
    kernels = profile_steps(step, device) if profile else None
    q = statistics.quantiles(times, n=10) if len(times) >= 2 else [times[0]] * 9
    med = statistics.median(times)
    return {"attn": cfg.attn, "mlp": cfg.mlp, "d_model": cfg.d_model, "n_layers": cfg.n_layers,
            "n_heads": cfg.n_heads, "context_length": cfg.context_length, "batch": batch,
            "T_attn": cfg.T_attn, "T_mlp": cfg.T_mlp, "check_finite": cfg.check_finite,
            "params": model.num_parameters(),
            "median_s": med, "p10_s": q[0], "p90_s": q[-1], "tokens_per_s": batch * cfg.context_length / med,
            "forward_flops_per_token": flops_per_token(cfg),
            "compile_mode": (compile_mode or "default") if compile_ else None,
            "graph_breaks": breaks[0] if compile_ else None,
            "graph_break_reasons": breaks[1] if compile_ else None,
            "cudagraph_skips": skips,
            "peak_memory_bytes": torch.cuda.max_memory_allocated(device) if device.type == "cuda" else None,
            "gpu_kernels": kernels}


def model_configs(widths, Ts, *, vocab, context, layers, head_dim):
    """``[(name, LMConfig)]``: per width Llama, then CEM at each recursion depth T."""
    out = []
    for d in widths:
        shape = dict(vocab_size=vocab, context_length=context, d_model=d, n_layers=layers,
                      n_heads=max(1, d // head_dim))
        out.append((f"llama d={d}", LMConfig(**shape, attn="llama", mlp="llama")))
        for T in Ts:
            out.append((f"cem T={T} d={d}", LMConfig(**shape, attn="cem", mlp="cem", T_attn=T,
                                                      T_mlp=T)))
    return out


def run(configs, *, batch, device, bf16, compile_, warmup, iters, peak, deadline=None,
        profile=False, compiled=None, compile_mode=None) -> list:
    """One row per configuration (MFU against ``peak`` FLOP/s; with ``profile``, the GPU time of
    two more steps by kernel family). With a ``deadline`` (``time.monotonic()``), a configuration
    is skipped (and recorded so) when the previous one's wall time (building, compiling, timing)
    would end past it. ``compiled``: a count of the kernels compiled so far into Triton's cache
    (``warm_cache.compiled``; ``None`` where it cannot count): each row then says how many its
    configuration compiled (``triton_kernels_compiled``, cemlib's and Inductor's together; a kernel
    found in the cache, carried there by ``warm_cache.py`` or compiled by an earlier row, is not
    counted). ``compile_mode``: ``torch.compile``'s mode for every configuration. A configuration
    that raises is recorded with its error, and the next one runs."""
    rows, last = [], 0.0
    for name, cfg in configs:
        if deadline is not None and time.monotonic() + last > deadline:
            rows.append({"model": name, "skipped": "out of the stage's time budget"})
            print(f"{name:16s} skipped (time budget)", flush=True)
            continue
        t0 = time.monotonic()
        before = compiled() if compiled is not None else None
        try:
            row = {"model": name, **bench_one(cfg, batch, device, bf16, compile_, warmup, iters,
                                              profile, compile_mode)}
        except Exception as err:  # a model that fails (e.g. under CUDA graphs) is a result
            last = time.monotonic() - t0
            rows.append({"model": name, "compile_mode": (compile_mode or "default") if compile_
                         else None, "error": f"{type(err).__name__}: {err}"[:500], "wall_s": last})
            print(f"{name:16s} failed: {rows[-1]['error']}", flush=True)
            continue
        last = row["wall_s"] = time.monotonic() - t0
        if before is not None:
            row["triton_kernels_compiled"] = compiled() - before
        row["mfu"] = mfu(row["forward_flops_per_token"], row["tokens_per_s"], peak)
        rows.append(row)
        print(f"{name:16s} {1e3 * row['median_s']:8.2f} ms/step  {row['tokens_per_s']:10.0f} tok/s  "
              f"MFU {row['mfu'] if row['mfu'] is None else round(row['mfu'], 3)}  "
              f"graph breaks {row['graph_breaks']}"
              + (f"  mode {row['compile_mode']}, graphs skipped {row['cudagraph_skips']}"
                 if row["cudagraph_skips"] is not None else "")
              + (f"  Triton kernels compiled {row['triton_kernels_compiled']}"
                 if "triton_kernels_compiled" in row else ""), flush=True)
        if row.get("gpu_kernels"):
            k = row["gpu_kernels"]
            print(f"{'':16s} GPU {k['total_ms_per_step']:.2f} ms/step in {k['kernels_per_step']:.0f} "
                  "kernels: " + ", ".join(f"{f} {ms:.2f}" for f, ms in k["ms_per_step"].items()),
                  flush=True)
            h = k["host"]
            ops = ", ".join(f"{o['name']} {o['cpu_ms_per_step']:.2f} ms "
                            f"({o['calls_per_step']:.0f}x)" for o in h["custom_ops"])
            print(f"{'':16s} host: self CPU {h['self_cpu_ms_per_step']:.2f} ms/step; cemlib ops "
                  + (ops or "none"), flush=True)
    return rows


def ratios_to_llama(rows) -> list[dict]:
    """Each CEM row's tokens/s over Llama's at the same width and compile mode, with the target
    for its T."""
    key = lambda r: (r["d_model"], r.get("compile_mode"))  # noqa: E731
    llama = {key(r): r for r in rows if r.get("attn") == "llama"}
    out = []
    for r in rows:
        if r.get("attn") == "cem" and key(r) in llama:
            ratio = r["tokens_per_s"] / llama[key(r)]["tokens_per_s"]
            target = TARGETS.get(r["T_attn"])
            out.append({"d_model": r["d_model"], "T": r["T_attn"],
                        "compile_mode": r.get("compile_mode"), "cem_over_llama": ratio,
                        "target": target, "met": None if target is None else ratio >= target})
    return out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--device", default=None, help="cpu or cuda (default: CUDA when available)")
    p.add_argument("--widths", type=int, nargs="+", help="d_model values (default: CPU 64 128; GPU 384 768 1024)")
    p.add_argument("--layers", type=int, default=None, help="default: CPU 2, GPU 6")
    p.add_argument("--head-dim", type=int, default=None, help="default: CPU 16, GPU 64")
    p.add_argument("--context", type=int, default=None, help="default: CPU 64, GPU 256")
    p.add_argument("--batch", type=int, default=None, help="default: CPU 16, GPU 64")
    p.add_argument("--vocab", type=int, default=65, help="vocabulary size (65: char-level Shakespeare)")
    p.add_argument("--T", type=int, nargs="+", default=[1],
                   help="CEM recursion steps (attention and MLP), one CEM model per value")
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--iters", type=int, default=10)
    p.add_argument("--compile", action="store_true", help="torch.compile (CUDA only)")
    p.add_argument("--compile-mode", default=None,
                   help="torch.compile's mode, e.g. reduce-overhead (CUDA graphs); default: "
                        "its own")
    p.add_argument("--measure-peak", action="store_true", help="measure the bf16 matmul peak for MFU")
    p.add_argument("--out", required=True, help="JSON output path")
    a = p.parse_args(argv)
    device = default_device(a.device)
    gpu = device.type == "cuda"
    widths = a.widths or ([384, 768, 1024] if gpu else [64, 128])
    configs = model_configs(widths, a.T, vocab=a.vocab, context=a.context or (256 if gpu else 64),
                            layers=a.layers or (6 if gpu else 2),
                            head_dim=a.head_dim or (64 if gpu else 16))
    batch = a.batch or (64 if gpu else 16)
    dev_info, versions = environment_info(device)
    peak, peak_source = None, "none (CPU)"
    if gpu:
        if a.measure_peak:
            peak, peak_source = measure_peak_flops(device), "measured bf16 8192^3 matmul"
        elif stated_peak_tflops(dev_info["name"]) is not None:
            peak, peak_source = stated_peak_tflops(dev_info["name"]) * 1e12, "vendor dense bf16 table"
    rows = run(configs, batch=batch, device=device, bf16=gpu, compile_=a.compile and gpu,
               warmup=a.warmup, iters=a.iters, peak=peak, compile_mode=a.compile_mode)
    out = {"schema": "cemlib.benchmarks.train_step/2", "device": dev_info, "versions": versions,
           "git_commit": git_commit(), "dtype": "bf16-autocast" if gpu else "float32",
           "compile": a.compile and gpu, "peak_flops": peak, "peak_source": peak_source,
           "command": "python benchmarks/train_step.py " + shlex.join(sys.argv[1:] if argv is None else argv),
           "rows": rows, "cem_over_llama": ratios_to_llama(rows)}
    with open(a.out, "w") as f:
        json.dump(out, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
