"""How long a run will take, from what this machine measures or the stored runs recorded.

Two sources, each named in what it returns (:class:`Estimate`):

- *stored runs*: the book's results files (``book/results/``, in a clone, or the copies shipped
  in the wheel) record each run's wall time, device and thread count. :func:`stored_estimate`
  finds the runs of the same configuration (any seed) on the same kind of device and returns
  their median time; ``cemlib train --list`` shows it for every preset that has one.
- *a measured step*: :func:`measured_estimate` times one forward and backward pass of a few
  examples of the built model on this machine (after one untimed pass) and scales it to the run:
  ``batch_size x max_steps`` examples for training, a forward pass (a third of a forward and
  backward) for every example each evaluation reads. It leaves the model, its gradients and the
  random-number generators as they were. A run of the ``gpu`` preset started on a CPU prints it
  as a warning, and ``cemlib train --estimate`` prints it for any configuration.

Both are estimates: another load on the machine, another thread count or another CPU change the
time (the stored runs' CPU may be faster or slower than this one; the measured step is the best of
a few, so a busy CPU makes the run itself slower than measured), and for a small model the
trainer's own work per step (logging, the progress line) weighs more than the measured parts.
"""

from __future__ import annotations

import json
import math
import statistics
import time
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn

__all__ = ["Estimate", "stored_results_folder", "stored_estimate", "measured_estimate", "duration", "about",
           "evaluation_examples"]


@dataclass
class Estimate:
    """``seconds`` the run takes, where (``device``: ``"CPU"`` or the GPU's name) and what the
    number is based on (``basis``, in words)."""

    seconds: float
    device: str
    basis: str
    first_eval_s: float | None = None

    def text(self) -> str:
        """``"about 3.2 min on a CPU (stored runs: ...)"``."""
        where = "a CPU" if self.device == "CPU" else _article(self.device)
        return f"{about(self.seconds)} on {where} ({self.basis})"


def _article(name: str) -> str:
    """``"an NVIDIA H200"``, ``"an AMD EPYC"``, ``"a Tesla T4"``."""
    return f"an {name}" if name[:1].upper() in "AEIOU" or name.upper().startswith(("NVIDIA", "RTX")) else f"a {name}"


def about(seconds: float) -> str:
    """``"about 43 s"``, or ``"under a second"``."""
    return "under a second" if seconds < 1 else f"about {duration(seconds)}"


def duration(seconds: float) -> str:
    """``"43 s"``, ``"12 min"``, ``"3.4 h"``."""
    if not math.isfinite(seconds):
        return "an unknown time"
    if seconds < 90:
        return f"{seconds:.0f} s"
    if seconds < 90 * 60:
        return f"{seconds / 60:.0f} min" if seconds >= 600 else f"{seconds / 60:.1f} min"
    return f"{seconds / 3600:.1f} h"


# ------------------------------------------------------------------------------ stored runs
def stored_results_folder() -> Path | None:
    """``book/results`` of the clone this package runs from, else the copy shipped in the wheel
    (``cemlib/_stored/book/results``), else ``None``."""
    import cemlib
    pkg = Path(cemlib.__file__).resolve().parent
    for folder in (pkg.parent / "book" / "results", pkg / "_stored" / "book" / "results"):
        if folder.is_dir():
            return folder
    return None


_INDEX: dict | None = None


def _key(config) -> str:
    """What decides a run's time: its identity without the seeds."""
    from cemlib.train.folders import identity_config
    d = identity_config(config)
    d["train"].pop("seed", None)
    d["task"].pop("data_seed", None)
    return json.dumps(d, sort_keys=True, default=repr)


def _index() -> dict:
    """``{(key, device type): [(seconds, device name, threads, file)]}`` of the stored complete runs."""
    global _INDEX
    if _INDEX is not None:
        return _INDEX
    index: dict = {}
    folder = stored_results_folder()
    for path in sorted(folder.rglob("*.json")) if folder is not None else ():
        if path.name.startswith("summary"):
            continue
        try:
            r = json.loads(path.read_text())
            if r.get("status", "complete") != "complete":
                continue
            dev, m, timing = r["device"], r["metrics"], r.get("timing") or {}
            seconds = (m["wall_time_s"] + (timing.get("startup_s") or 0.0) + (timing.get("final_eval_s") or 0.0))
            index.setdefault((_key(r["config"]), dev["type"]), []).append(
                (float(seconds), dev.get("name", dev["type"]), dev.get("threads"), path.name))
        except Exception:  # noqa: BLE001 -- a file this version cannot read gives no estimate
            continue
    _INDEX = index
    return index


def stored_estimate(cfg, device_type: str = "cpu") -> Estimate | None:
    """The median wall time (start-up, training, evaluations) of the stored complete runs of
    ``cfg``'s configuration, any seed, on ``device_type`` (``"cpu"`` or ``"cuda"``); ``None`` if
    there is none."""
    try:
        runs = _index().get((_key(cfg), device_type), [])
    except Exception:  # noqa: BLE001 -- a config this version cannot key
        return None
    if not runs:
        return None
    seconds = statistics.median(r[0] for r in runs)
    names = sorted({r[1] for r in runs})
    threads = sorted({r[2] for r in runs if r[2]})
    device = "CPU" if device_type == "cpu" else names[0]
    on = f"{', '.join(map(str, threads))} thread{'s' * (threads != [1])} of {_article(names[0])}" \
        if device_type == "cpu" and threads else names[0]
    return Estimate(seconds, device, f"median of {len(runs)} stored run{'s' * (len(runs) > 1)} on {on}")


# ------------------------------------------------------------------------------ a measured step
def evaluation_examples(task, cfg, micro: int) -> tuple[int, int]:
    """``(examples one periodic evaluation reads, number of evaluations)`` for ``cfg`` on ``task``."""
    tc = cfg.train
    per_eval = 0
    for split in task.eval_splits:
        if task.kind == "language_modelling":  # eval_batches random windows of every split
            per_eval += tc.eval_batches * micro
        elif split == "train":                  # a fixed subset of the training split
            per_eval += min(len(task.splits[split]), tc.eval_batches * micro)
        else:                                   # the whole split
            per_eval += len(task.splits[split])
    evaluations = tc.max_steps // tc.eval_interval + 1 + (tc.max_steps % tc.eval_interval != 0)
    return per_eval, evaluations


def _update_seconds(model: nn.Module, task, tc) -> float:
    """The measured time of what a step does besides the forward and backward passes: drawing the
    batch, the gradient norm and clipping, and an AdamW update, on copies of the parameters (the
    model and its gradients are not touched); the best of three after an untimed one."""
    params = [p.detach().clone().requires_grad_(True) for p in model.parameters() if p.requires_grad]
    if not params:
        return 0.0
    for q in params:
        q.grad = torch.full_like(q, 1e-3)
    opt = torch.optim.AdamW(params, lr=1e-3)
    best = math.inf
    for i in range(4):
        t0 = time.perf_counter()
        task.train.micro_batch(i, tc.batch_size, 0, max(1, tc.batch_size // tc.grad_accum))
        norm = nn.utils.get_total_norm([q.grad for q in params])
        nn.utils.clip_grads_with_norm_(params, 1.0, norm)
        opt.step()
        bool(torch.stack([torch.isfinite(q).all() for q in params]).all())  # the trainer's finite check
        if i:
            best = min(best, time.perf_counter() - t0)
    return best


def measured_estimate(model: nn.Module, task, cfg, device: torch.device, budget_s: float = 1.0) -> Estimate:
    """Time forward and backward passes of ``model`` on training examples on ``device`` and scale
    them to ``cfg``'s run (see the module docstring): one example first, then twice as many while a
    pass takes less than ``budget_s / 4`` and stays within the run's micro-batch (the best of three
    passes counts, after an untimed one; fixed costs per pass then weigh little). The model's
    parameters, gradients, mode and the random-number generators are left as they were."""
    from cemlib.train.config import micro_batch_size
    tc = cfg.train
    micro = micro_batch_size(tc, 1)
    was_training = model.training
    grads = {p: p.grad for p in model.parameters()}
    model.to(device)

    def best_of(m: int, times: int) -> float:
        batch = tuple(t.to(device) for t in task.train.micro_batch(0, tc.batch_size, 0, m))
        best = math.inf
        for _ in range(times):
            for p in model.parameters():
                p.grad = None
            t0 = time.perf_counter()
            task.loss(model, batch).backward()
            if device.type == "cuda":
                torch.cuda.synchronize(device)
            best = min(best, time.perf_counter() - t0)
        return best

    with torch.random.fork_rng(devices=[]):
        model.eval()  # no dropout, no running statistics: the weights stay as built
        try:
            m = 1
            best_of(m, 1)  # untimed: first-call costs
            t = best_of(m, 3)
            while t < budget_s / 4 and 2 * m <= micro:
                m *= 2
                t = best_of(m, 3)
        finally:
            for p, g in grads.items():
                p.grad = g
            model.train(was_training)
    update = _update_seconds(model, task, tc)
    per_example = t / m
    per_eval, evaluations = evaluation_examples(task, cfg, micro)
    train_s = (per_example * tc.batch_size + update) * tc.max_steps
    eval_each = per_example / 3 * per_eval
    n = torch.get_num_threads()
    threads = f" ({n} thread{'s' * (n != 1)})" if device.type == "cpu" else ""
    basis = (f"measured here{threads}: a forward and backward pass of {m} example{'s' * (m > 1)} took "
             f"{t:.2g} s, an optimiser update {update:.2g} s; x {tc.batch_size} examples and 1 update x "
             f"{tc.max_steps} steps, and {evaluations} "
             f"evaluations of {per_eval:,} examples; start-up not included")
    dev = "CPU" if device.type == "cpu" else (torch.cuda.get_device_name(device) if device.type == "cuda"
                                               else device.type.upper())
    return Estimate(train_s + eval_each * evaluations, dev, basis, first_eval_s=eval_each)
