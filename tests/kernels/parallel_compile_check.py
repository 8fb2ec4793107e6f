"""Run by tests/kernels/test_kernels_runtime.py in a fresh process (compiled kernels, not the
interpreter, its own empty Triton cache): the first plain attention call (forward and backward)
with an autotune space of three configurations per kernel, kernels compiled for sm_90 and
launched by the stand-in driver of ``tools/gpu/host_overhead.py``; the autotuner's timing runs
reduced to the compilation each starts with. Prints, per kernel, the threads its compilations
ran in, as JSON (``CEMLIB_PARALLEL_COMPILE`` set by the caller)."""

import collections
import json
import os
import sys
import threading

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "tools", "gpu"))
sys.path.insert(0, ROOT)

import host_overhead as ho  # noqa: E402  (sets TRITON_INTERPRET=0 before triton loads)
import triton.compiler  # noqa: E402
from triton.runtime.autotuner import Autotuner  # noqa: E402

from cemlib.kernels import attention  # noqa: E402


def bench_by_compiling(self, *args, config, **meta):
    """Stands in for ``Autotuner._bench`` without a GPU: the compilation a timing run starts
    with, then equal times (the autotuner keeps its first configuration)."""
    self.fn.run(*args, **dict(meta, **config.all_kwargs(), warmup=True))
    return [1.0, 1.0, 1.0]


def main():
    ho.gpu_paths()
    Autotuner._bench = bench_by_compiling
    for name in ("fwd", "pre", "bwd"):
        attention.GPU_CONFIGS[name] = {64: attention.GPU_CONFIGS[name][64][:3]}
    threads = collections.defaultdict(list)
    compile_ = triton.compiler.compile  # what each kernel's binder takes as its compiler

    def recording(src, *args, **kw):
        threads[src.name].append(threading.current_thread() is threading.main_thread())
        return compile_(src, *args, **kw)
    triton.compiler.compile = recording
    call, _ = ho.call_of("cem_v2")
    call()
    call()  # a second call compiles nothing
    print(json.dumps({"parallel": attention.TUNING.parallel_compile,
                      "compiled_in_main_thread": dict(threads)}))


if __name__ == "__main__":
    main()
