"""Tokens on a circle under Hyper-SET's attention and feed-forward flows, CEM's attention flow for
comparison, their small multiples, an animation and a live explorer (the Hyper-SET chapter; Hu et
al. 2025, arXiv:2502.11646, §4, Fig. 1).

The state is ``N`` tokens in the plane (``d = 2``, one head with ``W = I``, so ``p = 2``), started as
a seeded cluster of directions. One iteration applies, depending on ``flow``:

- ``"attention"``: Hyper-SET's normalised bi-softmax step (eq. 9),
  ``x <- x - alpha sum_h W_h (softmax_row + softmax_col)(beta U U^T) U`` with ``U = RMSNorm(x)``
  (:class:`~cemlib.layers.hyperset.BiSoftmaxAttention`): repulsion, the tokens spread;
- ``"feedforward"``: the tied ReLU step (eq. 11) towards ``M`` anchor directions ``D``
  (:class:`~cemlib.layers.hyperset.TiedReLUFeedForward`): alignment;
- ``"both"``: attention then feed-forward (the alternating iteration of eq. 6);
- ``"cem"``: CEM's causal attention step on the same tokens, ``x_i <- x_i - eta grad eps(x_i | h)``
  with ``h = x`` (keys held fixed during the step), ``W_Q = W_K = I`` and ``tau = 1/beta``
  (:func:`cemlib.energies.cem.interaction_energy_grad`): attraction.

After each step the tokens are put back on the unit circle (``retract=True``, the default), so
that the picture shows directions, the only thing the normalised updates see; with
``retract=False`` the raw update is kept (its norm drifts: eq. 9 is not a Riemannian step). The
explorer needs a running kernel; its static companions are :func:`circle_flow_small_multiples` and
:func:`circle_flow_animation` (a JavaScript player via :func:`cemlib.viz.landscape.animation_html`).
"""

from __future__ import annotations

import functools
import math

import torch

from cemlib.energies import cem as cem_energies
from cemlib.layers.hyperset import BiSoftmaxAttention, TiedReLUFeedForward
from cemlib.metrics import average_angle
from cemlib.utils import check_positive_int

__all__ = ["FLOWS", "circle_tokens", "circle_anchors", "circle_flow", "plot_circle_flow",
           "circle_flow_small_multiples", "circle_flow_animation", "render_circle_flow_png",
           "circle_flow_explorer"]

FLOWS = {"attention": "Hyper-SET attention (repulsive)", "feedforward": "Hyper-SET feed-forward",
         "both": "attention + feed-forward", "cem": "CEM attention (attractive)"}


def circle_tokens(n_tokens: int = 12, spread: float = 0.6, seed: int = 0, dtype=torch.float64):
    """``n_tokens`` unit vectors whose angles are ``N(0, spread^2)`` around the x-axis, sorted by
    angle (a seeded cluster)."""
    check_positive_int(n_tokens, "n_tokens")
    g = torch.Generator().manual_seed(seed)
    theta = torch.sort(spread * torch.randn(n_tokens, generator=g, dtype=dtype)).values
    return torch.stack([torch.cos(theta), torch.sin(theta)], -1)


def circle_anchors(n_anchors: int = 3, offset: float = 0.5 * math.pi, dtype=torch.float64):
    """``D (2, M)``: ``M`` evenly spaced unit anchor directions starting at ``offset``."""
    check_positive_int(n_anchors, "n_anchors")
    phi = offset + 2 * math.pi * torch.arange(n_anchors, dtype=dtype) / n_anchors
    return torch.stack([torch.cos(phi), torch.sin(phi)])


def _layers(beta: float, anchors: torch.Tensor):
    attn = BiSoftmaxAttention(2, 1, beta=beta).to(anchors.dtype)
    ff = TiedReLUFeedForward(2, anchors.shape[1]).to(anchors.dtype)
    with torch.no_grad():
        attn.W.copy_(torch.eye(2, dtype=anchors.dtype))
        ff.D.copy_(anchors)
    return attn, ff


def circle_flow(x0: torch.Tensor, flow: str = "attention", beta: float = 1.0, step: float = 0.1,
                steps: int = 30, anchors: torch.Tensor | None = None, retract: bool = True) -> dict:
    """Run ``steps`` iterations from ``x0 (N, 2)``; returns ``states (steps+1, N, 2)``, the
    per-state Hyper-SET energies ``attention_energy``, ``ff_energy`` (summed over tokens, at the
    normalised projections) and the average angle (eq. 18, degrees)."""
    if flow not in FLOWS:
        raise ValueError(f"flow must be one of {tuple(FLOWS)}, got {flow!r}")
    if x0.dim() != 2 or x0.shape[-1] != 2:
        raise ValueError(f"x0 must be (N, 2), got {tuple(x0.shape)}")
    if not (math.isfinite(beta) and beta > 0 and math.isfinite(step)):
        raise ValueError(f"beta must be positive and step finite, got beta={beta!r}, step={step!r}")
    check_positive_int(steps, "steps")
    anchors = circle_anchors(dtype=x0.dtype) if anchors is None else anchors.to(x0.dtype)
    attn, ff = _layers(beta, anchors)
    eye = torch.eye(2, dtype=x0.dtype)[None]
    states, x = [x0], x0
    with torch.no_grad():
        for _ in range(steps):
            if flow in ("attention", "both"):
                x = attn(x, step)
            if flow in ("feedforward", "both"):
                x = ff(x, step)
            if flow == "cem":
                h = x[None]
                x = x - step * cem_energies.interaction_energy_grad(h, h, eye, eye, tau=1.0 / beta)[0]
            if retract:
                x = x / x.norm(dim=-1, keepdim=True)
            states.append(x)
        S = torch.stack(states)
        ea = torch.stack([attn.energy(s).sum() for s in S])
        ef = torch.stack([ff.energy(s).sum() for s in S])
    return {"states": S, "attention_energy": ea, "ff_energy": ef, "angle": average_angle(S),
            "anchors": anchors}


def plot_circle_flow(ax, run: dict, title: str | None = None, show_anchors: bool = True):
    """Unit circle, each token's path of directions (thin), start (open) and end (filled) points,
    and the anchors (arrows) when the flow used them."""
    import numpy as np

    S = run["states"]
    U = (S / S.norm(dim=-1, keepdim=True)).numpy()
    t = np.linspace(0, 2 * np.pi, 200)
    ax.plot(np.cos(t), np.sin(t), color="0.75", lw=0.8)
    N = U.shape[1]
    colors = [__import__("matplotlib").colormaps["viridis"](k / max(N - 1, 1)) for k in range(N)]
    for k in range(N):
        ax.plot(U[:, k, 0], U[:, k, 1], color=colors[k], lw=0.9, alpha=0.8)
        ax.plot(U[0, k, 0], U[0, k, 1], "o", mfc="none", mec=colors[k], ms=4)
        ax.plot(U[-1, k, 0], U[-1, k, 1], "o", color=colors[k], ms=5)
    if show_anchors:
        for a in run["anchors"].T.numpy():
            ax.annotate("", xy=1.25 * a, xytext=(0, 0), arrowprops=dict(arrowstyle="->", color="C3", lw=1.2))
    ax.set(xlim=(-1.35, 1.35), ylim=(-1.35, 1.35), aspect="equal", xticks=[], yticks=[])
    ax.set_xlabel(f"angle {run['angle'][0].item():.0f}° → {run['angle'][-1].item():.0f}°")
    if title:
        ax.set_title(title)


def circle_flow_small_multiples(betas=(0.5, 2.0), flows=("attention", "feedforward", "both", "cem"),
                                step: float = 0.1, steps: int = 30, n_tokens: int = 12, seed: int = 0,
                                figsize=None):
    """Static companion of the explorer: rows = ``betas``, columns = ``flows``, the same starting
    tokens in every panel; returns ``(fig, angles)`` with ``angles[beta][flow] = (start, end)``."""
    import matplotlib.pyplot as plt

    x0 = circle_tokens(n_tokens, seed=seed)
    rows, cols = len(betas), len(flows)
    fig, axes = plt.subplots(rows, cols, figsize=figsize or (2.5 * cols, 2.7 * rows), squeeze=False,
                             layout="constrained")
    angles = {}
    for i, b in enumerate(betas):
        angles[b] = {}
        for j, f in enumerate(flows):
            run = circle_flow(x0, f, b, step, steps)
            angles[b][f] = (run["angle"][0].item(), run["angle"][-1].item())
            plot_circle_flow(axes[i, j], run, title=f"{FLOWS[f]}\n" + rf"$\beta={b:g}$",
                             show_anchors=f in ("feedforward", "both"))
    return fig, angles


#: short panel titles for the animation (three panels side by side)
SHORT_FLOWS = {"attention": "Hyper-SET attention", "feedforward": "Hyper-SET feed-forward",
               "both": "attention + feed-forward", "cem": "CEM attention"}


def circle_flow_animation(beta: float = 1.0, step: float = 0.1, steps: int = 30,
                          flows=("attention", "both", "cem"), n_tokens: int = 12, seed: int = 0,
                          figsize=(7.5, 3.1), dpi: int = 100, interval: int = 150):
    """A ``FuncAnimation`` with one frame per iteration, one panel per flow (the same start): short
    panel titles, the iteration ``t`` in the figure's title (turn it into a player with
    :func:`cemlib.viz.landscape.animation_html`; at its default dpi a frame is about 700 px wide)."""
    from matplotlib.animation import FuncAnimation
    from matplotlib.figure import Figure

    x0 = circle_tokens(n_tokens, seed=seed)
    runs = [circle_flow(x0, f, beta, step, steps) for f in flows]
    fig = Figure(figsize=figsize, dpi=dpi, layout="constrained")
    axes = fig.subplots(1, len(flows), squeeze=False)[0]

    title = fig.suptitle("")

    def draw(frame: int):
        for ax, f, run in zip(axes, flows, runs):
            ax.clear()
            part = dict(run, states=run["states"][: frame + 1], angle=run["angle"][: frame + 1])
            plot_circle_flow(ax, part, title=SHORT_FLOWS[f], show_anchors=f in ("feedforward", "both"))
        title.set_text(rf"iteration $t = {frame}$ of {steps} ($\beta={beta:g}$, step ${step:g}$)")
        return []

    return FuncAnimation(fig, draw, frames=steps + 1, interval=interval, blit=False)


def render_circle_flow_png(flow: str, beta: float, step: float, steps: int, n_tokens: int = 12,
                           seed: int = 0, figsize=(4.2, 4.0), dpi: int = 80, layout_key=None) -> tuple[bytes, dict]:
    """One panel as PNG bytes (for the explorer) and its run (``layout_key``: see
    :func:`cemlib.viz.style.render_png`)."""
    from cemlib.viz.style import render_png

    run = circle_flow(circle_tokens(n_tokens, seed=seed), flow, beta, step, steps)
    png, _ = render_png(lambda fig: plot_circle_flow(
        fig.subplots(), run, title=rf"{FLOWS[flow]}, $\beta={beta:.3g}$, step ${step:.3g}$",
        show_anchors=flow in ("feedforward", "both")), figsize, dpi, layout_key)
    return png, run


@functools.lru_cache(maxsize=None)
def _explorer_class():
    import ipywidgets as W

    from cemlib.viz.widgets import finish_explorer

    class CircleFlowExplorer(W.VBox):
        """Sliders for beta, step size, steps, number of tokens; the flow; the picture below."""

        def __init__(self, flow, beta, step, steps, n_tokens, seed):
            self.seed = seed
            self.layout_key = object()           # this explorer's frozen layout (see render_png)
            st = {"description_width": "initial"}
            self.beta = W.FloatLogSlider(value=beta, base=10, min=-1, max=1, step=0.05,
                                         description="β (inverse temp.)", style=st)
            self.step = W.FloatLogSlider(value=step, base=10, min=-2.5, max=0.5, step=0.05,
                                         description="step size α = γ", style=st)
            self.steps = W.IntSlider(value=steps, min=1, max=100, description="steps", style=st)
            self.n = W.IntSlider(value=n_tokens, min=2, max=40, description="tokens N", style=st)
            self.flow = W.Dropdown(options=[(v, k) for k, v in FLOWS.items()], value=flow,
                                   description="flow", style=st)
            finish_explorer(self, [[self.beta, self.step, self.flow], [self.steps, self.n]],
                            legend="each token's direction on the unit circle: ○ start · ● end · thin line: its path "
                                   "· arrows: the feed-forward's anchor directions")

        def _redraw(self, change=None):
            png, run = render_circle_flow_png(self.flow.value, self.beta.value, self.step.value,
                                              self.steps.value, self.n.value, self.seed, layout_key=self.layout_key)
            self.image.value = png
            ea, ef = run["attention_energy"], run["ff_energy"]
            self.info.value = (f"average angle {run['angle'][0].item():.1f}° → {run['angle'][-1].item():.1f}°; "
                               f"E_ATTN {ea[0].item():.3f} → {ea[-1].item():.3f}; "
                               f"E_FF {ef[0].item():.3f} → {ef[-1].item():.3f}")

        def __repr__(self):
            return (f"CircleFlowExplorer(flow={self.flow.value!r}, beta={self.beta.value:.3g}, "
                    f"step={self.step.value:.3g}, steps={self.steps.value}, tokens={self.n.value})")

    return CircleFlowExplorer


def circle_flow_explorer(flow: str = "attention", beta: float = 1.0, step: float = 0.1, steps: int = 30,
                         n_tokens: int = 12, seed: int = 0):
    """The live explorer (ipywidgets; needs a running kernel: Jupyter or Colab)."""
    if flow not in FLOWS:
        raise ValueError(f"flow must be one of {tuple(FLOWS)}, got {flow!r}")
    return _explorer_class()(flow, float(beta), float(step), int(steps), int(n_tokens), int(seed))
