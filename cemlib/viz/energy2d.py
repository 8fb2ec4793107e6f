"""Landscapes of any energy on a 2-D state, with the path of plain gradient steps on it.

:mod:`cemlib.viz.landscape` draws the modern Hopfield energy of Chapter 1. This module draws any
energy ``E: R^2 -> R`` together with the descent path ``x <- x - eta grad E(x)``, and ships the two
CEM energies the book explores in two dimensions:

- :func:`cem_attention_landscape`: the interaction energy of one query among a few keys (CEM
  [arXiv] eq. 2 with ``W_Q = W_K = I``, one head, optional ALiBi, optionally with Ramsauer's
  ``+|x|^2/2``, which turns it into Chapter 1's modern Hopfield energy);
- :func:`cem_mlp_landscape`: the element-wise energy ``-gamma^T phi(V x)`` (CEM eq. 7) or its
  Appendix-C sign variant.

Conventions as in :mod:`cemlib.viz.landscape`: every figure is built on an explicit ``Figure``
(no pyplot state), float64 throughout, and every live explorer (:func:`energy_explorer`, needs a
kernel) has static companions (:func:`energy_small_multiples`, :func:`energy_animation`).
"""

from __future__ import annotations

import functools
import math
import re
from dataclasses import dataclass
from typing import Callable

import numpy as np
import torch

from cemlib.utils import check_positive_int, check_tensor
from cemlib.viz.landscape import contour_panel
from cemlib.viz.widgets import PATH_LEGEND, finish_explorer, leaves_frame, set_legend, step_controls

__all__ = ["Landscape2D", "cem_attention_landscape", "cem_mlp_landscape", "energy_grid",
           "shared_levels", "descent_path", "plot_energy", "energy_small_multiples",
           "energy_animation", "render_energy_png", "energy_explorer"]

Lim = tuple[float, float]
_PATH_COLORS = ("white", "#E69F00", "#56B4E9", "#CC79A7", "#F0E442", "#009E73")


@dataclass(frozen=True)
class Landscape2D:
    """An energy of a 2-D state: ``energy`` maps (..., 2) to (...); ``grad`` maps (..., 2) to
    (..., 2) (``None``: autograd of ``energy``). ``points`` (N, 2) are drawn as stars (keys, rows
    of ``V``) with the legend text ``points_label``; ``title`` heads the panel."""

    energy: Callable[[torch.Tensor], torch.Tensor]
    grad: Callable[[torch.Tensor], torch.Tensor] | None = None
    title: str = ""
    points: torch.Tensor | None = None
    points_label: str = ""

    def gradient(self, x: torch.Tensor) -> torch.Tensor:
        """``grad E(x)`` (closed form if given, else autograd)."""
        if self.grad is not None:
            return self.grad(x)
        from cemlib.testing import autograd_grad
        return autograd_grad(self.energy, x)


# ------------------------------------------------------------------------------ CEM energies
def cem_attention_landscape(keys: torch.Tensor, tau: float = 1.0, alibi_slope: float = 0.0,
                            quadratic: bool = False, title: str | None = None) -> Landscape2D:
    """The interaction energy of the last of ``N`` tokens as a function of its 2-D state.

    ``keys`` (N, 2) is the fixed context ``h_1..h_N``; the state ``x`` is token N's (the query),
    and the energy is ``-tau log sum_j exp(h_j . x / tau - m (N - j))`` -- CEM [arXiv] eq. 2 with
    one head, ``W_Q = W_K = I`` (so ``beta_j = h_j``) and ALiBi slope ``m`` (Appendix B). With
    ``quadratic=True`` it gains ``+|x|^2/2``: the modern Hopfield energy of Chapter 1 at
    ``beta = 1/tau`` (bounded below; CEM drops the term, which is what makes the step residual).
    Energy and gradient come from :mod:`cemlib.energies.cem`.
    """
    from cemlib.energies.cem import interaction_energy, interaction_energy_grad

    check_tensor(keys, "keys", ndim=2, last_dim=2)
    if not tau > 0:
        raise ValueError(f"tau must be positive, got {tau}")
    N = keys.shape[0]
    eye = torch.eye(2, dtype=keys.dtype)[None]                   # W_Q = W_K = I, one head
    kw = dict(tau=float(tau))
    if alibi_slope:
        kw["alibi"] = torch.tensor([float(alibi_slope)], dtype=keys.dtype)

    def _inputs(x):
        flat = x.reshape(-1, 2)
        h = keys.expand(flat.shape[0], N, 2)
        xs = torch.cat([h[:, :-1], flat[:, None]], dim=1)          # token N's state is x
        return flat, h, xs

    def energy(x):
        flat, h, xs = _inputs(x)
        e = interaction_energy(xs, h, eye, eye, **kw)[:, -1]
        if quadratic:
            e = e + 0.5 * (flat * flat).sum(-1)
        return e.reshape(x.shape[:-1])

    def grad(x):
        flat, h, xs = _inputs(x)
        g = interaction_energy_grad(xs, h, eye, eye, **kw)[:, -1]
        if quadratic:
            g = g + flat
        return g.reshape(x.shape)

    if title is None:
        title = rf"$\tau={tau:g}$" + (rf", $m={alibi_slope:g}$" if alibi_slope else "") + \
            (r", $+\frac{1}{2}\|\mathbf{x}\|^2$" if quadratic else "")
    return Landscape2D(energy, grad, title, keys, "keys $\\mathbf{h}_j$")


def cem_mlp_landscape(V: torch.Tensor, gamma: torch.Tensor, phi: str = "silu",
                      variant: str = "standard", title: str | None = None) -> Landscape2D:
    """The element-wise energy ``-gamma^T phi(V x)`` (CEM eq. 7) of a 2-D state, ``V`` (D_v, 2),
    ``gamma`` (D_v,) fixed (``gamma = W h``); ``variant="sign"`` is Appendix C's
    ``-|gamma|^T phi(sign(gamma) V x)``. The rows of ``V`` are drawn as points."""
    from cemlib.energies import cem

    check_tensor(V, "V", ndim=2, last_dim=2)
    check_tensor(gamma, "gamma", ndim=1, last_dim=V.shape[0])
    if variant == "standard":
        e_fn, g_fn = cem.elementwise_energy, cem.elementwise_energy_grad
    elif variant == "sign":
        e_fn, g_fn = cem.sign_variant_energy, cem.sign_variant_energy_grad
    else:
        raise ValueError(f"variant must be 'standard' or 'sign', got {variant!r}")
    names = {"silu": r"\mathrm{SiLU}", "gelu": r"\mathrm{GELU}", "relu2": r"\mathrm{ReLU}"}
    if phi not in names:
        raise ValueError(f"phi must be one of {sorted(names)}, got {phi!r}")

    def energy(x):
        return e_fn(x, gamma.expand(*x.shape[:-1], -1), V, phi)

    def grad(x):
        return g_fn(x, gamma.expand(*x.shape[:-1], -1), V, phi)

    if title is None:
        title = rf"$\phi=\int{names[phi]}$" + (", sign variant" if variant == "sign" else "")
    return Landscape2D(energy, grad, title, V, r"rows $\mathbf{v}_m$ of $\mathbf{V}$")


# ------------------------------------------------------------------------------ computation
def energy_grid(land: Landscape2D, xlim: Lim = (-2.0, 2.0), ylim: Lim = (-2.0, 2.0),
                n: int = 121) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``(X, Y, E)`` on an ``n x n`` grid (float64, ``meshgrid`` ``xy`` indexing) as NumPy arrays."""
    check_positive_int(n, "n")
    xs = torch.linspace(xlim[0], xlim[1], n, dtype=torch.float64)
    ys = torch.linspace(ylim[0], ylim[1], n, dtype=torch.float64)
    X, Y = torch.meshgrid(xs, ys, indexing="xy")
    with torch.no_grad():
        E = land.energy(torch.stack([X, Y], -1))
    return X.numpy(), Y.numpy(), E.detach().numpy()


def shared_levels(lands, xlim: Lim = (-2.0, 2.0), ylim: Lim = (-2.0, 2.0), n: int = 61,
                  count: int = 21, clip: float = 0.02) -> np.ndarray:
    """Contour levels shared by several landscapes: ``count`` levels between the ``clip`` and
    ``1 - clip`` quantiles of all their grid values (energies outside use the end colours)."""
    vals = np.concatenate([energy_grid(land, xlim, ylim, n)[2].ravel() for land in lands])
    lo, hi = np.quantile(vals, [clip, 1.0 - clip])
    if not hi > lo:
        lo, hi = lo - 0.5, hi + 0.5
    return np.linspace(lo, hi, count)


def descent_path(land: Landscape2D, start, eta: float = 1.0, steps: int = 10) -> torch.Tensor:
    """Plain gradient steps ``x <- x - eta grad E(x)`` from ``start`` ((2,) or (S, 2)); returns the
    path of shape ``(steps + 1, *start.shape)`` (entry 0 is the start)."""
    check_positive_int(steps, "steps")
    x = torch.as_tensor(start, dtype=torch.float64)
    check_tensor(x, "start", last_dim=2)
    path = [x]
    for _ in range(steps):
        x = x - eta * land.gradient(x)
        path.append(x)
    return torch.stack(path)


# ------------------------------------------------------------------------------ drawing
def plot_energy(ax, land: Landscape2D, xlim: Lim = (-2.0, 2.0), ylim: Lim = (-2.0, 2.0),
                n: int = 121, levels: np.ndarray | None = None, title: bool = True):
    """Filled contours of the energy, its marked points and axis labels; returns the contour set."""
    X, Y, E = energy_grid(land, xlim, ylim, n)
    levels = np.linspace(np.quantile(E, 0.02), np.quantile(E, 0.98), 21) if levels is None else levels
    cs = contour_panel(ax, X, Y, E, levels, xlim, ylim, extend="both")
    if land.points is not None:
        p = land.points.detach().numpy()
        ax.scatter(p[:, 0], p[:, 1], marker="*", s=150, color="#D55E00", edgecolor="white",
                   linewidth=0.8, zorder=5, label=land.points_label or None)
    if title and land.title:
        ax.set_title(land.title)
    return cs


def _plot_path(ax, path: torch.Tensor, color: str = "white"):
    t = path.detach().numpy()
    (line,) = ax.plot(t[:, 0], t[:, 1], "-o", color=color, ms=3, lw=1.4, zorder=6)
    ax.plot(t[0, 0], t[0, 1], "o", mfc="none", mec=color, ms=9, mew=1.5, zorder=6)
    ax.plot(t[-1, 0], t[-1, 1], "x", color=color, ms=9, mew=2.0, zorder=7)
    return line


def _draw_paths(ax, land, starts, eta, steps):
    paths = descent_path(land, starts, eta, steps)
    for k in range(starts.shape[0]):
        _plot_path(ax, paths[:, k], _PATH_COLORS[k % len(_PATH_COLORS)])
    return paths


def _starts(starts) -> torch.Tensor:
    s = torch.as_tensor(starts, dtype=torch.float64)
    check_tensor(s, "starts", ndim=2, last_dim=2)
    return s


def energy_small_multiples(lands, starts, eta: float = 1.0, steps: int = 10,
                           xlim: Lim = (-2.0, 2.0), ylim: Lim = (-2.0, 2.0), n: int = 121,
                           ncols: int | None = None, levels: np.ndarray | None = None,
                           label: str = r"energy (dimensionless)"):
    """One panel per landscape, each with the descent paths from ``starts`` (S, 2) (ring: start,
    cross: end) on shared contour levels, and one colour bar labelled ``label``. Returns the
    ``Figure``."""
    from matplotlib.figure import Figure

    lands = list(lands)
    if not lands:
        raise ValueError("lands must contain at least one landscape")
    starts = _starts(starts)
    ncols = len(lands) if ncols is None else check_positive_int(ncols, "ncols")
    nrows = math.ceil(len(lands) / ncols)
    fig = Figure(figsize=(2.9 * ncols + 0.8, 2.9 * nrows), layout="constrained")
    axes = fig.subplots(nrows, ncols, squeeze=False).ravel()
    levels = shared_levels(lands, xlim, ylim) if levels is None else levels
    cs = None
    for ax, land in zip(axes, lands):
        cs = plot_energy(ax, land, xlim, ylim, n, levels)
        _draw_paths(ax, land, starts, eta, steps)
    for ax in axes[len(lands):]:
        ax.set_visible(False)
    fig.colorbar(cs, ax=list(axes[:len(lands)]), label=label, shrink=0.9, format="%.3g")
    return fig


def energy_animation(lands, starts, eta: float = 1.0, steps: int = 10, xlim: Lim = (-2.0, 2.0),
                     ylim: Lim = (-2.0, 2.0), n: int = 81, interval: int = 600,
                     figsize: tuple[float, float] = (4.2, 3.6), dpi: int = 72,
                     label: str = r"energy (dimensionless)"):
    """A ``FuncAnimation`` with one frame per landscape (shared levels); turn it into a kernel-free
    JavaScript player with :func:`cemlib.viz.landscape.animation_html`."""
    from matplotlib.animation import FuncAnimation
    from matplotlib.figure import Figure

    lands = list(lands)
    if not lands:
        raise ValueError("lands must contain at least one landscape")
    starts = _starts(starts)
    fig = Figure(figsize=figsize, dpi=dpi, layout="constrained")
    ax = fig.subplots()
    levels = shared_levels(lands, xlim, ylim)
    fig.colorbar(plot_energy(ax, lands[0], xlim, ylim, n, levels), ax=ax, label=label, format="%.3g")

    def draw(frame: int):
        ax.clear()
        plot_energy(ax, lands[frame], xlim, ylim, n, levels)
        _draw_paths(ax, lands[frame], starts, eta, steps)
        return []

    return FuncAnimation(fig, draw, frames=len(lands), interval=interval, blit=False)


# ------------------------------------------------------------------------------ live explorer
def render_energy_png(land: Landscape2D, start, eta: float = 1.0, steps: int = 10,
                      xlim: Lim = (-2.0, 2.0), ylim: Lim = (-2.0, 2.0), n: int = 81,
                      figsize=(4.6, 3.8), dpi: int = 80,
                      label: str = "energy", layout_key=None) -> tuple[bytes, torch.Tensor]:
    """Draw the landscape and the descent path from ``start`` (2,); return ``(png, path)``
    (``layout_key``: see :func:`cemlib.viz.style.render_png`)."""
    from cemlib.viz.style import render_png

    path = descent_path(land, start, eta, steps)

    def draw(fig):
        ax = fig.subplots()
        cs = plot_energy(ax, land, xlim, ylim, n, title=False)
        _plot_path(ax, path)
        fig.colorbar(cs, ax=ax, label=label, format="%.3g")
        ax.set_title(f"{land.title}, $\\eta={eta:g}$, {steps} steps" if land.title else
                     f"$\\eta={eta:g}$, {steps} steps")

    return render_png(draw, figsize, dpi, layout_key)[0], path


def _plain(tex: str) -> str:
    """A label's text without TeX markup (``keys $\\mathbf{h}_j$`` -> ``keys h_j``), for an HTML line."""
    text = re.sub(r"\\(?:mathbf|boldsymbol|mathrm|operatorname)\{([^{}]*)\}", r"\1", tex)
    return text.replace("$", "").replace("\\", "")


def _fmt(v) -> str:
    return f"{v:.3g}" if isinstance(v, float) else repr(v)


@functools.lru_cache(maxsize=None)
def _explorer_class():
    import ipywidgets as W

    class EnergyExplorer(W.VBox):
        """Sliders for the landscape's own parameters, the step size, the number of steps and the
        start point; the landscape with the descent path below, and the energies in a label."""

        def __init__(self, make, controls, start, eta, steps, xlim, ylim, label):
            self.make, self.xlim, self.ylim, self.label = make, xlim, ylim, label
            self.layout_key = object()           # this explorer's frozen layout (see render_png)
            style = {"description_width": "initial"}
            self.params = {}
            for name, spec in controls.items():
                if isinstance(spec[1], (list, tuple)):          # (description, options, value)
                    desc, options, value = spec
                    w = W.Dropdown(options=list(options), value=value, description=desc, style=style)
                else:                                            # (description, min, max, step, value)
                    desc, lo, hi, step, value = spec
                    w = W.FloatSlider(value=value, min=lo, max=hi, step=step, description=desc,
                                      style=style)
                self.params[name] = w
            self.eta, self.steps, self.x0, self.y0 = step_controls(start, eta, steps, xlim, ylim, eta_max=3.0)
            finish_explorer(self, [list(self.params.values()), [self.eta, self.steps, self.x0, self.y0]],
                            legend=PATH_LEGEND.format(points="marked points"))

        def _layout_for(self):
            """The frozen layout's key: one per choice of the drop-downs (which may change the
            energy's range, and so the colour bar's labels); the sliders reuse it."""
            return (self.layout_key, *((k, w.value) for k, w in self.params.items() if isinstance(w, W.Dropdown)))

        def values(self) -> dict:
            return {name: w.value for name, w in self.params.items()}

        def _redraw(self, change=None):
            land = self.make(**self.values())
            start = torch.tensor([self.x0.value, self.y0.value], dtype=torch.float64)
            png, path = render_energy_png(land, start, self.eta.value, self.steps.value, self.xlim,
                                          self.ylim, label=self.label, layout_key=self._layout_for())
            self.image.value = png
            if land.points is not None:
                set_legend(self, PATH_LEGEND.format(points=_plain(land.points_label) or "marked points"))
            with torch.no_grad():
                E = land.energy(path)
            mono = bool((E[1:] <= E[:-1] + 1e-12).all())
            self.info.value = (f"energy: start {E[0].item():.4f} → end {E[-1].item():.4f} "
                               f"({'decreased at every step' if mono else 'rose at some step'});  "
                               f"end point ({path[-1, 0].item():.3f}, {path[-1, 1].item():.3f})"
                               + ("; the path leaves the plotted square" if leaves_frame(path, self.xlim, self.ylim) else ""))

        def __repr__(self):
            args = [f"{k}={_fmt(v)}" for k, v in self.values().items()]
            args += [f"eta={self.eta.value:.3g}", f"steps={self.steps.value}"]
            return f"EnergyExplorer({', '.join(args)})"

    return EnergyExplorer


def energy_explorer(make: Callable[..., Landscape2D], controls: dict, start=(1.0, 1.0),
                    eta: float = 1.0, steps: int = 10, xlim: Lim = (-2.0, 2.0),
                    ylim: Lim = (-2.0, 2.0), label: str = "energy"):
    """The live explorer (ipywidgets; needs a running kernel: Jupyter or Colab).

    ``make(**values)`` builds the :class:`Landscape2D` for the current control values;
    ``controls`` maps each keyword of ``make`` to ``(description, min, max, step, value)`` (a
    slider) or ``(description, options, value)`` (a drop-down). Step size, number of steps and the
    start point are always present. On the website the controls are inert; show a static
    companion (:func:`energy_small_multiples`, :func:`energy_animation`) next to it.
    """
    if not isinstance(controls, dict):
        raise TypeError(f"controls must be a dict, got {type(controls).__name__}")
    for name, spec in controls.items():
        if not isinstance(spec, (tuple, list)) or len(spec) not in (3, 5):
            raise ValueError(f"control {name!r} must be (description, min, max, step, value) or "
                             f"(description, options, value), got {spec!r}")
    return _explorer_class()(make, dict(controls), tuple(float(v) for v in start), eta, steps,
                             tuple(xlim), tuple(ylim), label)
