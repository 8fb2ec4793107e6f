"""The autotune space is compiled in parallel threads before the autotuner times it
(``tied_attention_v2._precompile``), and the autotuner then compiles nothing again.

No GPU is needed: ``parallel_compile_check.py`` (a fresh process per case, compiled kernels, an
empty Triton cache) makes the first plain v2 attention call with three configurations per
kernel, kernels compiled for sm_90 and launched by a stand-in driver, and records in which
thread each compilation ran. With parallel compilation every configuration is compiled exactly
once, all in worker threads: had the warm-up compiled under another cache key than the
autotuner's launch (a missing ``num_warps``, say), the autotuner would compile each again in
the main thread and the counts would double. With ``CEMLIB_PARALLEL_COMPILE=0`` the same
compilations happen one after another in the main thread, inside the autotuner, as Triton does.
The fold of the bias gradients (``_fold_kernel``, one fixed configuration, not autotuned) is
compiled once, in the main thread, either way.
The time this saves is measured by ``benchmarks/first_call.py``.
"""

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

if importlib.util.find_spec("triton") is None:
    pytest.skip("triton is not installed", allow_module_level=True)
ROOT = Path(__file__).resolve().parent.parent


def _run(tmp_path, parallel):
    cache = tmp_path / ("parallel" if parallel else "serial")
    run = subprocess.run([sys.executable, str(ROOT / "tests" / "parallel_compile_check.py")],
                         cwd=ROOT, capture_output=True, text=True, timeout=1200,
                         env={**os.environ, "TRITON_INTERPRET": "0", "TRITON_CACHE_DIR": str(cache),
                              "CEMLIB_PARALLEL_COMPILE": "1" if parallel else "0"})
    assert run.returncode == 0, run.stderr[-3000:]
    return json.loads(run.stdout.strip().splitlines()[-1])


@pytest.mark.skipif((os.cpu_count() or 1) < 2, reason="parallel compilation needs two cores")
def test_the_autotune_space_is_compiled_once_in_worker_threads(tmp_path):
    out = _run(tmp_path, True)
    assert out["parallel"]
    assert out["compiled_in_main_thread"] == {
        "_fwd_kernel": [False] * 3, "_pre_kernel": [False] * 3, "_bwd_kernel": [False] * 3,
        "_fold_kernel": [True]}


def test_without_parallel_compilation_the_autotuner_compiles(tmp_path):
    out = _run(tmp_path, False)
    assert not out["parallel"]
    assert out["compiled_in_main_thread"] == {
        "_fwd_kernel": [True] * 3, "_pre_kernel": [True] * 3, "_bwd_kernel": [True] * 3,
        "_fold_kernel": [True]}
