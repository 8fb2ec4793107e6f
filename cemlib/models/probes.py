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
"""

from __future__ import annotations

from dataclasses import dataclass

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

__all__ = ["DepthEnergies", "energy_along_depth", "ENERGY_MODELS"]

#: the model classes :func:`energy_along_depth` accepts
ENERGY_MODELS = (LanguageModel, NRGPTModel, NewtonTransformer, HyperSETModel)


@dataclass(frozen=True)
class DepthEnergies:
    """Per-token energies of every energy step of a forward pass.

    ``before[s]`` and ``after[s]`` (each ``(B, L)``) are step ``s``'s own energy at its input and
    at its output; ``labels[s]`` names the step. ``one_energy`` is true when every step descends the
    same energy (a weight-shared model), so that ``after[s] == before[s + 1]``.
    """

    labels: tuple[str, ...]
    before: torch.Tensor
    after: torch.Tensor
    one_energy: bool

    @property
    def change(self) -> torch.Tensor:
        """``after - before`` per step and token, ``(S, B, L)``: negative where the step descends."""
        return self.after - self.before

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
    labels, before, after = [], [], []
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
                before.append(layer.energy(x, x))
                after.append(layer.energy(x1, x))
                labels.append(f"layer {i} {name}" + (f" (use {r + 1})" if reps > 1 else ""))
                x = x1
    if not labels:
        raise ValueError("this LanguageModel has no CEM sublayer, hence no energy to follow")
    return labels, before, after, False


def _nrgpt(model: NRGPTModel, idx: torch.Tensor, n_steps: int):
    E = model.energy_trajectory(idx, n_steps)
    return [f"step {t}" for t in range(1, n_steps + 1)], list(E[:-1]), list(E[1:]), True


def _newton(model: NewtonTransformer, idx: torch.Tensor):
    if model.blocks[0].kind != "mha2nd1st":
        raise ValueError("a NewtonTransformer with attn='mha' has no energy to follow")
    L = idx.shape[1]
    causal = torch.ones(L, L, dtype=torch.bool, device=idx.device).tril()
    x = model.embed(idx)
    labels, before, after = [], [], []
    for i, blk in enumerate(model.blocks, 1):
        g = blk.ln1(x)
        u = causal_mha2nd1st_update(blk.attn, g)
        h = g.unsqueeze(-3)                                   # every token's particles: (B, 1, L, d)
        before.append(blk.attn.energy(g, h, causal))
        after.append(blk.attn.energy(g + u, h, causal))
        labels.append(f"layer {i} attention")
        x = blk(x)
    return labels, before, after, False


def _hyperset(model: HyperSETModel, x: torch.Tensor, n_steps: int):
    X0 = model.embed_inputs(x)
    X, labels, before, after = X0, [], [], []
    for t in range(n_steps):
        tw = min(t, model.n_iter - 1)                         # past the trained depth: the last weights
        X1 = model.layer(X, t, X0)
        before.append(sum(model.layer.energies(X, tw)))
        after.append(sum(model.layer.energies(X1, tw)))
        labels.append(f"iteration {t + 1}")
        X = X1
    return labels, before, after, True


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
    finally:
        model.train(was_training)
    labels, before, after, one = out
    return DepthEnergies(tuple(labels), torch.stack(before), torch.stack(after), one)
