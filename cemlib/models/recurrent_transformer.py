"""The recurrent-Transformer baseline of Hyper-SET's experiments (Hu et al. 2025, arXiv:2502.11646, §5): one
pre-LayerNorm Transformer layer (bidirectional multi-head softmax attention with ``W_Q, W_K, W_V,
W_O``, then a ReLU MLP, each with a residual connection) applied ``n_iter`` times with shared
weights, inside exactly the embedding, positions and head of
:class:`~cemlib.models.hyperset.HyperSETModel`, so that the two differ only in the iterated layer.

It is not an energy model: it has no :meth:`trajectory` energies.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from cemlib.layers.gpt import MLP
from cemlib.models.hyperset import HyperSETModel
from cemlib.utils import resolve_head_dim

__all__ = ["RecurrentTransformer", "TransformerLayer"]


class TransformerLayer(nn.Module):
    """``x + MHA(LN x)``, then ``+ MLP(LN x)``; called as ``layer(X, t, X0)`` like Hyper-SET's
    layer (``t`` and ``X0`` are unused: the same weights at every iteration, no conditioning).

    ``forward(X, t=0, X0=None)`` returns the next state (..., N, d), residuals and norms inside:
    iterate it as ``X = layer(X, t, X0)``.

    :param d: the token width.
    :param n_heads: attention heads (bidirectional).
    :param ff_dim: the MLP width (default ``4 d``).
    :param norm: ``"layernorm"`` or ``"rmsnorm"``.
    :param bias: biases in every linear map.
    """

    def __init__(self, d: int, n_heads: int, ff_dim: int | None = None, norm: str = "layernorm",
                 bias: bool = True):
        super().__init__()
        resolve_head_dim(d, n_heads, explicit_ok=False)
        if norm not in ("layernorm", "rmsnorm"):
            raise ValueError(f"norm must be 'layernorm' or 'rmsnorm', got {norm!r}")
        self.n_heads = n_heads
        Norm = nn.LayerNorm if norm == "layernorm" else nn.RMSNorm
        self.ln1, self.ln2 = Norm(d), Norm(d)
        self.qkv, self.proj = nn.Linear(d, 3 * d, bias=bias), nn.Linear(d, d, bias=bias)
        self.mlp = MLP(d, ff_dim if ff_dim is not None else 4 * d, act="relu", bias=bias)

    def forward(self, X: torch.Tensor, t: int = 0, X0: torch.Tensor | None = None) -> torch.Tensor:
        B, N, D = X.shape
        q, k, v = self.qkv(self.ln1(X)).split(D, dim=-1)
        q, k, v = (u.view(B, N, self.n_heads, D // self.n_heads).transpose(1, 2) for u in (q, k, v))
        o = F.scaled_dot_product_attention(q, k, v).transpose(1, 2).reshape(B, N, D)
        X = X + self.proj(o)
        return X + self.mlp(self.ln2(X))


class RecurrentTransformer(HyperSETModel):
    """Same arguments as :class:`~cemlib.models.hyperset.HyperSETModel` minus the Hyper-SET-specific
    ones (attention and feed-forward kind, step sizes, LoRA, gains); ``ff_dim`` defaults to ``4 d``.
    ``norm="rmsnorm"`` and ``bias=False`` give the authors' baseline layer (pre-RMSNorm, no biases);
    ``head``, ``patch_embed`` and ``init_std`` are ``HyperSETModel``'s.

    ``forward(x)`` returns logits as ``HyperSETModel``'s does; the iterated
    :class:`~cemlib.models.recurrent_transformer.TransformerLayer` is a standard pre-norm layer (``x + MHA(LN x)``, then
    ``+ MLP(LN x)``) that returns the next state.

    :param d: the token width.
    :param n_heads: attention heads.
    :param n_iter: iterations of the layer.
    :param n_classes: classes per position or per example.
    :param n_positions: tokens per example.
    :param vocab_size: for token inputs (give this or ``patch_dim``).
    :param patch_dim: for patch inputs.
    :param ff_dim: the MLP width (default ``4 d``).
    :param pool: ``"none"``, ``"mean"`` or ``"cls"``.
    :param positional: ``"learned"`` or ``"sinusoidal"``.
    :param norm: ``"layernorm"`` or ``"rmsnorm"``.
    :param bias: biases in the layer's linear maps.
    :param head: ``"layernorm"`` or ``"rmsnorm"``.
    :param patch_embed: ``"linear"`` or ``"ln_linear_ln"``.
    :param init_std: ``None`` or the initial weights' standard deviation.
    """

    def __init__(self, *, d: int, n_heads: int, n_iter: int, n_classes: int, n_positions: int,
                 vocab_size: int | None = None, patch_dim: int | None = None,
                 ff_dim: int | None = None, pool: str = "none", positional: str = "learned",
                 norm: str = "layernorm", bias: bool = True, head: str = "layernorm",
                 patch_embed: str = "linear", init_std: float | None = None):
        super().__init__(d=d, n_heads=n_heads, n_iter=n_iter, n_classes=n_classes,
                         n_positions=n_positions, vocab_size=vocab_size, patch_dim=patch_dim,
                         pool=pool, positional=positional, head=head, patch_embed=patch_embed)
        self.layer = TransformerLayer(d, n_heads, ff_dim, norm=norm, bias=bias)
        self.init_std = init_std
        if init_std is not None:
            self.normal_init(init_std)

    def trajectory(self, x, n_iter=None):
        raise NotImplementedError("the recurrent Transformer is not an energy model: no energies")
