"""Draws of the Gaussian processes of CEM's regression benchmark (Table 3 of the CEM paper), seen
along one line through the input cube, and a live explorer for them (Chapter 6).

The regression inputs are 10-D, so a draw cannot be drawn whole; the book looks at it along the
cube's main diagonal ``z = s·(1, …, 1)``, ``s ∈ [-1, 1]``, where the lengthscale, the period and the
roughness of each kernel show directly. The explorer needs a running kernel; its static companion
is the five-panel figure made with :func:`plot_gp_draws`. :func:`plot_table3_panels` draws Table 3's
RMSE against the recursion depth beside ours, one column per kernel.
"""

from __future__ import annotations

import functools

import torch

from cemlib.data.gp import KERNELS, sample_gp
from cemlib.utils import check_positive_int

__all__ = ["KERNEL_TITLES", "diagonal_inputs", "plot_gp_draws", "plot_table3_panels", "gp_slice_explorer"]

KERNEL_TITLES = {"rbf": "RBF", "matern": r"Matérn $\nu=3/2$", "periodic": "periodic",
                 "rq": "rational quadratic", "nonstationary": "non-stationary"}


def diagonal_inputs(n: int = 241, dim: int = 10) -> tuple[torch.Tensor, torch.Tensor]:
    """``(s, z)``: ``n`` points ``s`` in ``[-1, 1]`` and the inputs ``z = s·1`` of shape ``(n, dim)`` (float64)."""
    s = torch.linspace(-1, 1, check_positive_int(n, "n"), dtype=torch.float64)
    return s, s[:, None].repeat(1, check_positive_int(dim, "dim"))


def plot_gp_draws(ax, kernel: str, lengthscale: float, seed: int = 0, num_draws: int = 3, n: int = 241,
                  dim: int = 10, title: bool = True, color: str | None = None,
                  **kernel_options) -> torch.Tensor:
    """Plot ``num_draws`` draws of the GP with ``kernel`` along the diagonal of the ``dim``-cube and
    return them, shape ``(num_draws, n)``. ``kernel_options`` (``nu``, ``period``, ``alpha``) go to
    :func:`cemlib.data.gp.sample_gp`."""
    if kernel not in KERNELS:
        raise ValueError(f"kernel must be one of {KERNELS}, got {kernel!r}")
    s, z = diagonal_inputs(n, dim)
    draws = sample_gp(z, kernel, lengthscale, generator=torch.Generator().manual_seed(int(seed)),
                      num_draws=num_draws, **kernel_options)
    for d in draws:
        ax.plot(s.numpy(), d.numpy(), lw=1.2, color=color)
    ax.set_xlabel(r"$s$ (input $\mathbf{z}=s\,\mathbf{1}$)")
    if title:
        ax.set_title(KERNEL_TITLES[kernel])
    return draws


#: (colour, marker) of our sweeps in :func:`plot_table3_panels`, in the order given; the paper is C0
SWEEP_STYLES = (("C2", "s"), ("C4", "D"), ("C3", "^"))


def plot_table3_panels(paper: dict, ours: dict, kernels=KERNELS, steps=(1, 2, 4, 8),
                       splits=("test", "train"), figsize=(12.5, 5.4)):
    """Table 3 of CEM beside our sweeps: RMSE against the recursion depth ``T`` (log-log), one
    column per kernel, one row per split; returns ``(fig, axes)``.

    ``paper[kernel][model] = (train mean, train std, test mean, test std)`` for the models
    ``"Gated"`` and ``"CEM-T{T}"``: the CEM means with ± one standard deviation (blue, circles) and
    the gated MLP's mean (blue, dotted). ``ours[label][(kernel, model, split)] = (mean, half_width)``
    (a 95 % interval, say): each sweep's CEM points with bars and its gated MLP's mean (dashed), in
    the colours and markers of :data:`SWEEP_STYLES` (green squares, then orange diamonds); a sweep
    may hold any subset of ``steps``."""
    import matplotlib as mpl
    import matplotlib.pyplot as plt

    if len(ours) > len(SWEEP_STYLES):
        raise ValueError(f"at most {len(SWEEP_STYLES)} sweeps, got {len(ours)}")
    fig, axes = plt.subplots(len(splits), len(kernels), figsize=figsize, sharex=True, squeeze=False)
    col = {"train": 0, "test": 2}
    for j, kern in enumerate(kernels):
        for i, split in enumerate(splits):
            ax, rows, k = axes[i, j], paper[kern], col[split]
            ax.errorbar(steps, [rows[f"CEM-T{T}"][k] for T in steps], fmt="-o", ms=4, capsize=3,
                        yerr=[rows[f"CEM-T{T}"][k + 1] for T in steps], color="C0",
                        label="CEM, paper (± std)")
            ax.axhline(rows["Gated"][k], color="C0", ls=":", lw=1.2, label="gated, paper")
            for (label, sweep), (color, marker) in zip(ours.items(), SWEEP_STYLES):
                have = [T for T in steps if (kern, f"CEM-T{T}", split) in sweep]
                est = [sweep[(kern, f"CEM-T{T}", split)] for T in have]
                ax.errorbar(have, [m for m, _ in est], yerr=[h for _, h in est], fmt="-" + marker,
                            ms=4, capsize=3, color=color, label=f"CEM, {label}")
                if (kern, "Gated", split) in sweep:
                    ax.axhline(sweep[(kern, "Gated", split)][0], color=color, ls="--", lw=1.2,
                               label=f"gated, {label}")
            ax.set_xscale("log", base=2)
            ax.set_yscale("log")
            ax.set_xticks(list(steps), [str(T) for T in steps])
            ax.yaxis.set_major_locator(mpl.ticker.LogLocator(subs=(1.0, 2.0, 5.0)))
            ax.yaxis.set_major_formatter(mpl.ticker.FormatStrFormatter("%g"))
            ax.yaxis.set_minor_formatter(mpl.ticker.NullFormatter())
            ax.tick_params(which="both", labelsize=7)
            if i == 0:
                ax.set_title(KERNEL_TITLES.get(kern, kern))
            if i == len(splits) - 1:
                ax.set_xlabel(r"recursion steps $T$")
        for i, split in enumerate(splits):
            axes[i, 0].set_ylabel(f"{split} RMSE (units of $f$)")
    fig.legend(*axes[0, 0].get_legend_handles_labels(), loc="upper center", ncol=3,
               bbox_to_anchor=(0.5, 0.0), fontsize=8)
    return fig, axes


def render_gp_png(kernel: str, lengthscale: float, seed: int = 0, period: float = 2.0, alpha: float = 1.0,
                  figsize=(5.2, 3.0), dpi: int = 80, layout_key=None) -> bytes:
    """One panel of :func:`plot_gp_draws` as PNG bytes (for the explorer; ``layout_key``: see
    :func:`cemlib.viz.style.render_png`)."""
    from cemlib.viz.style import render_png

    def draw(fig):
        ax = fig.subplots()
        plot_gp_draws(ax, kernel, lengthscale, seed, period=period, alpha=alpha)
        ax.set_ylabel(r"$f(\mathbf{z})$")

    return render_png(draw, figsize, dpi, layout_key)[0]


@functools.lru_cache(maxsize=None)
def _explorer_class():
    import ipywidgets as W

    from cemlib.viz.widgets import finish_explorer

    class GPSliceExplorer(W.VBox):
        """Kernel, lengthscale, period, RQ α and seed; three draws along the cube's diagonal below."""

        def __init__(self, kernel, lengthscale):
            st = {"description_width": "initial"}
            names = [(KERNEL_TITLES[k].replace("$", "").replace(r"\nu", "ν"), k) for k in KERNELS]
            self.kernel = W.Dropdown(options=names, value=kernel, description="kernel", style=st)
            self.ell = W.FloatLogSlider(value=lengthscale, base=10, min=-0.5, max=1.2, step=0.05,
                                        description="lengthscale ℓ", style=st)
            self.period = W.FloatSlider(value=2.0, min=0.25, max=3.0, step=0.05, description="period p",
                                        style=st)
            self.alpha = W.FloatLogSlider(value=1.0, base=10, min=-1, max=3, step=0.1, description="RQ α",
                                          style=st)
            self.seed = W.IntSlider(value=0, min=0, max=20, description="seed", style=st)
            self.layout_key = object()           # this explorer's frozen layout (see render_png)
            finish_explorer(self, [[self.kernel, self.ell, self.seed], [self.period, self.alpha]], info=False,
                            legend="three draws of the Gaussian process along the diagonal of the input cube")

        def _redraw(self, change=None):
            self.image.value = render_gp_png(self.kernel.value, self.ell.value, self.seed.value,
                                             self.period.value, self.alpha.value,
                                             layout_key=self.layout_key)

        def __repr__(self):
            return (f"GPSliceExplorer(kernel={self.kernel.value!r}, lengthscale={self.ell.value:.3g}, "
                    f"seed={self.seed.value})")

    return GPSliceExplorer


def gp_slice_explorer(kernel: str = "rbf", lengthscale: float = 10 ** 0.5):
    """The live explorer of GP draws (ipywidgets; needs a running kernel: Jupyter or Colab)."""
    if kernel not in KERNELS:
        raise ValueError(f"kernel must be one of {KERNELS}, got {kernel!r}")
    return _explorer_class()(kernel, float(lengthscale))
