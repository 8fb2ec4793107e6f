"""The live energy-landscape explorer (ipywidgets; needs a running kernel: Jupyter or Colab).

Its static companion for the website is :func:`cemlib.viz.landscape.landscape_small_multiples` or
:func:`cemlib.viz.landscape.landscape_animation` (``.to_jshtml()``), which need no kernel.

The plot is rendered to PNG bytes and shown in an ``ipywidgets.Image`` (not an ``Output`` widget),
so a slider move sends one comm message and the notebook cell itself emits no display output:
nbval compares only the explorer's short, deterministic ``text/plain``. ipywidgets is imported
lazily, so ``import cemlib.viz`` works without it.
"""

from __future__ import annotations

import functools

import torch

from cemlib.energies.hopfield import modern_energy, modern_retrieve
from cemlib.utils import check_tensor
from cemlib.viz.landscape import plot_landscape, plot_trajectory
from cemlib.viz.style import render_png

__all__ = ["render_landscape_png", "landscape_explorer", "kernel_note", "step_controls", "control_columns",
           "finish_explorer", "set_legend", "leaves_frame", "fits_beside"]

RULES = ("cccp", "gradient")


def render_landscape_png(patterns: torch.Tensor, start: torch.Tensor, beta: float = 2.0, rule: str = "cccp",
                         eta: float = 1.0, steps: int = 10, xlim=(-2.0, 2.0), ylim=(-2.0, 2.0), n: int = 81,
                         figsize=(4.6, 3.8), dpi: int = 80, layout_key=None) -> tuple[bytes, torch.Tensor]:
    """Draw the landscape and the trajectory from ``start`` (shape ``(2,)``); return ``(png, traj)``
    (``layout_key``: see :func:`cemlib.viz.style.render_png`)."""
    check_tensor(start, "start", ndim=1, last_dim=2)
    traj = modern_retrieve(start, patterns, beta, rule=rule, eta=eta, steps=steps)

    def draw(fig):
        ax = fig.subplots()
        cs = plot_landscape(ax, patterns, beta, xlim, ylim, n)
        plot_trajectory(ax, traj)
        fig.colorbar(cs, ax=ax, label=r"energy $\mathcal{E}(\mathbf{x})$")
        what = "CCCP" if rule == "cccp" else rf"gradient, $\eta={eta:g}$"
        ax.set_title(rf"$\beta={beta:.3g}$, {what}, {steps} steps")

    return render_png(draw, figsize, dpi, layout_key)[0], traj


KERNEL_NOTE = ("Live explorer: it needs a running Python kernel (open the chapter in Jupyter or Colab). "
               "On the website the controls do nothing; the static figure next to it shows the same.")

#: widths in pixels: the explorers' column of controls, the gap between it and the plot, and the
#: page's column at a 1366 px laptop window (the book's theme, measured in Chromium), in which an
#: explorer's plot (its PNG at its natural width) and its controls fit side by side
CONTROL_PX, GAP_PX, LAPTOP_COLUMN_PX = 320, 12, 755
#: the same control width as a CSS length, and the width of the description in front of a control
CONTROL_WIDTH, DESCRIPTION_WIDTH = f"{CONTROL_PX}px", "128px"
BUSY = "<span style='color:#B35900'>redrawing…</span>"

#: the one-line legend of the landscape explorers (what the marks on the plot mean)
PATH_LEGEND = "○ start · × end, after the last step · ★ {points} · white lines: energy contours"


def fits_beside(png: bytes) -> bool:
    """Whether an explorer's plot (PNG bytes, shown at its natural width) and its column of
    controls fit side by side in the page's column on a 1366 px laptop window."""
    from cemlib.viz.style import png_size

    return png_size(png)[0] + GAP_PX + CONTROL_PX <= LAPTOP_COLUMN_PX


def kernel_note():
    """The label every explorer shows above its controls, so a reader of the static website is told
    that the sliders need a kernel (the widget renders there, but nothing redraws)."""
    import ipywidgets as W

    return W.HTML(f"<p style='margin:0 0 4px 0; font-style:italic'>{KERNEL_NOTE}</p>",
                  layout=W.Layout(max_width="100%"))


def step_controls(start, eta: float, steps: int, xlim, ylim, eta_max: float = 2.5):
    """The controls every landscape explorer shares: step size η, number of steps, start point.

    Returns ``(eta, steps, x0, y0)`` ipywidgets sliders."""
    import ipywidgets as W

    style = {"description_width": "initial"}
    eta_w = W.FloatSlider(value=eta, min=0.05, max=eta_max, step=0.05, description="step size η",
                          style=style)
    steps_w = W.IntSlider(value=steps, min=1, max=40, description="steps", style=style)
    x0 = W.FloatSlider(value=float(start[0]), min=xlim[0], max=xlim[1], step=0.05,
                       description="start x₁", style=style)
    y0 = W.FloatSlider(value=float(start[1]), min=ylim[0], max=ylim[1], step=0.05,
                       description="start x₂", style=style)
    return eta_w, steps_w, x0, y0


def control_columns(*columns):
    """Columns of controls side by side that wrap onto separate rows on a narrow (phone) screen."""
    import ipywidgets as W

    return W.HBox([W.VBox(list(c)) for c in columns], layout=W.Layout(flex_flow="row wrap"))


def _fit(control) -> None:
    """Give a control the column's width and a fixed description width, so that every slider keeps
    a usable track (a long description would otherwise take the whole width)."""
    control.layout.width = "100%"
    style = getattr(control, "style", None)
    if style is not None and hasattr(style, "description_width"):
        style.description_width = DESCRIPTION_WIDTH


def leaves_frame(path, xlim, ylim) -> bool:
    """Whether a path (``(steps + 1, 2)`` tensor or array) has a point outside the plotted square."""
    import numpy as np

    p = np.asarray(path.detach() if hasattr(path, "detach") else path, dtype=float).reshape(-1, 2)
    return bool(((p[:, 0] < xlim[0]) | (p[:, 0] > xlim[1]) | (p[:, 1] < ylim[0]) | (p[:, 1] > ylim[1])).any())


def finish_explorer(box, columns, info: bool = True, legend: str | None = None) -> None:
    """Complete the ``VBox`` explorer ``box`` (called from its ``__init__`` once its controls exist).

    Layout, the same for every explorer: the kernel note on top; below it the plot, a PNG image
    ``box.image`` shown at its natural size (never stretched; narrower on a phone), and beside it
    a column of the controls (``columns``, a list of lists, stacked), which wraps under the plot
    on a narrow screen; then the one-line ``legend`` (what the marks on the plot mean) and, with
    ``info``, a text line ``box.info``. Every control redraws on a change (``box._redraw``); while
    it redraws, ``box.status`` says so. The first drawing is made here."""
    import ipywidgets as W

    from cemlib.viz.style import png_size

    controls = [w for column in columns for w in column]
    for w in controls:
        _fit(w)
    box.image = W.Image(format="png", layout=W.Layout(max_width="100%", height="auto", flex="0 1 auto"))
    box.status = W.HTML(value="", layout=W.Layout(min_height="1.5em"))
    panel = W.VBox(controls + [box.status], layout=W.Layout(width=CONTROL_WIDTH, max_width="100%"))
    plot_row = W.HBox([box.image, panel], layout=W.Layout(flex_flow="row wrap", align_items="flex-start",
                                                          grid_gap=f"4px {GAP_PX}px"))
    children = [kernel_note(), plot_row]
    box.legend = W.HTML(value=f"<p style='margin:2px 0; font-size:90%'>{legend}</p>" if legend else "")
    children.append(box.legend)
    if info:
        box.info = W.HTML()
        children.append(box.info)
    W.VBox.__init__(box, children=children)
    draw = box._redraw

    def redraw(change=None):
        box.status.value = BUSY
        try:
            draw(change)
        finally:
            box.status.value = ""
        if box.image.value:
            width = f"{png_size(box.image.value)[0]}px"
            if box.image.layout.width != width:
                box.image.layout.width = width

    box._redraw = redraw
    for w in controls:
        w.observe(box._redraw, names="value")
    box._redraw()


def set_legend(box, legend: str) -> None:
    """Replace the explorer's one-line legend (e.g. when the marked points change meaning)."""
    value = f"<p style='margin:2px 0; font-size:90%'>{legend}</p>"
    if box.legend.value != value:
        box.legend.value = value


@functools.lru_cache(maxsize=None)
def _explorer_class():
    import ipywidgets as W

    class LandscapeExplorer(W.VBox):
        """Sliders for beta, step size, update rule, steps and start point; the landscape below."""

        def __init__(self, patterns, start, beta, eta, rule, steps, xlim, ylim):
            self.patterns, self.xlim, self.ylim = patterns, xlim, ylim
            self.layout_key = object()           # this explorer's frozen layout (see render_png)
            style = {"description_width": "initial"}
            self.beta = W.FloatLogSlider(value=beta, base=10, min=-1, max=1.5, step=0.05,
                                         description="β (inverse temp.)", style=style)
            self.rule = W.Dropdown(options=[("CCCP (η = 1)", "cccp"), ("gradient step", "gradient")],
                                   value=rule, description="update rule", style=style)
            self.eta, self.steps, self.x0, self.y0 = step_controls(start, eta, steps, xlim, ylim)
            finish_explorer(self, [[self.beta, self.rule, self.eta], [self.steps, self.x0, self.y0]],
                            legend=PATH_LEGEND.format(points="stored patterns"))

        def _redraw(self, change=None):
            self.eta.disabled = self.rule.value == "cccp"
            start = torch.tensor([self.x0.value, self.y0.value], dtype=self.patterns.dtype)
            png, traj = render_landscape_png(self.patterns, start, self.beta.value, self.rule.value,
                                             self.eta.value, self.steps.value, self.xlim, self.ylim,
                                             layout_key=self.layout_key)
            self.image.value = png
            e0, e1 = modern_energy(traj[[0, -1]], self.patterns, self.beta.value).tolist()
            out = "; the path leaves the plotted square" if leaves_frame(traj, self.xlim, self.ylim) else ""
            self.info.value = (f"energy: start {e0:.4f} → end {e1:.4f};  end point "
                               f"({traj[-1, 0].item():.3f}, {traj[-1, 1].item():.3f}){out}")

        def __repr__(self):
            return (f"LandscapeExplorer(beta={self.beta.value:.3g}, eta={self.eta.value:.3g}, "
                    f"rule={self.rule.value!r}, steps={self.steps.value})")

    return LandscapeExplorer


def landscape_explorer(patterns: torch.Tensor, start=(1.5, -1.5), beta: float = 2.0, eta: float = 1.0,
                       rule: str = "cccp", steps: int = 10, xlim=(-2.0, 2.0), ylim=(-2.0, 2.0)):
    """The live explorer widget for 2-D ``patterns`` (shape ``(N, 2)``). Display it in Jupyter/Colab.

    Moving a slider re-runs the retrieval and redraws; without a kernel (the website) the sliders
    are inert, which is why the book also shows the static companion.
    """
    check_tensor(patterns, "patterns", ndim=2, last_dim=2)
    if rule not in RULES:
        raise ValueError(f"rule must be one of {RULES}, got {rule!r}")
    return _explorer_class()(patterns, tuple(float(v) for v in start), beta, eta, rule, steps,
                             tuple(xlim), tuple(ylim))
