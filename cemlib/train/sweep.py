"""Sweeps: learning rates with the optimum located by Akima interpolation (CEM Fig. 3a / Fig. 5),
and grids of experiments x overrides x seeds with a mean ± std summary (:func:`grid_sweep`).

The CEM paper sweeps five learning rates from 5e-4 to 8e-3 ("doubling at each step" [ICLR]) and
marks the optimum of an Akima (1970) interpolant of test perplexity ([arXiv] §4.3, Fig. 3a, Fig. 5).
It does not say in which coordinate it interpolates; we interpolate in ``log2(lr)``, where the
grid is uniform, with SciPy's :class:`~scipy.interpolate.Akima1DInterpolator`, and minimise on a
fine grid that includes the measured points. Diverged runs (NaN/Inf loss) are reported and left
out of the interpolation.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Callable

import numpy as np
from scipy.interpolate import Akima1DInterpolator

__all__ = ["CEM_LR_GRID", "SweepResult", "akima_optimum", "lr_sweep", "sweep_experiment", "plot_sweep",
           "grid_runs", "grid_sweep", "run_name", "summarize_runs", "summary_markdown", "load_sweep",
           "PairedDifference", "paired_difference"]

CEM_LR_GRID = (5e-4, 1e-3, 2e-3, 4e-3, 8e-3)


@dataclass
class SweepResult:
    """Learning rates, their losses, the interpolated optimum, and the dense interpolant."""

    lrs: list[float]
    losses: list[float]
    best_lr: float
    best_loss: float
    excluded: list[float] = field(default_factory=list)
    curve_lrs: list[float] = field(default_factory=list)
    curve_losses: list[float] = field(default_factory=list)


def akima_optimum(lrs, losses, n_dense: int = 2001) -> SweepResult:
    """Minimum of the Akima interpolant of ``losses`` over ``log2(lrs)``.

    Needs at least three finite points with strictly increasing, positive learning rates. The
    optimum lies within the swept range; if it sits on an end point, widen the sweep.
    """
    lrs = [float(v) for v in lrs]
    losses = [float(v) for v in losses]
    if len(lrs) != len(losses):
        raise ValueError(f"got {len(lrs)} learning rates but {len(losses)} losses")
    if any(v <= 0 or not math.isfinite(v) for v in lrs):
        raise ValueError(f"learning rates must be positive and finite, got {lrs}")
    if any(b <= a for a, b in zip(lrs, lrs[1:])):
        raise ValueError(f"learning rates must be strictly increasing, got {lrs}")
    keep = [i for i, v in enumerate(losses) if math.isfinite(v)]
    excluded = [lrs[i] for i in range(len(lrs)) if i not in keep]
    if len(keep) < 3:
        raise ValueError(f"need at least 3 finite losses for Akima interpolation, got {len(keep)} "
                         f"(diverged at lr = {excluded})")
    x = np.log2([lrs[i] for i in keep])
    y = np.array([losses[i] for i in keep])
    interp = Akima1DInterpolator(x, y)
    dense = np.union1d(np.linspace(x[0], x[-1], n_dense), x)  # the measured points included
    yd = interp(dense)
    k = int(np.argmin(yd))
    return SweepResult(lrs=[lrs[i] for i in keep], losses=y.tolist(), best_lr=float(2.0 ** dense[k]),
                       best_loss=float(yd[k]), excluded=excluded, curve_lrs=(2.0 ** dense).tolist(),
                       curve_losses=yd.tolist())


def lr_sweep(train_fn: Callable[[float], float], lrs=CEM_LR_GRID) -> SweepResult:
    """Call ``train_fn(lr) -> final loss`` for each learning rate and interpolate the optimum."""
    return akima_optimum(lrs, [train_fn(float(lr)) for lr in lrs])


def sweep_experiment(experiment: str, preset: str = "cpu", lrs=CEM_LR_GRID, overrides=(),
                     metric: str = "final_val_loss") -> SweepResult:
    """Train ``experiment``/``preset`` once per learning rate and interpolate the optimum of
    ``metric``; a run stopped by NaN/Inf counts as diverged (left out, listed in ``excluded``)."""
    from cemlib.train.experiments import run_experiment
    from cemlib.train.trainer import NonFiniteError

    def train_fn(lr: float) -> float:
        try:
            res = run_experiment(experiment, preset, [*overrides, f"optim.lr={lr!r}"], verbose=False)
        except NonFiniteError:
            return float("nan")
        return res["metrics"][metric]
    return lr_sweep(train_fn, lrs)


def plot_sweep(result: SweepResult, ax=None, label: str | None = None, color=None):
    """Measured losses (dots), the Akima interpolant (line) and the optimum (star); returns axes."""
    import matplotlib.pyplot as plt
    if ax is None:
        _, ax = plt.subplots(figsize=(5, 3.5))
    line, = ax.plot(result.curve_lrs, result.curve_losses, color=color, label=label)
    ax.plot(result.lrs, result.losses, "o", color=line.get_color())
    ax.plot([result.best_lr], [result.best_loss], "*", ms=14, color=line.get_color(),
            markeredgecolor="black")
    ax.set_xscale("log", base=2)
    ax.set_xlabel("peak learning rate")
    ax.set_ylabel("final loss (nats / token)")
    if label:
        ax.legend(fontsize="small")
    return ax


# ------------------------------------------------------------------------------ grids with seeds
def grid_runs(experiments, grid: dict | None = None, seeds=(0,)) -> list[tuple[str, list[str], int]]:
    """Every ``(experiment, overrides, seed)`` of ``experiments x product(grid) x seeds``.

    ``grid`` maps an override key to its values, e.g. ``{"task.kernel": ["rbf", "matern"]}``.
    """
    import itertools
    grid = dict(grid or {})
    keys = list(grid)
    combos = list(itertools.product(*(grid[k] for k in keys))) if keys else [()]
    return [(e, [f"{k}={v}" for k, v in zip(keys, combo)], int(s))
            for e in experiments for combo in combos for s in seeds]


def run_name(experiment: str, overrides, seed: int) -> str:
    """File-name stem of one grid run: ``gp_cem_t2__task.kernel-matern__seed1``."""
    parts = [experiment.replace("-", "_")]
    parts += [o.replace("=", "-").replace("/", "_") for o in overrides]
    return "__".join(parts + [f"seed{seed}"])


def _mean_std(values: list[float]) -> tuple[float, float]:
    v = np.asarray(values, dtype=float)
    return float(v.mean()), float(v.std(ddof=1)) if len(v) > 1 else 0.0


def summarize_runs(results: list[dict], metrics=None) -> list[dict]:
    """Group results by ``(experiment, overrides without the seed)``; mean and sample std over seeds
    of every ``metrics["final"]`` entry (or of ``metrics`` if given), plus parameters and seeds."""
    groups: dict[tuple, list[dict]] = {}
    for r in results:
        key = (r["experiment"], r["preset"], tuple(r.get("sweep", {}).get("overrides", [])))
        groups.setdefault(key, []).append(r)
    rows = []
    for (exp, preset, overrides), rs in groups.items():
        names = metrics or sorted(rs[0]["metrics"]["final"])
        row = {"experiment": exp, "preset": preset, "overrides": list(overrides),
               "seeds": [r["config"]["train"]["seed"] for r in rs], "num_parameters": rs[0]["num_parameters"],
               "device": rs[0]["device"]["label"], "wall_time_s": _mean_std([r["metrics"]["wall_time_s"] for r in rs])[0]}
        for m in names:
            row[m] = _mean_std([r["metrics"]["final"][m] for r in rs])
        rows.append(row)
    return rows


def summary_markdown(rows: list[dict], metrics) -> str:
    """A Markdown table: experiment, overrides, params, seeds, ``mean ± std`` per metric."""
    head = ["experiment", "overrides", "params", "seeds", *metrics]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in rows:
        cells = [r["experiment"], " ".join(r["overrides"]) or "-", f"{r['num_parameters']:,}",
                 str(len(r["seeds"]))]
        cells += [f"{r[m][0]:.4g} ± {r[m][1]:.2g}" for m in metrics]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def grid_sweep(experiments, preset: str = "cpu", grid: dict | None = None, seeds=(0,), out_dir=None,
               overrides=(), metrics=None, verbose: bool = False, skip_existing: bool = True) -> list[dict]:
    """Run ``experiments x grid x seeds`` (``train.seed`` = each seed; ``overrides`` apply to all);
    with ``out_dir``, write ``<run_name>.json`` per run (already present files are loaded, not
    rerun, when ``skip_existing``) and ``summary.json`` / ``summary.md`` (mean ± std over seeds).
    Returns the summary rows (:func:`summarize_runs`)."""
    import json
    from pathlib import Path

    from cemlib.train.experiments import run_experiment
    from cemlib.train.results import load_results, save_results
    out = Path(out_dir) if out_dir is not None else None
    results = []
    for exp, ovr, seed in grid_runs(experiments, grid, seeds):
        path = out / f"{run_name(exp, ovr, seed)}.json" if out is not None else None
        if path is not None and skip_existing and path.is_file():
            results.append(load_results(path))
            continue
        res = run_experiment(exp, preset, [*overrides, *ovr, f"train.seed={seed}"], verbose=verbose)
        res["sweep"] = {"overrides": list(ovr), "seed": seed}
        if path is not None:
            path.parent.mkdir(parents=True, exist_ok=True)
            save_results(path, res)
        results.append(res)
    rows = summarize_runs(results, metrics)
    if out is not None:
        names = metrics or sorted(results[0]["metrics"]["final"])
        (out / "summary.json").write_text(json.dumps(rows, indent=1))
        (out / "summary.md").write_text(summary_markdown(rows, names))
    return rows


def load_sweep(folder) -> dict[str, list[dict]]:
    """``{model key: [results of seed 0, 1, ...]}`` from a folder of stored runs (``summary.json``
    skipped); the model key is the last ``-``-separated part of the experiment's name (chapter 10's
    ``bench-listops-cem`` -> ``cem``), the runs ordered by ``train.seed``."""
    from pathlib import Path

    from cemlib.train.results import load_results
    folder = Path(folder)
    files = sorted(p for p in folder.glob("*.json") if p.name != "summary.json")
    if not files:
        raise FileNotFoundError(f"no results files in {folder}")
    out: dict[str, list[dict]] = {}
    for p in files:
        res = load_results(p)
        out.setdefault(res["experiment"].rsplit("-", 1)[-1], []).append(res)
    for runs in out.values():
        runs.sort(key=lambda r: r["config"]["train"]["seed"])
    return out


# paired_difference lives with the book's verdict rule (cemlib.train.verdict); re-exported here
from cemlib.train.verdict import PairedDifference, paired_difference  # noqa: E402
