"""Time of the first call of a kind of attention call, measured without a GPU: compiling the
autotune space.

The first forward+backward of a kind of call (dtype, flags, head width; a new power-of-two bucket
of the length only re-times) compiles every configuration of each kernel's autotune space
(``tied_attention_v2.GPU_CONFIGS``: 19 for the forward, 26 each for the preprocess and the
backward of a plain call) before the autotuner times them. This script times that first call
from an empty Triton cache with the launchers of ``host_overhead.py`` (kernels compiled for
``sm_90``, a stand-in driver whose launcher does nothing, the autotuner's timing runs reduced to
the compilation each would start with, and equal times), so what is timed is compilation plus
host work: once with the space compiled in
parallel threads (``tied_attention_v2._precompile``, the default) and once one configuration
after another inside the autotuner (``CEMLIB_PARALLEL_COMPILE=0``, Triton's own way). Each
variant runs in a fresh process with its own empty cache directory. On a GPU the autotuner's
timing runs come on top (about 0.1 s per configuration with Triton's ``do_bench`` defaults).

Usage: ``python benchmarks/first_call.py [--methods cem_v2 ...] [--quick] [--out FILE | --replace]``
(writes ``results/first_call_cpu.json``; the CPU and its core count set the scale).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.dirname(HERE))


def bench_by_compiling(self, *args, config, **meta):
    """Stands in for ``Autotuner._bench`` without a GPU: the compilation a timing run starts
    with, then equal times (the autotuner keeps its first configuration)."""
    self.fn.run(*args, **dict(meta, **config.all_kwargs(), warmup=True))
    return [1.0, 1.0, 1.0]


def _child(method: str, quick: bool) -> dict:
    """In a fresh process (the cache directory and ``CEMLIB_PARALLEL_COMPILE`` set by the
    parent): the first call of ``method`` and a second one, in seconds (``quick``: two
    configurations per kernel, a check that the script runs)."""
    import host_overhead as ho
    import torch
    from triton.runtime.autotuner import Autotuner
    torch.set_num_threads(1)
    ho.gpu_paths()
    if quick:
        for name, by_width in ho.v2.GPU_CONFIGS.items():
            ho.v2.GPU_CONFIGS[name] = {w: c[:2] for w, c in by_width.items()}
    Autotuner._bench = bench_by_compiling
    call, _ = ho.call_of(method)
    t0 = time.perf_counter()
    call()
    first = time.perf_counter() - t0
    t0 = time.perf_counter()
    call()
    return dict(first_call_s=round(first, 2), second_call_s=round(time.perf_counter() - t0, 4))


def measure(method: str, parallel: bool, quick: bool = False) -> dict:
    with tempfile.TemporaryDirectory() as cache:
        env = dict(os.environ, TRITON_CACHE_DIR=cache, TRITON_INTERPRET="0",
                   CEMLIB_PARALLEL_COMPILE="1" if parallel else "0")
        run = subprocess.run([sys.executable, os.path.abspath(__file__), "--child", method]
                             + (["--quick"] if quick else []),
                             env=env, capture_output=True, text=True)
        if run.returncode != 0:
            raise RuntimeError(run.stdout[-2000:] + run.stderr[-3000:])
        files = sum(len(f) for _, _, f in os.walk(cache))
    row = json.loads(run.stdout.strip().splitlines()[-1])
    return dict(method=method, parallel=parallel, cache_files=files, **row)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--methods", nargs="+", default=["cem_v2"],
                   help="calls of host_overhead.py (cem_v2, cem_v2_atomic, cem_diag_v2)")
    p.add_argument("--out", help="JSON path (default: results/first_call_cpu.json; an existing "
                                 "one is kept unless --replace)")
    p.add_argument("--replace", action="store_true")
    p.add_argument("--quick", action="store_true", help="two configurations per kernel (a check "
                                                        "that the script runs, not a result)")
    p.add_argument("--child", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.child:
        print(json.dumps(_child(args.child, args.quick)))
        return None
    from host_overhead import run_env, v2
    from outputs import RESULTS, announce, command_line, write_json
    default = RESULTS / "first_call_cpu.json"
    announce(default, args.out, args.replace)
    env = run_env(cpu_count=os.cpu_count())
    rows = []
    for method in args.methods:
        for parallel in (True, False):
            row = measure(method, parallel, args.quick)
            rows.append(row)
            print(f"{method:14s} {'parallel' if parallel else 'one by one':10s} first call "
                  f"{row['first_call_s']:7.1f} s  second {row['second_call_s']:.4f} s  "
                  f"({row['cache_files']} cache files)", flush=True)
    spaces = {name: len(v2._gpu_configs(name, 64)) for name in ("fwd", "pre", "bwd")}
    payload = dict(
        benchmark="first_call", env=env,
        command=command_line(__file__, argv),
        note=("first forward+backward of a kind of call from an empty Triton cache: kernels "
              "compiled for sm_90 for every configuration of the autotune space, a no-op "
              "launcher, the autotuner's timing runs reduced to their compilation; CPU tensors (B=1, "
              "H=12, T=16, d=64, bf16); parallel: tied_attention_v2._precompile's threads"
              + ("; quick run (two configurations per kernel): not a result" if args.quick
                 else "")),
        quick=args.quick, autotune_space_at_width_64=spaces, rows=rows)
    write_json(payload, default, args.out, args.replace)
    return payload


if __name__ == "__main__":
    main()
