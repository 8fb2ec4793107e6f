"""The benchmark scripts run (CPU smoke mode) and write JSON with the fields results need.

Timings from these runs are not results: this only keeps the scripts from rotting between GPU runs.
"""

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def _run(args, tmp_path, name):
    out = tmp_path / f"{name}.json"
    r = subprocess.run([sys.executable, *args, "--out", str(out)], cwd=ROOT, capture_output=True,
                       text=True, timeout=600)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    return json.loads(out.read_text())


@pytest.mark.parametrize("script", ["bench_attention.py", "bench_mlp.py"])
def test_kernel_benchmark_smoke(script, tmp_path):
    d = _run([f"benchmarks/{script}", "--cpu-smoke"], tmp_path, script)
    assert d["mode"] != "gpu" and d["env"] and d["results"]
    for case in d["results"]:
        assert {"median_ms", "q20_ms", "q80_ms", "method", "dtype"} <= set(case)
        assert case["q20_ms"] <= case["median_ms"] <= case["q80_ms"]


def test_train_step_benchmark_smoke(tmp_path):
    d = _run(["benchmarks/train_step.py", "--device", "cpu", "--widths", "32", "--layers", "1",
              "--context", "16", "--batch", "2", "--warmup", "1", "--iters", "2"], tmp_path, "train")
    text = json.dumps(d)
    assert "tokens_per_s" in text and "llama" in text.lower() and "cem" in text.lower()


def test_cpu_speed_benchmark_smoke(tmp_path):
    d = _run(["benchmarks/cpu_speed.py", "--rounds", "2", "--steps", "1", "--warmup", "0"],
             tmp_path, "cpu_speed")
    rows = {r["key"]: r for r in d["rows"]}
    assert list(rows) == ["gpt", "llama", "cem", "cem-t2"]
    assert rows["llama"]["ratio_to_llama"] == 1.0 and rows["gpt"]["ratio_to_gpt"] == 1.0
    for r in rows.values():
        assert len(r["step_s_per_round"]) == 2 and r["tokens_per_s"] > 0
        assert r["tokens_per_step"] == r["batch"] * 64  # the cpu presets' context
        assert r["tokens_per_s"] == pytest.approx(r["tokens_per_step"] / r["median_step_s"])
        assert r["saved_activation_bytes"] > 0
    # the models are the trained ones: same parameter counts as the stored cpu results
    stored = json.loads((ROOT / "book/results/shakespeare_blocks_cpu/shakespeare_llama__seed0.json").read_text())
    assert rows["llama"]["params"] == stored["num_parameters"]
    # T = 2 keeps the keys/values and gamma of step 1 but saves a second step's activations
    assert rows["cem-t2"]["saved_activation_bytes"] > rows["cem"]["saved_activation_bytes"]
    assert {(g["variant"], g["reference"]) for g in d["goals"]} == {("llama", "gpt"), ("cem", "llama"),
                                                                    ("cem-t2", "llama")}


def test_cpu_speed_benchmark_suite_smoke(tmp_path):
    """The chapter 10 suite times every model of the task, built as its benchmark experiment."""
    from cemlib.train.experiments import BENCH_WIDTHS
    d = _run(["benchmarks/cpu_speed.py", "--suite", "bench-listops", "--rounds", "1", "--steps", "1",
              "--warmup", "0"], tmp_path, "cpu_speed_bench")
    rows = {r["key"]: r for r in d["rows"]}
    assert d["suite"] == "bench-listops" and set(rows) == set(BENCH_WIDTHS["listops"]) and d["goals"] == []
    for key, r in rows.items():
        assert r["experiment"] == f"bench-listops-{key}" and r["tokens_per_step"] == 32 * 30
        assert r["saved_activation_bytes"] > 0 and r["ratio_to_llama"] > 0
    # one block iterated 4 times costs about 4 blocks: more FLOPs than a 4-layer model of its size
    assert rows["nrgpt"]["forward_flops_per_token"] > 2 * rows["gpt"]["forward_flops_per_token"]
    # the same parameter counts as the stored benchmark runs
    stored = json.loads((ROOT / "book/results/bench_listops_cpu/bench_listops_nrgpt__seed0.json").read_text())
    assert rows["nrgpt"]["params"] == stored["num_parameters"]
    r = subprocess.run([sys.executable, "benchmarks/cpu_speed.py", "--suite", "bench-listops",
                        "--variants", "cem-t2"], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert r.returncode != 0 and "unknown variant" in r.stderr
