"""How many Triton compilations a stage of the GPU script asks for, counted without a GPU.

On the GPU, compiling is host time that the session's device minutes pay for: the first H100 run
of ``gpu_kernels.py`` spent most of its correctness stage's 191 s compiling and did not finish it
(``RESULTS_H100.md``). This script runs the correctness stage's shape checks
(:func:`gpu_kernels._shape_checks`: CEM attention v1, v2 and v2 with the atomic dq, the plain call
and the default layer's, the tied MLP step v2 and v1, bf16 and fp16, the GPU settings' shapes) on
CPU tensors along cemlib's GPU path (``host_overhead.gpu_paths``: GPU configurations, the
autotuner, a stand-in driver for ``sm_90``) and records every compilation Triton is asked for,
through Triton's ``jit_cache_hook``, which it calls before compiling: the hook records the
request and declines it, so nothing compiles and nothing runs (the outputs are not computed; only
the launches are). A request is distinct by kernel, options (warps, stages) and Triton's cache key
(specialization and constants), as Triton's own in-memory cache is.

Rows: the count with the v2 autotuner on (it compiles every configuration of a kernel's space,
19-30, at each new specialization, then times each) and with each kernel's default configuration
(``CEMLIB_AUTOTUNE=0``, what the stage now runs, counted through the stage's own
``default_configurations``; the autotune spaces are checked configuration by
configuration on one shape by ``every_config_v2``), per kernel.

Usage: ``python benchmarks/compile_requests.py [--autotune on off] [--out FILE | --replace]``
(writes ``results/compile_requests_cpu.json``). Each count takes about 20 s on a 2-core CPU.
Relies on Triton internals (``knobs.runtime.jit_cache_hook``, ``JITFunction.warmup``), checked on
Triton 3.6 and 3.9.
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import os
import sys

os.environ["TRITON_INTERPRET"] = "0"  # compilations requested for sm_90, never the interpreter
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import host_overhead  # noqa: E402  (before gpu_kernels: it sets the interpreter off first)
import torch  # noqa: E402
from triton import knobs  # noqa: E402

import gpu_kernels  # noqa: E402
from cemlib.kernels import direct_launch  # noqa: E402
from cemlib.kernels import tied_attention_v2 as v2  # noqa: E402
from outputs import RESULTS, add_output_arguments, announce, command_line, write_json  # noqa: E402


def count_shape_checks(autotune: bool, settings: str = "gpu") -> dict:
    """Distinct compilations requested by the correctness stage's shape checks (``settings``:
    ``gpu_kernels.SETTINGS`` key) with the v2 autotuner on (cemlib's default), or off as the stage
    turns it off (``gpu_kernels.default_configurations``): ``{"total", "per_kernel",
    "errors"}``. Call :func:`stand_in` once first."""
    requests = collections.Counter()

    def hook(*, repr, key, **_):  # noqa: A002 - Triton's keyword
        requests[(repr.split("[")[0], repr, str(key))] += 1
        return True  # declined: Triton neither compiles nor launches

    errors = []
    previous, v2.AUTOTUNE = v2.AUTOTUNE, True  # cemlib's default
    knobs.runtime.jit_cache_hook = hook
    try:
        # off: as the stage runs them, inside its own default_configurations()
        with contextlib.nullcontext() if autotune else gpu_kernels.default_configurations():
            gpu_kernels._shape_checks(gpu_kernels.SETTINGS[settings], torch.device("cpu"),
                                      gpu_kernels.error_recorder(errors), {})
    finally:
        knobs.runtime.jit_cache_hook, v2.AUTOTUNE = None, previous
        v2._tuned.clear()
        v2._choices.clear()
        v2._fitting.clear()
    per_kernel = collections.Counter(name for name, _, _ in requests)
    return {"total": len(requests), "per_kernel": dict(sorted(per_kernel.items())),
            "errors": errors}


def stand_in() -> None:
    """cemlib's GPU path on CPU tensors with a stand-in ``sm_90`` driver
    (``host_overhead.gpu_paths``), every launch turned into a compilation request: a declined
    request returns no kernel to launch or to read spills from."""
    host_overhead.gpu_paths()
    direct_launch._enabled[0] = False
    direct_launch.launch = lambda kernel, grid, args, kw, cuda=True: kernel.warmup(
        *args, grid=grid, **kw)
    v2._spills = lambda kernel, grid, args, kw: (kernel.warmup(*args, grid=grid, **kw), 0)[1]


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--autotune", nargs="+", choices=("on", "off"), default=["on", "off"])
    p.add_argument("--settings", choices=tuple(gpu_kernels.SETTINGS), default="gpu",
                   help="the shapes of gpu_kernels.SETTINGS (default: the GPU run's)")
    add_output_arguments(p, "results/compile_requests_cpu.json")
    args = p.parse_args(argv)
    default = RESULTS / "compile_requests_cpu.json"
    announce(default, args.out, args.replace)
    stand_in()
    rows = []
    for mode in args.autotune:
        row = dict(stage="correctness (shape checks)", autotune=mode == "on",
                   **count_shape_checks(mode == "on", args.settings))
        print(f"autotune {mode}: {row['total']} distinct compilations requested", flush=True)
        rows.append(row)
    payload = dict(
        benchmark="compile_requests", env=host_overhead.run_env(),
        command=command_line(__file__, argv), settings=args.settings,
        note=("distinct Triton compilations requested for sm_90 (kernel, options, cache key) by "
              "gpu_kernels.py's correctness shape checks, on CPU tensors along cemlib's GPU path; "
              "each request recorded and declined, nothing compiled or launched"),
        rows=rows)
    write_json(payload, default, args.out, args.replace)
    return payload


if __name__ == "__main__":
    main()
