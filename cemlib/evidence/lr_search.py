"""Learning-rate search: the optimum of a sweep located by Akima interpolation (CEM Fig. 3a / Fig. 5).

The CEM paper sweeps five learning rates from 5e-4 to 8e-3 ("doubling at each step" [ICLR]) and
marks the optimum of an Akima (1970) interpolant of test perplexity ([arXiv] §4.3, Fig. 3a, Fig. 5).
It does not say in which coordinate it interpolates; we interpolate in ``log2(lr)``, where the
grid is uniform, with SciPy's :class:`~scipy.interpolate.Akima1DInterpolator`, and minimise on a
fine grid that includes the measured points. Diverged runs (NaN/Inf loss) are reported and left
out of the interpolation. :func:`per_seed_optimum` gives each seed's optimum of a stored sweep.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Callable

import numpy as np
from scipy.interpolate import Akima1DInterpolator

from cemlib.train import NonFiniteError, run_experiment

__all__ = ["CEM_LR_GRID", "SweepResult", "akima_optimum", "lr_sweep", "sweep_experiment", "plot_sweep",
           "per_seed_optimum"]

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


def per_seed_optimum(losses: Mapping) -> dict[int, tuple[float, float]]:
    """Per seed, the Akima optimum ``(learning rate, loss)`` of a learning-rate sweep: ``losses`` maps
    learning rate -> {seed: loss}; a seed needs at least three learning rates. An optimum at an end of
    the swept range is the end point itself (the sweep does not bracket it): check with the range."""
    seeds = sorted({int(s) for v in losses.values() for s in v})
    out = {}
    for s in seeds:
        pts = sorted((float(lr), float(v[s])) for lr, v in losses.items() if s in v)
        if len(pts) < 3:
            raise ValueError(f"seed {s} has {len(pts)} learning rates; the Akima optimum needs 3")
        r = akima_optimum([p[0] for p in pts], [p[1] for p in pts])
        out[s] = (r.best_lr, r.best_loss)
    return out
