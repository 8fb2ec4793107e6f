"""Residual MLP regressors for the CEM recursion experiment on GP data (CEM [ICLR] §5.4, Table 3).

``x (B, d_in) -> Linear -> h (B, D_h) -> n_layers residual MLP blocks -> RMSNorm -> Linear -> (B, d_out)``
with the block one of

- ``"plain"``: ``h + W_2 SiLU(W_1 RMSNorm(h) + b_1) + b_2`` (Table 3's "Plain");
- ``"gated"``: ``h + W_down (SiLU(W_gate g) * W_up g)``, ``g = RMSNorm(h)`` (SwiGLU, "Gated");
- ``"cem"``: :class:`~cemlib.layers.cem_mlp.CEMMLP`, ``T`` recursive gradient steps on the
  element-wise energy (eqs. 7-8, 17), whose tied weights are 2/3 of the gated block's ("CEM-T").

The paper gives no architecture ("the latent state dimension is set equal to the model
dimension"); depth, widths and the input/output maps are ours and are arguments.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from cemlib.layers.cem_mlp import CEMMLP
from cemlib.layers.llama import SwiGLU
from cemlib.layers.norm import RMSNorm
from cemlib.utils import check_positive_int

__all__ = ["MLPRegressor", "MLP_KINDS", "regressor_matmul_flops"]

MLP_KINDS = ("plain", "gated", "cem")


class _PlainBlock(nn.Module):
    def __init__(self, d: int, d_ff: int):
        super().__init__()
        self.norm, self.fc1, self.fc2 = RMSNorm(d), nn.Linear(d, d_ff), nn.Linear(d_ff, d)

    def forward(self, h):
        return h + self.fc2(F.silu(self.fc1(self.norm(h))))


class _BiasedSwiGLU(nn.Module):
    """SwiGLU with a bias on each of its three projections (init as :class:`SwiGLU`, zero biases)."""

    def __init__(self, d: int, d_ff: int, init_std: float = 0.02):
        super().__init__()
        self.gate, self.up, self.down = nn.Linear(d, d_ff), nn.Linear(d, d_ff), nn.Linear(d_ff, d)
        for lin in (self.gate, self.up, self.down):
            nn.init.normal_(lin.weight, std=init_std)
            nn.init.zeros_(lin.bias)

    def forward(self, x):
        return self.down(F.silu(self.gate(x)) * self.up(x))


class _GatedBlock(nn.Module):
    def __init__(self, d: int, d_ff: int, bias: bool = False):
        super().__init__()
        self.norm, self.mlp = RMSNorm(d), (_BiasedSwiGLU(d, d_ff) if bias else SwiGLU(d, d_ff))

    def forward(self, h):
        return h + self.mlp(self.norm(h))


class MLPRegressor(nn.Module):
    """``mlp`` in ``MLP_KINDS``; ``d_ff`` is the hidden width (``d_v`` for the CEM MLP);
    ``T`` the CEM recursion depth (``mlp="cem"`` only); ``bias`` adds biases to the gated block's
    three projections (the plain block always has them; the CEM block never does). With
    ``d_model=64``, ``d_ff=170`` and ``in_dim=10`` the counts are 33,941 (gated, ``bias=True``) and
    22,657 (CEM), Table 3's 33.94K and 22.66K; the plain block with ``d_ff=256`` has 33,985 (33.98K).

    ``forward(x)`` (B, in_dim) returns predictions (B, out_dim). The plain and gated blocks are
    pre-norm residual blocks ``h + f(RMSNorm(h))``; the CEM block is the
    :class:`~cemlib.layers.cem_mlp.CEMMLP` itself
    (``h = mlp(h)``: it returns ``h`` plus its update and normalises inside).

    :param in_dim: input features.
    :param out_dim: outputs.
    :param d_model: the width ``D_h`` of the residual stream.
    :param d_ff: the block's hidden width.
    :param mlp: ``"plain"``, ``"gated"`` or ``"cem"``.
    :param T: the CEM recursion depth.
    :param n_layers: residual blocks.
    :param check_finite: the CEM MLP rejects NaN/Inf input.
    :param bias: biases on the gated block's projections.
    """

    def __init__(self, in_dim: int, out_dim: int = 1, d_model: int = 64, d_ff: int = 172,
                 mlp: str = "gated", T: int = 1, n_layers: int = 1, check_finite: bool = False,
                 bias: bool = False):
        super().__init__()
        for v, n in ((in_dim, "in_dim"), (out_dim, "out_dim"), (d_model, "d_model"), (d_ff, "d_ff"),
                     (T, "T"), (n_layers, "n_layers")):
            check_positive_int(v, n)
        if mlp not in MLP_KINDS:
            raise ValueError(f"mlp must be one of {MLP_KINDS}, got {mlp!r}")
        if mlp == "cem" and bias:
            raise ValueError("bias=True applies to the gated block; the CEM block (tied W, V) has no biases")
        if mlp != "cem" and T != 1:
            raise ValueError(f"T = {T} is the CEM recursion depth; the {mlp!r} block has no recursion")
        self.mlp, self.T = mlp, T
        self.inp = nn.Linear(in_dim, d_model)

        def block():
            if mlp == "cem":
                return CEMMLP(d_model, d_ff, T=T, check_finite=check_finite)
            return _PlainBlock(d_model, d_ff) if mlp == "plain" else _GatedBlock(d_model, d_ff, bias)
        self.blocks = nn.ModuleList(block() for _ in range(n_layers))
        self.norm, self.out = RMSNorm(d_model), nn.Linear(d_model, out_dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.inp(x)
        for blk in self.blocks:
            h = blk(h)  # CEMMLP returns x^(T), the state after T steps (residual included)
        return self.out(self.norm(h))


def regressor_matmul_flops(in_dim: int, d_model: int, d_ff: int, mlp: str = "gated", T: int = 1,
                           out_dim: int = 1, n_layers: int = 1, batch: int = 1) -> int:
    """The matrix-product FLOPs of :class:`MLPRegressor` on ``batch`` inputs, in closed form (what
    :func:`cemlib.kernels.costs.count_flops` counts of a forward pass):
    ``2 B (d_in D_h + D_h d_out + L F_block)`` with ``F_block`` = ``2 D_h d_ff`` (plain),
    ``3 D_h d_ff`` (gated) or ``D_h d_ff (1 + 2T)`` (CEM: ``gamma = W RMSNorm(h)`` once, then
    ``V u`` and ``V^T (.)`` at each of the T steps). Affine in T for the CEM block."""
    if mlp not in MLP_KINDS:
        raise ValueError(f"mlp must be one of {MLP_KINDS}, got {mlp!r}")
    block = {"plain": 2, "gated": 3, "cem": 1 + 2 * T}[mlp] * d_model * d_ff
    return 2 * batch * (in_dim * d_model + d_model * out_dim + n_layers * block)
