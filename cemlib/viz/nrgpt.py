"""Per-token energy trajectories of a random NRGPT block, their small multiples and a live explorer
(the NRGPT chapter; Dehmamy et al. 2025, NRGPT, §2.3, Prop. 2.1, Fig. 2).

A seeded random-init :class:`~cemlib.layers.nrgpt.NRGPTBlock` (float64, an unconstrained rate
matrix, a frozen normalisation gain ``gamma_i = exp(s z_i)`` whose log-spread ``s`` the reader
sets) is run for ``steps`` steps with ``eta = c diag(gamma)`` (Prop. 2.1) or ``eta = c I`` (which
Prop. 2.1 covers only when ``gamma`` is uniform), and the energy ``E_A(t)`` of every token is
recorded. The explorer needs a running kernel; its static companion is
:func:`token_energy_small_multiples`, which needs none. The plot is rendered to PNG bytes in an
``ipywidgets.Image`` so the notebook cell emits only a short deterministic ``repr``.
"""

from __future__ import annotations

import functools
import math

import torch

from cemlib.layers.nrgpt import NRGPTBlock
from cemlib.utils import check_positive_int

__all__ = ["RATE_CHOICES", "random_block", "token_energy_trajectories", "count_rises",
           "plot_token_energies", "token_energy_small_multiples", "render_token_energy_png",
           "token_energy_explorer", "first_token_rises", "plot_relaxation", "plot_trained_relaxation",
           "plot_accuracy_vs_parameters"]

RATE_CHOICES = {"gamma": r"$\eta=c\,\mathrm{diag}(\gamma)$", "identity": r"$\eta=c\,\mathbf{I}$"}


def random_block(d_model: int = 16, n_tokens: int = 8, n_heads: int = 2, gamma_spread: float = 0.0,
                 seed: int = 0, init_std: float = 0.3, ff: str = "ff2w", norm: str = "layernorm"):
    """``(block, x0)``: a seeded float64 :class:`NRGPTBlock` (``rate="matrix"``, gain frozen at
    ``exp(gamma_spread * z)`` with ``z ~ N(0, 1)``) and a start state ``x0`` of shape ``(1, N, D)``."""
    check_positive_int(n_tokens, "n_tokens")
    if not gamma_spread >= 0:
        raise ValueError(f"gamma_spread must be >= 0, got {gamma_spread!r}")
    gen = torch.Generator().manual_seed(int(seed))
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(int(seed))
        block = NRGPTBlock(d_model, n_heads, ff=ff, norm=norm, learn_gain=False, rate="matrix",
                           init_std=init_std).double()
    if block.gain is not None:
        z = torch.randn(d_model, generator=gen, dtype=torch.float64)
        block.gain.copy_(torch.exp(gamma_spread * z))
    x0 = torch.randn(1, n_tokens, d_model, generator=gen, dtype=torch.float64)
    return block, x0


def token_energy_trajectories(block: NRGPTBlock, x0: torch.Tensor, c: float, steps: int,
                              rate: str = "gamma") -> torch.Tensor:
    """Run ``steps`` steps with ``eta = c diag(gamma)`` (``rate="gamma"``) or ``c I``
    (``"identity"``) and return the per-token energies, shape ``(steps + 1, N)`` (first sequence).
    ``block`` must have ``rate="matrix"``; its ``eta`` is overwritten."""
    if rate not in RATE_CHOICES:
        raise ValueError(f"rate must be one of {tuple(RATE_CHOICES)}, got {rate!r}")
    if block.rate != "matrix":
        raise ValueError("token_energy_trajectories needs a block with rate='matrix'")
    if not c > 0:
        raise ValueError(f"c must be positive, got {c!r}")
    D = block.d_model
    gamma = block.gain if (rate == "gamma" and block.gain is not None) else block.eta.new_ones(D)
    with torch.no_grad():
        block.eta.copy_(c * torch.diag(gamma.to(block.eta.dtype)))
        _, E = block.run(x0, check_positive_int(steps, "steps"), return_energies=True)
    return E[:, 0]


def count_rises(E: torch.Tensor, rtol: float = 1e-9) -> torch.Tensor:
    """Boolean ``(steps, N)``: the energy of token ``A`` rose at step ``t`` (beyond round-off)."""
    dE = E[1:] - E[:-1]
    return dE > rtol * E[:-1].abs().clamp_min(1.0)


def first_token_rises(block: NRGPTBlock, x: torch.Tensor, cs, steps: int):
    """Run ``block`` (``rate="gamma"``) from the states ``x`` (B, N, D) for ``steps`` steps at each
    step size ``c`` in ``cs`` and return two lists: the fraction of the ``B`` sequences in which the
    first token's energy rose at some step (it has no earlier token, so Prop. 2.1 applies to it
    without a transient), and the fraction of all (step, sequence, token) triples that rose. The
    block's ``c`` is restored afterwards."""
    if block.rate != "gamma":
        raise ValueError("first_token_rises needs a block with rate='gamma'")
    steps = check_positive_int(steps, "steps")
    first, every = [], []
    with torch.no_grad():
        saved = block.log_c.detach().clone()
        try:
            for c in cs:
                if not c > 0:
                    raise ValueError(f"step sizes must be positive, got {c!r}")
                block.log_c.fill_(math.log(c))
                _, E = block.run(x, steps, return_energies=True)          # (steps + 1, B, N)
                r = count_rises(E.flatten(1)).view(steps, *E.shape[1:])
                first.append(r[..., 0].any(0).double().mean().item())
                every.append(r.double().mean().item())
        finally:
            block.log_c.copy_(saved)
    return first, every


def _token_colours(N: int):
    import matplotlib as mpl

    cmap = mpl.colormaps["viridis"]
    return [cmap(a / max(N - 1, 1)) for a in range(N)]


def plot_relaxation(E: torch.Tensor, G: torch.Tensor, X: torch.Tensor, figsize=(11, 3.3)):
    """Three panels over the steps of a run, one line per token (colour: position): the energy
    relative to its start with the rises marked, the step of the normalised state
    ``|g_A(t+1) - g_A(t)|`` (log scale) and the raw norm ``|x_A(t)|``. ``E`` is ``(T + 1, N)``,
    ``G`` and ``X`` are ``(T + 1, N, D)``. Returns the figure."""
    import matplotlib as mpl
    import matplotlib.pyplot as plt

    if not (E.shape[:2] == G.shape[:2] == X.shape[:2]):
        raise ValueError(f"E {tuple(E.shape)}, G {tuple(G.shape)} and X {tuple(X.shape)} must share (T + 1, N)")
    N = E.shape[1]
    colours = _token_colours(N)
    dg = (G[1:] - G[:-1]).norm(dim=-1)
    xnorm = X.norm(dim=-1)
    fig, axes = plt.subplots(1, 3, figsize=figsize, layout="constrained")
    for a in range(N):
        axes[0].plot((E[:, a] - E[0, a]).numpy(), color=colours[a], lw=1)
        axes[1].semilogy(dg[:, a].clamp_min(1e-16).numpy(), color=colours[a], lw=1)
        axes[2].plot(xnorm[:, a].numpy(), color=colours[a], lw=1)
    t_r, a_r = count_rises(E).nonzero(as_tuple=True)
    axes[0].plot((t_r + 1).numpy(), (E[t_r + 1, a_r] - E[0, a_r]).numpy(), "o", ms=3, color="#d62728",
                 label="energy rose")
    axes[0].set(xlabel="step $t$", ylabel=r"$E_A(t)-E_A(0)$ (dimensionless)", title="per-token energy")
    axes[1].set(xlabel="step $t$", ylabel=r"$\|\mathbf{g}_A(t+1)-\mathbf{g}_A(t)\|$", title="normalised state")
    axes[2].set(xlabel="step $t$", ylabel=r"$\|\mathbf{x}_A(t)\|$", title="raw state")
    axes[0].legend(loc="upper right")
    sm = plt.cm.ScalarMappable(cmap=mpl.colormaps["viridis"], norm=plt.Normalize(1, N))
    fig.colorbar(sm, ax=axes, label="token position $A$", shrink=0.85)
    return fig


def plot_trained_relaxation(E: torch.Tensor, n_tokens: int, trained_steps: int, figsize=(10, 3.3)):
    """A trained model run past its depth: per-token energies of the first sequence (its first
    ``n_tokens`` columns of ``E``, shape ``(T + 1, sequences * n_tokens)``) relative to their
    start, and over all columns the largest per-step change (log scale) and the share of tokens
    whose energy rose at each step; a dotted line marks the trained depth. Returns the figure."""
    import matplotlib.pyplot as plt

    steps = E.shape[0] - 1
    rises = count_rises(E)
    dE = (E[1:] - E[:-1]).abs().max(1).values
    colours = _token_colours(n_tokens)
    fig, axes = plt.subplots(1, 2, figsize=figsize, layout="constrained")
    for a in range(n_tokens):
        axes[0].plot((E[:, a] - E[0, a]).numpy(), color=colours[a], lw=1)
    axes[0].axvline(trained_steps, color="0.4", ls=":", lw=1, label=f"trained depth $T={trained_steps}$")
    axes[0].set(xlabel="step $t$", ylabel=r"$E_A(t)-E_A(0)$ (dimensionless)", title="one sequence")
    axes[0].legend(loc="upper right")
    t = range(1, steps + 1)
    axes[1].semilogy(t, dE.numpy(), "-o", ms=3, label=r"$\max_A|E_A(t)-E_A(t-1)|$")
    axes[1].plot(t, rises.double().mean(1).clamp_min(1e-3).numpy(), "-s", ms=3,
                 label="share of tokens whose energy rose")
    axes[1].axvline(trained_steps, color="0.4", ls=":", lw=1)
    axes[1].set(xlabel="step $t$", ylabel="per-step change / share (dimensionless)", title="all sequences")
    axes[1].legend(loc="lower left", fontsize=8)
    return fig


def plot_accuracy_vs_parameters(ax, curves: dict, transitions: dict | None = None, majority: float | None = None):
    """Test accuracy (%) against parameters (log scale), one curve per model: ``curves[name]`` is an
    array with columns (width, parameters, mean accuracy, standard deviation), accuracies as
    fractions. ``transitions[name]``: a dotted vertical line at that parameter count (a paper's
    learning transition), drawn with the curve's colour; ``majority``: the majority-class accuracy,
    a grey line. The 80 % threshold of the NRGPT paper's transition is drawn dashed."""
    for (name, c), marker in zip(curves.items(), "so^dv<>"):
        line = ax.errorbar(c[:, 1], 100 * c[:, 2], yerr=100 * c[:, 3], marker=marker, ms=4, capsize=2, label=name)
        if transitions and name in transitions:
            ax.axvline(transitions[name], color=line[0].get_color(), ls=":", lw=1)
    left = min(c[:, 1].min() for c in curves.values()) * 0.8
    ax.axhline(80, color="0.4", lw=0.8, ls="--")
    ax.text(left, 81.5, "80%: the paper's transition threshold", fontsize=8, color="0.3")
    if majority is not None:
        ax.axhline(100 * majority, color="0.6", lw=0.8)
        ax.text(left, 100 * majority + 1.5, "majority class", fontsize=8, color="0.4")
    ax.set(xscale="log", xlabel="parameters", ylabel="test accuracy (%)", ylim=(0, 100))
    ax.legend(fontsize=8, loc="center right")
    return ax


def plot_token_energies(ax, E: torch.Tensor, title: str | None = None, legend: bool = False) -> int:
    """Plot ``E_A(t) - E_A(0)`` for every token (colour = position ``A``), mark each rise with a red
    dot, and return the number of (token, step) rises."""
    import matplotlib as mpl

    N = E.shape[1]
    cmap = mpl.colormaps["viridis"]
    dE = (E - E[0]).numpy()
    t = range(E.shape[0])
    for a in range(N):
        ax.plot(t, dE[:, a], color=cmap(a / max(N - 1, 1)), lw=1.2)
    rises = count_rises(E)
    ts, as_ = rises.nonzero(as_tuple=True)
    if len(ts):
        ax.plot((ts + 1).numpy(), dE[(ts + 1).numpy(), as_.numpy()], "o", color="#d62728", ms=3.5,
                label="energy rose at this step")
    ax.set_xlabel("step $t$")
    ax.set_ylabel(r"$E_A(t)-E_A(0)$ (dimensionless)")
    if title:
        ax.set_title(title)
    if legend and len(ts):
        ax.legend(loc="upper right")
    return int(rises.sum())


def token_energy_small_multiples(cs, rates=("gamma", "identity"), gamma_spread: float = 1.0,
                                 steps: int = 30, figsize=None, **block_kwargs):
    """Static companion of the explorer: one panel per (rate, c), rows = rates, columns = ``cs``;
    returns ``(fig, rises)`` with ``rises[rate][c]`` the number of (token, step) rises."""
    import matplotlib.pyplot as plt

    rows, cols = len(rates), len(cs)
    fig, axes = plt.subplots(rows, cols, figsize=figsize or (3.0 * cols, 2.6 * rows), squeeze=False,
                             sharex=True, layout="constrained")
    rises = {}
    for i, rate in enumerate(rates):
        rises[rate] = {}
        for j, c in enumerate(cs):
            block, x0 = random_block(gamma_spread=gamma_spread, **block_kwargs)
            E = token_energy_trajectories(block, x0, c, steps, rate)
            ax = axes[i, j]
            rises[rate][c] = plot_token_energies(ax, E, title=f"{RATE_CHOICES[rate]}, $c={c:g}$")
            if j:
                ax.set_ylabel("")
            if i < rows - 1:
                ax.set_xlabel("")
    return fig, rises


def render_token_energy_png(c: float, gamma_spread: float, steps: int, rate: str = "gamma",
                            figsize=(5.2, 3.4), dpi: int = 80, layout_key=None,
                            **block_kwargs) -> tuple[bytes, int, int]:
    """One panel as PNG bytes (for the explorer), its number of (token, step) rises and the number
    of rises of the first token (which has no earlier token to wait for). ``layout_key``: see
    :func:`cemlib.viz.style.render_png`."""
    from cemlib.viz.style import render_png

    block, x0 = random_block(gamma_spread=gamma_spread, **block_kwargs)
    E = token_energy_trajectories(block, x0, c, steps, rate)
    png, n = render_png(lambda fig: plot_token_energies(
        fig.subplots(), E, title=f"{RATE_CHOICES[rate]}, $c={c:.3g}$, "
                                 rf"$\log\gamma$ spread $s={gamma_spread:.2g}$", legend=True), figsize, dpi, layout_key)
    return png, n, int(count_rises(E)[:, 0].sum())


@functools.lru_cache(maxsize=None)
def _explorer_class():
    import ipywidgets as W

    from cemlib.viz.widgets import finish_explorer

    class TokenEnergyExplorer(W.VBox):
        """Step size c, gain spread s, number of steps and the rate; the trajectories below."""

        def __init__(self, c, gamma_spread, steps, rate, block_kwargs):
            self.block_kwargs = block_kwargs
            self.layout_key = object()           # this explorer's frozen layout (see render_png)
            st = {"description_width": "initial"}
            self.c = W.FloatLogSlider(value=c, base=10, min=-2.5, max=2, step=0.1,
                                      description="step size c", style=st)
            self.spread = W.FloatSlider(value=gamma_spread, min=0.0, max=2.0, step=0.1,
                                        description="log-γ spread s", style=st)
            self.steps = W.IntSlider(value=steps, min=1, max=100, description="steps", style=st)
            self.rate = W.Dropdown(options=[("η = c diag(γ)", "gamma"), ("η = c I", "identity")],
                                   value=rate, description="inference rate", style=st)
            finish_explorer(self, [[self.c, self.spread], [self.steps, self.rate]],
                            legend="one line per token, coloured by position (dark: first token) · "
                                   "red dot: that token's energy rose at that step")

        def _redraw(self, change=None):
            png, n, n1 = render_token_energy_png(self.c.value, self.spread.value, self.steps.value,
                                                 self.rate.value, layout_key=(self.layout_key, self.rate.value),
                                                 **self.block_kwargs)
            self.image.value = png
            self.rises, self.first_rises = n, n1
            self.info.value = (f"energy rose at {n} (token, step) pairs; "
                               f"the first token's energy rose at {n1} steps")

        def __repr__(self):
            return (f"TokenEnergyExplorer(c={self.c.value:.3g}, spread={self.spread.value:.3g}, "
                    f"steps={self.steps.value}, rate={self.rate.value!r})")

    return TokenEnergyExplorer


def token_energy_explorer(c: float = 0.1, gamma_spread: float = 1.0, steps: int = 30, rate: str = "gamma",
                          **block_kwargs):
    """The live explorer (ipywidgets; needs a running kernel: Jupyter or Colab)."""
    if rate not in RATE_CHOICES:
        raise ValueError(f"rate must be one of {tuple(RATE_CHOICES)}, got {rate!r}")
    return _explorer_class()(float(c), float(gamma_spread), int(steps), rate, dict(block_kwargs))
