"""Every Triton kernel compiles for the H100 (sm_90) with the GPU tile sizes, in bf16, without
spilling registers.

No GPU is needed: ``benchmarks/compile_kernels.py`` compiles through Triton's bundled ``ptxas``
and reads each cubin's registers, local memory (spills) and shared memory with ``cuobjdump``.
This catches what the interpreter-run tests cannot (a kernel that only fails to compile for the
real target, or that spills at the GPU tile sizes). It runs in a fresh process because the
interpreter tests set ``TRITON_INTERPRET=1`` for this one.
"""

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest

# not imported here: test_kernels_triton.py must be the first to import triton (interpreter mode)
if importlib.util.find_spec("triton") is None:
    pytest.skip("triton is not installed", allow_module_level=True)
ROOT = Path(__file__).resolve().parent.parent


def test_all_kernels_compile_for_sm90_without_spills(tmp_path):
    out = tmp_path / "compile.json"
    run = subprocess.run([sys.executable, "benchmarks/compile_kernels.py", "--quick", "--arch",
                          "90", "--out", str(out)], cwd=ROOT, capture_output=True, text=True,
                         timeout=600)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    d = json.loads(out.read_text())
    kernels = {(r["case"].split(" bfloat16")[0], r["kernel"]) for r in d["records"]}
    fused_path = "attention d=64 shared-logits De=768"
    for name in ("_fwd_kernel", "_bwd_dkv_kernel", "_bwd_dq_kernel", "_headsum_kernel",
                 "_rowdot_kernel"):
        assert (fused_path, name) in kernels
    assert {r["kernel"] for r in d["records"]} >= {"_gate_kernel", "_dplr_kernel"}
    for r in d["records"]:
        assert r["arch"] == "sm_90" and r["num_warps"] == 4
        spilled = r["local_bytes"] + r["stack_bytes"]  # ptxas spills to the stack frame
        assert not r["spills"] and spilled == 0, f"{r['case']} {r['kernel']} spills {spilled} B"
        assert r["fits_shared"] and 0 < r["registers"] <= 255, r
