"""Figures of chapter 10's benchmark: learning curves of a stored sweep, cost against quality, the
energy of each trained model along its depth, and a live explorer of the curves.

A *sweep* is what :func:`cemlib.train.results.load_runs` (``by="model"``) reads from a folder of stored results files (one per model and
seed, as ``python -m cemlib.train ... --seeds 0,1,2 --out FOLDER`` writes them): a dict from the
model's key (``"cem"``, ``"nrgpt"``, ...: the last part of the experiment's name) to its runs,
ordered by seed. The explorer (:func:`bench_explorer`) needs a running kernel; its static companion
is :func:`bench_small_multiples`, which needs none. The explorer's plot is rendered to PNG bytes in
an ``ipywidgets.Image``, so the notebook cell emits only a short deterministic ``repr``.
"""

from __future__ import annotations

import functools
import numpy as np

from cemlib.viz.style import render_png

__all__ = ["MODEL_LABELS", "MODEL_COLORS", "METRIC_LABELS", "sweep_curves",
           "plot_sweep_curves", "bench_small_multiples", "plot_energy_depth", "render_bench_png",
           "bench_explorer"]

#: display names and fixed colours of the benchmark's models (the same in every figure)
MODEL_LABELS = {"cem": "CEM", "nrgpt": "NRGPT", "newton": "Newton (MHA2nd1st)", "hyperset": "Hyper-SET",
                "llama": "Llama", "gpt": "GPT", "rgpt": "recurrent GPT"}
MODEL_COLORS = {"cem": "C0", "nrgpt": "C1", "newton": "C2", "hyperset": "C3", "llama": "C7", "gpt": "C5",
                "rgpt": "C6"}
METRIC_LABELS = {"val_loss": "validation loss (nats / token)", "train_loss": "training loss (nats / token)",
                 "val_accuracy": "validation accuracy", "test_accuracy": "test accuracy",
                 "test_loss": "test loss (nats / answer)"}
X_AXES = {"step": "training step", "tokens": "training tokens"}


def _tokens_per_step(res: dict) -> float:
    return res["metrics"]["tokens"] / res["metrics"]["steps"]


def sweep_curves(runs: list[dict], metric: str, x: str = "step") -> tuple[np.ndarray, np.ndarray]:
    """``(x values (P,), metric (S, P))`` of the periodic evaluations of ``S`` runs of one model
    (which must share their evaluation steps)."""
    if x not in X_AXES:
        raise ValueError(f"x must be one of {tuple(X_AXES)}, got {x!r}")
    if not runs:
        raise ValueError("no runs")
    steps = [[e["step"] for e in r["curves"]["eval"]] for r in runs]
    if any(s != steps[0] for s in steps):
        raise ValueError("the runs were evaluated at different steps")
    missing = [r["experiment"] for r in runs if metric not in r["curves"]["eval"][0]]
    if missing:
        raise KeyError(f"metric {metric!r} is not in the curves of {missing[0]}")
    xs = np.asarray(steps[0], dtype=float) * (_tokens_per_step(runs[0]) if x == "tokens" else 1.0)
    return xs, np.array([[e[metric] for e in r["curves"]["eval"]] for r in runs], dtype=float)


def plot_sweep_curves(ax, sweep: dict, metric: str, models=None, x: str = "step", seeds: str = "band",
                      legend: bool = True):
    """One model per colour: the mean over seeds and, with ``seeds="band"``, the band from the
    lowest to the highest seed (``"all"``: every seed as a thin line; ``"mean"``: the mean only)."""
    if seeds not in ("band", "all", "mean"):
        raise ValueError(f"seeds must be 'band', 'all' or 'mean', got {seeds!r}")
    for m in (models or list(sweep)):
        xs, Y = sweep_curves(sweep[m], metric, x)
        color = MODEL_COLORS.get(m)
        ax.plot(xs, Y.mean(0), color=color, lw=1.8, label=f"{MODEL_LABELS.get(m, m)} ({len(Y)} seeds)")
        if seeds == "band" and len(Y) > 1:
            ax.fill_between(xs, Y.min(0), Y.max(0), color=color, alpha=0.2, lw=0)
        elif seeds == "all":
            for y in Y:
                ax.plot(xs, y, color=color, lw=0.7, alpha=0.6)
    ax.set_xlabel(X_AXES[x])
    ax.set_ylabel(METRIC_LABELS.get(metric, metric))
    if legend:
        ax.legend(fontsize="small")
    return ax


def _zoom_limits(sweep: dict, metric: str, models, x: str, zoom_from: float):
    """``(xlim, ylim)`` showing every seed of ``models`` from ``zoom_from`` of the training on."""
    xs, _ = sweep_curves(sweep[models[0]], metric, x)
    keep = xs >= zoom_from * xs[-1]
    vals = np.concatenate([sweep_curves(sweep[m], metric, x)[1][:, keep].ravel() for m in models])
    pad = 0.05 * (vals.max() - vals.min() + 1e-12)
    return (zoom_from * xs[-1], xs[-1]), (vals.min() - pad, vals.max() + pad)


def bench_small_multiples(sweep: dict, metric: str, ncols: int = 3, zoom_from: float = 0.3, x: str = "step"):
    """One panel per model: its seeds in colour, the other models' means in light grey; the x axis
    starts at ``zoom_from`` of the training (the early steps, where every model is far from its
    final value, would flatten the differences that matter)."""
    import matplotlib.pyplot as plt

    models = list(sweep)
    nrows = -(-len(models) // ncols)
    fig, axes = plt.subplots(nrows, ncols, figsize=(3.1 * ncols, 2.5 * nrows), sharex=True, sharey=True,
                             squeeze=False)
    xlim, ylim = _zoom_limits(sweep, metric, models, x, zoom_from)
    for ax, m in zip(axes.flat, models):
        for other in models:
            if other != m:
                xs, Y = sweep_curves(sweep[other], metric, x)
                ax.plot(xs, Y.mean(0), color="0.8", lw=1)
        xs, Y = sweep_curves(sweep[m], metric, x)
        for y in Y:
            ax.plot(xs, y, color=MODEL_COLORS.get(m), lw=1.2)
        ax.set_title(f"{MODEL_LABELS.get(m, m)}: {Y[:, -1].mean():.3f} ± {Y[:, -1].std(ddof=1):.3f}"
                     if len(Y) > 1 else MODEL_LABELS.get(m, m), fontsize="medium")
        ax.set_xlim(*xlim)
    for ax in axes.flat[len(models):]:
        ax.set_visible(False)
    axes[0, 0].set_ylim(*ylim)
    for ax in axes[-1]:
        ax.set_xlabel(X_AXES[x])
    for ax in axes[:, 0]:
        ax.set_ylabel(METRIC_LABELS.get(metric, metric))
    return fig


def plot_energy_depth(ax, row: dict, label: str | None = None, color=None, linestyle="-",
                      offset: float = 0.0, width: float = 0.4, trained_line: bool = True):
    """One model's energy along depth from a row of ``benchmarks/energy_depth.py``'s JSON.

    A weight-shared model (``row["one_energy"]``) descends one energy: it is drawn as its trajectory
    (the mean energy divided by ``|E|`` at the first input), past the trained depth when recorded (a
    dotted line marks the trained depth). A layered model has a different energy at every step, so
    its steps are drawn as bars at steps ``1..S`` (shifted by ``offset``): each step's relative change
    of its own energy, ``(E_after - E_before) / |E_before|`` of the means, negative for descent."""
    if row["one_energy"] and "trajectory_mean" in row:
        E = np.asarray(row["trajectory_mean"])
        E = E / (abs(E[0]) or 1.0)
        ax.plot(np.arange(len(E)), E, color=color, ls=linestyle, marker="o", ms=2.5, label=label)
        if trained_line:
            ax.axvline(row["trained_steps"], color="0.6", ls=":", lw=1)
        return ax
    b, a = np.asarray(row["before_mean"]), np.asarray(row["after_mean"])
    rel = (a - b) / np.where(b == 0, 1.0, np.abs(b))
    ax.bar(np.arange(1, len(b) + 1) + offset, rel, width=width, color=color, label=label)
    return ax


def render_bench_png(sweep: dict, metric: str, models, x: str = "step", seeds: str = "band",
                     zoom_from: float = 0.0, figsize=(5.2, 3.8), dpi: int = 80, layout_key=None) -> bytes:
    """The explorer's drawing: :func:`plot_sweep_curves` from ``zoom_from`` of the training on
    (``layout_key``: see :func:`cemlib.viz.style.render_png`)."""
    def draw(fig):
        ax = fig.subplots()
        plot_sweep_curves(ax, sweep, metric, models, x, seeds)
        xlim, ylim = _zoom_limits(sweep, metric, models, x, zoom_from)
        ax.set_xlim(*xlim)
        if zoom_from > 0:
            ax.set_ylim(*ylim)

    return render_png(draw, figsize, dpi, layout_key)[0]


@functools.lru_cache(maxsize=None)
def _explorer_class():
    import ipywidgets as W

    from cemlib.viz.widgets import finish_explorer

    class BenchExplorer(W.VBox):
        """Task, metric, models, seeds display, x axis and zoom; the learning curves below."""

        def __init__(self, sweeps, metrics, task):
            self.sweeps, self.metrics = sweeps, metrics
            self.layout_key = object()           # this explorer's frozen layout (see render_png)
            st = {"description_width": "initial"}
            self.task = W.Dropdown(options=list(sweeps), value=task, description="task", style=st)
            self.metric = W.Dropdown(options=metrics[task], value=metrics[task][0], description="metric",
                                     style=st)
            self.models = W.SelectMultiple(options=[(MODEL_LABELS.get(m, m), m) for m in sweeps[task]],
                                           value=tuple(sweeps[task]), description="models", rows=6, style=st)
            self.seeds = W.ToggleButtons(options=[("band", "band"), ("every seed", "all"), ("mean", "mean")],
                                         value="band", description="seeds", style=st)
            self.x = W.Dropdown(options=[(v, k) for k, v in X_AXES.items()], value="step",
                                description="x axis", style=st)
            self.zoom = W.FloatSlider(value=0.3, min=0.0, max=0.9, step=0.1, description="start at fraction",
                                      style=st)
            self.task.observe(self._task_changed, names="value")
            finish_explorer(self, [[self.task, self.metric, self.models], [self.seeds, self.x, self.zoom]],
                            legend="line: mean over the seeds · band: lowest to highest seed")

        def _task_changed(self, change):
            t = self.task.value
            with self.hold_trait_notifications():
                self.metric.options = self.metrics[t]
                self.metric.value = self.metrics[t][0]
                self.models.options = [(MODEL_LABELS.get(m, m), m) for m in self.sweeps[t]]
                self.models.value = tuple(self.sweeps[t])

        def _redraw(self, change=None):
            sweep = self.sweeps[self.task.value]
            models = [m for m in self.models.value if m in sweep]
            if not models or self.metric.value not in self.metrics[self.task.value]:
                self.info.value = "choose at least one model"
                return
            self.image.value = render_bench_png(sweep, self.metric.value, models, self.x.value,
                                                self.seeds.value, self.zoom.value,
                                                layout_key=(self.layout_key, self.task.value, self.metric.value,
                                                            self.x.value, self.zoom.value > 0))
            finals = {m: sweep_curves(sweep[m], self.metric.value)[1][:, -1] for m in models}
            self.info.value = "final: " + "; ".join(
                f"{MODEL_LABELS.get(m, m)} {v.mean():.3f} ± {v.std(ddof=1) if len(v) > 1 else 0:.3f}"
                for m, v in finals.items())

        def __repr__(self):
            return (f"BenchExplorer(task={self.task.value!r}, metric={self.metric.value!r}, "
                    f"models={len(self.models.value)}, seeds={self.seeds.value!r})")

    return BenchExplorer


def bench_explorer(sweeps: dict, metrics: dict, task: str | None = None):
    """The live explorer of stored sweeps (ipywidgets; needs a running kernel: Jupyter or Colab).

    ``sweeps``: ``{task name: sweep}``; ``metrics``: ``{task name: [metric names]}`` (the first is
    shown first)."""
    if not sweeps or set(sweeps) != set(metrics):
        raise ValueError("sweeps and metrics must name the same, non-empty set of tasks")
    task = next(iter(sweeps)) if task is None else task
    if task not in sweeps:
        raise ValueError(f"task must be one of {tuple(sweeps)}, got {task!r}")
    return _explorer_class()(sweeps, {t: list(m) for t, m in metrics.items()}, task)
