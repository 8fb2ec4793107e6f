"""Triton's cache for the H100, compiled without a GPU and carried to the GPU machine.

A GPU session pays for compiling in device minutes: the first H100 run's correctness stage spent
most of its 191 s compiling, and a first call of the default CEM layer compiles about 150 kernels
(``benchmarks/NOTES.md`` steps 12 and 20). Triton compiles for a named target anywhere
(``benchmarks/compile_kernels.py``), and looks a kernel up in its cache by a key made of Triton
itself (its
version, the hashes of its Python sources and of ``libtriton``), the kernel's source and
specialization, the target and the ``ptxas`` version, the compile options and a few environment
variables, none of which says on which machine it was compiled. So:

``build``
    runs the GPU script's calls on CPU tensors along cemlib's GPU path with a stand-in ``sm_90``
    driver (``host_overhead.gpu_paths``: launches do nothing, so nothing is computed; every
    kernel is compiled, with the autotune spaces where the GPU autotunes): the correctness
    stage's shape checks, ``every_config_v2``, its direct-launch check and its sync check's layers
    (:func:`correctness_layers`), the attention stage's CEM methods (one length:
    the others are multiples of the tiles, the same specialization), the MLP stage's steps
    (a few rows: only the widths specialize), the train stage's CEM models (one layer, a
    training step's forward and backward at its context and width: :func:`train_models`) and
    the GPU campaign's models with CEM layers (a training step each: :func:`campaign_models`),
    and the CUDA tests of ``run_gpu.sh tests`` in their default configurations, run on CPU
    tensors (:func:`cuda_tests`).
    Then packs each kernel's binary and metadata (not its intermediate representations) with a
    manifest of what the key depends on into
    ``.triton_warm/triton_sm90.tar.xz`` (ignored by git, carried to the device with ``carry``;
    its manifest, with the kernels and compile seconds per part, also goes to
    ``tools/gpu/results/warm_cache_sm90.json``; the last one built is stored in
    ``benchmarks/results/history/``). The manifest names the kernel code it was built from
    (:func:`kernel_code_hash`: Triton's key holds each kernel's source *and starting line*, so one
    line more above a kernel makes the archive useless for it: rebuild after any kernel change).
``check``
    whether the archive (or a manifest, ``.json``) was built from this checkout's kernel code:
    ``"stale": true`` and exit status 1 if not, or if there is no archive; run it before carrying
    the archive to a GPU.
``install``
    unpacks it into this machine's Triton cache (``TRITON_CACHE_DIR``, default
    ``~/.triton/cache``), rewrites each kernel's file list to where it now lies (Triton stores
    absolute paths), and says whether this machine's Triton and ``ptxas`` match the manifest,
    and whether the kernel code does (``kernel_code_matches``). A
    kernel that does not match is simply compiled again on the GPU: the cache can only save
    time. ``tools/gpu/run_gpu.sh`` installs it when it is there, and ``gpu_kernels.py`` records
    per stage how many kernels it still compiled (``triton_cache``), which says on the GPU
    whether the carried kernels were found.

Build with the GPU machine's Triton (3.6.0 on the H100 and H200 images, Python 3.12): the key
holds Triton's own hashes, and ``libtriton`` differs between Python versions. Usage::

    python tools/gpu/warm_cache.py build [--quick] [--out FILE] [--manifest FILE]
    python tools/gpu/warm_cache.py check [FILE]     # built from this kernel code? (exit 1: no)
    python tools/gpu/warm_cache.py install [FILE]
    python tools/gpu/warm_cache.py replay --quick   # the quick build's call: kernels compiled

Relies on Triton internals (its cache layout, ``triton_key``, ``get_ptxas_version``), checked on
Triton 3.6 and 3.9.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import io
import json
import os
import platform
import sys
import tarfile
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPOSITORY = HERE.parents[1]
for _folder in (REPOSITORY, REPOSITORY / "benchmarks", HERE):  # cemlib, the benchmarks, the tools
    if str(_folder) not in sys.path:
        sys.path.insert(0, str(_folder))
ARCHIVE = REPOSITORY / ".triton_warm" / "triton_sm90.tar.xz"
ARCH = 90
KEPT = (".cubin", ".json")  # what loading a cached kernel reads: its binary and metadata


def cache_dir() -> Path:
    """This process's Triton cache directory (``TRITON_CACHE_DIR``, else ``~/.triton/cache``)."""
    from triton import knobs
    return Path(knobs.cache.dir)


def entries(directory: str | Path | None = None) -> int:
    """Kernels in a Triton cache directory: one group file (``__grp__*.json``) per compiled
    kernel. 0 where the directory does not exist."""
    directory = Path(directory) if directory is not None else cache_dir()
    return sum(1 for _ in directory.glob("*/__grp__*.json")) if directory.is_dir() else 0


def compiled(directory: str | Path | None = None) -> int:
    """Kernels compiled into a Triton cache directory on this machine: each compilation writes
    its intermediate representations (one ``.ttir`` file per kernel), which an installed kernel
    does not carry. A kernel compiled again over an installed one (its key matched nothing
    installed, or its files did not load) counts too."""
    directory = Path(directory) if directory is not None else cache_dir()
    return sum(1 for _ in directory.glob("*/*.ttir")) if directory.is_dir() else 0


def fingerprint(arch: int = ARCH) -> dict:
    """What a cached kernel's key depends on besides the kernel: Triton's version and own key
    (hashed), the ``ptxas`` version the target compiles with, the environment variables Triton
    puts in its keys (those set), and Python's version (for the record)."""
    import triton
    from triton._C.libtriton import get_cache_invalidating_env_vars
    from triton.backends.nvidia.compiler import get_ptxas_version
    from triton.runtime.cache import triton_key
    return {"triton": triton.__version__,
            "triton_key_sha256": hashlib.sha256(triton_key().encode()).hexdigest(),
            "ptxas": get_ptxas_version(arch).strip().splitlines()[-1],
            "env_vars": dict(sorted(get_cache_invalidating_env_vars().items())),
            "python": platform.python_version()}


#: the modules whose ``@triton.jit`` functions the cache holds compiled
KERNEL_MODULES = ("cemlib.kernels.attention", "cemlib.kernels.gated_mlp", "cemlib.kernels.dplr")


def kernel_code_hash(modules=KERNEL_MODULES) -> str:
    """A hash of what Triton's cache keys take from the kernel ``modules``: each ``@triton.jit``
    function's source and the line it starts on, and the modules' ``tl.constexpr`` globals.
    Triton puts a kernel's starting line into its key, so an edit above a kernel (one more line in
    the module's docstring) changes the key of every kernel below it, and a carried cache built
    before the edit holds none of them. Independent of the Triton version (the build's Triton
    and this machine's may differ). Equal hashes: the archive was built from this kernel code."""
    import importlib
    import inspect

    import triton.language as tl
    from triton.runtime.jit import JITFunction
    kinds = [JITFunction]
    try:  # what triton.jit returns under TRITON_INTERPRET=1
        from triton.runtime.interpreter import InterpretedFunction
        kinds.append(InterpretedFunction)
    except ImportError:
        pass
    h = hashlib.sha256()
    for name in modules:
        module = importlib.import_module(name)
        for attr, value in sorted(vars(module).items()):
            fn = getattr(value, "fn", None)
            if isinstance(value, tuple(kinds)) and getattr(fn, "__module__", None) == name:
                lines, start = inspect.getsourcelines(fn)
                h.update(f"{name}.{attr}:{start}\n{''.join(lines)}".encode())
            elif isinstance(value, tl.constexpr):
                h.update(f"{name}.{attr}={value.value!r}\n".encode())
    return h.hexdigest()[:16]


# ------------------------------------------------------------------------------------ build

def _compile_calls(quick: bool) -> dict:
    """Run the GPU script's kernel calls on CPU tensors with the stand-in driver (set up by the
    caller); returns the kernels compiled per part."""
    import torch

    import bench_attention
    import bench_mlp
    import gpu_kernels
    from cemlib.kernels import attention as attention_kernels
    from cemlib.kernels import reference

    cpu = torch.device("cpu")
    parts = {}

    def part(name, run):
        before = compiled()
        t0 = time.monotonic()
        run()
        parts[name] = {"kernels": compiled() - before, "seconds": round(time.monotonic() - t0, 1)}
        print(f"{name}: {parts[name]['kernels']} kernels in {parts[name]['seconds']} s", flush=True)

    if quick:  # one plain call, default configurations: three kernels
        def one_call():
            with gpu_kernels.default_configurations():
                x = bench_attention.attention_inputs(1, 2, 64, 16, 32, torch.float16, cpu)
                fn, inputs, _ = bench_attention.method("cem_v2", x, 0.25,
                                                       reference.alibi_slopes(2), 64, cpu)
                bench_attention.fwd_and_fwd_bwd(fn, inputs, x["do"], x["doe"])[0]["fwd_bwd"]()
        part("quick", one_call)
        return parts

    s = gpu_kernels.SETTINGS["gpu"]
    errors = []
    record = gpu_kernels.error_recorder(errors)

    def shape_checks():
        with gpu_kernels.default_configurations():
            gpu_kernels._shape_checks(s, cpu, record, {})
    part("correctness: shape checks", shape_checks)
    part("correctness: every_config_v2", lambda: gpu_kernels.every_config_check(
        cpu, s["dtypes"][0], s["check_every_config"], None, float("inf"), gpu_options=True))
    part("correctness: direct launch and sync check", lambda: correctness_layers(record))

    def attention():
        a = s["attention"]
        T = a["Ts"][0]  # every T of the table is a multiple of the tiles: one specialization
        # B = 2 instead of 8: the batch is neither 1 nor a multiple of 16 either way (Triton
        # specializes integers on those), and the CPU's bf16 products of the default layer's
        # shared pair cost a quarter
        x = bench_attention.attention_inputs(2, a["H"], T, a["d"], a["H"] * a["d"], a["dtype"], cpu)
        slopes = reference.alibi_slopes(a["H"]).to(torch.float32)
        for name in s["methods"]:
            if name.startswith("sdpa"):
                continue
            fn, inputs, rec = bench_attention.method(name, x, a["d"] ** -0.5, slopes, T, cpu)
            if fn is not None:  # the forward alone (no grad) and forward+backward, as timed
                calls = bench_attention.fwd_and_fwd_bwd(fn, inputs, x["do"], x["doe"])[0]
                record(name, [2, a["H"], T, a["d"]], a["dtype"],
                       lambda calls=calls: (calls["fwd"](), calls["fwd_bwd"]()))
    part("attention and profile", attention)

    def mlp():
        for Dh in s["mlp"]["widths"]:
            # 64 rows instead of 8192: a multiple of 16 either way, and the CPU's products small
            (u, V, gamma), dy = bench_mlp.step_inputs(64, Dh, bench_mlp.MULT * Dh,
                                                      torch.bfloat16, cpu)
            for name, step in bench_mlp.step_methods(False, ("v2",)).items():
                def run(step=step):
                    leaves = [t.clone().requires_grad_() for t in (u, V, gamma)]
                    step(*leaves).backward(dy)
                record(f"mlp_{name}", [64, Dh], torch.bfloat16, run)
    part("mlp", mlp)
    part("train", lambda: train_models(s["train"], record))
    part("campaign", lambda: campaign_models(record))
    outcomes = {}
    part("CUDA tests", lambda: outcomes.update(cuda_tests()))
    parts["CUDA tests"].update(outcomes)
    attention_kernels.TUNING.tuned.clear()
    if errors:
        parts["errors"] = errors
    return parts


TRAIN_BATCH = 16  # the train stage's 64 sequences: a multiple of 16 either way


def as_trained(model, compile_: bool):
    """``model`` as a GPU run trains it: through ``torch.compile`` where the run compiles. Here
    with the ``aot_eager`` backend: what decides the kernels' specializations is AOTAutograd,
    which hands the attention's backward a zero tensor for the unused ``lse`` gradient (another
    variant of its preprocess and backward kernels than the eager step's ``None``); Inductor
    compiles nothing more of cemlib's (checked on the CPU: the same kernels with ``inductor``),
    and ``aot_eager`` needs no C++ compiler."""
    import torch
    if not compile_:
        return model
    torch._dynamo.reset()  # a fresh model each time: no recompilation limit reached
    return torch.compile(model, backend="aot_eager")


@contextlib.contextmanager
def _as_on_a_gpu():
    """cemlib's dispatcher sending every call the kernels take to them, as on a GPU with
    tensor-core dots (on CPU tensors it keeps them on PyTorch), restored on exit."""
    from cemlib.kernels import dispatch
    use = dispatch._use_triton
    dispatch._use_triton = lambda x, supported, dots=True: supported
    try:
        yield
    finally:
        dispatch._use_triton = use


def _record_step(record, name, shape, loss) -> None:
    """``record`` one training step: ``loss()`` under bf16 autocast (as the GPU runs train), then
    its backward."""
    import torch

    def step():
        with torch.autocast("cpu", dtype=torch.bfloat16):
            value = loss()
        value.float().backward()
    record(name, shape, "bf16-autocast", step)


def correctness_layers(record) -> None:
    """The correctness stage's calls outside its shape checks: the direct-launch check (a plain
    call with both biases learnable, default configurations) and the sync check's default CEM
    attention and MLP layers (d = 768, bf16 autocast, autotuned as on the GPU: the stage's warm-up
    call compiles their spaces). The H100 run of 2026-11-27 compiled 93 kernels in its correctness
    stage with the cache carried; replayed here, these calls compile 55 of them (3 and 52)."""
    import torch

    import gpu_kernels
    s = gpu_kernels.SETTINGS["gpu"]
    shape = gpu_kernels.direct_launch_shape(s)
    cpu = torch.device("cpu")
    record("direct_launch_v2", list(shape), s["dtypes"][0],
           lambda: gpu_kernels.direct_launch_check(cpu, s["dtypes"][0], shape))
    with _as_on_a_gpu():
        for name, call in gpu_kernels.sync_check_calls(cpu):
            record(f"sync check: {name}", [4, 256, 768], "bf16-autocast", call)


def train_models(t: dict, record, batch: int = TRAIN_BATCH) -> None:
    """The train stage's CEM models (each recursion depth T of ``t``), one training step's forward
    and backward, compiled as the stage compiles them (:func:`as_trained`; the kernels run inside
    opaque custom operators), with every call sent to the kernels as on a GPU with tensor-core
    dots: the kernels at the train stage's shapes (context, heads, widths), with the autotune
    spaces the GPU's first step compiles. One layer (the others have the same shapes) and
    ``batch`` sequences; ``check_finite`` off (the stand-in driver computes nothing, so the
    values are whatever memory held)."""
    import dataclasses

    import torch
    import train_step
    from cemlib.models.lm import LanguageModel

    configs = train_step.model_configs(t["widths"], t["Ts"], vocab=65, context=t["context"],
                                       layers=1, head_dim=t["head_dim"])
    with _as_on_a_gpu():
        for name, cfg in configs:
            if cfg.attn != "cem" and cfg.mlp != "cem":
                continue
            torch.manual_seed(0)
            model = as_trained(LanguageModel(dataclasses.replace(cfg, check_finite=False)),
                               t.get("compile", True))
            x = torch.randint(0, cfg.vocab_size, (batch, cfg.context_length))
            _record_step(record, name, [batch, cfg.context_length, cfg.d_model],
                         lambda model=model, x=x: model(x).float().sum())


def campaign_experiments() -> list[str]:
    """The GPU campaign's experiments (both plans, in order) whose models hold CEM layers (the
    attention or the MLP: the ones that call cemlib's kernels)."""
    from campaign import plan_runs  # tools/gpu/campaign.py
    from cemlib.train import get_config
    out = []
    for run in plan_runs():
        model = get_config(run.experiment, run.preset).model
        if run.experiment not in out and "cem" in (model.get("attn"), model.get("mlp")):
            out.append(run.experiment)
    return out


def campaign_models(record, batch: int = TRAIN_BATCH) -> None:
    """One training step (forward and backward of the task's loss, compiled where the preset
    compiles: :func:`as_trained`) of each model of :func:`campaign_experiments` at its ``gpu``
    preset, on ``batch`` training examples (the preset's 64: a multiple of 16 either way): the
    kernels at the campaign's shapes, autotune spaces included."""
    from cemlib.train import build, get_config

    with _as_on_a_gpu():
        for experiment in campaign_experiments():
            cfg = get_config(experiment, "gpu", ["model.check_finite=false"])
            model, task = build(cfg)
            model = as_trained(model, cfg.train.compile)
            data = task.train.batch(0, batch)
            _record_step(record, experiment, [batch, cfg.train.context_length, cfg.model.get("d_model")],
                         lambda model=model, task=task, data=data: task.loss(model, data))


#: the CUDA test files of ``run_gpu.sh tests`` whose kernels the build compiles
#: (:func:`cuda_tests`): all but the trainer's, ``test_train_cuda.py``, which trains with
#: Inductor, and Inductor writes C++ for CPU tensors, not the GPU's kernels; both run the tests
#: not marked slow (:data:`CUDA_TEST_MARKS`)
CUDA_TEST_FILES = ("tests/kernels/test_kernels_cuda.py", "tests/kernels/test_kernels_attention.py",
                   "tests/kernels/test_kernels_gated_mlp.py", "tests/kernels/test_kernels_dplr.py",
                   "tests/kernels/test_kernels_dispatch.py",
                   "tests/kernels/test_kernels_attention_torch.py", "tests/layers/test_no_sync.py",
                   "tests/kernels/test_kernels_runtime.py")
CUDA_TEST_MARKS = "not slow"
_CUDA_NO_OPS = ("synchronize", "set_sync_debug_mode", "manual_seed", "manual_seed_all",
                "reset_peak_memory_stats", "empty_cache")


def _on_the_cpu(device):
    """``device`` with a CUDA device replaced by the CPU (anything else unchanged)."""
    import torch
    if isinstance(device, (str, torch.device)) and str(device).startswith("cuda"):
        return "cpu"
    return device


@contextlib.contextmanager
def cuda_on_the_cpu():
    """Code written for a GPU run on CPU tensors, for :func:`cuda_tests`:
    ``torch.cuda.is_available()`` says yes; a tensor asked for on a CUDA device (a factory's
    ``device=``, ``.to("cuda")``, ``.cuda()``), a ``torch.Generator`` and ``torch.autocast`` on
    CUDA are the CPU's; ``torch.cuda``'s synchronisation, seeding and memory-statistics calls do
    nothing. Restored on exit. Anything else of ``torch.cuda`` still raises (the code stops there).
    """
    import torch
    from torch.overrides import TorchFunctionMode

    class OnTheCPU(TorchFunctionMode):
        def __torch_function__(self, func, types, args=(), kwargs=None):
            kwargs = dict(kwargs or {})
            if "device" in kwargs:
                kwargs["device"] = _on_the_cpu(kwargs["device"])
            name = getattr(func, "__name__", "")
            if name == "cuda":
                return args[0]
            if name == "to":
                args = tuple(_on_the_cpu(a) for a in args)
            return func(*args, **kwargs)

    generator, autocast = torch.Generator, torch.autocast

    class Generator(generator):  # a class still (annotations such as ``Generator | None``)
        def __new__(cls, device="cpu"):
            return generator(device=_on_the_cpu(device))

    class Autocast(autocast):
        def __init__(self, device_type, *args, **kw):
            super().__init__(_on_the_cpu(device_type), *args, **kw)

    saved = {name: getattr(torch.cuda, name) for name in
             (*_CUDA_NO_OPS, "is_available", "max_memory_allocated")}
    try:
        torch.Generator, torch.autocast = Generator, Autocast
        for name in _CUDA_NO_OPS:
            setattr(torch.cuda, name, lambda *args, **kw: None)
        torch.cuda.is_available = lambda: True
        torch.cuda.max_memory_allocated = lambda *args, **kw: 0
        with OnTheCPU():
            yield
    finally:
        torch.Generator, torch.autocast = generator, autocast
        for name, value in saved.items():
            setattr(torch.cuda, name, value)


def cuda_tests() -> dict:
    """The CUDA tests' calls (:data:`CUDA_TEST_FILES`) as ``run_gpu.sh tests`` makes them: each
    kernel in its default configuration (``CEMLIB_AUTOTUNE=0``), on CPU tensors
    (:func:`cuda_on_the_cpu`) along the GPU path. The stand-in driver computes nothing, so most
    tests fail on their values, after their calls have compiled the kernels; a test that asks
    ``torch.cuda`` for more than :func:`cuda_on_the_cpu` answers stops there, and its kernels
    compile on the GPU. Returns pytest's counts."""
    import pytest
    from cemlib.kernels import attention

    class Counts:
        def __init__(self):
            self.outcomes = {}

        def pytest_runtest_logreport(self, report):
            if report.when == "call" or report.outcome != "passed":
                self.outcomes[report.outcome] = self.outcomes.get(report.outcome, 0) + 1

    counts, autotune = Counts(), attention.TUNING.autotune
    attention.TUNING.autotune = False
    try:
        with _as_on_a_gpu(), cuda_on_the_cpu():
            pytest.main([*(str(REPOSITORY / f) for f in CUDA_TEST_FILES), "-m", CUDA_TEST_MARKS,
                         "-q", "-rN", "--tb=no", "-p", "no:cacheprovider", "-o", "addopts=",
                         "-W", "ignore"], plugins=[counts])
    finally:
        attention.TUNING.autotune = autotune
    return {"tests": counts.outcomes}


def build(out: Path, quick: bool = False, argv=None, manifest_out: Path | None = None) -> dict:
    """Compile (into the empty cache directory this process was started with) and pack; the
    manifest is also written to ``manifest_out`` (the archive itself is not kept in git)."""
    import host_overhead
    from outputs import command_line, write_json
    directory = cache_dir()
    if entries(directory):
        sys.exit(f"build needs an empty Triton cache; {directory} holds {entries(directory)} kernels")
    host_overhead.gpu_paths()
    t0 = time.monotonic()
    parts = _compile_calls(quick)
    manifest = {"benchmark": "warm_cache", "arch": f"sm_{ARCH}", "fingerprint": fingerprint(),
                "kernel_code_hash": kernel_code_hash(),
                "kernels": entries(directory), "parts": parts, "quick": quick,
                "build_dir": "<temporary>", "compile_s": round(time.monotonic() - t0, 1),
                "env": host_overhead.run_env(),
                "command": command_line(__file__, argv)}
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(out.name + ".partial")
    with tarfile.open(tmp, "w:xz") as tar:
        data = json.dumps(manifest, indent=1).encode()
        info = tarfile.TarInfo("manifest.json")
        info.size, info.mtime = len(data), int(time.time())
        tar.addfile(info, io.BytesIO(data))
        for path in sorted(directory.glob("*/*")):
            if path.suffix in KEPT:
                tar.add(path, arcname=f"cache/{path.parent.name}/{path.name}")
    tmp.replace(out)
    manifest["archive_mib"] = round(out.stat().st_size / 2**20, 2)
    print(f"{manifest['kernels']} kernels, {manifest['archive_mib']} MiB -> {out}")
    if manifest_out is not None:
        write_json(manifest, manifest_out, manifest_out, replace=True)
    return manifest


# ---------------------------------------------------------------------------------- install

def install(archive: Path, directory: Path | None = None) -> dict:
    """Unpack ``archive`` into the Triton cache ``directory`` (default this process's), files
    already there kept, each group's file list pointed at where its files now lie; and compare
    the manifest's fingerprint with this machine's."""
    directory = Path(directory) if directory is not None else cache_dir()
    added = 0
    with tarfile.open(archive, "r:xz") as tar:
        manifest = json.load(tar.extractfile("manifest.json"))
        for member in tar.getmembers():
            parts = Path(member.name).parts
            if not member.isfile() or len(parts) != 3 or parts[0] != "cache" or \
                    Path(parts[2]).suffix not in KEPT or ".." in parts:
                continue
            target = directory / parts[1] / parts[2]
            if target.exists():
                continue
            target.parent.mkdir(parents=True, exist_ok=True)
            data = tar.extractfile(member).read()
            if parts[2].startswith("__grp__"):
                group = json.loads(data)
                group["child_paths"] = {
                    child: str(directory / parts[1] / Path(path).name)
                    for child, path in group.get("child_paths", {}).items()
                    if Path(path).suffix in KEPT}
                data = json.dumps(group).encode()
                added += 1
            target.write_bytes(data)
    here = fingerprint()
    differs = sorted(k for k in ("triton", "triton_key_sha256", "ptxas", "env_vars")
                     if manifest["fingerprint"].get(k) != here.get(k))
    report = {"archive": archive.name, "kernels": manifest["kernels"], "installed": added,
              "cache_dir_kernels": entries(directory), "matches": not differs,
              "differs": {k: {"archive": manifest["fingerprint"].get(k), "here": here.get(k)}
                          for k in differs},
              "kernel_code_matches": _code_matches(manifest)}
    print("warm Triton cache:", json.dumps(report), flush=True)
    if report["kernel_code_matches"] is False:
        print("warm Triton cache: built from other kernel code (kernel_code_hash differs): its "
              "kernels will be compiled again; rebuild it with warm_cache.py build",
              file=sys.stderr, flush=True)
    return report


def _code_matches(manifest: dict) -> bool | None:
    """Whether ``manifest``'s archive was built from this checkout's kernel code (None: the
    manifest does not say)."""
    built = manifest.get("kernel_code_hash")
    return None if built is None else built == kernel_code_hash()


def check(archive: Path) -> dict:
    """Whether ``archive`` (or a manifest: a ``.json`` file) holds the kernels of this checkout's
    code (before carrying it to a GPU): its manifest's ``kernel_code_hash`` against this code's.
    ``stale`` where it does not, or where there is no archive: the cache must be rebuilt
    (``build``) before the next GPU call."""
    if not archive.exists():
        report = {"archive": str(archive.name), "exists": False, "here": kernel_code_hash(),
                  "kernel_code_matches": None, "stale": True}
    else:
        if archive.suffix == ".json":
            manifest = json.loads(archive.read_text())
        else:
            with tarfile.open(archive, "r:xz") as tar:
                manifest = json.load(tar.extractfile("manifest.json"))
        matches = _code_matches(manifest)
        report = {"archive": str(archive.name), "exists": True,
                  "built_at": manifest.get("env", {}).get("git_commit"),
                  "kernel_code_hash": manifest.get("kernel_code_hash"), "here": kernel_code_hash(),
                  "kernel_code_matches": matches, "stale": not matches}
    print(json.dumps(report))
    if report["stale"]:
        print("warm Triton cache: stale (built from other kernel code, or missing): rebuild it "
              "with tools/gpu/warm_cache.py build before the next GPU call", file=sys.stderr)
    return report


def replay(quick: bool) -> dict:
    """The build's calls again (stand-in driver), reporting how many kernels they compiled: 0
    when the cache installed here holds them all."""
    import host_overhead
    host_overhead.gpu_paths()
    before = compiled()
    parts = _compile_calls(quick)
    report = {"compiled": compiled() - before, "parts": parts}
    print(json.dumps(report))
    return report


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="command", required=True)
    b = sub.add_parser("build", help="compile for sm_90 without a GPU and pack")
    b.add_argument("--quick", action="store_true", help="one small call (3 kernels): a check")
    b.add_argument("--out", type=Path, default=ARCHIVE)
    b.add_argument("--manifest", type=Path, default=None,
                   help="also write the manifest here (default: "
                        "tools/gpu/results/warm_cache_sm90.json, none with --quick)")
    i = sub.add_parser("install", help="unpack into this machine's Triton cache")
    i.add_argument("archive", type=Path, nargs="?", default=ARCHIVE)
    r = sub.add_parser("replay", help="the build's calls again: how many kernels still compile")
    r.add_argument("--quick", action="store_true")
    c = sub.add_parser("check", help="whether the archive (or a manifest .json) was built from "
                                     "this kernel code")
    c.add_argument("archive", type=Path, nargs="?", default=ARCHIVE)
    args = p.parse_args(argv)
    if args.command == "install":
        return install(args.archive)
    if args.command == "check":
        report = check(args.archive)
        sys.exit(1 if report["stale"] else 0)
    if args.command == "replay":
        return replay(args.quick)
    manifest = args.manifest or (None if args.quick else HERE / "results" / "warm_cache_sm90.json")
    return build(args.out, args.quick, argv, manifest)


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] in ("build", "replay"):
        os.environ["TRITON_INTERPRET"] = "0"  # compiled kernels, never the interpreter
        if sys.argv[1] == "build" and "TRITON_CACHE_DIR" not in os.environ:
            os.environ["TRITON_CACHE_DIR"] = tempfile.mkdtemp(prefix="cemlib_triton_warm_")
    main()
