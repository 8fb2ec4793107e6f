"""Energy along depth: each model's own energy before and after each of its energy steps.

Chapter 10 trains the four energy-based models of the book on the same data and asks, of each
trained model, whether its forward pass still descends its energy. The four models organise their
steps differently, so :func:`energy_along_depth` records one *step* per energy update, each with
the energy that step is meant to descend, evaluated before and after it, per token:

- :class:`~cemlib.models.lm.LanguageModel` with CEM sublayers (CEM eqs. 2 and 7): per block, the
  attention energy ``eps(x | x)`` at the block input and ``eps(x' | x)`` after the attention update
  (the context frozen at the input, as the update treats it), then the MLP energy ``xi(x' | x')``
  and ``xi(x'' | x')``; a Llama sublayer advances the state without a record. Every layer has its
  own weights, hence its own energy: the records are a chain of descents, not one trajectory.
- :class:`~cemlib.models.nrgpt.NRGPTModel`: the per-token ``E_A(x^(t))`` of its one block, one
  energy for every step (NRGPT eq. 6).
- :class:`~cemlib.models.newton_transformer.NewtonTransformer` with ``attn="mha2nd1st"``: per
  block, the multi-head free energy ``F*(g | g)`` (Theorem 2 of the intrinsic-optimizers paper)
  at ``g = LN(x)`` and ``F*(g + u | g)`` after the block's attention update ``u``, with the causal
  mask the model trains with. The output matrices are trained freely, so descent is not
  guaranteed: that is what the record measures. The ReLU MLP has no energy and is not recorded.
- :class:`~cemlib.models.hyperset.HyperSETModel`: ``E_ATTN + E_FF`` per token (Hyper-SET eqs. 8
  and 10) before and after each iteration, with that iteration's weights.

For the two weight-shared models (NRGPT, Hyper-SET) the steps descend one energy, so the records
join into a trajectory (:meth:`DepthEnergies.trajectory`), and ``n_steps`` may run the block past
its trained depth.

Direction and overshoot. Whether a step lowers the energy mixes two questions: does the step point
downhill, and is it short enough not to overshoot? :func:`energy_along_depth` answers them apart:
``first_order`` is the directional derivative of the step's energy along the step,
``d/ds E(x + s*dx) at s = 0`` per token (autograd, float64; negative where the step points
downhill), next to ``change`` (the actual ``E(x + dx) - E(x)`` of the full step), and
``step_ratio`` is the size of the step against the state it changes, ``|dx| / |x|`` per token.

:func:`energy_along_recursion` follows one CEM layer's *within-layer* recursion instead (CEM eqs.
16-17, Algorithm 1): the energy of the normalised state at every one of its ``T`` steps, per token,
for chapter 4's descent theorem and its counterexamples.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch
from torch import nn

from cemlib.layers.cem_attention import CEMAttention
from cemlib.layers.cem_mlp import CEMMLP
from cemlib.layers.reuse import IncrementDropout, LayerReuse
from cemlib.models.hyperset import HyperSETModel
from cemlib.models.lm import LanguageModel
from cemlib.models.newton_transformer import NewtonTransformer, causal_mha2nd1st_update
from cemlib.models.nrgpt import NRGPTModel
from cemlib.utils import check_positive_int

__all__ = ["DepthEnergies", "energy_along_depth", "ENERGY_MODELS", "RecursionEnergies", "energy_along_recursion"]

#: the model classes :func:`energy_along_depth` accepts
ENERGY_MODELS = (LanguageModel, NRGPTModel, NewtonTransformer, HyperSETModel)


@dataclass(frozen=True)
class DepthEnergies:
    """Per-token energies of every energy step of a forward pass.

    ``before[s]`` and ``after[s]`` (each ``(B, L)``) are step ``s``'s own energy at its input and
    at its output; ``labels[s]`` names the step. ``one_energy`` is true when every step descends the
    same energy (a weight-shared model), so that ``after[s] == before[s + 1]``. ``first_order[s]``
    is the derivative of that energy along the step at its input (its sign is the step's direction:
    negative is downhill), and ``step_ratio[s]`` the step's norm over its input state's norm, per
    token.
    """

    labels: tuple[str, ...]
    before: torch.Tensor
    after: torch.Tensor
    one_energy: bool
    first_order: torch.Tensor | None = None
    step_ratio: torch.Tensor | None = None

    @property
    def change(self) -> torch.Tensor:
        """``after - before`` per step and token, ``(S, B, L)``: negative where the step descends."""
        return self.after - self.before

    def direction_table(self, step: int) -> dict[str, float]:
        """Step ``step``'s tokens split by direction (the sign of ``first_order``) and outcome (the
        sign of ``change``): the fractions ``downhill_descends`` (a descent step that descends),
        ``downhill_overshoots`` (points downhill, rises: too long), ``uphill_rises`` and
        ``uphill_descends`` (points uphill, yet lower at the end); they sum to 1."""
        if self.first_order is None:
            raise ValueError("no first-order record: this DepthEnergies was built without it")
        down, fell = self.first_order[step] < 0, self.change[step] < 0
        frac = lambda m: float(m.double().mean())
        return {"downhill_descends": frac(down & fell), "downhill_overshoots": frac(down & ~fell),
                "uphill_rises": frac(~down & ~fell), "uphill_descends": frac(~down & fell)}

    def trajectory(self) -> torch.Tensor:
        """``E(x^(0)), ..., E(x^(S))``, shape ``(S + 1, B, L)`` (weight-shared models only)."""
        if not self.one_energy:
            raise ValueError("the steps of this model descend different energies (one per layer); "
                             "there is no single trajectory: use before / after per step")
        return torch.cat([self.before, self.after[-1:]])


def _cem_steps(module: nn.Module):
    """The CEM layers inside a sublayer, each with its repeat count (``LayerReuse``), or ``None``
    for a sublayer without an energy (Llama). ``IncrementDropout`` is the identity in eval mode."""
    reps = 1
    if isinstance(module, LayerReuse):
        module, reps = module.step, module.T
    if isinstance(module, IncrementDropout):
        module = module.step
    return (module, reps) if isinstance(module, (CEMAttention, CEMMLP)) else (None, reps)


def _language_model(model: LanguageModel, idx: torch.Tensor):
    steps = []
    x = model.tok_emb(idx)
    for i, block in enumerate(model.blocks, 1):
        for name, sub in (("attention", block.attn), ("MLP", block.mlp)):
            layer, reps = _cem_steps(sub)
            if layer is None:
                x = sub(x)
                continue
            for r in range(reps):
                x1 = layer(x)
                # the attention update holds the context at its input; the MLP's context is its input
                energy = (lambda layer, ctx: lambda s: layer.energy(s, ctx))(layer, x)
                steps.append((f"layer {i} {name}" + (f" (use {r + 1})" if reps > 1 else ""), energy, x, x1))
                x = x1
    if not steps:
        raise ValueError("this LanguageModel has no CEM sublayer, hence no energy to follow")
    return steps, False


def _nrgpt(model: NRGPTModel, idx: torch.Tensor, n_steps: int):
    x, steps = model.embed(idx), []
    for t in range(1, n_steps + 1):            # the states of NRGPTModel.energy_trajectory
        x1 = model.block(x)
        steps.append((f"step {t}", model.block.energy, x, x1))
        x = x1
    return steps, True


def _newton(model: NewtonTransformer, idx: torch.Tensor):
    if model.blocks[0].kind != "mha2nd1st":
        raise ValueError("a NewtonTransformer with attn='mha' has no energy to follow")
    L = idx.shape[1]
    causal = torch.ones(L, L, dtype=torch.bool, device=idx.device).tril()
    x = model.embed(idx)
    steps = []
    for i, blk in enumerate(model.blocks, 1):
        g = blk.ln1(x)
        u = causal_mha2nd1st_update(blk.attn, g)
        h = g.unsqueeze(-3)                                   # every token's particles: (B, 1, L, d)
        energy = (lambda attn, h: lambda s: attn.energy(s, h, causal))(blk.attn, h)
        steps.append((f"layer {i} attention", energy, g, g + u))
        x = blk(x)
    return steps, False


def _hyperset(model: HyperSETModel, x: torch.Tensor, n_steps: int):
    X0 = model.embed_inputs(x)
    X, steps = X0, []
    for t in range(n_steps):
        tw = min(t, model.n_iter - 1)                         # past the trained depth: the last weights
        X1 = model.layer(X, t, X0)
        energy = (lambda tw: lambda s: sum(model.layer.energies(s, tw)))(tw)
        steps.append((f"iteration {t + 1}", energy, X, X1))
        X = X1
    return steps, True


def _first_order(energy: Callable, x0: torch.Tensor, dx: torch.Tensor) -> torch.Tensor:
    """``d/ds energy(x0 + s dx)`` at ``s = 0``, per token: the Jacobian-vector product ``J dx`` of
    the per-token energies, by reverse mode applied twice (``g(v) = J^T v`` is linear in ``v``, so
    the gradient of ``<g(v), dx>`` with respect to ``v`` is ``J dx``; the energies' custom autograd
    functions support double backward but not forward-mode transforms)."""
    with torch.enable_grad():
        x = x0.detach().requires_grad_(True)
        E = energy(x)
        v = torch.zeros_like(E, requires_grad=True)
        (g,) = torch.autograd.grad(E, x, v, create_graph=True)
        (jdx,) = torch.autograd.grad(g, v, dx.detach())
    return jdx.detach()


@torch.no_grad()
def energy_along_depth(model: nn.Module, inputs: torch.Tensor, n_steps: int | None = None) -> DepthEnergies:
    """Each energy step's own per-token energy before and after it, on ``inputs`` (token ids
    ``(B, L)``; patches for an image Hyper-SET). The model runs in eval mode (its mode is restored).

    ``n_steps``: the number of recurrent steps for a weight-shared model (NRGPT, Hyper-SET; default
    the trained number; more shows the behaviour past the trained depth); a layered model accepts
    only ``None``.
    """
    if not isinstance(model, ENERGY_MODELS):
        raise TypeError(f"model must be one of {', '.join(c.__name__ for c in ENERGY_MODELS)}, got "
                        f"{type(model).__name__}")
    recurrent = isinstance(model, (NRGPTModel, HyperSETModel))
    if n_steps is not None and not recurrent:
        raise ValueError(f"n_steps applies to a weight-shared model; {type(model).__name__} has "
                         f"{len(model.blocks)} layers of its own")
    if recurrent and n_steps is None:
        n_steps = model.n_steps if isinstance(model, NRGPTModel) else model.n_iter
    if recurrent:
        check_positive_int(n_steps, "n_steps")
    was_training = model.training
    model.eval()
    try:
        if isinstance(model, LanguageModel):
            out = _language_model(model, inputs)
        elif isinstance(model, NRGPTModel):
            out = _nrgpt(model, inputs, n_steps)
        elif isinstance(model, NewtonTransformer):
            out = _newton(model, inputs)
        else:
            out = _hyperset(model, inputs, n_steps)
        steps, one = out
        before = torch.stack([f(x0) for _, f, x0, _ in steps])
        after = torch.stack([f(x1) for _, f, _, x1 in steps])
        first = torch.stack([_first_order(f, x0, x1 - x0) for _, f, x0, x1 in steps])
        ratio = torch.stack([(x1 - x0).norm(dim=-1) / x0.norm(dim=-1) for _, _, x0, x1 in steps])
    finally:
        model.train(was_training)
    return DepthEnergies(tuple(lab for lab, *_ in steps), before, after, one, first, ratio)


# ------------------------------------------------------------------------------ within one layer
@dataclass(frozen=True)
class RecursionEnergies:
    """A CEM layer's recursion (CEM eqs. 16-17) on a context ``h``: ``energies[t]`` is the layer's
    energy of its normalised state ``E(RMSNorm(x^(t)) | h)`` per token, ``t = 0..T`` (shape
    ``(T + 1, B, L)``), and ``growth`` is ``|x^(T)| / |h|`` per token."""

    energies: torch.Tensor
    growth: torch.Tensor
    eta: float

    @property
    def rises(self) -> torch.Tensor:
        """Per token: whether the energy rose at some step (by more than ``1e-12`` relative to the
        energy's scale, so that round-off is not counted)."""
        tol = 1e-12 * self.energies.abs().amax(0).clamp_min(1.0)
        return ((self.energies[1:] - self.energies[:-1]) > tol).any(0)

    @property
    def share_rising(self) -> float:
        """The share of tokens whose energy rises at some step of the recursion."""
        return float(self.rises.double().mean())

    @property
    def mean_change(self) -> float:
        """The mean over tokens of ``E(x^(T)) - E(x^(0))``."""
        return float((self.energies[-1] - self.energies[0]).mean())


@torch.no_grad()
def energy_along_recursion(layer: nn.Module, h: torch.Tensor, eta: float | None = None) -> RecursionEnergies:
    """Run ``layer`` (a :class:`~cemlib.layers.cem_attention.CEMAttention` or
    :class:`~cemlib.layers.cem_mlp.CEMMLP` with ``T`` recursion steps) on ``h`` and record its own
    energy at every step. ``eta``: the step size to use (default: the layer's; the layer is left
    as it was).

    With query RMSNorm, a uniform gain, no preconditioner and the exact gradient
    (``diag_grad="exact"``), attention lowers this energy at every step for every step size
    (chapter 4's theorem); ``diag_grad="paper"`` (Algorithm 1 as printed) with a nonzero diagonal
    breaks it, and so do a non-uniform gain and the MLP energy."""
    if not isinstance(layer, (CEMAttention, CEMMLP)):
        raise TypeError(f"layer must be a CEMAttention or CEMMLP, got {type(layer).__name__}")
    old = layer.eta
    if eta is not None:
        if isinstance(old, torch.Tensor):
            raise ValueError("this layer learns its step size: set it on the layer, not through eta")
        layer.eta = float(eta)
    try:
        _, traj = layer(h, return_trajectory=True)
        energies = torch.stack([layer.energy(x, h) for x in traj])
        used = float(layer.eta)
    finally:
        layer.eta = old
    return RecursionEnergies(energies, traj[-1].norm(dim=-1) / h.norm(dim=-1), used)
