"""Learning curves of stored runs, mean ± one standard deviation over seeds, and a live explorer
that overlays any of them (ipywidgets; needs a running kernel: Jupyter or Colab).

The caller says what a curve is: ``curve(key, split, x)`` returns ``(x values, mean, std)`` of
the run group ``key`` for the loss ``split`` (e.g. ``"val_loss"``) against the x axis ``x`` (a
key of the caller's ``x_axes``, e.g. ``"step"``, ``"tokens"``, ``"compute"``), so the same
explorer serves any stored sweep whatever its x axes (chapter 5 plots training compute, which
needs the model's FLOPs). The plot is rendered to PNG bytes in an ``ipywidgets.Image``, so the
notebook cell emits only a short deterministic ``repr``; :func:`render_curves_png` draws the same
picture without widgets.
"""

from __future__ import annotations

import functools

import numpy as np

from cemlib.viz.style import render_png

__all__ = ["plot_curves", "render_curves_png", "curves_explorer", "BAND_LEGEND"]

BAND_LEGEND = "line: mean over the stored seeds · band: ± one standard deviation"


def plot_curves(ax, curve, keys, labels: dict, split: str, x: str, xlabel: str, ylabel: str,
                ylim=None, legend: bool = True):
    """One colour per run group in ``keys`` (in order): the mean and a ± std band."""
    for i, key in enumerate(keys):
        xs, mean, std = (np.asarray(v, dtype=float) for v in curve(key, split, x))
        if not (xs.shape == mean.shape == std.shape and xs.ndim == 1):
            raise ValueError(f"curve({key!r}, {split!r}, {x!r}) must return three equal 1-D arrays")
        ax.plot(xs, mean, color=f"C{i % 10}", label=labels.get(key, key))
        ax.fill_between(xs, mean - std, mean + std, color=f"C{i % 10}", alpha=0.2)
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    if ylim is not None:
        ax.set_ylim(*ylim)
    if legend and keys:
        ax.legend(fontsize=8)
    return ax


def render_curves_png(curve, keys, labels: dict, split: str, x: str, xlabel: str, ylabel: str,
                      ylim=None, figsize=(5.2, 3.8), dpi: int = 80, layout_key=None) -> bytes:
    """:func:`plot_curves` as PNG bytes (``layout_key``: see :func:`cemlib.viz.style.render_png`)."""
    return render_png(lambda fig: plot_curves(fig.subplots(), curve, keys, labels, split, x, xlabel,
                                              ylabel, ylim), figsize, dpi, layout_key)[0]


@functools.lru_cache(maxsize=None)
def _explorer_class():
    import ipywidgets as W

    from cemlib.viz.widgets import finish_explorer

    class CurvesExplorer(W.VBox):
        """Run groups, x axis and loss; their mean ± std learning curves beside."""

        def __init__(self, curve, labels, selected, x_axes, splits, unit, ylim):
            self.curve, self.labels, self.x_axes, self.unit, self.ylim = curve, labels, x_axes, unit, ylim
            self.layout_key = object()           # this explorer's frozen layout (see render_png)
            style = {"description_width": "initial"}
            self.pick = W.SelectMultiple(options=[(label, key) for key, label in labels.items()],
                                         value=tuple(selected), rows=8, description="models",
                                         style=style)
            self.xaxis = W.Dropdown(options=list(x_axes), value=next(iter(x_axes)),
                                    description="x axis", style=style)
            self.split = W.Dropdown(options=list(splits.items()), value=next(iter(splits.values())),
                                    description="loss", style=style)
            finish_explorer(self, [[self.pick, self.xaxis, self.split]], info=False, legend=BAND_LEGEND)

        def _redraw(self, change=None):
            name = next(k for k, v in self.split.options if v == self.split.value)
            self.image.value = render_curves_png(
                self.curve, list(self.pick.value), self.labels, self.split.value,
                self.x_axes[self.xaxis.value], self.xaxis.value,
                f"{name} ({self.unit})" if self.unit else name, self.ylim,
                layout_key=self.layout_key)

        def __repr__(self):
            return (f"CurvesExplorer(models={len(self.pick.value)}, x={self.xaxis.value!r}, "
                    f"loss={self.split.value!r})")

    return CurvesExplorer


def curves_explorer(curve, labels: dict, selected, x_axes: dict, splits: dict, unit: str = "",
                    ylim=None):
    """The live explorer: choose run groups (``labels``: ``{key: label}``, ``selected`` shown
    first), the x axis (``x_axes``: ``{label: key passed to curve}``, the first shown first) and
    the loss (``splits``: ``{label: key passed to curve}``); ``unit`` is appended to the y label.
    Display it in Jupyter or Colab."""
    selected = list(selected)
    unknown = [k for k in selected if k not in labels]
    if unknown:
        raise ValueError(f"selected run groups without a label: {unknown}")
    if not x_axes or not splits:
        raise ValueError("x_axes and splits must each name at least one choice")
    return _explorer_class()(curve, dict(labels), selected, dict(x_axes), dict(splits), unit, ylim)
