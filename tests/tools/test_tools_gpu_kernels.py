"""``tools/gpu/gpu_kernels.py``, the GPU call's measurements: a dry run on the CPU (every stage
writes its JSON, a second call resumes, a stage that no longer fits is skipped), and its helpers.
"""

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
TOOLS = ROOT / "tools" / "gpu"


def _run(args, tmp_path, name, timeout=600, env=None):
    out = tmp_path / f"{name}.json"
    r = subprocess.run([sys.executable, *args, "--out", str(out)], cwd=ROOT, capture_output=True,
                       text=True, timeout=timeout, env=env)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    return json.loads(out.read_text())


def _tool(name: str):
    """Import the script ``tools/gpu/<name>.py`` as a module."""
    import importlib
    sys.path.insert(0, str(TOOLS))
    try:
        return importlib.import_module(name)
    finally:
        sys.path.remove(str(TOOLS))


@pytest.mark.slow
def test_gpu_script_dry_run(tmp_path):
    """tools/gpu/gpu_kernels.py end to end on the CPU (interpreter, tiny shapes): every stage
    writes its JSON; a second call resumes (skips what is done); a stage that no longer fits in
    the call's time is skipped with a note."""
    out = tmp_path / "gpu"
    cmd = [sys.executable, "tools/gpu/gpu_kernels.py", "--dry-run", "--out-dir", str(out)]
    r = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    stages = ("correctness", "autotune", "attention", "profile", "mlp", "train")
    files = {s: json.loads((out / f"gpu_{s}_cpu_dry_run.json").read_text()) for s in stages}
    for s, d in files.items():
        assert d["status"] == "done" and d["mode"] == "dry run (not a result)", (s, d.get("error"))
        assert "<dir>" in d["command"] and str(out) not in d["command"]
    c = files["correctness"]
    assert c["passed"] and c["implementations"]["attention_v2"]["available"]
    assert {x["check"] for x in c["checks"]} >= {"attention_v2", "attention_diag_v2",
                                                 "attention_v2_atomic", "mlp_v2",
                                                 "direct_launch_v2"}
    every = next(x for x in c["checks"] if x["check"] == "every_config_v2")
    assert every["passed"] and every["checked"] == 12 and every["skipped"] == 0  # 6 spaces x 2
    assert {x["space"] for x in every["configurations"]} == {"fwd", "pre", "bwd", "headsum",
                                                             "extra_grads", "bwd_atomic"}
    direct = next(x for x in c["checks"] if x["check"] == "direct_launch_v2")
    assert direct["passed"] and not direct["direct_used"]   # the interpreter: Triton's own path
    assert files["autotune"]["mlp_elementwise"]["best"]
    methods = {x["method"] for x in files["attention"]["results"]}
    assert {"sdpa_untied", "sdpa_tied", "cem_v2", "cem_v2_atomic"} <= methods
    assert {x["method"] for x in files["profile"]["rows"]} >= {"sdpa_untied", "cem_v2"}
    # CUDA-graph replay is measured on a GPU only; the ratios are there, from wall times here
    assert all(x.get("graphed_ms") is None for x in files["profile"]["rows"])
    assert "wall" in files["profile"]["ratios"]["cem_v2 / sdpa_untied T=16"]
    assert "CUDA only" in files["profile"]["host"]["skipped"]  # host_overhead.run on a GPU
    assert {x["method"] for x in files["mlp"]["results"]} == {"v2", "v2_separate_dv", "eager"}
    assert set(files["mlp"]["v2_separate_dv_over_eager"]) == {"D_h=16 fwd", "D_h=16 fwd_bwd"}
    mlp_profile = files["mlp"]["profile"]
    assert {(x["method"], x["D_h"]) for x in mlp_profile["rows"]} == {
        ("v2", 16), ("v2_separate_dv", 16), ("eager", 16)}
    assert all(x["wall_ms"] > 0 and x["graphed_ms"] is None for x in mlp_profile["rows"])
    assert "wall" in mlp_profile["ratios"]["v2 / eager D_h=16"]
    assert "wall" in mlp_profile["ratios"]["v2_separate_dv / eager D_h=16"]
    assert [x["T"] for x in files["train"]["cem_over_llama"]] == [1, 2]
    again = subprocess.run(cmd + ["--stage", "mlp"], cwd=ROOT, capture_output=True, text=True,
                           timeout=600)
    assert again.returncode == 0, again.stderr[-3000:]
    short = subprocess.run(cmd + ["--stage", "train", "--force", "--total-s", "1"], cwd=ROOT,
                           capture_output=True, text=True, timeout=600)
    assert short.returncode == 0, short.stderr[-3000:]
    summary = json.loads((out / "gpu_summary_cpu_dry_run.json").read_text())["stages"]
    assert summary["mlp"]["status"] == "done earlier"
    assert summary["train"]["status"] == "skipped" and "left of the call" in summary["train"]["reason"]
    assert json.loads((out / "gpu_train_cpu_dry_run.json").read_text())["status"] == "done"


def test_gpu_script_finds_autotuners_built_at_first_call():
    """The autotune stage reads every ``triton.autotune`` of the v2 module, including those that
    the attention module's ``TUNING`` builds at its first call and keeps in ``tuners`` (keyed by
    kernel and padded head width) -- none of which exists at import."""
    import types

    triton = pytest.importorskip("triton")
    import triton.language as tl

    gpu_kernels = _tool("gpu_kernels")

    @triton.jit
    def _copy(x_ptr, BLOCK: tl.constexpr):
        pass

    tuner = triton.autotune([triton.Config({"BLOCK": 16})], key=[])(_copy)
    module = types.SimpleNamespace(TUNING=types.SimpleNamespace(tuners={("fwd", 64): tuner}),
                                   other=1)
    assert gpu_kernels._autotuners(module) == {"fwd@64": tuner}
    assert gpu_kernels._autotuners(types.SimpleNamespace()) == {}


def test_sync_check_counts_synchronising_calls_not_the_debug_modes_notice():
    gpu_kernels = _tool("gpu_kernels")
    notice = ("Synchronization debug mode is a prototype feature and does not yet detect all "
              "synchronizing operations (Triggered internally at /pytorch/torch/csrc/cuda/Module.cpp:1003.)")
    call = "called a synchronizing CUDA operation (Triggered internally at c10/cuda/CUDAFunctions.cpp:151.)"
    assert gpu_kernels.synchronising_calls([notice]) == []
    assert gpu_kernels.synchronising_calls([notice, call, call]) == [call[:200]] * 2
