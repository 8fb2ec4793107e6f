"""How long a preset takes on one GPU, estimated before it runs (the ``gpu`` presets' budget).

A run's time on one H100 is estimated from what can be counted on the CPU and a few constants
fitted to the H100 measurements in ``benchmarks/results/``::

    step_s  = n_ops * op_s + 3 * F_batch / (eta * peak) + trainer_s        (one optimiser step)
    eval_s  = sum over the forward batches of one evaluation of
              n_fwd_ops * op_s + F_examples / (eta * peak)
    total_s = startup_s + data_s + compile_s + max_steps * step_s
              + (number of evaluations) * eval_s + final whole-split evaluation

- ``n_ops``: the ATen operations of one training forward + backward pass of the preset's model
  (counted on the CPU with a dispatch mode; they do not depend on the batch size), ``n_fwd_ops``
  those of one evaluation batch;
- ``F_batch``: the matrix-product FLOPs of the forward pass of one global batch
  (:func:`cemlib.kernels.costs.count_flops`, which equals
  :func:`cemlib.models.params.flops_per_token` for the language models), times 3 for forward and
  backward;
- ``peak``: the vendor's dense bf16 rate (989 TFLOP/s for the H100 SXM,
  :data:`cemlib.train.flops.PEAK_BF16_TFLOPS`);
- ``op_s`` and ``eta`` per model :data:`FAMILIES` (the per-operation cost of launching and
  dispatching, and the arithmetic efficiency of the large products); ``trainer_s``,
  ``startup_s`` and ``compile_s`` as stated in :data:`TRAINER_STEP_S`, :data:`STARTUP_S` and
  :data:`FAMILIES`; ``data_s`` is the CPU time the task's data took to load or generate on the
  machine that counted (one thread; on an idle host that is its wall time).

Small models are bound by ``n_ops * op_s`` (launch and dispatch), not by their FLOPs: the
6-layer Llama at width 384 runs at an MFU of 0.09 on the H100 (``train_step_T1`` benchmark).

Counting loads the task's data and builds the model, which takes tens of seconds for some tasks,
so the counts of the registered ``gpu`` presets are stored in ``gpu_counts.json`` beside this
module, each under a fingerprint of the resolved configuration (seed excluded): ``python -m
cemlib.train --list`` and the GPU campaign read them, a preset whose configuration changed shows
no estimate until ``python tools/gpu/budget.py --update`` counts it again (a test checks that
every gpu preset has current counts and that a recount reproduces them).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
from torch import nn

from cemlib.kernels.costs import count_flops
from cemlib.kernels.launches import count_operators
from cemlib.train.config import ExperimentConfig, micro_batch_size
from cemlib.train.flops import PEAK_BF16_TFLOPS

__all__ = ["Family", "FAMILIES", "TRAINER_STEP_S", "STARTUP_S", "H100_PEAK_TFLOPS", "StepCounts",
           "Estimate", "fingerprint", "count_ops", "count_step", "estimate", "load_counts",
           "cached_counts", "preset_estimate", "COUNTS_FILE"]

H100_PEAK_TFLOPS = PEAK_BF16_TFLOPS["H100 SXM"]


@dataclass(frozen=True)
class Family:
    """Per-operation cost ``op_s`` (seconds), arithmetic efficiency ``eta`` (of the vendor peak) and
    compile time ``compile_s`` (when ``train.compile``) of a kind of model, and where they come from."""

    op_s: float
    eta: float
    compile_s: float
    source: str


#: The model families. ``compiled`` and ``cem`` are fitted to the H100 training-step benchmark
#: (``benchmarks/results/train_step_T1_/T2_NVIDIA_H100_80GB_HBM3.json``: 6 layers, context 256,
#: batch 64, bf16, torch.compile, forward FLOPs as recorded there; operations counted by
#: :func:`count_ops` for the same configurations on the CPU path: 1,311 for Llama, 1,935 / 3,555
#: for full CEM T = 1 / 2). A least-squares fit of ``step = n_ops * op_s + FLOPs / (eta * 989
#: TFLOP/s)`` gives 8.7 us and 0.48 for Llama (medians 13.6 / 21.1 / 27.4 ms at widths 384 / 768
#: / 1024), 22.7 us and 0.60 for CEM (47.6 .. 109.7 ms; the T = 2 points are noisy); the constants
#: below are rounded to the slow side, 10 us / 0.5 and 22 us / 0.4 (v1 Triton kernels: the
#: conservative end until the v2 kernels are measured), and reproduce all twelve medians within
#: -6 % to +16 % (``tests/test_gpu_campaign.py``). ``eager`` (no torch.compile, no CEM layer) has no
#: H100 measurement: 15 us per operation (1.5 x the compiled Llama's) and 0.3 are assumptions, to
#: be replaced by the first campaign's wall times. Compile times: the stored run
#: ``book/results/shakespeare_llama_gpu.json`` spent about 42 s beyond its steps and evaluations
#: (163.6 s wall - 5000 x 20.0 ms - 11 x 400 evaluation batches x 4.9 ms), taken as 45 s; CEM's
#: Triton kernels add their own compilation: 60 s (assumed).
FAMILIES: dict[str, Family] = {
    "compiled": Family(10e-6, 0.5, 45.0, "fitted: Llama, H100 train_step benchmark, compiled bf16"),
    "cem": Family(22e-6, 0.4, 60.0, "fitted: full CEM T = 1, 2, H100 train_step benchmark (v1 kernels)"),
    "eager": Family(15e-6, 0.3, 0.0, "assumed (no H100 measurement of an eager model yet)"),
}
#: The trainer's own work per step (data windows, host-to-device copy, gradient norm and clipping,
#: the one synchronising ``.tolist()``, scheduler): the stored Llama gpu run's 20.0 ms per step
#: (818,619 tokens/s at 16,384 tokens per step) less the benchmark's 13.5 ms at the same shape.
TRAINER_STEP_S = 6.5e-3
#: Interpreter start, imports, CUDA initialisation, model construction and the results file (assumed).
STARTUP_S = 15.0

COUNTS_FILE = Path(__file__).with_name("gpu_counts.json")


def fingerprint(cfg: ExperimentConfig) -> str:
    """A short hash of the resolved configuration, ``train.seed`` excluded (seeds change neither
    the model's size nor the data's), and fields added since the counts were stored left out at
    the value those configurations had (``cemlib.train.folders.drop_later_defaults``)."""
    from cemlib.train.folders import drop_later_defaults
    d = drop_later_defaults(cfg.to_dict())
    d["train"] = {k: v for k, v in d["train"].items() if k != "seed"}
    return hashlib.sha256(json.dumps(d, sort_keys=True, default=str).encode()).hexdigest()[:16]


def count_ops(fn) -> int:
    """The number of ATen operations ``fn()`` dispatches (views and in-place updates included: each
    costs a dispatch on the host): :func:`cemlib.kernels.launches.count_operators`."""
    return count_operators(fn)


@dataclass(frozen=True)
class StepCounts:
    """What :func:`estimate` needs of one preset, counted on the CPU (see the module docstring).

    ``forward_flops_per_example``: matrix-product FLOPs of the forward pass per example (a
    language model's example is one window of ``context_length`` tokens); ``train_ops`` /
    ``eval_ops``: ATen operations of a training forward + backward / of one evaluation batch;
    ``eval_forwards`` / ``eval_examples``: forward passes and examples of one periodic evaluation
    (every split, greedy decoding included); ``final_forwards`` / ``final_examples``: those of the
    final whole-validation-split evaluation (0 where the periodic one already covers it);
    ``data_s``: CPU seconds the data took to load on the counting machine."""

    fingerprint: str
    family: str
    num_parameters: int
    forward_flops_per_example: float
    train_ops: int
    eval_ops: int
    eval_forwards: int
    eval_examples: int
    final_forwards: int
    final_examples: int
    data_s: float


def _family(model: nn.Module, cfg: ExperimentConfig) -> str:
    from cemlib.layers.cem_attention import CEMAttention
    from cemlib.layers.cem_mlp import CEMMLP
    if any(isinstance(m, (CEMAttention, CEMMLP)) for m in model.modules()):
        return "cem"
    return "compiled" if cfg.train.compile else "eager"


def _forwards(task, batches, split) -> tuple[int, int]:
    """(forward passes, examples) of ``batches`` of ``split``; greedy decoding runs one forward
    pass per generated position."""
    forwards = examples = 0
    greedy = getattr(task, "_greedy_on", lambda s: False)(split)
    for _, batch in batches:
        n = batch[0].shape[0]
        steps = 1
        if greedy:
            from cemlib.train.tasks import IGNORE_INDEX
            steps += int((batch[1] != IGNORE_INDEX).any(0).sum())
        forwards += steps
        examples += steps * n
    return forwards, examples


def _task_key(cfg: ExperimentConfig) -> str:
    """What the loaded data depend on (configurations with equal keys share their task)."""
    return json.dumps([asdict(cfg.data), cfg.task, cfg.train.context_length, cfg.train.seed],
                      sort_keys=True, default=str)


def count_step(cfg: ExperimentConfig, probe_examples: int = 2, task_cache: dict | None = None) -> StepCounts:
    """Load the task of ``cfg``, build its model on the CPU and count (see :class:`StepCounts`):
    FLOPs and operations on ``probe_examples`` examples, evaluation batches at the preset's
    micro-batch size (one process). ``task_cache`` (a dict) keeps loaded tasks for the next
    configurations on the same data (with the time they took to load)."""
    from cemlib.train.registry import build
    from cemlib.train.datasets import make_task
    key = _task_key(cfg)
    if task_cache is not None and key in task_cache:
        task, data_s = task_cache[key]
    else:
        t0 = time.process_time()  # CPU time: on a busy machine the wall time says more of its load
        task = make_task(cfg)
        data_s = time.process_time() - t0
        if task_cache is not None:
            task_cache[key] = (task, data_s)
    model, _ = build(cfg, task)
    model.train()
    micro = micro_batch_size(cfg.train, 1)
    batch = tuple(t[:probe_examples] for t in task.train.micro_batch(0, cfg.train.batch_size, 0, micro))
    k = batch[0].shape[0]
    flops = count_flops(lambda: task.loss(model, batch)) / k

    def train_pass():
        task.loss(model, batch).backward()
    train_ops = count_ops(train_pass)
    model.zero_grad(set_to_none=True)
    model.eval()
    with torch.no_grad():
        eval_ops = count_ops(lambda: task.eval_stats(model, batch, "val"))
    ev_f = ev_x = 0
    for split in task.eval_splits:
        f, x = _forwards(task, task.eval_batches(split, micro, 0, 1, cfg.train.eval_batches), split)
        ev_f, ev_x = ev_f + f, ev_x + x
    fin_f = fin_x = 0
    if cfg.train.final_whole_eval and not task.val_eval_is_whole:
        fin_f, fin_x = _forwards(task, task.whole_batches("val", micro), "val")
    return StepCounts(fingerprint(cfg), _family(model, cfg), sum(p.numel() for p in model.parameters()),
                      float(flops), train_ops, eval_ops, ev_f, ev_x, fin_f, fin_x, round(data_s, 2))


@dataclass(frozen=True)
class Estimate:
    """The estimated wall time of one run (seconds; see the module docstring) and its parts."""

    experiment: str
    preset: str
    family: str
    steps: int
    step_s: float
    train_s: float
    evaluations: int
    eval_s: float
    final_eval_s: float
    compile_s: float
    startup_s: float
    data_s: float
    flops_per_step: float
    mfu: float

    @property
    def total_s(self) -> float:
        return (self.startup_s + self.data_s + self.compile_s + self.train_s + self.eval_s
                + self.final_eval_s)

    @property
    def minutes(self) -> float:
        return self.total_s / 60.0


def estimate(cfg: ExperimentConfig, counts: StepCounts, peak_tflops: float = H100_PEAK_TFLOPS) -> Estimate:
    """The estimated time of ``cfg`` on one GPU of dense bf16 peak ``peak_tflops`` (default: the
    H100's, which the families' constants were fitted to), from its ``counts``."""
    if counts.fingerprint != fingerprint(cfg):
        raise ValueError(f"the counts are of another configuration than {cfg.experiment}/{cfg.preset} "
                         f"(fingerprint {counts.fingerprint} != {fingerprint(cfg)}); count again")
    fam = FAMILIES[counts.family]
    rate = fam.eta * peak_tflops * 1e12
    tc = cfg.train
    flops_per_step = 3.0 * counts.forward_flops_per_example * tc.batch_size
    step_s = counts.train_ops * tc.grad_accum * fam.op_s + flops_per_step / rate + TRAINER_STEP_S
    evaluations = tc.max_steps // tc.eval_interval + 1 + (1 if tc.max_steps % tc.eval_interval else 0)
    one_eval = counts.eval_forwards * counts.eval_ops * fam.op_s + \
        counts.eval_examples * counts.forward_flops_per_example / rate
    final = counts.final_forwards * counts.eval_ops * fam.op_s + \
        counts.final_examples * counts.forward_flops_per_example / rate
    model_step_s = step_s - TRAINER_STEP_S
    return Estimate(cfg.experiment, cfg.preset, counts.family, tc.max_steps, step_s, tc.max_steps * step_s,
                    evaluations, evaluations * one_eval, final, fam.compile_s if tc.compile else 0.0,
                    STARTUP_S, counts.data_s, flops_per_step,
                    flops_per_step / model_step_s / (peak_tflops * 1e12))


def load_counts(path: str | Path = COUNTS_FILE) -> dict[str, StepCounts]:
    """The stored counts: ``{"experiment/preset": StepCounts}`` (empty if the file is absent)."""
    path = Path(path)
    if not path.is_file():
        return {}
    raw = json.loads(path.read_text())
    return {key: StepCounts(**value) for key, value in raw["counts"].items()}


def cached_counts(cfg: ExperimentConfig, store: dict[str, StepCounts] | None = None) -> StepCounts | None:
    """The stored counts of ``cfg`` if they were counted for this very configuration (seed aside)."""
    store = load_counts() if store is None else store
    c = store.get(f"{cfg.experiment}/{cfg.preset}")
    return c if c is not None and c.fingerprint == fingerprint(cfg) else None


def preset_estimate(experiment: str, preset: str = "gpu", overrides=(),
                    store: dict[str, StepCounts] | None = None) -> Estimate | None:
    """The estimate of a registered preset from the stored counts, or ``None`` if they are missing
    or stale (the configuration changed since it was counted)."""
    from cemlib.train.registry import get_config
    cfg = get_config(experiment, preset, list(overrides))
    counts = cached_counts(cfg, store)
    return None if counts is None else estimate(cfg, counts)


def _gpu_presets() -> list[str]:
    from cemlib.train.registry import EXPERIMENTS
    return sorted(name for name, exp in EXPERIMENTS.items() if "gpu" in exp.presets)


def update_counts(experiments=None, path: str | Path = COUNTS_FILE, verbose: bool = True) -> dict:
    """Count the ``gpu`` presets of ``experiments`` (default: all whose stored counts are missing or
    stale) and write ``path``; counts of presets no longer registered are dropped."""
    from cemlib.train.registry import get_config
    torch.set_num_threads(1)
    store = load_counts(path)
    names = _gpu_presets()
    todo = names if experiments is None else list(experiments)
    tasks: dict = {}
    for name in todo:
        cfg = get_config(name, "gpu")
        if experiments is None and cached_counts(cfg, store) is not None:
            continue
        t0 = time.perf_counter()
        store[f"{name}/gpu"] = count_step(cfg, task_cache=tasks)
        if verbose:
            print(f"counted {name}/gpu in {time.perf_counter() - t0:.1f} s", file=sys.stderr)
    store = {k: v for k, v in store.items() if k.split("/")[0] in names}
    text = json.dumps({"schema": "cemlib.train.budget/1",
                       "command": "python tools/gpu/budget.py --update",
                       "counts": {k: asdict(store[k]) for k in sorted(store)}}, indent=1)
    Path(path).write_text(text + "\n")
    return store


def format_table(rows: list[tuple[str, Estimate | None]]) -> str:
    """A plain-text table of estimates (minutes on one H100 and the parts)."""
    head = f"{'experiment':34s} {'min':>5s} {'steps':>6s} {'ms/step':>8s} {'evals':>6s} {'MFU':>5s}  family"
    lines = [head]
    for name, e in rows:
        if e is None:
            lines.append(f"{name:34s} {'?':>5s}  (no current counts: python tools/gpu/budget.py --update)")
        else:
            lines.append(f"{name:34s} {e.minutes:5.1f} {e.steps:6d} {1e3 * e.step_s:8.1f} "
                         f"{e.evaluations:6d} {e.mfu:5.2f}  {e.family}")
    return "\n".join(lines)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python tools/gpu/budget.py",
                                description="Estimated H100 minutes of the gpu presets (see the module docstring).")
    p.add_argument("--update", action="store_true", help="count presets whose stored counts are missing or stale")
    p.add_argument("--experiment", action="append", help="only these experiments (with --update: recount them)")
    args = p.parse_args(argv)
    if args.update:
        update_counts(args.experiment)
    store = load_counts()
    names = args.experiment or _gpu_presets()
    rows = [(n, preset_estimate(n, "gpu", store=store)) for n in names]
    print(format_table(rows))
    known = [e.minutes for _, e in rows if e is not None]
    print(f"\n{len(known)} of {len(rows)} presets estimated; {sum(known):.1f} H100-minutes in all")
    return 0


if __name__ == "__main__":
    sys.exit(main())
