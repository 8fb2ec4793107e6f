"""Roofline plots of tied against untied layers, a live explorer and its static companion.

:func:`roofline_panel` draws one machine's roofline (compute roof, bandwidth slope) and, for one
setting, the five costs of :func:`cemlib.kernels.costs.tie_comparison` (attention untied / tied;
MLP SwiGLU / tied with ``V`` read twice / once), each at its arithmetic intensity and roofline
bound. :func:`roofline_small_multiples` is the static companion (works on the website);
:func:`roofline_explorer` is the live widget (needs a running kernel), which renders the same
panel to PNG at every slider move, so the notebook cell emits only a short ``text/plain``.
ipywidgets is imported lazily.
"""

from __future__ import annotations

import functools

import numpy as np

from cemlib.kernels.costs import H100_SXM_DATASHEET, Machine, tie_comparison
from cemlib.viz.style import render_png

__all__ = ["plot_roofline", "roofline_panel", "roofline_small_multiples", "render_roofline_png",
           "roofline_explorer", "setting_title", "MARKERS"]

# label -> (marker, colour); attention in blue/orange, MLPs in greens/purple
MARKERS = {"attention, untied": ("o", "#0072B2"), "attention, tied": ("s", "#D55E00"),
           "MLP, SwiGLU": ("^", "#009E73"), "MLP, tied, V read twice": ("v", "#CC79A7"),
           "MLP, tied, V read once": ("D", "#E69F00")}
PHASES = ("forward", "decode")


def plot_roofline(ax, machine: Machine = H100_SXM_DATASHEET, imin: float = 0.25, imax: float = 8192.0,
                  measured_peak_tflops: float | None = None):
    """Draw the roofline ``min(peak, I * bandwidth)`` on log-log axes (TFLOP/s against FLOP/byte),
    the ridge point, and optionally a measured peak as a dashed line."""
    x = np.geomspace(imin, imax, 200)
    ax.plot(x, np.minimum(machine.peak_tflops, x * machine.bandwidth_tbs), color="0.25", lw=1.5,
            label=f"roofline, {machine.name} ({machine.source})")
    ax.axvline(machine.ridge, color="0.6", lw=0.8, ls=":")
    if measured_peak_tflops is not None:
        ax.axhline(measured_peak_tflops, color="0.45", lw=1, ls="--",
                   label="measured bf16 GEMM peak (stored)")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlim(imin, imax)
    ax.set_ylim(machine.bandwidth_tbs * imin * 0.8, machine.peak_tflops * 2.5)
    ax.set_xlabel("arithmetic intensity (FLOP/byte)")
    ax.set_ylabel("attainable throughput (TFLOP/s)")
    return ax


def setting_title(phase: str, L: int, batch: int, head_dim: int, block_m: int) -> str:
    """A short title for one setting (used by the panels and the explorer)."""
    if phase == "decode":
        return f"decode: batch {batch}, cache $L={L}$, $d={head_dim}$"
    return rf"forward: batch {batch}, $L={L}$, $d={head_dim}$, tile $B_m={block_m}$"


def roofline_panel(ax, *, phase: str = "forward", L: int = 4096, batch: int = 8, n_heads: int = 12,
                   head_dim: int = 64, d_ff: int | None = None, block_m: int = 64,
                   machine: Machine = H100_SXM_DATASHEET, legend: bool = True):
    """One roofline with the five costs of :func:`~cemlib.kernels.costs.tie_comparison` for one
    setting; returns the costs (label -> Cost). ``d_ff`` defaults to ``4 n_heads head_dim``."""
    if phase not in PHASES:
        raise ValueError(f"phase must be one of {PHASES}, got {phase!r}")
    d_ff = 4 * n_heads * head_dim if d_ff is None else d_ff
    costs = tie_comparison(phase=phase, L=L, batch=batch, n_heads=n_heads, head_dim=head_dim,
                           d_ff=d_ff, block_m=block_m)
    plot_roofline(ax, machine)
    for label, cost in costs.items():
        marker, color = MARKERS[label]
        ax.plot([cost.intensity], [machine.attainable(cost.intensity)], marker=marker, ls="none",
                ms=7, color=color, mec="black", mew=0.5, label=label)
    ax.set_title(setting_title(phase, L, batch, head_dim, block_m), fontsize=9)
    if legend:
        ax.legend(fontsize=7, loc="lower right")
    return costs


def roofline_small_multiples(settings: list[dict], ncols: int = 2, machine: Machine = H100_SXM_DATASHEET,
                             figsize: tuple[float, float] | None = None):
    """Static companion of :func:`roofline_explorer`: one :func:`roofline_panel` per setting
    (keyword dicts), one shared legend. Returns the figure (not attached to pyplot)."""
    from matplotlib.figure import Figure

    if not settings:
        raise ValueError("settings must contain at least one setting")
    nrows = -(-len(settings) // ncols)
    fig = Figure(figsize=figsize or (3.6 * ncols, 3.0 * nrows + 0.9), layout="constrained")
    axes = np.atleast_1d(fig.subplots(nrows, ncols, sharex=True, sharey=True)).ravel()
    for ax, setting in zip(axes, settings):
        roofline_panel(ax, machine=machine, legend=False, **setting)
    for ax in axes[len(settings):]:
        ax.set_visible(False)
    for ax in axes:
        if ax.get_visible():
            ax.label_outer()
    handles, labels = axes[0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="outside lower center", ncols=2, fontsize=7)
    return fig


def render_roofline_png(figsize=(5.2, 4.0), dpi: int = 80, layout_key=None, **setting) -> tuple[bytes, dict]:
    """Render :func:`roofline_panel` for ``setting`` to PNG bytes; return ``(png, costs)``
    (``layout_key``: see :func:`cemlib.viz.style.render_png`)."""
    return render_png(lambda fig: roofline_panel(fig.subplots(), **setting), figsize, dpi, layout_key)


def _fmt_time(seconds: float) -> str:
    return f"{seconds * 1e6:.3g} µs" if seconds < 1e-3 else f"{seconds * 1e3:.3g} ms"


@functools.lru_cache(maxsize=None)
def _explorer_class():
    import ipywidgets as W

    from cemlib.viz.widgets import finish_explorer

    class RooflineExplorer(W.VBox):
        """Controls for phase, sequence/cache length, batch, head width and query tile."""

        def __init__(self, machine, phase, L, batch, head_dim, block_m, n_heads):
            self.machine, self.n_heads = machine, n_heads
            style = {"description_width": "initial"}
            self.phase = W.Dropdown(options=[("training / prefill forward", "forward"),
                                             ("decode (one token, KV cache)", "decode")],
                                    value=phase, description="phase", style=style)
            self.logL = W.IntSlider(value=int(np.log2(L)), min=6, max=16, description="log₂ L (length)",
                                    tooltip="log₂ of the sequence length (forward) or of the cache length (decode)",
                                    style=style)
            self.logB = W.IntSlider(value=int(np.log2(batch)), min=0, max=9,
                                    description="log₂ batch", style=style)
            self.head_dim = W.Dropdown(options=[32, 64, 128, 256], value=head_dim,
                                       description="head width d", style=style)
            self.block_m = W.Dropdown(options=[16, 32, 64, 128, 256, 512], value=block_m,
                                      description="query tile B_m", style=style)
            self.layout_key = object()           # this explorer's frozen layout (see render_png)
            finish_explorer(self, [[self.phase, self.logL, self.logB], [self.head_dim, self.block_m]],
                            legend="marker: each layer's arithmetic intensity and roofline bound · solid line: "
                                   "the roofline (bandwidth slope, compute roof) · dotted: the ridge point")

        def setting(self):
            return dict(phase=self.phase.value, L=2 ** self.logL.value, batch=2 ** self.logB.value,
                        head_dim=self.head_dim.value, block_m=self.block_m.value,
                        n_heads=self.n_heads)

        def _redraw(self, change=None):
            self.block_m.disabled = self.phase.value == "decode"
            png, costs = render_roofline_png(machine=self.machine, layout_key=self.layout_key,
                                             **self.setting())
            self.image.value = png
            t = {k: c.time_bound(self.machine) for k, c in costs.items()}
            self.info.value = (
                "roofline time bounds: attention untied {} · tied {} (tied/untied {:.2f}); "
                "MLP SwiGLU {} · tied, V twice {} · tied, V once {} (V once / SwiGLU {:.2f})").format(
                _fmt_time(t["attention, untied"]), _fmt_time(t["attention, tied"]),
                t["attention, tied"] / t["attention, untied"], _fmt_time(t["MLP, SwiGLU"]),
                _fmt_time(t["MLP, tied, V read twice"]), _fmt_time(t["MLP, tied, V read once"]),
                t["MLP, tied, V read once"] / t["MLP, SwiGLU"])

        def __repr__(self):
            s = self.setting()
            return (f"RooflineExplorer(phase={s['phase']!r}, L={s['L']}, batch={s['batch']}, "
                    f"head_dim={s['head_dim']}, block_m={s['block_m']})")

    return RooflineExplorer


def roofline_explorer(machine: Machine = H100_SXM_DATASHEET, phase: str = "forward", L: int = 4096,
                      batch: int = 8, head_dim: int = 64, block_m: int = 64, n_heads: int = 12):
    """The live explorer (ipywidgets; needs a running kernel). ``L`` and ``batch`` are rounded
    to powers of two."""
    if phase not in PHASES:
        raise ValueError(f"phase must be one of {PHASES}, got {phase!r}")
    return _explorer_class()(machine, phase, L, batch, head_dim, block_m, n_heads)
