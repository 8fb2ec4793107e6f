"""Pictures and small measurements for the Helmholtz free energy and Newton attention (Chapter 8).

- :func:`circle_landscape`: the elastic free energy ``F*(z) = -T log sum_i exp(-|z - m_i|^2 / 2T)`` of
  ``N`` particles on the unit circle, as a :class:`~cemlib.viz.energy2d.Landscape2D`;
  :func:`outline_nonconvex` draws where its Hessian is indefinite.
- :func:`descend`: iterate a single-head layer of :mod:`cemlib.layers.helmholtz` or
  :mod:`cemlib.layers.newton` from many starts, recording the gradient norm and whether the energy
  ever rose; :func:`plot_convergence` draws the medians.
- :func:`best_times` and :func:`plot_cost`: wall time of layers against a size, measured in turn,
  round by round, so that other work on the machine slows them alike.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Mapping, Sequence

import torch

from cemlib.energies import helmholtz as fe
from cemlib.viz.energy2d import Landscape2D

__all__ = ["circle_particles", "circle_landscape", "outline_nonconvex", "descend", "plot_convergence",
           "best_times", "plot_cost"]


def circle_particles(n_particles: int = 3, phase: float = 0.3) -> torch.Tensor:
    """``n_particles`` points evenly spaced on the unit circle, the first at angle ``phase``
    (float64, shape ``(n_particles, 2)``)."""
    if n_particles < 1:
        raise ValueError(f"n_particles must be >= 1, got {n_particles}")
    ang = phase + 2 * math.pi * torch.arange(n_particles, dtype=torch.float64) / n_particles
    return torch.stack([ang.cos(), ang.sin()], -1)


def circle_landscape(T: float, n_particles: int = 3, phase: float = 0.3) -> Landscape2D:
    """The elastic free energy of ``n_particles`` particles on the unit circle at temperature ``T``
    (``W = I``), with its gradient, for the 2-D plots of :mod:`cemlib.viz.energy2d`."""
    if not T > 0:
        raise ValueError(f"the temperature T must be > 0, got {T}")
    pts, eye = circle_particles(n_particles, phase), torch.eye(2, dtype=torch.float64)
    return Landscape2D(energy=lambda x: fe.elastic_free_energy(x, pts, eye, T),
                       grad=lambda x: fe.elastic_free_energy_grad(x, pts, eye, T),
                       title=rf"$T={T:g}$, $N={n_particles}$", points=pts,
                       points_label=r"particles $\mathbf{m}_i$")


def outline_nonconvex(ax, land: Landscape2D, T: float, lim: float = 2.0, n: int = 121) -> float:
    """Draw (dashed) the boundary of the region of ``[-lim, lim]^2`` where the Hessian of the free
    energy of ``land``'s particles at temperature ``T`` has a negative eigenvalue; return the share of
    the grid's points in that region."""
    xs = torch.linspace(-lim, lim, n, dtype=torch.float64)
    X, Y = torch.meshgrid(xs, xs, indexing="xy")
    hess = fe.elastic_free_energy_hessian(torch.stack([X, Y], -1), land.points,
                                          torch.eye(2, dtype=torch.float64), T)
    lam = torch.linalg.eigvalsh(hess)[..., 0]
    if (lam < 0).any():
        ax.contour(X.numpy(), Y.numpy(), lam.numpy(), levels=[0.0], colors="#D55E00",
                   linestyles="--", linewidths=1.2)
    return (lam < 0).float().mean().item()


@torch.no_grad()
def descend(layer, particles: torch.Tensor, starts: torch.Tensor, iters: int = 40,
            tol: float = 1e-12) -> tuple[torch.Tensor, torch.Tensor]:
    """Iterate ``z <- layer(z, particles)`` from each row of ``starts``; a layer exposes ``energy``
    and ``energy_grad`` (the single-head layers of :mod:`cemlib.layers.helmholtz` and
    :mod:`cemlib.layers.newton` do). Returns ``(grad_norms, rose)``: the gradient norm before each
    step and after the last, shape ``(iters + 1, starts)``, and whether the energy rose by more than
    ``tol`` at some step, per start. A step that leaves the finite numbers is not taken."""
    zk = starts.clone()
    gnorm, rose = [], torch.zeros(starts.shape[0], dtype=torch.bool)
    for _ in range(iters):
        gnorm.append(layer.energy_grad(zk, particles).norm(dim=-1))
        zn = layer(zk, particles)
        rose |= layer.energy(zn, particles) > layer.energy(zk, particles) + tol
        zk = torch.where(torch.isfinite(zn).all(-1, keepdim=True), zn, zk)
    gnorm.append(layer.energy_grad(zk, particles).norm(dim=-1))
    return torch.stack(gnorm), rose


def plot_convergence(grad_norms: Mapping, temperatures: Sequence[float], methods: Sequence[str],
                     figsize=(9.6, 3.2)):
    """One panel per temperature: the median over starts of the gradient norm against the iteration,
    one line per method (``grad_norms[(T, method)]`` of shape ``(iters + 1, starts)``), log scale.
    Returns the figure."""
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(temperatures), figsize=figsize, layout="constrained", sharey=True,
                             squeeze=False)
    for ax, T in zip(axes[0], temperatures):
        for name, style in zip(methods, ["-", "--", ":", "-."]):
            gn = grad_norms[(T, name)]
            ax.plot(gn.median(1).values.clamp_min(1e-16).numpy(), style, lw=2, label=name)
        ax.set_yscale("log")
        ax.set_title(rf"$T={T:g}$")
        ax.set_xlabel(r"iteration $k$")
    axes[0, 0].set_ylabel(r"median $\|\nabla F^*(\mathbf{z}^{(k)})\|$")
    axes[0, 0].legend(fontsize=8)
    return fig


def best_times(fns: Sequence[Callable[[], object]], reps: int = 5) -> list[float]:
    """The best of ``reps`` wall times (seconds) of each function; the functions run in turn in every
    round, so that other work on the machine slows them alike."""
    if reps < 1:
        raise ValueError(f"reps must be >= 1, got {reps}")
    best = [float("inf")] * len(fns)
    for _ in range(reps):
        for i, fn in enumerate(fns):
            t0 = time.perf_counter()
            fn()
            best[i] = min(best[i], time.perf_counter() - t0)
    return best


def plot_cost(times: Mapping, sweeps: Mapping[str, Sequence[tuple[int, int]]], names: Sequence[str],
              tokens: int, figsize=(8.4, 3.3)):
    """Wall time against the number of particles and against the width, log-log: ``sweeps`` maps
    ``"N"`` and ``"d"`` to their ``(d, N)`` grids, ``times[(axis, name, d, N)]`` is in seconds, one
    line per layer name. Returns the figure."""
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(sweeps), figsize=figsize, layout="constrained", squeeze=False)
    for ax, (axis, grid) in zip(axes[0], sweeps.items()):
        xs = [n if axis == "N" else d for d, n in grid]
        for name, style in zip(names, ["-o", "-s", "-^", "-D"]):
            ax.loglog(xs, [1e3 * times[(axis, name, d, n)] for d, n in grid], style, ms=4, label=name)
        ax.set_xticks(xs, [str(x) for x in xs])
        ax.minorticks_off()
        other = f"$d={grid[0][0]}$" if axis == "N" else f"$N={grid[0][1]}$"
        ax.set_xlabel(("number of particles $N$" if axis == "N" else "width $d$") + f" ({other})")
        ax.set_ylabel(f"wall time for {tokens} tokens (ms)")
    axes[0, 0].legend(fontsize=8)
    return fig
