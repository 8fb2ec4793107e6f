"""The CPU settings under which the book's chapters are executed and checked.

The committed outputs of a chapter are compared digit for digit (nbval, strict). A float32 training
run of a few hundred steps amplifies the last bit of every matrix product, and the math libraries
pick their kernels by processor: the same code printed a live accuracy of 0.386 on an AMD EPYC and
0.380 on an Intel Xeon. So the chapters run with the kernel choice pinned to one that every x86-64
processor executes alike:

- ``MKL_CBWR=COMPATIBLE``: oneMKL's conditional numerical reproducibility, on its SSE2 branch without
  the approximate reciprocal instructions (``rcpps``/``rsqrtps``), which is the branch oneMKL offers
  for the same results on Intel and non-Intel processors (the AVX2 branch falls back to automatic
  dispatch on non-Intel processors). PyTorch's CPU matrix products go through oneMKL.
- ``ATEN_CPU_CAPABILITY=avx2``: PyTorch's own vectorised kernels in their AVX2 build, also where the
  processor has AVX-512.
- ``ONEDNN_MAX_CPU_ISA=AVX2``: the same cap for oneDNN.
- ``OPENBLAS_CORETYPE=Haswell``: one kernel set for the OpenBLAS inside NumPy and SciPy.

This narrows the difference between processors but does not remove it. Chapter 3's live run (the
CEM MLP on tiny Shakespeare, CPU preset, float32) ends at a validation loss of 1.832 with these
settings on the Intel Xeon that executed the committed chapter and at 1.826 on an AMD EPYC (1.830
there without them, 1.825 with ``MKL_CBWR=AVX2``; one thread or two: the same to the last bit). So
the cells that print numbers of a live float32 training run are tagged ``nbval-ignore-output``: they
still run and their asserts still decide, and ``book/rerun.py`` refuses the tag on a cell that reads
nothing from a live run. Every other output is compared digit for digit.

The price is speed: matrix products on the SSE2 branch take about 1.5-2x longer in a chapter. A
reader's own run is not affected unless they set these variables: their numbers may differ from
the book's in the last printed digits, never in a conclusion. Values already in the environment are
kept (``setdefault``), so one variable can be overridden for an experiment. Off x86-64 (Apple
silicon, ARM) the variables are not set: they mean nothing there.
"""

from __future__ import annotations

import os
import platform

PORTABLE_ENV = {
    "MKL_CBWR": "COMPATIBLE",
    "ATEN_CPU_CAPABILITY": "avx2",
    "ONEDNN_MAX_CPU_ISA": "AVX2",
    "OPENBLAS_CORETYPE": "Haswell",
}


def apply(environ=None) -> dict:
    """Set :data:`PORTABLE_ENV` in ``environ`` (default ``os.environ``) where not already set, on
    x86-64 only; must run before the process (or the kernel it starts) imports torch or NumPy.
    Returns the settings in effect."""
    environ = os.environ if environ is None else environ
    if platform.machine().lower() not in ("x86_64", "amd64"):
        return {}
    for key, value in PORTABLE_ENV.items():
        environ.setdefault(key, value)
    return {key: environ[key] for key in PORTABLE_ENV}
