"""Figures of the CEM Transformer chapter: stored language-model runs of several seeds, drawn as the
CEM paper draws its ablations (Figs. 2-4), its training curves and its learning-rate sweep (Fig. 3a).

Every function takes plain data (per-seed final losses, mean curves, per-learning-rate means) and
returns a :class:`matplotlib.figure.Figure`; reading the runs is the caller's (``eval_curve`` reads
one model's stored runs). Legends are typeset labels given by the caller, axes carry units.

- :func:`eval_curve`: the mean and standard deviation over seeds of a periodic-evaluation curve;
- :func:`ablation_figure`: one panel per comparison, each model's seeds (crosses), their mean and
  standard deviation, and the baseline's mean as a dashed line;
- :func:`curves_figure`: mean curves with one-standard-deviation bands, and an enlarged view of
  the end of training;
- :func:`lr_sweep_figure`: mean loss per learning rate, and an interpolant over ``log2(lr)`` with
  its minimum where the caller gives one (:func:`cemlib.evidence.lr_search.akima_optimum`);
- :func:`compute_figure`: small multiples of loss against training compute, one panel per
  comparison, the baseline dashed in each (the static companion of the chapter's live explorer);
- :func:`interval_figure`: panels of mean values with their intervals against a setting (the
  loss of trained models run at other recursion steps or step sizes), the trained setting starred.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np

__all__ = ["eval_curve", "ablation_figure", "curves_figure", "lr_sweep_figure", "compute_figure",
           "interval_figure"]


def _plt():
    import matplotlib.pyplot as plt
    return plt


def _check_keys(keys, labels: Mapping, what: str) -> None:
    missing = [k for k in keys if k not in labels]
    if missing:
        raise ValueError(f"{what} without a label: {missing}")


def eval_curve(runs: Sequence[dict], key: str = "val_loss"):
    """``(steps, mean, std)`` of the periodic evaluation ``key`` over ``runs`` (a model's results,
    one per seed, evaluated at the same steps); ``std`` is the sample standard deviation (zero for
    one run)."""
    if not runs:
        raise ValueError("eval_curve needs at least one run")
    steps = [e["step"] for e in runs[0]["curves"]["eval"]]
    for r in runs[1:]:
        if [e["step"] for e in r["curves"]["eval"]] != steps:
            raise ValueError("the runs were evaluated at different steps")
    ys = np.array([[e[key] for e in r["curves"]["eval"]] for r in runs], dtype=float)
    std = ys.std(0, ddof=1) if len(runs) > 1 else np.zeros(ys.shape[1])
    return np.array(steps), ys.mean(0), std


def ablation_figure(values: Mapping, groups: Sequence, labels: Mapping, baseline: str,
                    xlabel: str = "final validation loss (nats per character)", xlim=None,
                    width: float = 6.4):
    """One panel per ``(title, [model, ...])`` of ``groups``: each model's per-seed values
    (``values[model]``: a sequence of floats) as crosses, their mean with one standard deviation,
    and the mean of ``baseline`` as a dashed vertical line. Models whose key starts with
    ``baseline`` (its own family, e.g. the baseline with reuse) are drawn in the baseline's colour;
    ``labels`` maps every model (and the baseline) to its tick or legend text."""
    plt = _plt()
    keys = [baseline] + [k for _, ks in groups for k in ks]
    _check_keys(keys, labels, "models")
    _check_keys(keys, values, "models")
    base = float(np.mean(values[baseline]))
    fig, axes = plt.subplots(len(groups), 1, figsize=(width, 0.9 + 0.42 * sum(len(g) + 0.6 for _, g in groups)),
                             sharex=True, squeeze=False,
                             gridspec_kw={"height_ratios": [len(g) + 0.6 for _, g in groups]})
    axes = axes[:, 0]
    for ax, (title, models) in zip(axes, groups):
        ys = np.arange(len(models))[::-1]
        for y, m in zip(ys, models):
            v = np.asarray(values[m], dtype=float)
            color = "C1" if m.startswith(baseline) else "C0"
            sd = v.std(ddof=1) if len(v) > 1 else 0.0
            ax.errorbar(v.mean(), y, xerr=sd, fmt="o", ms=8, color=color, capsize=4,
                        label="mean ± std" if y == ys[0] else None)
            ax.plot(v, [y] * len(v), "x", color="k", ms=5, label="seeds" if y == ys[0] else None)
        ax.axvline(base, color="C1", ls="--", lw=1.2, label=labels[baseline])
        ax.set_ylim(-0.6, len(models) - 0.4)
        ax.set_yticks(ys, [labels[m] for m in models])
        ax.set_title(title, fontsize=10, loc="left")
        if xlim is not None:
            ax.set_xlim(*xlim)
    axes[0].legend(loc="lower right", fontsize=7)
    axes[-1].set_xlabel(xlabel)
    fig.tight_layout()
    return fig


def curves_figure(curves: Mapping, labels: Mapping, baseline_prefix: str = "",
                  xlabel: str = "training step", ylabel: str = "validation loss (nats per character)",
                  ylim=None, zoom=None):
    """Mean curves (``curves[model] = (x, mean, std)``) with one-standard-deviation bands; models
    whose key starts with ``baseline_prefix`` (if given) dashed. With ``zoom = ((x0, x1), (y0, y1))``
    a second panel enlarges that window."""
    plt = _plt()
    _check_keys(list(curves), labels, "curves")
    n = 2 if zoom is not None else 1
    fig, axes = plt.subplots(1, n, figsize=(5.0 * n, 3.8), squeeze=False)
    axes = axes[0]
    for i, (m, (x, mean, std)) in enumerate(curves.items()):
        style = "--" if baseline_prefix and m.startswith(baseline_prefix) else "-"
        for ax in axes:
            ax.plot(x, mean, style, color=f"C{i}", label=labels[m])
            ax.fill_between(x, mean - std, mean + std, color=f"C{i}", alpha=0.2)
    if ylim is not None:
        axes[0].set_ylim(*ylim)
    if zoom is not None:
        axes[1].set_xlim(*zoom[0])
        axes[1].set_ylim(*zoom[1])
        axes[1].set_title("end of training, enlarged", fontsize=10)
    for ax in axes:
        ax.set_xlabel(xlabel)
    axes[0].set_ylabel(ylabel)
    axes[-1].legend(fontsize=8)
    fig.tight_layout()
    return fig


def lr_sweep_figure(points: Mapping, labels: Mapping, optima: Mapping | None = None,
                    colors: Mapping | None = None,
                    ylabel: str = "final validation loss (nats per character)"):
    """For each model, ``points[model] = {lr: loss}`` (the mean over seeds at each learning rate)
    as circles; where ``optima[model]`` is given (an interpolated sweep with ``curve_lrs``,
    ``curve_losses``, ``best_lr`` and ``best_loss``, e.g.
    :func:`cemlib.evidence.lr_search.akima_optimum`), its interpolant as a line and its minimum as
    a star. The learning-rate axis is logarithmic, base 2, with the grid's values as ticks."""
    plt = _plt()
    _check_keys(list(points), labels, "models")
    colors, optima = dict(colors or {}), dict(optima or {})
    unknown = [m for m in optima if m not in points]
    if unknown:
        raise ValueError(f"optima for models without points: {unknown}")
    fig, ax = plt.subplots(figsize=(6.4, 4.0))
    for i, (m, pts) in enumerate(points.items()):
        lrs = np.array(sorted(pts), dtype=float)
        losses = np.array([pts[lr] for lr in sorted(pts)], dtype=float)
        color = colors.get(m, f"C{i}")
        ax.plot(lrs, losses, "o", color=color, label=labels[m])
        if m in optima:
            sw = optima[m]
            ax.plot(sw.curve_lrs, sw.curve_losses, "-", color=color, lw=1.2)
            ax.plot(sw.best_lr, sw.best_loss, "*", color=color, ms=14, mec="k")
    grid = sorted({float(lr) for pts in points.values() for lr in pts})
    ax.set_xscale("log", base=2)
    if grid:
        ax.set_xticks(grid, [f"{lr:g}" for lr in grid])
        ax.minorticks_off()
    ax.set_xlabel("peak learning rate (log scale)")
    ax.set_ylabel(ylabel)
    ax.legend(fontsize=8)
    fig.tight_layout()
    return fig


def compute_figure(curves: Mapping, panels: Sequence, labels: Mapping, baseline: str,
                   xlabel: str = "training compute (TFLOPs)", ylabel: str = "validation loss (nats/char)",
                   ylim=None, ncols: int = 2):
    """Small multiples: one panel per ``(title, [model, ...])`` of ``panels``, each with the
    ``baseline`` dashed and the panel's models solid; ``curves[model] = (compute, mean, std)``."""
    plt = _plt()
    keys = [baseline] + [k for _, ks in panels for k in ks]
    _check_keys(keys, labels, "models")
    _check_keys(keys, curves, "models")
    nrows = -(-len(panels) // ncols)
    fig, axes = plt.subplots(nrows, ncols, figsize=(5.0 * ncols, 3.5 * nrows), sharey=True, squeeze=False)
    for ax, (title, models) in zip(axes.flat, panels):
        for i, m in enumerate([baseline] + [k for k in models if k != baseline]):
            x, mean, std = curves[m]
            ax.plot(x, mean, "--" if m == baseline else "-", color=f"C{i}", label=labels[m])
            ax.fill_between(x, mean - std, mean + std, color=f"C{i}", alpha=0.15)
        ax.set_title(title, fontsize=10, loc="left")
        if ylim is not None:
            ax.set_ylim(*ylim)
        ax.set_xlabel(xlabel)
        ax.legend(fontsize=7)
    for ax in axes[:, 0]:
        ax.set_ylabel(ylabel)
    for ax in list(axes.flat)[len(panels):]:
        ax.axis("off")
    fig.tight_layout()
    return fig


def interval_figure(panels: Sequence[Mapping], ylabel: str = "validation loss (nats per character)",
                    sharey: bool = True, width: float = 5.0, height: float = 3.8):
    """One panel per mapping of ``panels``: ``title``, ``xlabel``, ``series`` (``{label: (x, mean,
    low, high)}``: a line through the means with the interval ``[low, high]`` as error bars),
    optionally ``marks`` (``{label: x}``: that series' point at ``x`` starred, e.g. the trained
    setting) and ``logx`` (a base-2 axis with the points' values as ticks)."""
    plt = _plt()
    if not panels:
        raise ValueError("interval_figure needs at least one panel")
    fig, axes = plt.subplots(1, len(panels), figsize=(width * len(panels), height), sharey=sharey,
                             squeeze=False)
    for ax, panel in zip(axes[0], panels):
        series, marks = panel["series"], dict(panel.get("marks") or {})
        unknown = [k for k in marks if k not in series]
        if unknown:
            raise ValueError(f"marks for series that are not drawn: {unknown}")
        xs = set()
        for i, (label, (x, mean, low, high)) in enumerate(series.items()):
            x, mean = np.asarray(x, dtype=float), np.asarray(mean, dtype=float)
            low, high = np.asarray(low, dtype=float), np.asarray(high, dtype=float)
            if not (x.shape == mean.shape == low.shape == high.shape):
                raise ValueError(f"{label}: x, mean, low and high must have one shape")
            if np.any(low > mean) or np.any(high < mean):
                raise ValueError(f"{label}: the interval must contain the mean")
            xs |= set(x.tolist())
            ax.errorbar(x, mean, yerr=[mean - low, high - mean], fmt="o-", color=f"C{i}",
                        capsize=3, ms=5, label=label)
            if label in marks:
                k = int(np.argmin(np.abs(x - marks[label])))
                ax.plot(x[k], mean[k], "*", color=f"C{i}", ms=15, mec="k", zorder=5)
        if panel.get("logx"):
            ax.set_xscale("log", base=2)
            ax.set_xticks(sorted(xs), [f"{v:g}" for v in sorted(xs)])
            ax.minorticks_off()
        ax.set_title(panel.get("title", ""), fontsize=10, loc="left")
        ax.set_xlabel(panel.get("xlabel", ""))
        ax.legend(fontsize=8)
    axes[0, 0].set_ylabel(ylabel)
    fig.tight_layout()
    return fig
