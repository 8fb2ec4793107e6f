"""Energy landscapes of the modern Hopfield energy on a 2-D state, with retrieval trajectories.

All figures are built on explicit ``Axes``/``Figure`` objects (no global pyplot state is read),
so they work under any backend; chapters call :func:`cemlib.viz.use_book_style` first.

The colour scale is shared across panels: for every beta, 0 <= E <= 2 M^2 on the ball
||x|| <= M (Ramsauer et al. 2021), so one scale from 0 to 2 M^2 (values above are drawn in the
top colour) makes panels for different beta comparable.
"""

from __future__ import annotations

import math

import numpy as np
import torch

from cemlib.energies.hopfield import modern_energy, modern_retrieve
from cemlib.utils import check_positive_int, check_tensor

__all__ = ["energy_grid", "energy_levels", "plot_landscape", "plot_patterns", "plot_trajectory",
           "landscape_small_multiples", "landscape_animation", "animation_html"]

Lim = tuple[float, float]


def _check_2d(patterns: torch.Tensor) -> torch.Tensor:
    check_tensor(patterns, "patterns", ndim=2, last_dim=2)
    return patterns


def energy_grid(patterns: torch.Tensor, beta: float, xlim: Lim = (-2.0, 2.0), ylim: Lim = (-2.0, 2.0),
                n: int = 121) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Modern Hopfield energy (book eq. ``eq-lse-energy``) on an ``n x n`` grid of 2-D states.

    Returns ``(X, Y, E)`` as NumPy arrays of shape ``(n, n)`` (``meshgrid`` ``xy`` indexing).
    """
    _check_2d(patterns)
    check_positive_int(n, "n")
    xs = torch.linspace(xlim[0], xlim[1], n, dtype=patterns.dtype)
    ys = torch.linspace(ylim[0], ylim[1], n, dtype=patterns.dtype)
    X, Y = torch.meshgrid(xs, ys, indexing="xy")
    E = modern_energy(torch.stack([X, Y], -1), patterns, beta)
    return X.numpy(), Y.numpy(), E.numpy()


def energy_levels(patterns: torch.Tensor, count: int = 21) -> np.ndarray:
    """Contour levels 0 .. 2 M^2 shared by every beta (see the module docstring)."""
    M2 = float((patterns * patterns).sum(-1).max())
    return np.linspace(0.0, 2.0 * M2, count)


def plot_patterns(ax, patterns: torch.Tensor, label: str = "stored patterns"):
    """Mark the stored patterns as stars; returns the ``PathCollection``."""
    p = _check_2d(patterns).numpy()
    return ax.scatter(p[:, 0], p[:, 1], marker="*", s=160, color="#D55E00", edgecolor="white",
                      linewidth=0.8, zorder=5, label=label)


def contour_panel(ax, X: np.ndarray, Y: np.ndarray, E: np.ndarray, levels: np.ndarray, xlim: Lim, ylim: Lim,
                  extend: str = "max"):
    """Filled contours of a 2-D energy ``E`` on the grid ``(X, Y)`` with white level lines, equal
    aspect and the state-coordinate axis labels shared by every landscape in the book; returns the
    contour set (for a colorbar)."""
    cs = ax.contourf(X, Y, E, levels=levels, cmap="viridis", extend=extend)
    ax.contour(X, Y, E, levels=levels[::2], colors="white", linewidths=0.4, alpha=0.6)
    ax.set_xlim(*xlim)
    ax.set_ylim(*ylim)
    ax.set_aspect("equal")
    ax.set_xlabel(r"state coordinate $x_1$")
    ax.set_ylabel(r"state coordinate $x_2$")
    ax.grid(False)
    return cs


def plot_landscape(ax, patterns: torch.Tensor, beta: float, xlim: Lim = (-2.0, 2.0), ylim: Lim = (-2.0, 2.0),
                   n: int = 121, levels: np.ndarray | None = None, title: bool = True):
    """Filled contours of E on ``ax``, the stored patterns, axis labels; returns the contour set."""
    X, Y, E = energy_grid(patterns, beta, xlim, ylim, n)
    levels = energy_levels(patterns) if levels is None else levels
    cs = contour_panel(ax, X, Y, E, levels, xlim, ylim, extend="max")
    plot_patterns(ax, patterns)
    if title:
        ax.set_title(rf"$\beta = {beta:g}$")
    return cs


def plot_trajectory(ax, traj: torch.Tensor, color: str = "white", label: str | None = None):
    """Draw a trajectory of shape ``(steps + 1, 2)``: a line with dots, a ring at the start and a
    cross at the end. Returns the trajectory's ``Line2D``."""
    check_tensor(traj, "traj", ndim=2, last_dim=2)
    t = traj.detach().numpy()
    (line,) = ax.plot(t[:, 0], t[:, 1], "-o", color=color, ms=3, lw=1.4, label=label, zorder=6)
    ax.plot(t[0, 0], t[0, 1], "o", mfc="none", mec=color, ms=9, mew=1.5, zorder=6)
    ax.plot(t[-1, 0], t[-1, 1], "x", color=color, ms=9, mew=2.0, zorder=7)
    return line


_TRAJ_COLORS = ("white", "#E69F00", "#56B4E9", "#CC79A7", "#F0E442", "#009E73")


def landscape_small_multiples(patterns: torch.Tensor, betas, starts: torch.Tensor, rule: str = "cccp",
                              eta: float = 1.0, steps: int = 10, xlim: Lim = (-2.0, 2.0),
                              ylim: Lim = (-2.0, 2.0), n: int = 121, ncols: int | None = None):
    """One landscape panel per beta, each with the retrieval trajectories from ``starts`` (shape
    ``(S, 2)``) under ``rule``; one shared colour bar. Returns the ``Figure``."""
    from matplotlib.figure import Figure

    _check_2d(patterns)
    check_tensor(starts, "starts", ndim=2, last_dim=2)
    betas = list(betas)
    if not betas:
        raise ValueError("betas must contain at least one inverse temperature")
    ncols = len(betas) if ncols is None else check_positive_int(ncols, "ncols")
    nrows = math.ceil(len(betas) / ncols)
    fig = Figure(figsize=(2.9 * ncols + 0.8, 2.9 * nrows), layout="constrained")
    axes = fig.subplots(nrows, ncols, squeeze=False).ravel()
    levels = energy_levels(patterns)
    cs = None
    for ax, beta in zip(axes, betas):
        cs = plot_landscape(ax, patterns, beta, xlim, ylim, n, levels)
        trajs = modern_retrieve(starts, patterns, beta, rule=rule, eta=eta, steps=steps)
        for k in range(starts.shape[0]):
            plot_trajectory(ax, trajs[:, k], color=_TRAJ_COLORS[k % len(_TRAJ_COLORS)])
    for ax in axes[len(betas):]:
        ax.set_visible(False)
    fig.colorbar(cs, ax=list(axes[:len(betas)]), label=r"energy $\mathcal{E}(\mathbf{x})$ (dimensionless)",
                 shrink=0.9)
    return fig


def landscape_animation(patterns: torch.Tensor, betas, starts: torch.Tensor, rule: str = "cccp",
                        eta: float = 1.0, steps: int = 10, xlim: Lim = (-2.0, 2.0), ylim: Lim = (-2.0, 2.0),
                        n: int = 81, interval: int = 600, figsize: tuple[float, float] = (4.2, 3.6), dpi: int = 72):
    """A matplotlib ``FuncAnimation`` with one frame per beta (landscape + trajectories).

    :func:`animation_html` turns it into a JavaScript player that needs no kernel. The figure is
    not attached to pyplot, so nothing is displayed twice.
    """
    from matplotlib.animation import FuncAnimation
    from matplotlib.figure import Figure

    _check_2d(patterns)
    check_tensor(starts, "starts", ndim=2, last_dim=2)
    betas = list(betas)
    if not betas:
        raise ValueError("betas must contain at least one inverse temperature")
    fig = Figure(figsize=figsize, dpi=dpi, layout="constrained")
    ax = fig.subplots()
    levels = energy_levels(patterns)
    fig.colorbar(plot_landscape(ax, patterns, betas[0], xlim, ylim, n, levels), ax=ax,
                 label=r"energy $\mathcal{E}(\mathbf{x})$")

    def draw(frame: int):
        ax.clear()
        beta = betas[frame]
        plot_landscape(ax, patterns, beta, xlim, ylim, n, levels)
        trajs = modern_retrieve(starts, patterns, beta, rule=rule, eta=eta, steps=steps)
        for k in range(starts.shape[0]):
            plot_trajectory(ax, trajs[:, k], color=_TRAJ_COLORS[k % len(_TRAJ_COLORS)])
        return []

    return FuncAnimation(fig, draw, frames=len(betas), interval=interval, blit=False)


def animation_html(anim, dpi: int = 90, frame_format: str = "jpeg") -> str:
    """``anim.to_jshtml()`` with frames saved at ``dpi`` in ``frame_format`` (JPEG frames keep the
    embedded player about a fifth of the size of PNG ones). Returns the HTML string. At the default
    90 dpi a frame is shown at its figure's size in the book style (the site's CSS narrows the
    player to the column on a phone).

    Matplotlib caches the player on ``anim`` at the first call, so call this once per animation.
    """
    import matplotlib

    if frame_format not in ("png", "jpeg"):
        raise ValueError(f"frame_format must be 'png' or 'jpeg', got {frame_format!r}")
    with matplotlib.rc_context({"animation.frame_format": frame_format, "savefig.dpi": dpi}):
        return anim.to_jshtml()
