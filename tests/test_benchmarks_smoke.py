"""The benchmark scripts run (CPU smoke mode) and write JSON with the fields results need.

Timings from these runs are not results: this only keeps the scripts from rotting between GPU runs.
"""

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parent.parent


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


@pytest.mark.parametrize("script", ["bench_attention.py", "bench_mlp.py"])
def test_kernel_benchmark_smoke(script, tmp_path):
    d = _run([f"benchmarks/{script}", "--cpu-smoke"], tmp_path, script)
    assert d["mode"] != "gpu" and d["env"] and d["results"]
    for case in d["results"]:
        assert {"median_ms", "q20_ms", "q80_ms", "method", "dtype"} <= set(case)
        assert case["q20_ms"] <= case["median_ms"] <= case["q80_ms"]


def test_train_step_benchmark_smoke(tmp_path):
    d = _run(["benchmarks/train_step.py", "--device", "cpu", "--widths", "32", "--layers", "1",
              "--context", "16", "--batch", "2", "--warmup", "1", "--iters", "2", "--T", "1", "2"],
             tmp_path, "train")
    assert [r["model"] for r in d["rows"]] == ["llama d=32", "cem T=1 d=32", "cem T=2 d=32"]
    for r in d["rows"]:  # every model built from the same defaults, finite checks on
        assert r["tokens_per_s"] > 0 and r["check_finite"] is True and r["graph_breaks"] is None
    assert [(x["T"], x["target"]) for x in d["cem_over_llama"]] == [(1, 0.9), (2, 0.55)]


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


def test_gpu_script_dry_run(tmp_path):
    """benchmarks/gpu_kernels.py end to end on the CPU (interpreter, tiny shapes): every stage
    writes its JSON; a second call resumes (skips what is done); a stage that no longer fits in
    the call's time is skipped with a note."""
    out = tmp_path / "gpu"
    cmd = [sys.executable, "benchmarks/gpu_kernels.py", "--dry-run", "--out-dir", str(out)]
    r = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    stages = ("correctness", "autotune", "attention", "profile", "mlp", "train")
    files = {s: json.loads((out / f"gpu_{s}_cpu_dry_run.json").read_text()) for s in stages}
    for s, d in files.items():
        assert d["status"] == "done" and d["mode"] == "dry run (not a result)", (s, d.get("error"))
        assert "<dir>" in d["command"] and str(out) not in d["command"]
    c = files["correctness"]
    assert c["passed"] and c["implementations"]["attention_v1"]["available"]
    assert {x["check"] for x in c["checks"]} >= {"attention_v1", "attention_diag_v1", "mlp_v2",
                                                 "mlp_v1", "direct_launch_v2"}
    every = next(x for x in c["checks"] if x["check"] == "every_config_v2")
    assert every["passed"] and every["checked"] == 12 and every["skipped"] == 0  # 6 spaces x 2
    assert {x["space"] for x in every["configurations"]} == {"fwd", "pre", "bwd", "headsum",
                                                             "extra_grads", "bwd_atomic"}
    direct = next(x for x in c["checks"] if x["check"] == "direct_launch_v2")
    assert direct["passed"] and not direct["direct_used"]   # the interpreter: Triton's own path
    assert files["autotune"]["mlp_elementwise"]["best"]
    methods = {x["method"] for x in files["attention"]["results"]}
    assert {"sdpa_untied", "sdpa_tied", "cem_v1"} <= methods
    assert {x["method"] for x in files["profile"]["rows"]} >= {"sdpa_untied", "cem_v1"}
    # CUDA-graph replay is measured on a GPU only; the ratios are there, from wall times here
    assert all(x.get("graphed_ms") is None for x in files["profile"]["rows"])
    assert "wall" in files["profile"]["ratios"]["cem_v2 / sdpa_untied T=16"]
    assert "CUDA only" in files["profile"]["host"]["skipped"]  # host_overhead.run on a GPU
    assert {x["method"] for x in files["mlp"]["results"]} == {"v2", "v2_separate_dv", "v1",
                                                              "eager"}
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


def test_gpu_script_finds_autotuners_built_at_first_call():
    """The autotune stage reads every ``triton.autotune`` of the v2 module, including those that
    ``tied_attention_v2`` builds at its first call and keeps in ``_tuners`` (keyed by kernel and
    padded head width) -- none of which exists at import."""
    import types

    triton = pytest.importorskip("triton")
    import triton.language as tl

    gpu_kernels = _benchmark("gpu_kernels")

    @triton.jit
    def _copy(x_ptr, BLOCK: tl.constexpr):
        pass

    tuner = triton.autotune([triton.Config({"BLOCK": 16})], key=[])(_copy)
    module = types.SimpleNamespace(_tuners={("fwd", 64): tuner}, other=1)
    assert gpu_kernels._autotuners(module) == {"fwd@64": tuner}
    assert gpu_kernels._autotuners(types.SimpleNamespace()) == {}


def test_sync_check_counts_synchronising_calls_not_the_debug_modes_notice():
    gpu_kernels = _benchmark("gpu_kernels")
    notice = ("Synchronization debug mode is a prototype feature and does not yet detect all "
              "synchronizing operations (Triggered internally at /pytorch/torch/csrc/cuda/Module.cpp:1003.)")
    call = "called a synchronizing CUDA operation (Triggered internally at c10/cuda/CUDAFunctions.cpp:151.)"
    assert gpu_kernels.synchronising_calls([notice]) == []
    assert gpu_kernels.synchronising_calls([notice, call, call]) == [call[:200]] * 2


def test_host_overhead_script_runs(tmp_path):
    """benchmarks/host_overhead.py (quick): kernels compiled for sm_90, launches taken by a
    stand-in driver; the rows and the layers of one launch are recorded (no timing is checked)."""
    pytest.importorskip("triton")
    d = _run(["benchmarks/host_overhead.py", "--quick"], tmp_path, "host", timeout=900,
             env={**os.environ, "TRITON_INTERPRET": "0"})
    assert d["quick"] and "not a result" in d["note"] and d["env"]["triton"]
    # the recorded command keeps this machine's path out (failing input: --out <tmp path>)
    assert d["command"] == "python benchmarks/host_overhead.py --quick --out <file>"
    rows = {(x["method"], x["path"]): x for x in d["rows"]}
    assert set(rows) == {("cem_v2", "cemlib"), ("cem_v2", "without_direct_launch"),
                         ("cem_v2", "through_autotuner"), ("cem_v2", "operators")}
    for x in rows.values():
        # forward, preprocess, backward, and the fold of the bias gradients (failing input:
        # the fold left out of the recorded launchers, 3)
        assert x["launches_per_call"] == 4
        assert x["full_us"] > 0 and x["without_launches_us"] > 0 and x["launches_us"] > 0
    layers = rows[("cem_v2", "cemlib")]["bwd_launch_layers_us"]
    assert set(layers) >= {"autotuner_and_jit", "cached_choice_and_jit", "cached_choice_and_direct",
                           "jit_run", "direct_launch", "binder"}
    assert d["floor_us"] > 0 and d["device"] == "cpu"
    assert d["ratios_to_sdpa"] == {}  # the quick run has no sdpa_untied row
    # each row (and the floor) over PyTorch's attention of the same run
    code = ("import json, host_overhead as h; print(json.dumps(h.ratios_to_sdpa([{'method': "
            "'sdpa_untied', 'path': 'torch', 'full_us': 40.0}, {'method': 'cem_v2', 'path': "
            "'cemlib', 'full_us': 100.0}], 30.0)))")
    r = subprocess.run([sys.executable, "-c", code], cwd=ROOT / "benchmarks", capture_output=True,
                       text=True, timeout=300, env={**os.environ, "TRITON_INTERPRET": "0",
                                                    "PYTHONPATH": str(ROOT)})
    assert r.returncode == 0, r.stderr[-2000:]
    assert json.loads(r.stdout) == {"cem_v2 cemlib": 2.5, "floor": 0.75}
    # rounds combine number by number, the smallest of each (nested too); the rest kept
    code = ("import json, host_overhead as h; print(json.dumps(h.smallest([[{'a': 1.0, 'b': "
            "{'c': 2.0}, 'm': 'x', 'n': 3}], [{'a': 0.5, 'b': {'c': 3.0}, 'm': 'x', 'n': 3}]])))")
    r = subprocess.run([sys.executable, "-c", code], cwd=ROOT / "benchmarks", capture_output=True,
                       text=True, timeout=300, env={**os.environ, "TRITON_INTERPRET": "0",
                                                    "PYTHONPATH": str(ROOT)})
    assert r.returncode == 0, r.stderr[-2000:]
    assert json.loads(r.stdout) == [{"a": 0.5, "b": {"c": 2.0}, "m": "x", "n": 3}]


def test_gpu_correctness_shape_checks_compile_each_kernel_once_per_shape(tmp_path):
    """The GPU script's correctness stage checks shapes with each v2 kernel's default
    configuration: counted without a GPU (``benchmarks/compile_requests.py``, requests for
    sm_90 recorded and declined), its shape checks ask Triton for about a twelfth of the
    compilations the autotuner would (1254 against 102 with Triton 3.9). Failing input, shown
    once: with the stage's ``default_configurations`` made a no-op, both counts were 1254."""
    pytest.importorskip("triton")
    d = _run(["benchmarks/compile_requests.py"], tmp_path, "requests", timeout=900,
             env={**os.environ, "TRITON_INTERPRET": "0"})
    rows = {x["autotune"]: x for x in d["rows"]}
    assert not rows[True]["errors"] and not rows[False]["errors"]
    assert rows[False]["total"] * 8 < rows[True]["total"]
    # the default configuration: one compilation per kernel and specialization (20 v2 calls, 10
    # v1 calls, 8 MLP steps), never a space
    assert rows[False]["total"] <= 110


def test_warm_triton_cache_is_found_by_another_process(tmp_path):
    """benchmarks/warm_cache.py (quick: one plain call with bias gradients, four kernels: forward,
    preprocess, backward and the fold of the bias gradients): kernels compiled for sm_90
    into one cache directory, packed (binaries and metadata only), installed into another by a
    second process, are found there by a third, which compiles nothing (the build's directory is
    gone). Failing input, shown once: with the installed file lists left pointing at the build's
    directory, the third process compiled the 4 kernels again."""
    pytest.importorskip("triton")
    env = {**os.environ, "TRITON_INTERPRET": "0", "PYTHONPATH": str(ROOT)}
    archive = tmp_path / "warm.tar.xz"

    def run(*args, cache):
        r = subprocess.run([sys.executable, "benchmarks/warm_cache.py", *args], cwd=ROOT,
                           capture_output=True, text=True, timeout=600,
                           env={**env, "TRITON_CACHE_DIR": str(tmp_path / cache)})
        assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
        return r.stdout
    run("build", "--quick", "--out", str(archive), cache="build")
    import shutil
    shutil.rmtree(tmp_path / "build")
    report = json.loads(run("install", str(archive), cache="gpu").split("warm Triton cache: ")[1]
                        .splitlines()[0])
    assert report["kernels"] == report["installed"] == report["cache_dir_kernels"] == 4
    assert report["matches"] and not report["differs"]  # the same Triton here
    assert report["kernel_code_matches"]  # built from this checkout's kernels
    assert json.loads(run("check", str(archive), cache="gpu"))["kernel_code_matches"]
    assert not list((tmp_path / "gpu").glob("*/*.ttir"))  # binaries and metadata only
    replay = json.loads(run("replay", "--quick", cache="gpu").strip().splitlines()[-1])
    assert replay["compiled"] == 0
    # and where nothing is installed, the same call compiles its four kernels
    assert json.loads(run("replay", "--quick", cache="empty").strip().splitlines()[-1])[
        "compiled"] == 4


def _kernel_code_hash(*modules, interpret="0", path=()):
    """``warm_cache.kernel_code_hash`` of ``modules`` (default: the kernel modules), computed in a
    fresh process (with ``TRITON_INTERPRET=interpret``; ``path``: more import folders)."""
    code = ("import sys; sys.path.insert(0, 'benchmarks'); import warm_cache; "
            "print(warm_cache.kernel_code_hash(*([sys.argv[1:]] if sys.argv[1:] else [])))")
    r = subprocess.run([sys.executable, "-c", code, *modules], cwd=ROOT, capture_output=True,
                       text=True, timeout=300,
                       env={**os.environ, "TRITON_INTERPRET": interpret,
                            "PYTHONPATH": os.pathsep.join([*map(str, path), str(ROOT)])})
    assert r.returncode == 0, r.stderr[-2000:]
    return r.stdout.strip().splitlines()[-1]


KERNEL_MODULE = """import triton
import triton.language as tl

SCALE = tl.constexpr(2.0)


@triton.jit
def _double(X, N: tl.constexpr):
    tl.store(X + tl.arange(0, N), SCALE * tl.load(X + tl.arange(0, N)))
"""


@pytest.mark.parametrize("interpret", ["0", "1"])
def test_the_kernel_code_hash_follows_what_tritons_cache_keys_take(tmp_path, interpret):
    """``warm_cache.kernel_code_hash``: the carried cache holds the kernels of the code it was
    built from, and Triton's key has each kernel's starting line in it. The hash is the same for the
    same module, and changes with one more line above a kernel (failing input, shown once: the
    docstring edits of commit 4909ed7 changed the key of every kernel, and the hash of the
    kernel modules from 0c53690e266a1b99 to 66dd38139bb29816), and with a constexpr global's
    value; compiled or under the interpreter."""
    pytest.importorskip("triton")

    def code_hash(text):
        (tmp_path / "kmod.py").write_text(text)
        return _kernel_code_hash("kmod", interpret=interpret, path=[tmp_path])
    first = code_hash(KERNEL_MODULE)
    assert code_hash(KERNEL_MODULE) == first
    assert code_hash('"""One line more above the kernel."""\n' + KERNEL_MODULE) != first
    assert code_hash(KERNEL_MODULE.replace("tl.constexpr(2.0)", "tl.constexpr(3.0)")) != first


def test_the_committed_warm_cache_was_built_from_this_kernel_code():
    """The manifest of the Triton cache carried to the GPU (``results/warm_cache_sm90.json``)
    names the kernel code it was built from (``kernel_code_hash``). A change to the kernel modules,
    even a line more in a docstring above the kernels, makes its kernels unfindable, and the
    next GPU session would compile them in device minutes. So the change must come with a
    rebuild (``python benchmarks/warm_cache.py build``, about 10 minutes on this CPU; its
    docstring says with which Triton), or keep every kernel's line."""
    pytest.importorskip("triton")
    manifest = json.loads((ROOT / "benchmarks" / "results" / "warm_cache_sm90.json").read_text())
    assert _kernel_code_hash() == manifest["kernel_code_hash"], (
        "the kernel modules changed since the carried Triton cache was built (at "
        f"{manifest['env']['git_commit'][:7]}): rebuild it with benchmarks/warm_cache.py build")


TRAIN_WARM_PROBE = """
import json, sys
sys.path.insert(0, "benchmarks")
import gpu_kernels, host_overhead, warm_cache
from cemlib.kernels import dispatch
host_overhead.gpu_paths()
use, errors = dispatch._use_triton, []
with gpu_kernels.default_configurations():
    warm_cache.train_models(dict(widths=[32], Ts=[1], context=16, head_dim=16, compile=sys.argv[1] == "compiled"),
                            gpu_kernels.error_recorder(errors), batch=2)
keys = sorted(d.name for d in warm_cache.cache_dir().iterdir() if list(d.glob("*.ttir")))
print(json.dumps({"compiled": warm_cache.compiled(), "keys": keys, "errors": errors,
                  "restored": dispatch._use_triton is use}))
"""


def test_warm_cache_compiles_the_train_stage_models_kernels(tmp_path):
    """warm_cache.py's train part: a CEM model's training step (forward and backward, bf16
    autocast, on CPU tensors with the stand-in sm_90 driver) reaches cemlib's kernels as on a GPU,
    so their binaries at the train stage's shapes go into the carried cache; the dispatcher is
    restored afterwards. Compiled as the stage compiles it (``aot_eager`` here), the step needs
    other kernels than eagerly: AOTAutograd hands the attention's backward a zero ``lse`` gradient
    where the eager step passes none, another variant of two kernels (Inductor's backend compiled
    no further kernel of cemlib's, checked by hand), so a cache built from the eager step alone
    would miss them. Failing inputs, shown once: without sending the calls to the kernels (the
    CPU's dispatch), the step compiled 0 kernels; with the compiled mode run eagerly, both sets
    were the same 8 kernels."""
    pytest.importorskip("triton")

    def probe(mode):
        r = subprocess.run([sys.executable, "-c", TRAIN_WARM_PROBE, mode], cwd=ROOT, capture_output=True,
                           text=True, timeout=600,
                           env={**os.environ, "TRITON_INTERPRET": "0", "PYTHONPATH": str(ROOT),
                                "TRITON_CACHE_DIR": str(tmp_path / mode)})
        assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
        got = json.loads(r.stdout.strip().splitlines()[-1])
        assert got["errors"] == [] and got["restored"]
        assert got["compiled"] == len(got["keys"]) >= 4   # the attention's forward and backward, the MLP's
        return set(got["keys"])

    eager, compiled = probe("eager"), probe("compiled")
    assert len(compiled - eager) >= 2, (len(eager), len(compiled), len(compiled & eager))


CORRECTNESS_WARM_PROBE = """
import json, sys
sys.path.insert(0, "benchmarks")
import gpu_kernels, host_overhead, warm_cache
from cemlib.kernels import dispatch
host_overhead.gpu_paths()
if sys.argv[1] == "cpu-dispatch":
    warm_cache._as_on_a_gpu = gpu_kernels.contextlib.nullcontext
use, errors = dispatch._use_triton, []
with gpu_kernels.default_configurations():
    warm_cache.correctness_layers(gpu_kernels.error_recorder(errors))
names = sorted({json.load(open(f))["name"] for f in warm_cache.cache_dir().glob("*/*.json")
                if not f.name.startswith("__grp__")})
import torch
from cemlib.kernels import gated_mlp_triton, tied_attention_triton
cpu = torch.device("cpu")
print(json.dumps({"compiled": warm_cache.compiled(), "names": names, "errors": errors,
                  "restored": dispatch._use_triton is use,
                  "v1_blocks": tied_attention_triton._blocks(256, 64, 0, cpu)[1],
                  "gate_blocks": gated_mlp_triton._gate_blocks(cpu)[1]}))
"""


def test_warm_cache_compiles_the_correctness_stages_layer_calls(tmp_path):
    """warm_cache.py's part for the correctness stage's calls outside its shape checks: the
    direct-launch check and the sync check's default CEM attention and MLP layers (the H100 run of
    2026-11-27 compiled them on the GPU: the carried cache lacked them). On CPU tensors with the
    stand-in sm_90 driver the layers reach the attention v2 kernels, the default layer's head sum
    and extra gradients included, and the MLP step's element-wise kernels; the dispatcher is
    restored; the first version's attention kernels and the MLP gate take their GPU tiles.
    Failing inputs: the CPU's dispatch (the layers take the PyTorch path), where only the
    direct-launch check's four kernels compile; ``gpu_paths`` without the tile choices (the
    CPU's tiles, no launch options)."""
    pytest.importorskip("triton")

    def probe(mode):
        r = subprocess.run([sys.executable, "-c", CORRECTNESS_WARM_PROBE, mode], cwd=ROOT,
                           capture_output=True, text=True, timeout=600,
                           env={**os.environ, "TRITON_INTERPRET": "0", "PYTHONPATH": str(ROOT),
                                "TRITON_CACHE_DIR": str(tmp_path / mode)})
        assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
        got = json.loads(r.stdout.strip().splitlines()[-1])
        assert got["errors"] == [] and got["restored"]
        return got
    on_gpu = probe("gpu-dispatch")
    # the first version's attention kernels and the MLP gate choose their tiles from the tensors'
    # device: on the stand-in they take the GPU's (launch options present; {} is the CPU's). The
    # H100 run compiled 38 first-version kernels of its shape checks that the cache, built with
    # the CPU's tiles, lacked.
    assert on_gpu["v1_blocks"] == {"num_warps": 4, "num_stages": 2}
    assert on_gpu["gate_blocks"] == {"num_warps": 4, "num_stages": 3}
    assert {"_fwd_kernel", "_pre_kernel", "_bwd_kernel", "_headsum_kernel", "_extra_grads_kernel",
            "_fold_kernel", "_silu_gate_kernel", "_silu_gate_bwd_kernel"} <= set(on_gpu["names"]), \
        on_gpu["names"]
    assert probe("cpu-dispatch")["compiled"] == 4 < on_gpu["compiled"]


def test_warm_cache_covers_the_campaigns_models_with_cem_layers():
    """The campaign part of the warm cache: every experiment of the GPU campaign's plans whose model
    holds a CEM attention or MLP layer, once each, and none without (they call no cemlib kernel)."""
    warm_cache = _benchmark("warm_cache")
    from cemlib.train import get_config
    from cemlib.train.campaign import plan_runs

    got = warm_cache.campaign_experiments()
    assert len(got) == len(set(got))
    assert {"shakespeare-cem", "shakespeare-cem-attn", "shakespeare-cem-mlp", "shakespeare-cem-t2"} <= set(got)
    for experiment in {r.experiment for r in plan_runs()}:
        model = get_config(experiment, "gpu").model
        assert (experiment in got) == ("cem" in (model.get("attn"), model.get("mlp"))), experiment


def test_first_call_script_runs(tmp_path):
    """benchmarks/first_call.py (quick: two configurations per kernel): the first call from an
    empty cache, with the space compiled in threads and one by one; both compile the same
    kernels (as many cache files), and a second call compiles nothing (no timing checked)."""
    pytest.importorskip("triton")
    d = _run(["benchmarks/first_call.py", "--quick"], tmp_path, "first", timeout=900,
             env={**os.environ, "TRITON_INTERPRET": "0"})
    assert d["quick"] and "not a result" in d["note"]
    rows = {x["parallel"]: x for x in d["rows"]}
    assert set(rows) == {True, False}
    assert rows[True]["cache_files"] == rows[False]["cache_files"] > 0
    assert all(x["first_call_s"] > x["second_call_s"] for x in rows.values())


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


def test_bias_grad_rounding_formulas_are_the_gradients(tmp_path):
    """``bias_grad_rounding.py`` emulates the v2 kernels' self/cross-bias gradients
    (``dS_ii = P_ii (dP_ii - Delta_i)`` summed, ``dcross = sum dlse - dself``, the extra pair's
    ``dA`` in ``dP`` and ``Delta``). Without rounding the formulas must be autograd's gradients of
    the reference, plain and with the extra pair; failing input: ``Delta`` without the
    ``sum_j P_ij dA_ij`` term (off by up to 2.3 in the extra case). Then the script runs and writes
    what the results need."""
    bgr = _benchmark("bias_grad_rounding")
    from cemlib.kernels import reference
    for extra in (False, True):
        inputs = [None if x is None else x.double()
                  for x in bgr._inputs((2, 3, 19, 8), extra, seed=4)]
        alibi = reference.alibi_slopes(3)
        exact = bgr._reference_grads(inputs, alibi, 8 ** -0.5, torch.float64)
        got = bgr.kernel_formulas(inputs, alibi, 8 ** -0.5, round_o=True, dtype=torch.float64)
        for a, b in zip(got, exact):
            torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-10)
    d = _run(["benchmarks/bias_grad_rounding.py", "--seeds", "2", "--shapes", "1", "2", "16", "8"],
             tmp_path, "bias_grad_rounding")
    (r,) = d["results"]
    assert r["shape"] == [1, 2, 16, 8] and r["gradients"] == 4
    assert d["command"].endswith("--out <file>") and str(tmp_path) not in d["command"]
    for name in ("exact_rounded", "reference_bf16", "kernel_formulas_o_bf16"):
        assert 0 <= r[name]["median_ulp"] <= r[name]["max_ulp"] < 50
    assert 0 <= r["kernel_formulas_o_bf16"]["criterion_failures"] <= 4


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


def test_cuda_tests_run_on_cpu_tensors_for_the_warm_cache_and_everything_is_restored():
    """``warm_cache.cuda_on_the_cpu``, under which the build replays the CUDA tests to compile their
    kernels: a tensor asked for on CUDA (factory ``device=``, ``.to``, ``.cuda()``), a CUDA
    generator and CUDA autocast are the CPU's, ``torch.cuda.is_available()`` says yes and its
    synchronisation does nothing; on exit everything is PyTorch's again (failing input, shown
    once: without the restore, ``torch.cuda.is_available()`` stayed True after the block)."""
    warm_cache = _benchmark("warm_cache")
    originals = (torch.Generator, torch.autocast, torch.cuda.is_available, torch.cuda.synchronize)
    with warm_cache.cuda_on_the_cpu():
        assert torch.cuda.is_available()
        torch.cuda.synchronize()
        g = torch.Generator(device="cuda").manual_seed(0)
        x = torch.randn(3, 4, generator=g, device="cuda")
        assert x.device.type == "cpu"
        assert x.to("cuda").device.type == x.cuda().device.type == "cpu"
        assert torch.zeros(2, device=torch.device("cuda", 0)).device.type == "cpu"
        with torch.autocast("cuda", dtype=torch.bfloat16):
            assert (x @ x.T).dtype == torch.bfloat16  # the CPU's autocast
        assert isinstance(g, torch._C.Generator) and isinstance(None, torch.Generator | None)
    assert (torch.Generator, torch.autocast, torch.cuda.is_available,
            torch.cuda.synchronize) == originals
    assert torch.randn(2, device="cpu").to("cpu").device.type == "cpu"


def test_the_warm_cache_replays_the_cuda_tests_that_run_gpu_sh_runs():
    """The CUDA test files the build replays (``warm_cache.CUDA_TEST_FILES``) are those that
    ``run_gpu.sh tests`` runs, but the trainer's (Inductor writes C++ for CPU tensors), and each
    exists."""
    warm_cache = _benchmark("warm_cache")
    script = (ROOT / "benchmarks" / "run_gpu.sh").read_text()
    listed = sorted(set(re.findall(r"tests/test_\w+\.py", script)))
    assert sorted(warm_cache.CUDA_TEST_FILES) == [f for f in listed if f != "tests/test_train_cuda.py"]
    assert all((ROOT / f).is_file() for f in listed)
