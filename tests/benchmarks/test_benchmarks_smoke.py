"""The benchmark scripts run (CPU smoke mode) and write JSON with the fields results need.

Timings from these runs are not results: this only keeps the scripts from rotting between GPU runs.
"""

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _run(args, tmp_path, name, timeout=600, env=None):
    out = tmp_path / f"{name}.json"
    r = subprocess.run([sys.executable, *args, "--out", str(out)], cwd=ROOT, capture_output=True,
                       text=True, timeout=timeout, env=env)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    return json.loads(out.read_text())


def _benchmark(name: str):
    """Import the benchmark script ``benchmarks/<name>.py`` as a module."""
    import importlib
    sys.path.insert(0, str(ROOT / "benchmarks"))
    try:
        return importlib.import_module(name)
    finally:
        sys.path.pop(0)


@pytest.mark.slow
@pytest.mark.parametrize("script", ["bench_attention.py", "bench_mlp.py"])
def test_kernel_benchmark_smoke(script, tmp_path):
    d = _run([f"benchmarks/{script}", "--cpu-smoke"], tmp_path, script)
    assert d["mode"] != "gpu" and d["env"] and d["results"]
    for case in d["results"]:
        assert {"median_ms", "q20_ms", "q80_ms", "method", "dtype"} <= set(case)
        assert case["q20_ms"] <= case["median_ms"] <= case["q80_ms"]


@pytest.mark.slow
def test_train_step_benchmark_smoke(tmp_path):
    d = _run(["benchmarks/train_step.py", "--device", "cpu", "--widths", "32", "--layers", "1",
              "--context", "16", "--batch", "2", "--warmup", "1", "--iters", "2", "--T", "1", "2"],
             tmp_path, "train")
    assert [r["model"] for r in d["rows"]] == ["llama d=32", "cem T=1 d=32", "cem T=2 d=32"]
    for r in d["rows"]:  # every model built from the same defaults, finite checks on
        assert r["tokens_per_s"] > 0 and r["check_finite"] is True and r["graph_breaks"] is None
    assert [(x["T"], x["target"]) for x in d["cem_over_llama"]] == [(1, 0.9), (2, 0.55)]


@pytest.mark.slow
def test_mlp_memory_prediction_smoke(tmp_path):
    """The CPU prediction of the GPU peak memory: v2 saves one (N, D_v) tensor for backward
    (eager three), and its forward+backward peak is at most 0.7 of eager's (N >> D_h here, as in
    the GPU setting); the profiler saw every free (nothing left allocated)."""
    d = _run(["benchmarks/bench_mlp.py", "--memory-cpu", "--cpu-smoke"], tmp_path, "memory")
    rows = {r["method"]: r for r in d["rows"]}
    assert rows["v2"]["saved_bytes_per_ND_v"] == 1 and rows["eager"]["saved_bytes_per_ND_v"] == 3
    assert all(r["fwd_net_bytes"] == r["fwd_bwd_net_bytes"] == 0 for r in rows.values())
    ratio = d["v2_over_eager_peak"]["D_h=16"]
    assert ratio["fwd_bwd"] <= 0.7 and ratio["fwd"] < 1


@pytest.mark.slow
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


@pytest.mark.slow
def test_cpu_speed_benchmark_suite_smoke(tmp_path):
    """The chapter 10 suite times every model of the task, built as its benchmark experiment."""
    from cemlib.train.presets.bench import WIDTHS as BENCH_WIDTHS
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


def test_train_step_sorts_kernels_into_families():
    """The train stage's profile: GPU time per step by kernel family, first matching family,
    'other' for the rest, in ms per step; the longest kernels first."""
    train_step = _benchmark("train_step")

    per_kernel_us = {"_bwd_kernel": 4000.0, "_fwd_kernel": 1000.0, "nvjet_tst_128x256_h_bz": 6000.0,
                     "triton_poi_fused_add_mul_0": 800.0, "void at::native::vectorized_elementwise_kernel": 200.0,
                     "Memset (Device)": 20.0}
    k = train_step.kernel_families(per_kernel_us, steps=2)
    assert k["ms_per_step"] == {"matrix products (cuBLAS)": 3.0, "cemlib attention (Triton)": 2.5,
                                "fused element-wise (Inductor)": 0.4,
                                "element-wise / reductions (eager)": 0.1, "other": 0.01}
    assert list(k["ms_per_step"]) == sorted(k["ms_per_step"], key=lambda f: -k["ms_per_step"][f])
    assert k["total_ms_per_step"] == sum(per_kernel_us.values()) / 2e3
    assert k["longest"][0] == {"name": "nvjet_tst_128x256_h_bz", "ms_per_step": 3.0}


def test_train_step_counts_the_kernels_each_model_compiled():
    """A train-stage row says how many kernels its model compiled into Triton's cache (the
    counter's difference around the row: what says on a GPU whether the carried cache was found);
    without a counter (CPU, dry run) the row has no such field."""
    import torch
    train_step = _benchmark("train_step")
    configs = train_step.model_configs([16], [1], vocab=11, context=8, layers=1, head_dim=8)
    counts = iter([5, 9, 9, 9])          # Llama compiles 4, CEM none

    rows = train_step.run(configs, batch=2, device=torch.device("cpu"), bf16=False, compile_=False, warmup=0,
                          iters=1, peak=None, compiled=lambda: next(counts))
    assert [r["triton_kernels_compiled"] for r in rows] == [4, 0]
    rows = train_step.run(configs[:1], batch=2, device=torch.device("cpu"), bf16=False, compile_=False,
                          warmup=0, iters=1, peak=None)
    assert "triton_kernels_compiled" not in rows[0]


def test_train_step_records_graph_break_reasons():
    """The train stage records how many graph breaks a compiled model had and why (the H100 run
    recorded 10 for CEM and no reason; they came from the dispatcher's ``find_spec``)."""
    import torch
    from torch._dynamo.utils import counters
    train_step = _benchmark("train_step")

    def breaks_once(x):
        x = x + 1
        torch._dynamo.graph_break()
        return x * 2

    torch._dynamo.reset()
    counters.clear()
    torch.compile(breaks_once, backend="eager")(torch.zeros(3))
    n, reasons = train_step._graph_breaks()
    assert n == 1 and len(reasons) == 1 and reasons[0]["count"] == 1
    assert "graph_break" in reasons[0]["reason"]


def test_train_step_compile_modes_compare_like_with_like(monkeypatch):
    """Each CEM row is compared with Llama's row of the same width *and* compile mode (the train
    stage runs the models compiled plainly, then with CUDA graphs); a configuration that raises
    is recorded with its error and the next one runs. Failing input: ratios keyed on the width
    alone pair the plainly compiled CEM row with Llama's under CUDA graphs (0.25 here, not 0.5)."""
    import torch
    train_step = _benchmark("train_step")
    rows = [dict(attn="llama", d_model=8, compile_mode="default", tokens_per_s=100.0),
            dict(attn="llama", d_model=8, compile_mode="reduce-overhead", tokens_per_s=200.0),
            dict(attn="cem", d_model=8, T_attn=1, compile_mode="default", tokens_per_s=50.0),
            dict(attn="cem", d_model=8, T_attn=1, compile_mode="reduce-overhead",
                 tokens_per_s=200.0),
            dict(model="cem T=2 d=8", compile_mode="reduce-overhead", error="RuntimeError: x")]
    got = {(r["compile_mode"], r["T"]): r["cem_over_llama"] for r in train_step.ratios_to_llama(rows)}
    assert got == {("default", 1): 0.5, ("reduce-overhead", 1): 1.0}

    configs = train_step.model_configs([16], [1], vocab=11, context=8, layers=1, head_dim=8)
    real = train_step.bench_one

    def fails_for_cem(cfg, *args):
        if cfg.attn == "cem":
            raise RuntimeError("CUDA graphs refused")
        return real(cfg, *args)
    monkeypatch.setattr(train_step, "bench_one", fails_for_cem)
    out = train_step.run(configs + configs[:1], batch=2, device=torch.device("cpu"), bf16=False,
                         compile_=False, warmup=0, iters=1, peak=None)
    assert [("error" in r, r["model"]) for r in out] == [
        (False, "llama d=16"), (True, "cem T=1 d=16"), (False, "llama d=16")]
    assert out[1]["error"] == "RuntimeError: CUDA graphs refused"


def test_train_step_host_summary_names_the_custom_operators():
    """The train stage's host summary (``train_step.host_summary``): per profiled step, the
    operators with the most self CPU time and every custom operator of the given namespace with
    its inclusive CPU time (a compiled CEM graph calls cemlib's operators into Python: the host
    time the H100 run found). Checked on a custom operator whose body sleeps 2 ms, called once
    per step: it is named, once per step, with at least 2 ms of CPU time."""
    import time as _time

    import torch
    from torch.profiler import ProfilerActivity, profile
    train_step = _benchmark("train_step")

    @torch.library.custom_op("cemlib_host_test::slow", mutates_args=())
    def slow(x: torch.Tensor) -> torch.Tensor:
        _time.sleep(0.002)
        return x.sin()

    x = torch.randn(64)
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        for _ in range(3):
            slow(x).cos()
    got = train_step.host_summary(prof.key_averages(), steps=3, prefix="cemlib_host_test::")
    (op,) = got["custom_ops"]
    assert op["name"] == "cemlib_host_test::slow" and op["calls_per_step"] == 1
    assert op["cpu_ms_per_step"] >= 2.0
    assert {r["name"] for r in got["top_self_cpu"]} >= {"aten::cos"}
    assert got["self_cpu_ms_per_step"] > 0
