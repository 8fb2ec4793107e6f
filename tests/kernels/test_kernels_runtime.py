"""What the Triton ops share (:mod:`cemlib.kernels.runtime`): the operators registered without
``torch.library.custom_op``, direct launches, the autotune helper, parallel compilation.

**Operators** (the attention forward and backward, the MLP step's forward, backward and
inference, the DPLR preconditioner): ``custom_op`` checks at every call that no output aliases an
input; these go without that check, so it is made here, once per operator: every output is a new
tensor. Also: each returns what its kernel function returns, its fake (meta) implementation gives
the outputs' shapes and dtypes, and it carries the ``pt2_compliant_tag``.

**Direct launches** hand the launcher exactly what Triton's own launch path would:
``direct_launch_check.py`` (a fresh process, compiled kernels rather than the interpreter)
compiles the attention kernels for sm_90 and replaces the CUDA driver by one whose launchers
record their arguments. Every launch of five calls (plain; ``q`` at an address that is not
16-byte aligned, which Triton compiles separately; atomic ``dq``; the default layer's call with
the shared diagonal; a launch hook set) is recorded through ``JITFunction.run`` and through the
direct path, with autotuning and with fixed configurations, and compared (where no launch hook is
set, the direct path passes none and no metadata, which the launcher hands only to hooks). With a
cache key that ignored the alignment, the misaligned call would launch the kernel compiled for the
aligned one: that comparison fails.

**The autotune helper** (:class:`runtime.Tuning`) and **parallel compilation**: the autotune space
is compiled in worker threads before the autotuner times it (``parallel_compile_check.py``: a
fresh process per case, an empty Triton cache, kernels compiled for sm_90 and launched by a
stand-in driver); every configuration is compiled exactly once, all in worker threads (had the
warm-up compiled under another cache key than the autotuner's launch, the autotuner would compile
each again in the main thread and the counts would double); with ``CEMLIB_PARALLEL_COMPILE=0`` the
same compilations happen one after another in the main thread, inside the autotuner. The fold of
the bias gradients (one fixed configuration) is compiled once, in the main thread, either way.

On the CPU the kernels run under Triton's interpreter.
"""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode

from triton_interpreter import CUDA, DEVICE, kernels_usable, rerun_in_fresh_process  # noqa: F401

triton = pytest.importorskip("triton")

from cemlib.kernels import attention as attn  # noqa: E402
from cemlib.kernels import dplr, reference, runtime  # noqa: E402
from cemlib.kernels import gated_mlp as gm  # noqa: E402

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
DTYPE = torch.float16 if CUDA else torch.float32


@pytest.mark.slow
def test_interpreted_suite_in_fresh_process():
    rerun_in_fresh_process(__file__)


# ------------------------------------------------------------------------------ operators
def _attention_backward_args():
    g = torch.Generator().manual_seed(0)
    B, K, L, D = 2, 2, 13, 16
    q, kv, do = (torch.randn(B, K, L, D, generator=g).to(DEVICE, DTYPE) for _ in range(3))
    alibi = reference.alibi_slopes(K).to(DEVICE)
    sb, cb = (torch.randn(K, generator=g).to(DEVICE) for _ in range(2))
    o, lse, _, e2, a = attn.forward(q, kv, D ** -0.5, alibi, sb, cb)
    needs = [True, True, False, True, True, False, False]
    return (do, None, None, q, kv, o, lse, D ** -0.5, alibi, sb, cb, None, None, e2, a, needs, -1)


def _attention_forward_args():
    """The default layer's call: ALiBi, self/cross biases, the head-shared extra pair with
    head-summed values (every output of the forward operator is a tensor of its own)."""
    g = torch.Generator().manual_seed(2)
    B, K, L, D, De = 2, 2, 13, 16, 12
    q, kv = (torch.randn(B, K, L, D, generator=g).to(DEVICE, DTYPE) for _ in range(2))
    qe, ke = (torch.randn(B, L, De, generator=g).to(DEVICE, DTYPE) for _ in range(2))
    alibi = reference.alibi_slopes(K).to(DEVICE)
    sb, cb = (torch.randn(K, generator=g).to(DEVICE) for _ in range(2))
    return (q, kv, D ** -0.5, alibi, sb, cb, qe, ke, True)


def _mlp_args():
    g = torch.Generator().manual_seed(1)
    u, dy = (torch.randn(7, 16, generator=g).to(DEVICE, DTYPE) for _ in range(2))
    V = torch.randn(40, 16, generator=g).to(DEVICE, DTYPE)
    gamma = torch.randn(7, 40, generator=g).to(DEVICE, DTYPE)
    _, h = gm._forward(u, V, gamma)
    return (dy, u, V, gamma, h), (u, V, gamma)


def _dplr_args():
    g = torch.Generator().manual_seed(3)
    return (torch.randn(7, 16, generator=g).to(DEVICE, DTYPE),
            torch.randn(16, generator=g).to(DEVICE, DTYPE),
            *(0.25 * torch.randn(16, 4, generator=g).to(DEVICE, DTYPE) for _ in range(2)))


def _cases():
    """``(name, operator, its kernel function, arguments)``"""
    bwd = _attention_backward_args()
    mlp_bwd, mlp_infer = _mlp_args()
    return [("tied_attention_bwd", attn._bwd_op, attn._bwd_kernel_op, bwd),
            ("tied_attention_fwd", attn._fwd_op, attn._fwd_kernel_op, _attention_forward_args()),
            ("tied_mlp_step_bwd", gm._step_bwd, gm._backward, mlp_bwd),
            ("tied_mlp_step_fwd", gm._step_fwd, gm._forward, mlp_infer),
            ("tied_mlp_step_infer", gm._step_infer, gm._inference, mlp_infer),
            ("dplr_precondition", dplr._dplr, dplr._apply_on_device, _dplr_args())]


def _tensors(x):
    return [t for t in (x if isinstance(x, (list, tuple)) else [x]) if isinstance(t, torch.Tensor)]


def _shares_memory(a, b) -> bool:
    """Whether two tensors share their memory (empty tensors own none)."""
    return bool(a.numel() and b.numel()) and \
        a.untyped_storage().data_ptr() == b.untyped_storage().data_ptr()


@pytest.mark.parametrize("case", range(6))
def test_operators_return_new_tensors_equal_to_their_kernels(case):
    name, op, kernel, args = _cases()[case]
    assert op.name() == f"cemlib::{name}" and torch.Tag.pt2_compliant_tag in op.tags
    got = _tensors(op(*args))
    inputs = _tensors(args)
    for i, out in enumerate(got):  # custom_op's alias check, made here
        assert not any(_shares_memory(out, x) for x in inputs), (name, i)
    for i, (a, b) in enumerate(zip(got, _tensors(kernel(*args)))):
        assert torch.equal(a, b), (name, i)
    # the fake implementation: the outputs' shapes and dtypes, without running a kernel
    with FakeTensorMode(allow_non_fake_inputs=False) as mode:
        fake_args = [mode.from_tensor(t) if isinstance(t, torch.Tensor) else t for t in args]
        fake = _tensors(op(*fake_args))
    assert [(t.shape, t.dtype) for t in fake] == [(t.shape, t.dtype) for t in got]


def test_an_output_that_aliases_an_input_is_caught():
    """The check above fails where an operator hands back an input or a view of one (what
    ``custom_op`` would have refused at the call)."""
    x = torch.randn(4, 4)
    assert _shares_memory(x[1:], x) and _shares_memory(x, x)
    assert not _shares_memory(x.clone(), x) and not _shares_memory(x.new_empty(0), x)


def _has_kernel(name: str, key: str) -> bool:
    return torch._C._dispatch_has_kernel_for_dispatch_key(f"cemlib::{name}", key)


def test_no_autograd_layer_stands_before_the_operators_of_a_compiled_graph():
    """Each operator registered here has a kernel for CPU and CUDA tensors and none for autograd:
    a compiled graph reaches the kernel function through the dispatcher alone (the derivative is
    the ``autograd.Function`` that dynamo traced into the graph). Failing input: an operator made
    with ``torch.library.custom_op`` and a derivative has an autograd kernel (custom_op's Python
    layer, which runs at every call, with grad mode off too)."""
    for name, *_ in _cases():
        assert _has_kernel(name, "CPU") and _has_kernel(name, "CUDA"), name
        assert not _has_kernel(name, "Autograd"), name

    @torch.library.custom_op("cemlib_runtime_test::with_autograd", mutates_args=())
    def with_autograd(x: torch.Tensor) -> torch.Tensor:
        return x.clone()
    with_autograd.register_autograd(lambda ctx, g: g)
    assert torch._C._dispatch_has_kernel_for_dispatch_key("cemlib_runtime_test::with_autograd",
                                                          "Autograd")


def test_an_operator_defined_again_keeps_its_first_definition():
    """A module that defines operators, imported a second time (a reload, or a fresh import
    after its ``sys.modules`` entry was dropped, as ``test_imports.py`` does), defines them
    again while the first definitions live on: ``define`` keeps the first. Failing input,
    shown once by that test: without the check the dispatcher refused the DPLR operator's
    second definition ("registered ... multiple times")."""
    fake = lambda x: x.new_empty(x.shape)  # noqa: E731
    first = runtime.define("test_defined_twice", "(Tensor x) -> Tensor", torch.clone, fake)
    again = runtime.define("test_defined_twice", "(Tensor x) -> Tensor", torch.neg, fake)
    x = torch.ones(3)
    assert again.name() == first.name() == "cemlib::test_defined_twice"
    assert torch.equal(again(x), x)  # the first kernel


# ------------------------------------------------------------------------------ direct launches

def _fresh_process(script, tmp_path=None, **env):
    """Run ``script`` (beside this file) in a fresh Python process with compiled kernels; its
    last line of output, parsed as JSON."""
    run = subprocess.run([sys.executable, str(HERE / script)], cwd=ROOT, capture_output=True,
                         text=True, timeout=1200,
                         env={**os.environ, "TRITON_INTERPRET": "0",
                              "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get(
                                  "PYTHONPATH", "")]), **env})
    assert run.returncode == 0, run.stderr[-3000:]
    return json.loads(run.stdout.strip().splitlines()[-1])


@pytest.mark.slow
def test_direct_launches_equal_tritons_own():
    out = _fresh_process("direct_launch_check.py")
    assert out["supported"], "the installed Triton no longer launches the way runtime.launch copies"
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
    calls = []

    class Kernel:
        pre_run_hooks = []

        def __getitem__(self, grid):
            return lambda *args, **kw: calls.append((grid, args, kw)) or "compiled"

    cached = len(runtime._compiled)
    for _ in range(2):
        assert runtime.launch(Kernel(), (2, 1), (1, 2), {"X": 3}, cuda=False) == "compiled"
    assert calls == [((2, 1), (1, 2), {"X": 3})] * 2 and len(runtime._compiled) == cached


def test_direct_launch_cache_starts_over_when_full(monkeypatch):
    """The cache of compiled kernels is bounded (a sampling loop launches at every length): at
    ``MAX_ENTRIES`` keys it starts over instead of growing."""

    class Kernel:
        pre_run_hooks = []
        fn = staticmethod(lambda L: None)  # the Python function (its parameters are bound once)

        def __getitem__(self, grid):
            return lambda *args, **kw: "compiled"

    class Driver:
        def get_current_device(self):
            return 0

    monkeypatch.setattr(runtime, "MAX_ENTRIES", 3)
    monkeypatch.setattr(runtime, "_compiled", {})
    monkeypatch.setattr(runtime, "_enabled", [True])
    monkeypatch.setattr(runtime, "_supported", [True])
    import triton.runtime
    monkeypatch.setattr(triton.runtime.driver, "_active", Driver(), raising=False)
    for L in range(5):
        runtime.launch(Kernel(), (1,), (L,), {})
    assert len(runtime._compiled) == 2   # 3 keys, cleared at the 4th, then 2


# ------------------------------------------------------------------------------ parallel compilation

@pytest.mark.slow
@pytest.mark.skipif((os.cpu_count() or 1) < 2, reason="parallel compilation needs two cores")
def test_the_autotune_space_is_compiled_once_in_worker_threads(tmp_path):
    out = _fresh_process("parallel_compile_check.py", TRITON_CACHE_DIR=str(tmp_path / "cache"),
                         CEMLIB_PARALLEL_COMPILE="1")
    assert out["parallel"]
    assert out["compiled_in_main_thread"] == {
        "_fwd_kernel": [False] * 3, "_pre_kernel": [False] * 3, "_bwd_kernel": [False] * 3,
        "_fold_kernel": [True]}


@pytest.mark.slow
def test_without_parallel_compilation_the_autotuner_compiles(tmp_path):
    out = _fresh_process("parallel_compile_check.py", TRITON_CACHE_DIR=str(tmp_path / "cache"),
                         CEMLIB_PARALLEL_COMPILE="0")
    assert not out["parallel"]
    assert out["compiled_in_main_thread"] == {
        "_fwd_kernel": [True] * 3, "_pre_kernel": [True] * 3, "_bwd_kernel": [True] * 3,
        "_fold_kernel": [True]}


# ------------------------------------------------------------------------------ the autotune helper

def _tuning(monkeypatch, **attrs):
    """The attention op's :class:`runtime.Tuning` with fresh caches (and ``attrs`` set)."""
    tuning = attn.TUNING
    for name in ("tuners", "tuned", "choices", "fitting"):
        monkeypatch.setattr(tuning, name, {})
    for name, value in attrs.items():
        monkeypatch.setattr(tuning, name, value)
    return tuning


def test_the_configurations_are_data():
    """The launch configurations come from ``attention_configs.json``: one per kernel under the
    interpreter, a space per kernel and head width on a GPU (width 0: any), each GPU entry with
    its warps and stages; the narrowest table at or above a padded head width serves it."""
    data = json.loads((ROOT / "cemlib" / "kernels" / "attention_configs.json").read_text())
    tuning = attn.TUNING
    assert tuning.interpreter == data["interpreter"] == attn.INTERPRETER_CONFIGS
    assert {n: {str(w): c for w, c in t.items()} for n, t in tuning.gpu.items()} == data["gpu"]
    assert set(tuning.gpu) == set(tuning.interpreter) | {"bwd_atomic"}
    for table in tuning.gpu.values():
        for configs in table.values():
            assert configs and all({"num_warps", "num_stages"} <= set(c) for c in configs)
    assert tuning.configs("fwd", 16) is tuning.gpu["fwd"][64]
    assert tuning.configs("fwd", 128) is tuning.gpu["fwd"][128]
    assert tuning.configs("fwd", 256) is tuning.gpu["fwd"][128]
    assert tuning.configs("extra_grads", 64) is tuning.gpu["extra_grads"][0]


def test_the_autotuner_times_each_configuration_for_autotune_rep_ms(monkeypatch):
    """The autotuner's timing of a configuration is ``do_bench`` for ``rep_ms`` (25 by default;
    Triton's own benchmarker takes 100 plus 25 of warm-up, about 3 s per kernel and kind of call
    on a space of 26). Failing input: a tuner built without the option times with the driver's
    benchmarker (its ``do_bench`` is not ``Tuning.timed``)."""
    tuning = _tuning(monkeypatch)
    tuner = tuning.tuner("fwd", attn._fwd_kernel, "fwd", 64)
    assert tuner.do_bench == tuning.timed
    assert len(tuner.configs) == len(attn.GPU_CONFIGS["fwd"][64])
    seen = []
    monkeypatch.setattr(triton.testing, "do_bench",
                        lambda fn, warmup, rep, quantiles: seen.append((warmup, rep, quantiles)))
    monkeypatch.setattr(tuning, "rep_ms", 40.0)
    tuning.timed(lambda: None, quantiles=(0.5, 0.2, 0.8))
    assert seen == [(8.0, 40.0, (0.5, 0.2, 0.8))]
    plain = triton.autotune([triton.Config({"BLOCK_M": 16})], key=["L"])(attn._fwd_kernel)
    assert plain._do_bench is None  # (the failing input: Triton's own benchmarker, chosen later)


def test_autotuned_launches_consult_the_tuner_once_per_signature(monkeypatch):
    """On a GPU, every autotuned launch used to go through ``triton.autotune``'s ``run``, which
    rebuilds its key from every argument (about 20 us of host time per launch,
    ``tools/gpu/host_overhead.py``); now the tuner is consulted once per call signature and
    later launches go to the kernel with its choice. With a stand-in kernel and tuner: the tuner
    runs once, every launch gets exactly its configuration and grid, and another length, dtype
    or flag consults it again."""
    launches, consulted = [], []

    class Kernel:
        def __getitem__(self, grid):
            return lambda *args, **kw: launches.append((grid, args, kw))

    class Config:
        def all_kwargs(self):
            return {"BLOCK_M": 64, "num_warps": 8, "num_stages": 2}

    class Tuner:
        best_config = None

        def __getitem__(self, grid):
            def run(*args, **meta):
                consulted.append(args)
                self.best_config = Config()
                kw = {**meta, **self.best_config.all_kwargs()}
                launches.append((grid(kw), args, kw))
            return run

    tuning = _tuning(monkeypatch, select=lambda name, device, block_d, table: None,
                     tuner=lambda name, kernel, table, block_d, t=Tuner(): t)
    x = torch.zeros(4)

    def launch(L=100, dtype=torch.float32, flag=True):
        tuning.launch("fwd", Kernel(), lambda cfg: (-(-L // cfg["BLOCK_M"]), 3), (x.to(dtype), L),
                      dict(D=64, HAS_ALIBI=flag), 64, torch.device("cpu"), L)

    for _ in range(3):
        launch()
    assert len(consulted) == 1 and len(launches) == 3
    expected = {"D": 64, "HAS_ALIBI": True, "BLOCK_M": 64, "num_warps": 8, "num_stages": 2}
    assert all(grid == (2, 3) and kw == expected for grid, _, kw in launches)
    launch(L=200), launch(dtype=torch.float16), launch(flag=False)
    assert len(consulted) == 4
    launch(L=200)
    assert len(consulted) == 4 and launches[-1][0] == (4, 3)
    # another length in a tuned power-of-two bucket (100 and 128: 128; 200 and 256: 256) takes
    # that bucket's choice without timing the configurations again (generation, one length
    # after another); its launch gets its own grid
    launch(L=128), launch(L=97), launch(L=256)
    assert len(consulted) == 4 and [g for g, _, _ in launches[-3:]] == [(2, 3), (2, 3), (4, 3)]
    launch(L=300)
    assert len(consulted) == 5


def test_length_buckets():
    assert [runtime.length_bucket(L) for L in (1, 16, 17, 100, 128, 129, 4096)] == \
        [16, 16, 32, 128, 128, 256, 4096]


def test_autotuning_off_launches_the_first_configuration_the_gpu_runs_well(monkeypatch):
    """``CEMLIB_AUTOTUNE=0`` on a GPU: the space is ordered and pruned for the H100. Elsewhere an
    entry may not load (a T4's 64 KiB of shared memory per block: the forward's default
    128 x 128 tiles need 96 KiB there, compiled for sm_75) or may spill registers (the default
    forward and backward compiled for sm_80, ``results/compile_kernels.json``). The launch
    compiles and loads entries without launching them until one loads without spilling, runs
    it, and remembers it; where every entry that loads spills, the first of them runs; where
    none loads, the error shows. With a stand-in compiler: 128-row query tiles do not load,
    128-column key tiles spill. Failing input: the previous rule (the first entry that
    loads) launches a spilling configuration."""
    probed, launched = [], []

    def spills(kernel, grid, args, kw):
        probed.append((kw["BLOCK_M"], kw["BLOCK_N"], kw["num_warps"]))
        if kw["BLOCK_M"] == 128:
            raise triton.runtime.errors.OutOfResources(96 * 1024, 64 * 1024, "shared memory")
        return 88 if kw["BLOCK_N"] == 128 else 0

    def launch(kernel, grid, args, kw, cuda=True):
        launched.append((kw["BLOCK_M"], kw["BLOCK_N"], kw["num_warps"]))

    monkeypatch.setattr(runtime, "spills", spills)
    monkeypatch.setattr(runtime, "launch", launch)
    tuning = _tuning(monkeypatch, autotune=False, interpret=False)
    configs = tuning.configs("fwd", 64)
    tiles = [(c["BLOCK_M"], c["BLOCK_N"], c["num_warps"]) for c in configs]
    assert tiles[0][0] == 128  # the H100's default
    loads = [i for i, t in enumerate(tiles) if t[0] != 128]
    good = next(i for i in loads if tiles[i][1] != 128)
    assert loads[0] != good  # the space has an entry that loads but spills before a good one
    cuda = torch.device("cuda")

    def call():
        tuning.launch("fwd", None, lambda cfg: (1,), (), dict(D=64), 64, cuda, 100)
    for _ in range(2):
        call()
    # the first call probes in order up to the good entry; both calls launch only that one
    assert probed == tiles[:good + 1] and launched == [tiles[good]] * 2
    assert tuning.fitting == {("fwd", 64, cuda): good}
    # every entry that loads spills: the first that loads runs
    probed.clear(), launched.clear()
    monkeypatch.setattr(tuning, "fitting", {})
    monkeypatch.setattr(tuning, "configs",
                        lambda table, block_d: [c for c in configs if c["BLOCK_N"] == 128])
    call()
    assert launched == [next(t for t in tiles if t[0] != 128 and t[1] == 128)]
    # nothing loads: the error shows
    monkeypatch.setattr(tuning, "fitting", {})
    monkeypatch.setattr(tuning, "configs", lambda table, block_d: [configs[0]])
    with pytest.raises(triton.runtime.errors.OutOfResources):
        call()


def test_probing_a_configuration_compiles_and_loads_without_launching(monkeypatch):
    """:func:`runtime.spills` asks Triton for the compiled kernel (``warmup``: no launch) and loads
    it (``_init_handles``: where a GPU refuses it), and reads its spills."""
    events = []

    class Compiled:
        n_spills = 5

        def _init_handles(self):
            events.append("load")

    class Kernel:
        def warmup(self, *args, grid, **kw):
            events.append(("compile", args, grid, kw))
            return Compiled()

        def __getitem__(self, grid):
            raise AssertionError("launched")

    assert runtime.spills(Kernel(), (3, 1), (1, 2), {"BLOCK_M": 64}) == 5
    assert events == [("compile", (1, 2), (3, 1), {"BLOCK_M": 64}), "load"]

    class Future:  # what Triton's cache holds for a kernel compiled in parallel
        def result(self):
            events.append("waited")
            return Compiled()

    Kernel.warmup = lambda self, *args, grid, **kw: Future()
    events.clear()
    assert runtime.spills(Kernel(), (3, 1), (1, 2), {"BLOCK_M": 64}) == 5
    assert events == ["waited", "load"]
