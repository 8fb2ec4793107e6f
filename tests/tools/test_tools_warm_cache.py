"""``tools/gpu/warm_cache.py``: Triton's cache for the H100 compiled without a GPU (kernels
compiled for sm_90 on the CPU with a stand-in driver), packed, installed and found by another
process; the hash of the kernel code it is keyed on, and ``check`` saying when it is stale; the
calls it replays (the GPU script's stages, the CUDA tests, the campaign's models).
"""

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

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
def test_warm_triton_cache_is_found_by_another_process(tmp_path):
    """tools/gpu/warm_cache.py (quick: one plain call with bias gradients, four kernels: forward,
    preprocess, backward and the fold of the bias gradients): kernels compiled for sm_90
    into one cache directory, packed (binaries and metadata only), installed into another by a
    second process, are found there by a third, which compiles nothing (the build's directory is
    gone). Failing input, shown once: with the installed file lists left pointing at the build's
    directory, the third process compiled the 4 kernels again."""
    pytest.importorskip("triton")
    env = {**os.environ, "TRITON_INTERPRET": "0", "PYTHONPATH": str(ROOT)}
    archive = tmp_path / "warm.tar.xz"

    def run(*args, cache):
        r = subprocess.run([sys.executable, "tools/gpu/warm_cache.py", *args], cwd=ROOT,
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
    code = ("import sys; sys.path.insert(0, 'tools/gpu'); import warm_cache; "
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


TRAIN_WARM_PROBE = """
import json, sys
sys.path.insert(0, "tools/gpu")
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


@pytest.mark.slow
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
sys.path.insert(0, "tools/gpu")
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
from cemlib.kernels import dplr
cpu = torch.device("cpu")
print(json.dumps({"compiled": warm_cache.compiled(), "names": names, "errors": errors,
                  "restored": dispatch._use_triton is use,
                  "dplr_blocks": dplr._blocks(16, cpu)}))
"""


@pytest.mark.slow
def test_warm_cache_compiles_the_correctness_stages_layer_calls(tmp_path):
    """warm_cache.py's part for the correctness stage's calls outside its shape checks: the
    direct-launch check and the sync check's default CEM attention and MLP layers (the H100 run of
    2026-11-27 compiled them on the GPU: the carried cache lacked them). On CPU tensors with the
    stand-in sm_90 driver the layers reach the attention v2 kernels, the default layer's head sum
    and extra gradients included, and the MLP step's element-wise kernels; the dispatcher is
    restored; the DPLR preconditioner, which chooses its tiles from the tensors' device, takes
    its GPU tiles. Failing inputs: the CPU's dispatch (the layers take the PyTorch path), where
    only the direct-launch check's four kernels compile; ``gpu_paths`` without the tile choice
    (the CPU's tiles)."""
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
    # the DPLR kernel chooses its tiles from the tensors' device: on the stand-in it takes the
    # GPU's (32 x 128; the CPU's are 16 x 32). An H100 run compiled 38 kernels of its shape checks
    # that a cache built with the CPU's tiles lacked.
    assert (on_gpu["dplr_blocks"]["BLOCK_M"], on_gpu["dplr_blocks"]["BLOCK_K"]) == (32, 128)
    assert {"_fwd_kernel", "_pre_kernel", "_bwd_kernel", "_headsum_kernel", "_extra_grads_kernel",
            "_fold_kernel", "_silu_gate_kernel", "_silu_gate_bwd_kernel"} <= set(on_gpu["names"]), \
        on_gpu["names"]
    assert probe("cpu-dispatch")["compiled"] == 4 < on_gpu["compiled"]


def test_warm_cache_covers_the_campaigns_models_with_cem_layers():
    """The campaign part of the warm cache: every experiment of the GPU campaign's plans whose model
    holds a CEM attention or MLP layer, once each, and none without (they call no cemlib kernel)."""
    warm_cache = _tool("warm_cache")
    plan_runs = _tool("campaign").plan_runs
    from cemlib.train import get_config

    got = warm_cache.campaign_experiments()
    assert len(got) == len(set(got))
    assert {"shakespeare-cem", "shakespeare-cem-attn", "shakespeare-cem-mlp", "shakespeare-cem-t2"} <= set(got)
    for experiment in {r.experiment for r in plan_runs()}:
        model = get_config(experiment, "gpu").model
        assert (experiment in got) == ("cem" in (model.get("attn"), model.get("mlp"))), experiment


def test_cuda_tests_run_on_cpu_tensors_for_the_warm_cache_and_everything_is_restored():
    """``warm_cache.cuda_on_the_cpu``, under which the build replays the CUDA tests to compile their
    kernels: a tensor asked for on CUDA (factory ``device=``, ``.to``, ``.cuda()``), a CUDA
    generator and CUDA autocast are the CPU's, ``torch.cuda.is_available()`` says yes and its
    synchronisation does nothing; on exit everything is PyTorch's again (failing input, shown
    once: without the restore, ``torch.cuda.is_available()`` stayed True after the block)."""
    warm_cache = _tool("warm_cache")
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
    warm_cache = _tool("warm_cache")
    script = (TOOLS / "run_gpu.sh").read_text()
    listed = sorted(set(re.findall(r"tests/(?:\w+/)?test_\w+\.py", script)))
    assert sorted(warm_cache.CUDA_TEST_FILES) == [f for f in listed if f != "tests/train/test_train_cuda.py"]
    assert all((ROOT / f).is_file() for f in listed)


@pytest.mark.slow
def test_check_says_when_the_cache_is_stale(tmp_path):
    """``warm_cache.py check`` compares an archive's (or a manifest's) ``kernel_code_hash`` with
    this checkout's kernel code: ``"stale": true`` and exit status 1 for another code's manifest
    or a missing archive, exit status 0 for this code's."""
    pytest.importorskip("triton")
    here = _kernel_code_hash()

    def check(path):
        r = subprocess.run([sys.executable, "tools/gpu/warm_cache.py", "check", str(path)],
                           cwd=ROOT, capture_output=True, text=True, timeout=300,
                           env={**os.environ, "TRITON_INTERPRET": "0", "PYTHONPATH": str(ROOT)})
        return r.returncode, json.loads(r.stdout.strip().splitlines()[-1]), r.stderr
    for name, code_hash in (("old", "0" * 16), ("current", here)):
        (tmp_path / f"{name}.json").write_text(json.dumps({"kernel_code_hash": code_hash,
                                                          "env": {"git_commit": "abc"}}))
    status, report, err = check(tmp_path / "old.json")
    assert status == 1 and report["stale"] and "stale" in err
    status, report, _ = check(tmp_path / "missing.tar.xz")
    assert status == 1 and report["stale"] and not report["exists"]
    status, report, _ = check(tmp_path / "current.json")
    assert status == 0 and not report["stale"] and report["kernel_code_matches"]
