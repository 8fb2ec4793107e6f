"""Recurrent-depth Hyper-SET model (Hu et al. 2025, §4, App. D): embed, iterate one layer, head.

Inputs are either integer tokens ``(B, N)`` (``vocab_size``; e.g. Sudoku: 81 cells, digits 0-9
with 0 = blank) or patch vectors ``(B, N, patch_dim)`` (images). The same
:class:`~cemlib.layers.hyperset.HyperSETLayer` is applied ``n_iter`` times (more at test time for
extrapolation, unless depth-wise LoRA fixes the depth). The head is ``LayerNorm -> Linear``:

- ``pool="none"``: per-token logits ``(B, N, n_classes)`` (Sudoku);
- ``pool="mean"``: mean over tokens, logits ``(B, n_classes)``;
- ``pool="cls"``: a learnable CLS token is prepended; its final state gives ``(B, n_classes)``.

:meth:`HyperSETModel.trajectory` records every state and the per-sample energies ``E_ATTN`` and
``E_FF`` (normalised, as in the paper's Fig. 5) at every iteration.
"""

from __future__ import annotations

import math

import torch
from torch import nn

from cemlib.layers import hyperset as hl
from cemlib.layers import hyperset_variants as hv
from cemlib.utils import check_positive_int, check_tensor

__all__ = ["HyperSETModel", "ATTENTIONS", "FEEDFORWARDS", "sinusoidal_positions"]

ATTENTIONS = {"bisoftmax": hl.BiSoftmaxAttention, "sigmoid": hv.SigmoidAttention,
              "linear": hv.LinearAttention}
FEEDFORWARDS = {"relu": hl.TiedReLUFeedForward, "softmax": hv.SoftmaxFeedForward,
                "gated": hv.GatedFeedForward}


def sinusoidal_positions(n: int, d: int) -> torch.Tensor:
    """Absolute sinusoidal positional encoding (Vaswani et al.), shape ``(n, d)``."""
    pos = torch.arange(n, dtype=torch.float64)[:, None]
    i = torch.arange(0, d, 2, dtype=torch.float64)
    ang = pos * torch.exp(-math.log(10000.0) * i / d)
    pe = torch.zeros(n, d, dtype=torch.float64)
    pe[:, 0::2] = torch.sin(ang)
    pe[:, 1::2] = torch.cos(ang[:, : d // 2])
    return pe.float()


class HyperSETModel(nn.Module):
    """Embedding, ``n_iter`` iterations of one Hyper-SET layer, and a classification head."""

    def __init__(self, *, d: int, n_heads: int, n_iter: int, n_classes: int, n_positions: int,
                 vocab_size: int | None = None, patch_dim: int | None = None,
                 ff_dim: int | None = None, pool: str = "none", positional: str = "learned",
                 attention: str = "bisoftmax", feedforward: str = "relu",
                 step_size: float | None = None, condition: str = "x0", freq_dim: int = 512,
                 lora_rank: int = 0, lora_scale: float = 4.0):
        super().__init__()
        for v, n in ((d, "d"), (n_heads, "n_heads"), (n_iter, "n_iter"), (n_classes, "n_classes"),
                     (n_positions, "n_positions")):
            check_positive_int(v, n)
        if (vocab_size is None) == (patch_dim is None):
            raise ValueError("give exactly one of vocab_size (tokens) or patch_dim (patches)")
        if pool not in ("none", "mean", "cls"):
            raise ValueError(f"pool must be 'none', 'mean' or 'cls', got {pool!r}")
        if positional not in ("learned", "sinusoidal"):
            raise ValueError(f"positional must be 'learned' or 'sinusoidal', got {positional!r}")
        for kind, table, what in ((attention, ATTENTIONS, "attention"),
                                  (feedforward, FEEDFORWARDS, "feedforward")):
            if kind not in table:
                raise ValueError(f"unknown {what} {kind!r}; choose from {sorted(table)}")
        self.d, self.n_iter, self.pool, self.n_positions = d, n_iter, pool, n_positions
        self.vocab_size, self.patch_dim = vocab_size, patch_dim
        if vocab_size is not None:
            self.embed = nn.Embedding(check_positive_int(vocab_size, "vocab_size"), d)
        else:
            self.embed = nn.Linear(check_positive_int(patch_dim, "patch_dim"), d)
        n_tok = n_positions + (pool == "cls")
        if positional == "learned":
            self.pos = nn.Parameter(0.02 * torch.randn(n_tok, d))
        else:
            self.register_buffer("pos", sinusoidal_positions(n_tok, d))
        self.cls = nn.Parameter(0.02 * torch.randn(d)) if pool == "cls" else None
        attn = ATTENTIONS[attention](d, n_heads)
        ff = FEEDFORWARDS[feedforward](d, ff_dim)
        lora = None
        if lora_rank:
            lora = hv.DepthwiseLoRA(d, attn.W.shape[1], ff.ff_dim, n_iter, lora_rank, lora_scale)
        self.layer = hl.HyperSETLayer(attn, ff, step_size, condition, freq_dim, lora)
        self.head = nn.Sequential(nn.LayerNorm(d), nn.Linear(d, n_classes))

    def embed_inputs(self, x: torch.Tensor) -> torch.Tensor:
        """``x(0)``: token or patch embedding plus positions (CLS prepended if ``pool="cls"``)."""
        if self.vocab_size is not None:
            if x.dim() != 2 or x.dtype not in (torch.int64, torch.int32):
                raise ValueError(f"token input must be an integer tensor (B, N), got "
                                 f"{tuple(x.shape)} {x.dtype}")
            if x.numel() and (x.min() < 0 or x.max() >= self.vocab_size):
                raise ValueError(f"token ids must be in [0, {self.vocab_size}), got range "
                                 f"[{int(x.min())}, {int(x.max())}]")
        else:
            check_tensor(x, "patches", ndim=3, last_dim=self.patch_dim)
        if x.shape[1] != self.n_positions:
            raise ValueError(f"expected {self.n_positions} tokens per sample, got {x.shape[1]}")
        X = self.embed(x)
        if self.cls is not None:
            X = torch.cat([self.cls.expand(X.shape[0], 1, -1).to(X.dtype), X], dim=1)
        return X + self.pos.to(X.dtype)

    def _n_iter(self, n_iter):
        return self.n_iter if n_iter is None else check_positive_int(n_iter, "n_iter")

    def head_logits(self, X: torch.Tensor) -> torch.Tensor:
        if self.pool == "mean":
            X = X.mean(1)
        elif self.pool == "cls":
            X = X[:, 0]
        return self.head(X)

    def forward(self, x: torch.Tensor, n_iter: int | None = None) -> torch.Tensor:
        X0 = self.embed_inputs(x)
        X = X0
        for t in range(self._n_iter(n_iter)):
            X = self.layer(X, t, X0)
        return self.head_logits(X)

    @torch.no_grad()
    def trajectory(self, x: torch.Tensor, n_iter: int | None = None) -> dict:
        """States ``(T+1, B, N, d)`` and per-sample energies ``(T+1, B)`` at each iteration.

        The energy at state ``t`` uses the weights of iteration ``t`` (those of the last
        iteration for the final state when depth-wise LoRA is on).
        """
        X0 = self.embed_inputs(x)
        states, X = [X0], X0
        T = self._n_iter(n_iter)
        for t in range(T):
            X = self.layer(X, t, X0)
            states.append(X)
        ea, ef = zip(*(self.layer.energies(s, min(t, T - 1)) for t, s in enumerate(states)))
        return {"states": torch.stack(states), "attention_energy": torch.stack(ea).sum(-1),
                "ff_energy": torch.stack(ef).sum(-1), "logits": self.head_logits(X)}

    def num_parameters(self, trainable_only: bool = True) -> int:
        return sum(p.numel() for p in self.parameters() if p.requires_grad or not trainable_only)
