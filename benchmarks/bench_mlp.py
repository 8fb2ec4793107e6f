"""Benchmark: the tied gated-MLP step and the DPLR preconditioner (Triton kernels) against eager and
``torch.compile``.

Methods of the step ``y = (gamma * SiLU(u V^T)) V``:

- ``v2``: :func:`cemlib.kernels.gated_mlp.tied_gated_mlp_step`, what dispatch uses: cuBLAS
  GEMMs and two fused element-wise Triton kernels, ``h = u V^T`` saved for backward (the name is
  the stored files' label; they also hold the removed first generation, ``v1``, Triton GEMMs
  with the element-wise work in their epilogues: ``"triton"`` in the first H100 file);
- ``v2_separate_dv``: the same with ``dV``'s two products apart, then added;
- ``eager``: the reference (autograd keeps three (N, D_v) intermediates); ``compile``: the
  reference under ``torch.compile``.

GPU mode: N = 8 x 1024 tokens, bf16, widths D_h in {768, 1024, 1536, 2048} with D_v = 4 D_h;
forward (no grad) and forward+backward, with peak memory above the inputs. The preconditioner
``softplus(d) g + U (V^T g) + V (U^T g)`` is measured at rank R = 16 (the paper's MLP rank).
FLOPs of the step: 4 N D_h D_v forward, x 3 for forward+backward.

``--memory-cpu`` predicts the GPU mode's peak memory on the CPU: the same calls at the same
shapes in float32 (v2's kernels under the Triton interpreter), the peak read from PyTorch's CPU
allocator (``common.cpu_peak_bytes``), and the bytes autograd saves for backward
(``cemlib.models.memory.saved_activation_bytes``); bf16 MiB are half the float32 bytes. It writes
``results/mlp_memory_cpu.json`` with the v2 / eager ratios next to the issue's target (<= 0.7).

Usage: ``python benchmarks/bench_mlp.py`` (GPU), ``... --memory-cpu`` (CPU prediction) or
``... --cpu-smoke`` (checks it runs).
"""

from __future__ import annotations

import functools
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common  # noqa: E402

CUDA = common.setup_cpu_interpreter()

import torch  # noqa: E402

from cemlib.kernels import dplr, gated_mlp, reference  # noqa: E402
from cemlib.models.memory import saved_activation_bytes  # noqa: E402

GPU_WIDTHS, GPU_N, MULT, RANK = [768, 1024, 1536, 2048], 8 * 1024, 4, 16
MEMORY_TARGET = 0.7  # issue: peak memory of the tied MLP step <= 0.7 x eager (forward+backward)
#: (N, D_v) passes (one read or one write of an (N, D_v) tensor) of the element-wise work:
#: eager SiLU (2) and product (3) forward; product backward (3 + 3) and SiLU backward (3).
#: v2: gate kernel (3) forward; backward kernel (5) and the gate product recomputed (3).
PASSES = {"eager": {"fwd": 5, "fwd_bwd": 14}, "v2": {"fwd": 3, "fwd_bwd": 11}}
H100_BANDWIDTH = 3.35e12  # bytes/s, H100 SXM HBM3 (vendor figure)


def step_methods(use_compile: bool, include=("v2", "eager", "compile")) -> dict:
    methods = {"v2": gated_mlp.tied_gated_mlp_step,
               # dV's two products apart, then added (``gated_mlp.DV_PRODUCTS``)
               "v2_separate_dv": functools.partial(gated_mlp.tied_gated_mlp_step,
                                                   dv_products="separate"),
               "eager": reference.tied_gated_mlp_step}
    if use_compile:
        methods["compile"] = torch.compile(reference.tied_gated_mlp_step)
    return {k: v for k, v in methods.items() if k in include}


def dplr_methods(use_compile: bool) -> dict:
    methods = {"triton": dplr.dplr_precondition, "eager": reference.dplr_precondition}
    if use_compile:
        methods["compile"] = torch.compile(reference.dplr_precondition)
    return methods


def step_inputs(N, Dh, Dv, dtype, device, seed=0):
    """``u`` (N, D_h), ``V`` (D_v, D_h) scaled by D_h^-1/2, ``gamma`` (N, D_v), cotangent ``dy``."""
    g = torch.Generator(device=device).manual_seed(seed)
    u = torch.randn(N, Dh, generator=g, device=device, dtype=dtype)
    V = torch.randn(Dv, Dh, generator=g, device=device, dtype=dtype) / Dh ** 0.5
    gamma = torch.randn(N, Dv, generator=g, device=device, dtype=dtype)
    dy = torch.randn(N, Dh, generator=g, device=device, dtype=dtype)
    return [u, V, gamma], dy


def calls(fn, inputs, dy):
    """``{"fwd": no-grad forward, "fwd_bwd": forward+backward}`` and the leaves whose gradients
    the timing loop resets."""
    leaves = [x.detach().clone().requires_grad_() for x in inputs]

    def fwd():
        with torch.no_grad():
            fn(*inputs)

    def fwd_bwd():
        fn(*leaves).backward(dy)

    return {"fwd": fwd, "fwd_bwd": fwd_bwd}, leaves


def measure(N, widths, dtype, device, rep, peak_tflops, methods, dplr=None, mult=MULT, R=RANK,
            deadline=None) -> list[dict]:
    """Time and peak memory of every method at every width (GPU: ``do_bench``; CPU: a plain
    loop, not a result). ``dplr``: preconditioner methods to time as well. Cases not reached
    before ``deadline`` (``time.monotonic()``) are recorded as skipped."""
    results = []
    for Dh in widths:
        Dv = mult * Dh
        inputs, dy = step_inputs(N, Dh, Dv, dtype, device)
        cases = [("step", name, fn, inputs, 4 * N * Dh * Dv) for name, fn in methods.items()]
        if dplr:
            g = torch.Generator(device=device).manual_seed(1)
            d = torch.randn(Dh, generator=g, device=device, dtype=dtype)
            U, W = (torch.randn(Dh, R, generator=g, device=device, dtype=dtype) / Dh ** 0.5
                    for _ in range(2))
            cases += [("dplr", name, fn, [inputs[0], d, U, W], 8 * N * Dh * R)
                      for name, fn in dplr.items()]
        for op, name, fn, args, fwd_flops in cases:
            fns, leaves = calls(fn, args, dy)
            for mode, flops in (("fwd", fwd_flops), ("fwd_bwd", 3 * fwd_flops)):
                r = common.timed_case(fns[mode], device, rep, leaves, flops, peak_tflops,
                                      deadline)
                r.update(op=op, method=name, mode=mode, N=N, D_h=Dh, D_v=Dv, R=R,
                         dtype=str(dtype))
                results.append(r)
                print(op, name, mode, Dh, r.get("median_ms"), r.get("peak_mem_mb"),
                      r.get("error", r.get("skipped", "")), flush=True)
    return results


def ratios(results, num="v2", den="eager") -> dict:
    """``{"D_h=.. mode": {"time": num/den, "memory": num/den}}`` of the step."""
    out = {}
    by = {(r["method"], r["D_h"], r["mode"]): r for r in results if r["op"] == "step"}
    for (m, Dh, mode), r in by.items():
        d = by.get((den, Dh, mode))
        if m != num or d is None:
            continue
        key = f"D_h={Dh} {mode}"
        out[key] = {}
        if r.get("median_ms") and d.get("median_ms"):
            out[key]["time"] = r["median_ms"] / d["median_ms"]
        if r.get("peak_mem_mb") and d.get("peak_mem_mb"):
            out[key]["memory"] = r["peak_mem_mb"] / d["peak_mem_mb"]
    return out


def memory_prediction(N, widths, mult=MULT, methods=("eager", "v2")) -> list[dict]:
    """CPU, float32: peak allocated bytes of the GPU mode's two calls (the no-grad forward, and
    forward+backward with the gradients already allocated, as after ``do_bench``) and the bytes
    saved for backward, per method and width. v2's element-wise kernels write into buffers their
    launchers allocate through PyTorch; their launches are replaced by no-ops here (memory does
    not depend on the values, and the interpreter would hide frees from the profiler)."""
    launch = gated_mlp._elementwise
    gated_mlp._elementwise = lambda *args, **kwargs: None
    rows = []
    try:
        for Dh in widths:
            Dv = mult * Dh
            inputs, dy = step_inputs(N, Dh, Dv, torch.float32, torch.device("cpu"))
            for name, fn in step_methods(False, methods).items():
                fns, leaves = calls(fn, inputs, dy)
                fns["fwd_bwd"]()  # allocate the gradients (the GPU timing loop leaves them)
                row = dict(method=name, N=N, D_h=Dh, D_v=Dv, dtype="float32 (CPU)")
                for mode in ("fwd", "fwd_bwd"):
                    mem = common.cpu_peak_bytes(fns[mode])
                    row[f"{mode}_peak_bytes"], row[f"{mode}_net_bytes"] = mem["peak"], mem["net"]
                    row[f"{mode}_peak_bf16_mib"] = mem["peak"] / 2 / 2 ** 20
                row["saved_bytes"] = saved_activation_bytes(lambda: fn(*leaves), exclude=leaves)
                row["saved_bytes_per_ND_v"] = row["saved_bytes"] / (4 * N * Dv)
                rows.append(row)
                print(name, Dh, {k: v for k, v in row.items() if k.endswith(("mib", "ND_v"))},
                      flush=True)
    finally:
        gated_mlp._elementwise = launch
    return rows


def time_model(h100_json) -> dict | None:
    """A bandwidth model of v2's time, not a measurement: from the H100's eager times, take
    away eager's element-wise passes at the HBM bandwidth (what is left is the GEMMs), add v2's.
    Assumes both run their element-wise work at full bandwidth."""
    if not os.path.exists(h100_json):
        return None
    with open(h100_json) as f:
        eager = {(r["D_h"], r["mode"]): r for r in json.load(f)["results"]
                 if r["op"] == "step" and r["method"] == "eager" and "median_ms" in r}
    rows = []
    for (Dh, mode), r in sorted(eager.items()):
        pass_ms = 2 * r["N"] * r["D_v"] / H100_BANDWIDTH * 1e3  # bf16
        gemm_ms = r["median_ms"] - PASSES["eager"][mode] * pass_ms
        v2_ms = gemm_ms + PASSES["v2"][mode] * pass_ms
        rows.append(dict(D_h=Dh, mode=mode, eager_ms_h100=r["median_ms"], pass_ms=pass_ms,
                         gemm_ms=gemm_ms, gemm_tflops=r["flops"] / gemm_ms / 1e9,
                         v2_ms_model=v2_ms, v2_over_eager_model=v2_ms / r["median_ms"]))
    return {"note": "model, not a measurement: eager's H100 time minus eager's element-wise "
                    "(N, D_v) passes at the HBM bandwidth, plus v2's",
            "bandwidth_bytes_per_s": H100_BANDWIDTH, "passes": PASSES, "rows": rows}


def memory_main(args):
    N, widths = (512, [16]) if args.cpu_smoke else (GPU_N, GPU_WIDTHS)
    rows = memory_prediction(N, widths)
    by = {(r["method"], r["D_h"]): r for r in rows}
    predicted = {}
    for Dh in widths:
        v2, eager = by[("v2", Dh)], by[("eager", Dh)]
        predicted[f"D_h={Dh}"] = {mode: v2[f"{mode}_peak_bytes"] / eager[f"{mode}_peak_bytes"]
                                  for mode in ("fwd", "fwd_bwd")}
    h100 = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results",
                        "mlp_NVIDIA_H100_80GB_HBM3.json")
    check = []  # the CPU prediction of eager (unchanged since) against the H100 measurement
    if os.path.exists(h100) and not args.cpu_smoke:
        with open(h100) as f:
            for r in json.load(f)["results"]:
                if r["op"] == "step" and r["method"] == "eager" and ("eager", r["D_h"]) in by:
                    check.append(dict(D_h=r["D_h"], mode=r["mode"],
                                      h100_peak_mem_mb=r["peak_mem_mb"],
                                      cpu_predicted_bf16_mib=by[("eager", r["D_h"])][
                                          f"{r['mode']}_peak_bf16_mib"]))
    payload = {"benchmark": "mlp_memory_cpu", "env": common.environment(torch.device("cpu")),
               "time_model": time_model(h100) if not args.cpu_smoke else None,
               "note": "peak allocated memory predicted on the CPU (float32, PyTorch's CPU "
                       "allocator); bf16 MiB = float32 bytes / 2; not a GPU measurement",
               "target_fwd_bwd_ratio": MEMORY_TARGET, "rows": rows,
               "v2_over_eager_peak": predicted, "eager_prediction_vs_h100": check}
    common.write_json(payload, "mlp_memory_cpu", args, torch.device("cpu"),
                      default_name="mlp_memory_cpu.json", mode="cpu-prediction")


def main():
    p = common.parser(__doc__.splitlines()[0])
    p.add_argument("--no-compile", action="store_true", help="skip the torch.compile baseline")
    p.add_argument("--memory-cpu", action="store_true",
                   help="predict the GPU mode's peak memory on the CPU (see the docstring)")
    args = p.parse_args()
    if args.memory_cpu:
        return memory_main(args)
    device = torch.device("cuda" if CUDA and not args.cpu_smoke else "cpu")
    if args.cpu_smoke:
        N, widths, dtype, mult, R = 40, [48], torch.float32, 2, 4
        use_compile = False  # compiling on a 2-core CPU takes longer than the smoke test
    else:
        if not CUDA:
            sys.exit("GPU mode needs CUDA; use --cpu-smoke on a CPU machine")
        N, widths, dtype, mult, R = GPU_N, GPU_WIDTHS, torch.bfloat16, MULT, RANK
        use_compile = not args.no_compile
    env = common.environment(device)
    peak = common.measured_peak_tflops(device)
    results = measure(N, widths, dtype, device, args.rep, peak["tflops"],
                      step_methods(use_compile), dplr_methods(use_compile), mult=mult, R=R)
    common.write_json({"benchmark": "mlp", "env": env, "peak_gemm": peak, "results": results,
                       "v2_over_eager": ratios(results)},
                      "mlp", args, device)


if __name__ == "__main__":
    main()
