"""Shared helpers for cemlib's kernel benchmarks: environment record, timing, peak memory, JSON.

Timing on CUDA uses ``triton.testing.do_bench`` (it flushes L2 between repetitions and reports
quantiles); on CPU (``--cpu-smoke`` only, to check that the scripts run) a plain
``time.perf_counter`` loop. Peak memory is ``torch.cuda.max_memory_allocated`` above the memory
held before the call; on CPU it is not measured (``null``).
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import statistics
import sys
import tempfile
import time

import torch

QUANTILES = (0.5, 0.2, 0.8)


def setup_cpu_interpreter(argv=None) -> bool:
    """Before anything imports triton: on a machine without CUDA, run the kernels under
    Triton's interpreter (``TRITON_INTERPRET=1``). Returns whether CUDA is available."""
    cuda = torch.cuda.is_available()
    if not cuda:
        os.environ.setdefault("TRITON_INTERPRET", "1")
    return cuda


def parser(description: str) -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=description)
    p.add_argument("--cpu-smoke", action="store_true",
                   help="tiny shapes on CPU (Triton interpreter): checks the script runs; "
                        "its timings are NOT results")
    p.add_argument("--out", default=None, help="output JSON path (default: see README.md)")
    p.add_argument("--rep", type=int, default=100, help="timed repetitions per case (ms on GPU)")
    return p


def environment(device: torch.device) -> dict:
    info = {"python": platform.python_version(), "torch": torch.__version__,
            "platform": platform.platform(), "date_utc":
            datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")}
    try:
        import triton
        info["triton"] = triton.__version__
    except ImportError:
        info["triton"] = None
    info["triton_interpret"] = os.environ.get("TRITON_INTERPRET") == "1"
    from cemlib.train.results import git_commit
    info["git_commit"] = git_commit()
    if device.type == "cuda":
        info["device_name"] = torch.cuda.get_device_name(device)
        info["cuda"] = torch.version.cuda
        info["sm_count"] = torch.cuda.get_device_properties(device).multi_processor_count
    else:
        info["device_name"] = platform.processor() or "cpu"
        info["cpu_threads"] = torch.get_num_threads()
    return info


def bench(fn, device: torch.device, rep: int = 100, grad_to_none=None) -> dict:
    """Median and 20%/80% quantiles of the run time of ``fn()`` in milliseconds."""
    if device.type == "cuda":
        import triton.testing
        med, q20, q80 = triton.testing.do_bench(fn, rep=rep, quantiles=list(QUANTILES),
                                                grad_to_none=grad_to_none)
        return {"median_ms": med, "q20_ms": q20, "q80_ms": q80}
    fn()  # warm-up
    times = []
    for _ in range(max(3, min(rep, 5))):
        for t in grad_to_none or []:
            t.grad = None
        t0 = time.perf_counter()
        fn()
        times.append(1e3 * (time.perf_counter() - t0))
    qs = statistics.quantiles(times, n=10, method="inclusive")
    return {"median_ms": statistics.median(times), "q20_ms": qs[1], "q80_ms": qs[7]}


def peak_memory_mb(fn, device: torch.device):
    """Peak allocated memory (MiB) during one call of ``fn`` above what was held before."""
    if device.type != "cuda":
        return None
    torch.cuda.synchronize(device)
    base = torch.cuda.memory_allocated(device)
    torch.cuda.reset_peak_memory_stats(device)
    fn()
    torch.cuda.synchronize(device)
    return (torch.cuda.max_memory_allocated(device) - base) / 2 ** 20


def cpu_peak_bytes(fn) -> dict:
    """Peak bytes allocated on the CPU while ``fn()`` runs, above what was allocated before:
    ``{"peak": ..., "net": ...}`` (``net``: allocated and not freed by the end).

    Read from the profiler's allocation events (``torch.profiler`` with ``profile_memory=True``:
    every allocation and free of PyTorch's CPU allocator, in time order). Run on the CPU, a
    PyTorch program allocates and frees the same tensors in the same order as on a GPU, so this
    *predicts* ``peak_memory_mb`` of the same call on CUDA, up to the caching allocator's
    rounding (512 B; large blocks in 2 MiB segments) and cuBLAS workspaces. Triton kernels must
    not run under the interpreter inside ``fn``: the profiler then misses the frees of their
    argument buffers (stand the launches in with no-ops; memory does not depend on values).
    Reads ``experimental_event_tree`` of the profiler results (checked on torch 2.13).
    """
    from torch._C._profiler import _EventType
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        fn()
    events, stack = [], list(prof.profiler.kineto_results.experimental_event_tree())
    while stack:
        node = stack.pop()
        if node.tag == _EventType.Allocation and str(node.extra_fields.device) == "cpu":
            events.append((node.start_time_ns, node.extra_fields.alloc_size))
        stack.extend(node.children)
    live = peak = 0
    for _, nbytes in sorted(events):
        live += nbytes
        peak = max(peak, live)
    return {"peak": peak, "net": live}


def cuda_kernel_times(events) -> tuple[dict, int]:
    """``({kernel name: total microseconds}, kernels)`` of the GPU kernels among a
    ``torch.profiler`` run's ``events``."""
    from torch.autograd import DeviceType

    per_kernel, n = {}, 0
    for e in events:
        if e.device_type == DeviceType.CUDA:
            per_kernel[e.name] = per_kernel.get(e.name, 0.0) + e.time_range.elapsed_us()
            n += 1
    return per_kernel, n


def measured_peak_tflops(device: torch.device, dtype=torch.bfloat16) -> dict:
    """The machine's measured dense GEMM throughput (8192^3 on CUDA; tiny fp32 on CPU), by
    :func:`cemlib.train.flops.measure_peak_flops` (the best of its repetitions)."""
    from cemlib.train.flops import measure_peak_flops
    n = 8192 if device.type == "cuda" else 256
    dtype = dtype if device.type == "cuda" else torch.float32
    flops = measure_peak_flops(device, dtype, n=n)
    return {"gemm_n": n, "dtype": str(dtype), "tflops": flops / 1e12}


def run_case(fn, device, rep, grad_to_none=None) -> dict:
    """Time and peak memory of one case; an out-of-memory error is recorded, not raised."""
    try:
        out = bench(fn, device, rep, grad_to_none)
        out["peak_mem_mb"] = peak_memory_mb(fn, device)
        return out
    except torch.OutOfMemoryError:
        torch.cuda.empty_cache()
        return {"error": "out of memory"}


def device_slug(device_name: str) -> str:
    """The device name as it appears in result file names (``NVIDIA_H100_80GB_HBM3``)."""
    return "".join(c if c.isalnum() else "_" for c in device_name).strip("_")


def timed_case(fn, device, rep, leaves, flops, peak_tflops=None, deadline=None) -> dict:
    """:func:`run_case` with the throughput of ``flops`` (and its fraction of ``peak_tflops``),
    or a ``skipped`` record once ``deadline`` (``time.monotonic()``) has passed."""
    if deadline is not None and time.monotonic() > deadline:
        return {"skipped": "out of the stage's time budget", "flops": flops}
    r = run_case(fn, device, rep, grad_to_none=leaves)
    if "median_ms" in r:
        r["tflops"] = flops / (r["median_ms"] * 1e-3) / 1e12
        if peak_tflops:
            r["fraction_of_peak"] = r["tflops"] / peak_tflops
    r["flops"] = flops
    return r


def write_json(payload: dict, name: str, args, device, default_name: str | None = None,
               mode: str | None = None) -> str:
    """Write ``payload`` to ``args.out``, else (smoke runs) the temporary directory, else
    ``results/<default_name>`` or ``results/<name>_<device>.json``; records the mode (``mode``,
    else ``"cpu-smoke (not a result)"`` or ``"gpu"``) and the command."""
    if args.out:
        path = args.out
    elif args.cpu_smoke:
        path = os.path.join(tempfile.gettempdir(), f"cemlib_{name}_cpu_smoke.json")
    else:
        path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results",
                            default_name or f"{name}_{device_slug(payload['env']['device_name'])}.json")
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    payload["mode"] = "cpu-smoke (not a result)" if args.cpu_smoke else (mode or "gpu")
    payload["command"] = " ".join(["python", os.path.join("benchmarks", os.path.basename(sys.argv[0]))]
                                  + sys.argv[1:])
    with open(path, "w") as f:
        json.dump(payload, f, indent=1)
    print(f"wrote {path}")
    return path
