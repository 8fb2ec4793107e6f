"""Direct launches (:mod:`cemlib.kernels.direct_launch`) hand the launcher exactly what Triton's
own launch path would.

No GPU is needed: ``direct_launch_check.py`` (in a fresh process, compiled kernels rather than the
interpreter) compiles the v2 attention kernels for sm_90 and replaces the CUDA driver by one whose
launchers record their arguments. Every launch of four calls (plain; ``q`` at an address that is
not 16-byte aligned, which Triton compiles separately; atomic ``dq``; the default layer's call
with the shared diagonal) is recorded through ``JITFunction.run`` and through the direct path
(the calls in that order from empty caches, each repeated until it hits them), with autotuning
and with fixed configurations, and compared: the same compiled kernel, grid, stream, metadata,
hooks and arguments (where no launch hook is set, the direct path passes none and no metadata,
which the launcher hands only to hooks; with a hook, a fifth call, exactly Triton's). With a cache key that ignored the alignment, the misaligned call would
launch the kernel compiled for the aligned one: that comparison fails, in both modes (shown once,
when the test was written).
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


def test_direct_launches_equal_tritons_own():
    run = subprocess.run([sys.executable, str(ROOT / "tests" / "direct_launch_check.py")],
                         cwd=ROOT, capture_output=True, text=True, timeout=1200,
                         env={**os.environ, "TRITON_INTERPRET": "0",
                              "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get(
                                  "PYTHONPATH", "")])})
    assert run.returncode == 0, run.stderr[-3000:]
    out = json.loads(run.stdout)
    assert out["supported"], "the installed Triton no longer launches the way direct_launch copies"
    for name, s in out["scenarios"].items():
        assert s["same"], (name, s["first_difference"])
        # the plain calls' bias gradients are folded by a launch of their own (not with atomic
        # dq); the default layer's call (no biases here) has none
        expected = 6 if "default" in name else 3 if "atomic" in name else 4
        assert s["launches"] == expected, (name, s)
    assert len(out["scenarios"]) == 10
    assert out["misaligned_q_uses_other_forward_kernel"]
    assert out["hooked_launches_get_metadata"]
    assert out["hooked_launches_get_metadata (fixed configurations)"]


def test_direct_launch_falls_back_off_cuda():
    """Off CUDA (and under the interpreter) a launch is Triton's ``kernel[grid](...)``."""
    from cemlib.kernels import direct_launch

    calls = []

    class Kernel:
        pre_run_hooks = []

        def __getitem__(self, grid):
            return lambda *args, **kw: calls.append((grid, args, kw)) or "compiled"

    cached = len(direct_launch._compiled)
    for _ in range(2):
        assert direct_launch.launch(Kernel(), (2, 1), (1, 2), {"X": 3}, cuda=False) == "compiled"
    assert calls == [((2, 1), (1, 2), {"X": 3})] * 2 and len(direct_launch._compiled) == cached


def test_direct_launch_cache_starts_over_when_full(monkeypatch):
    """The cache of compiled kernels is bounded (a sampling loop launches at every length): at
    ``MAX_ENTRIES`` keys it starts over instead of growing."""
    from cemlib.kernels import direct_launch

    class Kernel:
        pre_run_hooks = []
        fn = staticmethod(lambda L: None)  # the Python function (its parameters are bound once)

        def __getitem__(self, grid):
            return lambda *args, **kw: "compiled"

    class Driver:
        def get_current_device(self):
            return 0

    monkeypatch.setattr(direct_launch, "MAX_ENTRIES", 3)
    monkeypatch.setattr(direct_launch, "_compiled", {})
    monkeypatch.setattr(direct_launch, "_enabled", [True])
    monkeypatch.setattr(direct_launch, "SUPPORTED", True)
    import triton.runtime
    monkeypatch.setattr(triton.runtime.driver, "_active", Driver(), raising=False)
    for L in range(5):
        direct_launch.launch(Kernel(), (1,), (L,), {})
    assert len(direct_launch._compiled) == 2   # 3 keys, cleared at the 4th, then 2
