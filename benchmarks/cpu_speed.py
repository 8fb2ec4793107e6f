"""CPU training speed of the book's Shakespeare models against a nanoGPT-layout GPT, as ratios.

Every chapter and every CI run trains these models on a CPU, so their CPU speed matters. This script
builds each model exactly as the trainer does (``cemlib.train.experiments.get_config`` / ``build``,
cpu preset, same width, depth, heads, context and batch) and times one full training step: forward,
the task's loss, backward, gradient clipping and the AdamW update, on the task's first training
batch (the time does not depend on the data).

``--suite bench-shakespeare`` / ``--suite bench-listops`` time the parameter-matched models of the
chapter 10 benchmark instead (the ``bench-*`` experiments, every model of the task), with the
ratios to that benchmark's Llama and GPT.

Timing is *interleaved*: each round times every model for ``--steps`` steps in turn (the order
rotates every round), so a slow phase of a shared machine hits all models alike. Reported per model:
the median step time over rounds (each round's value is the median of its steps), tokens/s
(tokens per step over that median), and
the median over rounds of the per-round ratio of its tokens/s to the Llama baseline's (and to the
GPT's). Also recorded, because they do not depend on the machine's load: the bytes of activations
saved for the backward pass per step (``cemlib.models.memory.saved_activation_bytes`` of the
loss), the parameter count and the forward FLOPs per token of matrix products as PyTorch counts
them (``cemlib.kernels.costs.count_flops`` of one forward and loss: every matmul, einsum
and attention product, whatever the model's weight sharing; elementwise work is not counted).

The goals (issue "the model code's speed on CPU"): Llama >= 1.0x the GPT's tokens/s; full CEM with
T = 1 >= 0.9x Llama; T = 2 >= 0.55x Llama. The JSON records each ratio next to its goal::

    python benchmarks/cpu_speed.py --replace            # -> benchmarks/results/cpu_speed.json
    python benchmarks/cpu_speed.py --rounds 3 --steps 3 --out quick.json
    python benchmarks/cpu_speed.py --suite bench-listops # -> benchmarks/results/cpu_speed_bench_listops-<time>.json

Without ``--replace`` or ``--out`` a stored results file is never overwritten: the run goes to a new
file beside it (``benchmarks/outputs.py``), and the script says where.
"""

from __future__ import annotations

import argparse
import shlex
import statistics
import sys
import time

import torch

from cemlib.models.memory import saved_activation_bytes
from cemlib.train.presets.bench import (MODELS as BENCH_MODELS, WIDTHS as BENCH_WIDTHS,
                                        bench_experiment)
from cemlib.train.registry import build, get_config
from cemlib.kernels.costs import count_flops
from cemlib.train.optim import make_optimizer
from cemlib.train.results import environment_info, git_commit
from outputs import RESULTS, add_output_arguments, announce, write_json

#: (label, experiment, overrides). The GPT is nanoGPT's layout at the Llama's size: fused QKV
#: projection, LayerNorm with bias, GELU MLP of width 4d, learned positions.
NANOGPT = ("gpt (nanoGPT layout)", "shakespeare-gpt",
           ("model.d_model=128", "model.n_heads=4", "model.n_layers=2", "model.act=gelu"))
VARIANTS = {
    "gpt": NANOGPT,
    "llama": ("Llama", "shakespeare-llama", ()),
    "cem": ("full CEM, T = 1", "shakespeare-cem", ()),
    "cem-t2": ("full CEM, T = 2", "shakespeare-cem-t2", ()),
    "cem-t3": ("full CEM, T = 3", "shakespeare-cem-t3", ()),
    "cem-attn": ("CEM attention + SwiGLU", "shakespeare-cem-attn", ()),
    "cem-mlp": ("Llama attention + CEM MLP", "shakespeare-cem-mlp", ()),
    "cem-mlp-pm": ("Llama attention + CEM MLP, param.-matched", "shakespeare-cem-mlp-pm", ()),
    "cem-attn-t2": ("CEM attention T = 2 + SwiGLU", "shakespeare-cem-attn-t2", ()),
    "cem-attn-diag-none": ("CEM attention, no diagonal", "shakespeare-cem-attn-diag-none", ()),
    "cem-attn-diag-head": ("CEM attention, per-head diagonal", "shakespeare-cem-attn-diag-head", ()),
    "cem-mlp-t2": ("Llama attention + CEM MLP T = 2", "shakespeare-cem-mlp-t2", ()),
    "cem-precond-diag": ("full CEM, T = 2, diagonal P", "shakespeare-cem-precond-diag", ()),
    "cem-precond-dplr": ("full CEM, T = 2, DPLR P", "shakespeare-cem-precond-dplr", ()),
    "cem-reuse2": ("full CEM, layer reuse x2", "shakespeare-cem-reuse2", ()),
    "llama-reuse2": ("Llama, layer reuse x2", "shakespeare-llama-reuse2", ()),
}
DEFAULT = ("gpt", "llama", "cem", "cem-t2")
GOALS = {("llama", "gpt"): 1.0, ("cem", "llama"): 0.9, ("cem-t2", "llama"): 0.55}


def _bench_variants(task: str) -> dict:
    """The chapter 10 benchmark's models of ``task``, keyed by model name."""
    return {m: (BENCH_MODELS[m][0], bench_experiment(task, m), ()) for m in BENCH_WIDTHS[task]}


#: suite -> (its variants, the default selection, the goals checked)
SUITES = {"shakespeare": (VARIANTS, DEFAULT, GOALS),
          **{f"bench-{t}": (_bench_variants(t), tuple(BENCH_WIDTHS[t]), {}) for t in BENCH_WIDTHS}}


class _Case:
    """One model ready to step: built as the trainer builds it, with its optimizer and batch."""

    def __init__(self, key: str, variant: tuple):
        self.key = key
        self.label, self.experiment, self.overrides = variant
        self.cfg = get_config(self.experiment, "cpu", list(self.overrides))
        self.model, self.task = build(self.cfg)
        self.model.train()
        self.opt = make_optimizer(self.model, self.cfg.optim)
        B = self.cfg.train.batch_size
        self.batch = self.task.train.batch(0, B)
        self.tokens = B * self.task.tokens_per_example
        self.times: list[float] = []

    def loss(self) -> torch.Tensor:
        return self.task.loss(self.model, self.batch)

    def step(self) -> None:
        self.loss().backward()
        torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.cfg.optim.grad_clip)
        self.opt.step()
        self.opt.zero_grad(set_to_none=True)


def run(keys, rounds: int, steps: int, warmup: int, threads: int, suite: str = "shakespeare") -> dict:
    variants, _, goals_of_suite = SUITES[suite]
    torch.set_num_threads(threads)
    cases = [_Case(k, variants[k]) for k in keys]
    for c in cases:
        for _ in range(warmup):
            c.step()
    for r in range(rounds):
        order = cases[r % len(cases):] + cases[:r % len(cases)]
        for c in order:
            ts = []
            for _ in range(steps):
                t0 = time.perf_counter()
                c.step()
                ts.append(time.perf_counter() - t0)
            c.times.append(statistics.median(ts))
    by = {c.key: c for c in cases}
    rows = []
    for c in cases:
        tps = [c.tokens / t for t in c.times]
        row = {"key": c.key, "variant": c.label, "experiment": c.experiment,
               "overrides": list(c.overrides), "params": sum(p.numel() for p in c.model.parameters()),
               "batch": c.cfg.train.batch_size, "tokens_per_step": c.tokens,
               "model": dict(c.cfg.model), "median_step_s": statistics.median(c.times),
               "step_s_per_round": c.times, "tokens_per_s": c.tokens / statistics.median(c.times),
               "saved_activation_bytes": saved_activation_bytes(c.loss, exclude=list(c.model.parameters())),
               "forward_flops_per_token": count_flops(c.loss) / c.tokens}
        for ref in ("llama", "gpt"):
            if ref in by:
                ratios = [a / b for a, b in zip(tps, (by[ref].tokens / t for t in by[ref].times))]
                row[f"ratio_to_{ref}"] = statistics.median(ratios)
        rows.append(row)
    goals = []
    for (k, ref), goal in goals_of_suite.items():
        if k in by and ref in by:
            ratio = next(r[f"ratio_to_{ref}"] for r in rows if r["key"] == k)
            goals.append({"variant": k, "reference": ref, "goal": goal, "ratio": ratio,
                          "met": ratio >= goal})
    return {"rows": rows, "goals": goals}


def _without_out(args: list[str]) -> list[str]:
    """The arguments without ``--out PATH`` and ``--replace`` (where the file went is not part of
    the measurement, and may be a path of the machine)."""
    out, skip = [], False
    for a in args:
        if skip:
            skip = False
        elif a == "--out":
            skip = True
        elif not a.startswith("--out=") and a != "--replace":
            out.append(a)
    return out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--suite", default="shakespeare", choices=sorted(SUITES),
                   help="the book's Shakespeare variants (default) or a chapter 10 benchmark task")
    p.add_argument("--variants", nargs="+", default=None,
                   help=f"models of the suite to time (default for shakespeare: {' '.join(DEFAULT)}; "
                        "for a benchmark suite: all of its models)")
    p.add_argument("--all", action="store_true", help="time every variant (the book's chapter 5 table)")
    p.add_argument("--rounds", type=int, default=11, help="interleaved rounds (default 11)")
    p.add_argument("--steps", type=int, default=5, help="timed steps per model and round (default 5)")
    p.add_argument("--warmup", type=int, default=3, help="untimed steps per model first (default 3)")
    p.add_argument("--threads", type=int, default=1,
                   help="torch intra-op threads (default 1, as the book's chapters)")
    add_output_arguments(p, "benchmarks/results/cpu_speed.json, or cpu_speed_<suite>.json for a "
                            "benchmark suite")
    a = p.parse_args(argv)
    variants, default, _ = SUITES[a.suite]
    keys = list(variants) if a.all else list(a.variants or default)
    unknown = [k for k in keys if k not in variants]
    if unknown:
        p.error(f"unknown variant(s) {', '.join(unknown)} for suite {a.suite}; choose from "
                f"{', '.join(variants)}")
    if "llama" not in keys:
        keys = ["llama"] + keys
    default = RESULTS / ("cpu_speed" + ("" if a.suite == "shakespeare" else "_" + a.suite.replace("-", "_"))
                         + ".json")
    announce(default, a.out, a.replace)
    t0 = time.time()
    res = run(keys, a.rounds, a.steps, a.warmup, a.threads, a.suite)
    device, versions = environment_info(torch.device("cpu"))
    out = {"schema": "cemlib.benchmarks.cpu_speed/1", "device": device, "versions": versions,
           "suite": a.suite, "threads": a.threads, "git_commit": git_commit(), "dtype": "float32",
           "rounds": a.rounds, "steps_per_round": a.steps, "warmup": a.warmup,
           "command": "python benchmarks/cpu_speed.py " + shlex.join(_without_out(sys.argv[1:] if argv is None else argv)),
           "wall_time_s": time.time() - t0, **res}
    write_json(out, default, a.out, a.replace)
    for r in res["rows"]:
        print(f"{r['variant'][:45]:45s} {r['tokens_per_s']:9.0f} tok/s  x{r['ratio_to_llama']:.3f} Llama"
              + (f"  x{r['ratio_to_gpt']:.3f} GPT" if "ratio_to_gpt" in r else "")
              + f"  saved {r['saved_activation_bytes'] / 2**20:6.1f} MiB")
    for g in res["goals"]:
        print(f"goal {g['variant']} / {g['reference']} >= {g['goal']}: {g['ratio']:.3f} "
              f"({'met' if g['met'] else 'NOT met'})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
