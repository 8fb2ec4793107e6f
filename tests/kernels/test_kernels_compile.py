"""Every Triton kernel compiles for the H100 (sm_90) in bf16 without spilling registers, and the
attention kernels' loops stay within their instruction budgets.

No GPU is needed: ``benchmarks/compile_kernels.py`` compiles through Triton's bundled ``ptxas``
and reads each cubin's registers, local memory (spills) and shared memory with ``cuobjdump``, and
its machine code (SASS) for the instructions of every loop. This catches what the
interpreter-run tests cannot: a kernel that only fails to compile for the real target, that
spills at the GPU tile sizes, that falls back from ``wgmma`` (``HGMMA``) to ``mma.sync``, or whose
loops carry more element-wise work than the budget (``benchmarks/NOTES.md``). It runs in a fresh
process because the interpreter tests set ``TRITON_INTERPRET=1`` for this one.

The committed reports are checked too, without compiling: the attention's autotune space
(``attention.GPU_CONFIGS``, from ``attention_configs.json``) is the spill-free part of the
committed sweep, with at least 15 configurations per kernel at head width 64, and the committed
report's default configurations meet the budgets (records with ``version`` 2: the attention
kernels; the stored report also holds the removed first generation's).
"""

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

# not imported here: the interpreter tests must be the first to import triton (interpreter mode)
if importlib.util.find_spec("triton") is None:
    pytest.skip("triton is not installed", allow_module_level=True)
ROOT = Path(__file__).resolve().parents[2]
RESULTS = ROOT / "benchmarks" / "results"
V2_KERNELS = {"_fwd_kernel", "_pre_kernel", "_bwd_kernel", "_headsum_kernel", "_extra_grads_kernel",
              "_fold_kernel"}
NO_PRODUCT = {"_fold_kernel"}  # the bias-gradient fold sums rows: no matrix product
# non-MMA instructions per score element of each main loop (below the diagonal band); the
# atomic-dq backward's one loop does the work of both backward loops and keeps one loop's budget
BUDGET = {"forward": 12, "backward dkv": 20, "backward dq": 20, "backward dkv + atomic dq": 20}


def check_v2_records(records):
    """wgmma in every v2 kernel with a matrix product, and the main loops within budget."""
    v2 = [r for r in records if r["version"] == 2]
    assert {r["kernel"] for r in v2} == V2_KERNELS
    for r in v2:
        assert r["arch"] != "sm_90" or not any(lp["opcodes"].get("HMMA") for lp in r["loops"]), r
        if r["kernel"] in NO_PRODUCT:
            continue
        if r["kernel"] != "_pre_kernel" or r["flags"].get("HAS_DPB"):
            assert any(lp["opcodes"].get("HGMMA") for lp in r["loops"]), (r["case"], r["kernel"])
    main = {(r["case"], lp["kind"]): lp["non_mma_per_element"] for r in v2 for lp in r["loops"]
            if lp["kind"] in BUDGET}
    assert {kind for _, kind in main} == set(BUDGET)
    for (case, kind), value in main.items():
        assert value <= BUDGET[kind], (case, kind, value)


@pytest.mark.slow
def test_all_kernels_compile_for_sm90_without_spills(tmp_path):
    out = tmp_path / "compile.json"
    run = subprocess.run([sys.executable, "benchmarks/compile_kernels.py", "--quick", "--arch",
                          "90", "--out", str(out)], cwd=ROOT, capture_output=True, text=True,
                         timeout=1200)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    d = json.loads(out.read_text())
    assert {r["kernel"] for r in d["records"]} >= V2_KERNELS | {
        "_dplr_kernel", "_silu_gate_kernel", "_silu_gate_bwd_kernel"}
    for r in d["records"]:
        assert r["arch"] == "sm_90"
        assert r["version"] == 2 or r["num_warps"] == 4
        spilled = r["local_bytes"] + r["stack_bytes"]  # ptxas spills to the stack frame
        assert not r["spills"] and spilled == 0, f"{r['case']} {r['kernel']} spills {spilled} B"
        assert r["fits_shared"] and 0 < r["registers"] <= 255, r
    check_v2_records(d["records"])


@pytest.mark.slow
def test_triton_dots_run_on_tensor_cores_from_the_capability_dispatch_assumes(tmp_path):
    """``cemlib.kernels.dispatch`` sends attention to the kernels only on GPUs of compute
    capability >= ``TENSOR_CORE_DOTS_FROM`` (8.0): below it the installed Triton computes
    ``tl.dot`` on the FMA units (one 64^3 product: 2048 FFMA per thread on sm_75, no HMMA).
    Compiled for sm_75, sm_80 and sm_90; the committed ``compile_dots.json`` says the same."""
    out = tmp_path / "dots.json"
    run = subprocess.run([sys.executable, "benchmarks/compile_kernels.py", "--dots", "--arch",
                          "75", "80", "90", "--out", str(out)], cwd=ROOT, capture_output=True,
                         text=True, timeout=600)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    from cemlib.kernels.dispatch import TENSOR_CORE_DOTS_FROM
    threshold = 10 * TENSOR_CORE_DOTS_FROM[0] + TENSOR_CORE_DOTS_FROM[1]
    for d in (json.loads(out.read_text()), json.loads((RESULTS / "compile_dots.json").read_text())):
        rows = [r for r in d["records"] if "error" not in r]
        assert {r["arch"] for r in rows} >= {"sm_75", "sm_80", "sm_90"}
        for r in rows:
            on_tensor_cores = int(r["arch"][3:]) >= threshold
            assert r["tensor_cores"] is on_tensor_cores, r
            assert (r["fma_instructions"] > 0) is not on_tensor_cores, r
        assert d["tensor_cores_from"] == threshold


@pytest.mark.slow
def test_autotuning_off_picks_the_first_entry_that_loads_without_spilling():
    """``CEMLIB_AUTOTUNE=0`` on an A100 (sm_80) with the installed Triton: the forward's entries
    are compiled and loaded (by a stand-in driver that reads each cubin's spills and refuses
    more shared memory than the A100's 163 KiB per block) without a launch, in order, until one
    loads without spilling, and that one runs. Which entries spill depends on the Triton version
    (Triton 3.9: entries 0-2 spill for sm_80, entry 3 does not; on sm_75 the first of 19 that
    loads without spilling is entry 17), so the test checks the rule, not an index; the
    refusals of a smaller GPU are tested with a stand-in in ``test_kernels_runtime.py``."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")])
    run = subprocess.run([sys.executable, "tests/kernels/first_fitting_check.py", "80",
                          str(163 * 1024)],
                         cwd=ROOT, capture_output=True, text=True, timeout=900, env=env)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    out = json.loads(run.stdout)
    probed, chosen = out["probed"], out["chosen"]
    assert probed and chosen == probed[-1]["index"]
    assert all(not p["loads"] or p["spills"] > 0 for p in probed[:-1])
    assert probed[-1]["loads"] and probed[-1]["spills"] == 0


def test_committed_reports_agree_with_the_autotune_space():
    code = ("import json; from cemlib.kernels import attention as v;"
            "print(json.dumps({n: {str(w): c for w, c in t.items()} for n, t in "
            "v.GPU_CONFIGS.items()}))")  # in a subprocess: the module imports triton
    run = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True,
                         env={**os.environ, "TRITON_INTERPRET": "0"})
    assert run.returncode == 0, run.stderr[-2000:]
    space = json.loads(run.stdout)
    sweep = json.loads((RESULTS / "compile_kernels_sweep.json").read_text())
    report = json.loads((RESULTS / "compile_kernels.json").read_text())
    envs = [report["env"]] + [part["env"] for part in sweep.get("parts", [sweep])]
    for env in envs:  # recorded from committed code (each part of a merged sweep)
        assert env["git_commit"] and not env["git_commit"].endswith("+dirty")
    seen = {(r["name"], str(0 if r["name"] == "extra_grads" else r["width"]),
             json.dumps(r["config"], sort_keys=True)): r for r in sweep["records"]}
    for name, by_width in space.items():
        for width, configs in by_width.items():
            assert configs == sweep["spill_free"][name][width], (name, width)
            if width in ("0", "64"):
                assert len(configs) >= 15, (name, width, len(configs))
            for c in configs:
                r = seen[(name, width, json.dumps(c, sort_keys=True))]
                assert not r["spills"] and r["fits_shared"], r
    sixteen_bit = [r for r in report["records"] if r["arch"] == "sm_90"
                   and r["case"].split()[-1] in ("bfloat16", "float16")]
    check_v2_records(sixteen_bit)
    assert not any(r["spills"] for r in sixteen_bit)


def test_committed_fit_report_for_a_t4():
    """``compile_kernels.py --fit 75``: the whole v2 autotune space compiled for sm_75 (a T4,
    64 KiB of shared memory per block, float16). Every kernel keeps entries that load there, so
    the autotuner has a choice on a T4 and ``CEMLIB_AUTOTUNE=0`` finds one
    (``runtime.Tuning.first_fitting``); the summary is what the records say, the space is the
    one committed, and the run came from committed code."""
    code = ("import json; from cemlib.kernels import attention as v;"
            "print(json.dumps({n: v.TUNING.configs(n, 64) for n in v.GPU_CONFIGS}))")
    run = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True,
                         env={**os.environ, "TRITON_INTERPRET": "0"})
    assert run.returncode == 0, run.stderr[-2000:]
    space = json.loads(run.stdout)
    fit = json.loads((RESULTS / "compile_kernels_fit_sm75.json").read_text())
    assert fit["env"]["git_commit"] and not fit["env"]["git_commit"].endswith("+dirty")
    assert fit["arch"] == "sm_75" and all(r["arch"] == "sm_75" for r in fit["records"])
    assert set(fit["summary"]) == set(space)
    for name, row in fit["summary"].items():
        recs = [r for r in fit["records"] if r["name"] == name]
        assert [recs[0]["config"]] + [r["config"] for a, r in zip(recs, recs[1:])
                                      if r["index"] != a["index"]] == space[name]
        loads = sorted({r["index"] for r in recs} - {r["index"] for r in recs
                                                     if not r["fits_shared"]})
        assert row["entries"] == len(space[name]) and row["load"] == len(loads) >= 1, name
        assert row["first_loading"] == loads[0], name



@pytest.mark.slow
def test_the_committed_report_is_what_the_kernels_compile_to(tmp_path):
    """Compiled again for sm_90 in bf16 (ALiBi with both biases, head width 64: the case chapter 11
    used to recompile in a cell), every kernel has the registers, local memory, dynamic shared
    memory and per-loop instruction counts that the committed report holds, does not spill, and
    runs its loops on ``wgmma``. The chapter now shows the committed report; this test keeps it
    honest (it fails when a kernel changes and the report is not recompiled)."""
    case = "v2 attention d=64 alibi+self+cross"
    out = tmp_path / "case.json"
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    run = subprocess.run([sys.executable, "benchmarks/compile_kernels.py", "--quick", "--arch",
                          "90", "--case", case, "--out", str(out)], cwd=ROOT, capture_output=True,
                         text=True, timeout=900, env=env)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    fresh = json.loads(out.read_text())["records"]
    report = json.loads((RESULTS / "compile_kernels.json").read_text())
    stored = {(r["case"], r["kernel"], json.dumps(r["flags"], sort_keys=True)): r
              for r in report["records"] if r["arch"] == "sm_90"}
    assert {r["case"] for r in fresh} == {f"{case} bfloat16", f"{case} atomic-dq bfloat16"}
    for r in fresh:
        old = stored[(r["case"], r["kernel"], json.dumps(r["flags"], sort_keys=True))]
        for field in ("registers", "local_bytes", "dynamic_shared_bytes"):
            assert r[field] == old[field], (r["kernel"], field, r[field], old[field])
        assert [lp["instructions"] for lp in r["loops"]] == [lp["instructions"] for lp in old["loops"]]
        assert not r["spills"]
    assert any(lp["opcodes"].get("HGMMA") for r in fresh for lp in r["loops"])
