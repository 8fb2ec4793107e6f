"""The gated-MLP step's element-wise kernels compile for the H100 (sm_90) to bandwidth-bound
code: every global load and store is 128 bits wide (one access per operand per thread in bf16),
no register spills, and few enough instructions per element that the memory system, not the
issue rate, bounds them (see ``mlp_v2_elementwise`` in ``benchmarks/compile_kernels.py``).

No GPU is needed (Triton's bundled ``ptxas`` and ``cuobjdump``); a fresh process, because the
interpreter tests set ``TRITON_INTERPRET=1`` for this one.
"""

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest

if importlib.util.find_spec("triton") is None:
    pytest.skip("triton is not installed", allow_module_level=True)
ROOT = Path(__file__).resolve().parents[2]

PROBE = """
import json, sys, torch
sys.path.insert(0, "benchmarks")
import compile_kernels
print(json.dumps(compile_kernels.mlp_v2_elementwise([90], [torch.bfloat16, torch.float32])))
"""


@pytest.mark.slow
def test_mlp_v2_elementwise_kernels_are_vectorised_for_sm90():
    run = subprocess.run([sys.executable, "-c", PROBE], cwd=ROOT, capture_output=True, text=True,
                         timeout=600)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    rows = json.loads(run.stdout.strip().splitlines()[-1])
    # operands read / written: forward h, gamma -> a; backward h, gamma, da -> dgamma, dh
    operands = {"_silu_gate_kernel": (2, 1), "_silu_gate_bwd_kernel": (3, 2)}
    assert {(r["kernel"], r["dtype"]) for r in rows} == {
        (k, d) for k in operands for d in ("bfloat16", "float32")}
    for r in rows:
        loads, stores = operands[r["kernel"]]
        per_access = 16 // (2 if r["dtype"] == "bfloat16" else 4)  # entries in 128 bits
        accesses = r["elements_per_thread"] // per_access
        assert r["global_accesses"] == sorted(["LDG.E.128"] * loads * accesses
                                              + ["STG.E.128"] * stores * accesses), r
        assert r["local_bytes"] == r["stack_bytes"] == 0, r
        # issue rate: 128 thread-instructions per clock per SM; at <= 40 per element the H100's
        # 132 SMs (1.755 GHz) issue >= 0.74e12 elements/s, above what its HBM (3.35 TB/s) feeds:
        # 0.56e12 bf16 elements/s forward (6 bytes each), 0.34e12 backward (10 bytes each)
        assert r["instructions_per_element"] <= 40, r
