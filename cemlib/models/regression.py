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

__all__ = ["MLPRegressor", "MLP_KINDS"]

MLP_KINDS = ("plain", "gated", "cem")


class _PlainBlock(nn.Module):
    def __init__(self, d: int, d_ff: int):
        super().__init__()
        self.norm, self.fc1, self.fc2 = RMSNorm(d), nn.Linear(d, d_ff), nn.Linear(d_ff, d)

    def forward(self, h):
        return h + self.fc2(F.silu(self.fc1(self.norm(h))))


class _GatedBlock(nn.Module):
    def __init__(self, d: int, d_ff: int):
        super().__init__()
        self.norm, self.mlp = RMSNorm(d), SwiGLU(d, d_ff)

    def forward(self, h):
        return h + self.mlp(self.norm(h))


class MLPRegressor(nn.Module):
    """``mlp`` in :data:`MLP_KINDS`; ``d_ff`` is the hidden width (``d_v`` for the CEM MLP);
    ``T`` the CEM recursion depth (``mlp="cem"`` only)."""

    def __init__(self, in_dim: int, out_dim: int = 1, d_model: int = 64, d_ff: int = 172,
                 mlp: str = "gated", T: int = 1, n_layers: int = 1, check_finite: bool = False):
        super().__init__()
        for v, n in ((in_dim, "in_dim"), (out_dim, "out_dim"), (d_model, "d_model"), (d_ff, "d_ff"),
                     (T, "T"), (n_layers, "n_layers")):
            check_positive_int(v, n)
        if mlp not in MLP_KINDS:
            raise ValueError(f"mlp must be one of {MLP_KINDS}, got {mlp!r}")
        if mlp != "cem" and T != 1:
            raise ValueError(f"T = {T} is the CEM recursion depth; the {mlp!r} block has no recursion")
        self.mlp, self.T = mlp, T
        self.inp = nn.Linear(in_dim, d_model)

        def block():
            if mlp == "cem":
                return CEMMLP(d_model, d_ff, T=T, check_finite=check_finite)
            return _PlainBlock(d_model, d_ff) if mlp == "plain" else _GatedBlock(d_model, d_ff)
        self.blocks = nn.ModuleList(block() for _ in range(n_layers))
        self.norm, self.out = RMSNorm(d_model), nn.Linear(d_model, out_dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.inp(x)
        for blk in self.blocks:
            h = blk(h)  # CEMMLP returns x^(T), the state after T steps (residual included)
        return self.out(self.norm(h))
