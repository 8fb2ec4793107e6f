"""Transformer blocks: the CEM block (Algorithm 1) and the Llama block.

Both are ``x -> mlp_step(attn_step(x))`` on the un-normalised residual stream, where each step maps
stream -> stream: for CEM the layer's T-step update (its residual is built into the update), for
Llama ``x + f(RMSNorm(x))``, optionally reused T times (plain layer reuse).
"""

from __future__ import annotations

import torch
from torch import nn

from cemlib.layers.cem_attention import CEMAttention
from cemlib.layers.cem_mlp import CEMMLP
from cemlib.layers.llama import LlamaAttention, SwiGLU
from cemlib.layers.reuse import LayerReuse, ResidualSublayer

__all__ = ["Block", "CEMBlock", "LlamaBlock"]


class Block(nn.Module):
    """``mlp_step(attn_step(x))`` for any two stream -> stream modules.

    ``forward(x)`` returns the block's output stream (same shape as ``x``). The two steps carry
    their own residual connection and normalisation (the pre-norm convention lives inside them:
    :class:`~cemlib.layers.reuse.ResidualSublayer` for Llama branches, built in for the CEM layers),
    so a model stacks blocks as ``x = block(x)``.

    :param attn: the attention step, stream -> stream.
    :param mlp: the MLP step, stream -> stream.
    """

    def __init__(self, attn: nn.Module, mlp: nn.Module):
        super().__init__()
        self.attn, self.mlp = attn, mlp

    def forward(self, x: torch.Tensor, cache=None) -> torch.Tensor:
        """``mlp(attn(x))``; ``cache`` (decoding) is the attention step's decode cache (the MLP
        acts on each token alone and keeps nothing)."""
        return self.mlp(self.attn(x) if cache is None else self.attn(x, cache=cache))

    def new_cache(self, capacity: int):
        """The attention step's decode cache (a ``KVCache``, or a list under plain reuse)."""
        return self.attn.new_cache(capacity)


class CEMBlock(Block):
    """CEM Algorithm 1: ``CEMAttention`` (T_eps steps on eq. 2) then ``CEMMLP`` (T_xi steps on eq. 7).

    ``forward(x)`` returns ``mlp(attn(x))``, the block's output stream (B, L, D_h): each CEM layer
    returns its input plus its update and normalises its own query, so this *is* the pre-norm
    block; stack it as ``x = block(x)``, with no extra residual or norm around it.
    :meth:`energies` reports both energies before and after their sublayer.

    :param d_model: the width ``D_h``.
    :param n_heads: attention heads ``K``.
    :param d_v: the CEM MLP width.
    :param T_attn: recursion steps of the attention (``T_eps``).
    :param T_mlp: recursion steps of the MLP (``T_xi``).
    :param attn_kwargs: further options of :class:`~cemlib.layers.cem_attention.CEMAttention`.
    :param mlp_kwargs: further options of :class:`~cemlib.layers.cem_mlp.CEMMLP`.
    """

    def __init__(self, d_model: int, n_heads: int, d_v: int, *, T_attn: int = 1, T_mlp: int = 1,
                 attn_kwargs: dict | None = None, mlp_kwargs: dict | None = None):
        super().__init__(CEMAttention(d_model, n_heads, T=T_attn, **(attn_kwargs or {})),
                         CEMMLP(d_model, d_v, T=T_mlp, **(mlp_kwargs or {})))

    @torch.no_grad()
    def energies(self, x: torch.Tensor) -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
        """Per-token ``{"attn": (eps(x|x), eps(x'|x)), "mlp": (xi(x'|x'), xi(x''|x'))}``."""
        x1 = self.attn(x)
        x2 = self.mlp(x1)
        return {"attn": (self.attn.energy(x, x), self.attn.energy(x1, x)),
                "mlp": (self.mlp.energy(x1, x1), self.mlp.energy(x2, x1))}


class LlamaBlock(Block):
    """Pre-norm Llama block: ``x + Attn(RMSNorm(x))`` then ``x + SwiGLU(RMSNorm(x))``; with
    ``reuse_attn`` / ``reuse_mlp`` > 1 each residual sublayer is applied that many times.

    ``forward(x)`` returns the block's output stream (B, L, D_h); stack it as ``x = block(x)``.

    :param d_model: the width ``D_h``.
    :param n_heads: attention heads.
    :param d_ff: the SwiGLU hidden width.
    :param pos: positions of the attention, ``"rope"``, ``"alibi"`` or ``"none"``.
    :param reuse_attn: applications of the attention sublayer (plain layer reuse).
    :param reuse_mlp: applications of the MLP sublayer.
    :param norm_eps: the RMSNorms' epsilon.
    :param init_std: standard deviation of the initial weights.
    """

    def __init__(self, d_model: int, n_heads: int, d_ff: int, *, pos: str = "rope",
                 reuse_attn: int = 1, reuse_mlp: int = 1, norm_eps: float = 1e-6,
                 init_std: float = 0.02):
        attn = ResidualSublayer(LlamaAttention(d_model, n_heads, pos=pos, init_std=init_std),
                                d_model, norm_eps)
        mlp = ResidualSublayer(SwiGLU(d_model, d_ff, init_std=init_std), d_model, norm_eps)
        super().__init__(LayerReuse(attn, reuse_attn), LayerReuse(mlp, reuse_mlp))
