"""Figures and the explorer of the errata appendix (``book/errata.ipynb``).

The appendix's lesson checks a printed claim about *finite* steps, NRGPT's Proposition 2.1, by
running the paper's update (6) on one token for several step sizes ``c``. The page transcribes the
update itself (it is the paper's formula, so it stays on the page); this module only draws what
that run returns: per-step energies of many starts, with the steps that raised the energy marked.

- :func:`plot_energy_steps` draws one panel (energies relative to their start, rises in red);
- :func:`energy_steps_multiples` draws one panel per step size (the static companion);
- :func:`step_size_explorer` is the live explorer: a slider for ``c`` and one for the number of
  steps, redrawing one panel (needs a running kernel; ipywidgets is imported lazily).
"""

from __future__ import annotations

import functools

import numpy as np

from cemlib.viz.style import render_png

__all__ = ["rises", "plot_energy_steps", "energy_steps_multiples", "step_size_explorer"]

RISE_COLOR = "#d62728"


def rises(energies, tol: float = 0.0):
    """Boolean array ``(steps, n)``: where a step raised the energy by more than ``tol``.

    ``energies`` is ``(steps + 1, n)``: the energy of ``n`` starts after each of ``steps`` steps."""
    e = np.asarray(energies, dtype=float)
    if e.ndim != 2 or e.shape[0] < 2:
        raise ValueError(f"energies must be (steps + 1, n) with at least one step, got shape {e.shape}")
    return np.diff(e, axis=0) > tol


def plot_energy_steps(ax, energies, title: str = "", tol: float = 0.0):
    """One panel: ``E(t) - E(0)`` of every start (grey lines) against the step ``t``, and a red dot
    at each step that raised a start's energy by more than ``tol``. Returns the number of rises."""
    e = np.asarray(energies, dtype=float)
    up = rises(e, tol)
    rel = e - e[:1]
    t = np.arange(e.shape[0])
    ax.plot(t, rel, color="0.45", lw=0.7, alpha=0.6)
    ts, ns = np.nonzero(up)
    ax.plot(ts + 1, rel[ts + 1, ns], "o", color=RISE_COLOR, ms=3.5, zorder=3,
            label="a step that raised $E_1$" if len(ts) else None)
    ax.set_xlabel("step $t$")
    ax.set_title(title, fontsize=10)
    return int(up.sum())


def energy_steps_multiples(runs: dict, figsize=(8.0, 2.7), tol: float = 0.0):
    """One panel per entry of ``runs`` (``{title: energies (steps + 1, n)}``), side by side with a
    shared y axis; returns the figure (a ``matplotlib.figure.Figure``, not attached to pyplot)."""
    from matplotlib.figure import Figure

    fig = Figure(figsize=figsize, layout="constrained")
    axes = fig.subplots(1, len(runs), sharey=True, squeeze=False)[0]
    for ax, (title, e) in zip(axes, runs.items()):
        plot_energy_steps(ax, e, title, tol)
    axes[0].set_ylabel(r"$E_1(t)-E_1(0)$ (dimensionless)")
    return fig


@functools.lru_cache(maxsize=None)
def _explorer_class():
    import ipywidgets as W

    from cemlib.viz.widgets import finish_explorer

    class StepSizeExplorer(W.VBox):
        """A slider for the step size ``c`` (log scale) and one for the number of steps; one panel of
        per-step energies below (``run(c, steps)`` returns the ``(steps + 1, n)`` energies)."""

        def __init__(self, run, c, steps, c_range, tol):
            self.run, self.tol = run, tol
            self.layout_key = object()
            lo, hi = (float(np.log10(v)) for v in c_range)
            self.c = W.FloatLogSlider(value=c, base=10, min=lo, max=hi, step=0.05, description="step size c")
            self.steps = W.IntSlider(value=steps, min=1, max=60, description="steps")
            finish_explorer(self, [[self.c, self.steps]],
                            legend="grey: one start each · red dot: a step that raised its energy")

        def _redraw(self, change=None):
            e = np.asarray(self.run(self.c.value, self.steps.value), dtype=float)

            def draw(fig):
                ax = fig.subplots()
                n = plot_energy_steps(ax, e, f"c = {self.c.value:.3g}", self.tol)
                ax.set_ylabel(r"$E_1(t)-E_1(0)$")
                return n

            self.image.value, n = render_png(draw, (4.6, 3.2), layout_key=self.layout_key)
            self.info.value = (f"{n} of {e.shape[1] * (e.shape[0] - 1)} steps raised the energy; "
                               f"mean change {float((e[-1] - e[0]).mean()):+.3f}")

        def __repr__(self):
            return f"StepSizeExplorer(c={self.c.value:.3g}, steps={self.steps.value})"

    return StepSizeExplorer


def step_size_explorer(run, c: float = 0.5, steps: int = 30, c_range=(0.01, 10.0), tol: float = 0.0):
    """The live explorer of per-step energies against the step size (display it in Jupyter/Colab).

    ``run(c, steps)`` returns the ``(steps + 1, n)`` energies of ``n`` starts under ``steps`` steps
    of size ``c``; ``c_range`` bounds the logarithmic slider."""
    if not (0 < c_range[0] <= c <= c_range[1]):
        raise ValueError(f"c = {c} must lie in c_range = {c_range} (positive)")
    return _explorer_class()(run, c, steps, c_range, tol)
