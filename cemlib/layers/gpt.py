"""Standard GPT blocks, the baselines of NRGPT (Dehmamy et al. 2025, NRGPT, §2, §3).

- :class:`GPTBlock`: the sequential pre-LN block ``x' = x + AT(LN1 x)``, ``x'' = x' + FF(LN2 x')``.
  (NRGPT eq. (4) as printed, ``x + FF(LN(x + AT(LN x)))``, drops the attention output from the
  residual stream; this is the standard form it means.)
- :class:`ParallelGPTBlock`: GPT-J / PaLM, eq. (5): ``x + AT(g) + FF(g)`` with one ``g = LN(x)``.
- :class:`RecurrentGPT`: one parallel block applied ``n_steps`` times with shared weights
  (the paper's GPT_Rec_parallel baseline).

These are not energy layers (their attention is untied and their MLP is not a gradient); they
exist so that NRGPT can be compared with them at equal parameter count.

Biases: with ``bias=True`` (the default, as in nanoGPT) the attention's
fused ``qkv`` projection has 3D biases and its output projection D, and the MLP's two layers M and
D; eq. (9) writes the attention without them. ``bias=False`` gives the bias-free form.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from cemlib.layers.cache import KVCache, visible_keys
from cemlib.utils import check_positive_int, check_tensor, resolve_head_dim

__all__ = ["CausalSelfAttention", "MLP", "GPTBlock", "ParallelGPTBlock", "RecurrentGPT"]


class CausalSelfAttention(nn.Module):
    """Multi-head causal softmax attention, eq. (9): ``sum_h W^P_h^T V_h SM(K_h^T Q_Ah)``, scale
    ``1/sqrt(D/H)``, self-inclusive causal mask. With ``bias=True`` (default) the q/k/v projection
    (``qkv``, one Linear) and the output projection (``proj``) have biases, which eq. (9) does not.

    ``forward(x)`` takes the normalised stream (B, L, D) and returns only the attention output
    (B, L, D), the residual branch: ``x = x + attn(ln(x))`` in a pre-norm block (:class:`GPTBlock`).

    :param d_model: the width ``D``.
    :param n_heads: heads ``H`` (``D`` divisible by ``H``).
    :param dropout: dropout on the attention weights and on the output, in training mode.
    :param bias: biases on the fused ``qkv`` and output projections.
    """

    def __init__(self, d_model: int, n_heads: int, dropout: float = 0.0, bias: bool = True):
        super().__init__()
        resolve_head_dim(d_model, n_heads, explicit_ok=False)
        self.d_model, self.n_heads, self.dropout = d_model, n_heads, float(dropout)
        self.qkv = nn.Linear(d_model, 3 * d_model, bias=bias)
        self.proj = nn.Linear(d_model, d_model, bias=bias)
        self.resid_dropout = nn.Dropout(dropout)

    def forward(self, x: torch.Tensor, cache: KVCache | None = None) -> torch.Tensor:
        """The attention output (B, L, D). ``cache`` (decoding): ``x`` holds the tokens that
        follow the ``cache.length`` kept ones; their keys and values are kept, and their queries
        attend to every kept token."""
        check_tensor(x, "x", ndim=3, last_dim=self.d_model, finite="where_free")
        B, L, D = x.shape
        q, k, v = self.qkv(x).split(D, dim=-1)
        q, k, v = (t.view(B, L, self.n_heads, D // self.n_heads).transpose(1, 2) for t in (q, k, v))
        dropout_p = self.dropout if self.training else 0.0
        decoding = cache is not None and cache.length > 0
        if cache is not None:
            kept = cache.append(k=k, v=v)
        if decoding:  # the new queries against every kept key
            k, v = kept["k"], kept["v"]
            mask = visible_keys(L, k.shape[2], device=x.device)
            o = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=dropout_p)
        else:
            o = F.scaled_dot_product_attention(q, k, v, is_causal=True, dropout_p=dropout_p)
        return self.resid_dropout(self.proj(o.transpose(1, 2).reshape(B, L, D)))

    def new_cache(self, capacity: int) -> KVCache:
        """An empty :class:`~cemlib.layers.cache.KVCache` for :meth:`forward`: keys ``k`` and
        values ``v`` (2 D per token)."""
        return KVCache(capacity)


class MLP(nn.Module):
    """``W2^T sigma(W1 g)`` (with biases), hidden width ``ff_hidden`` (default 4D); ReLU as in the
    authors' baselines, or GELU.

    ``forward(x)`` returns only the MLP output (same shape as ``x``), the residual branch:
    ``x = x + mlp(ln(x))`` in a pre-norm block.

    :param d_model: the width ``D``.
    :param ff_hidden: the hidden width (default ``4 D``).
    :param act: ``"relu"`` or ``"gelu"``.
    :param dropout: dropout on the output, in training mode.
    :param bias: biases on both linear maps.
    """

    def __init__(self, d_model: int, ff_hidden: int | None = None, act: str = "relu",
                 dropout: float = 0.0, bias: bool = True):
        super().__init__()
        if act not in ("relu", "gelu"):
            raise ValueError(f"act must be 'relu' or 'gelu', got {act!r}")
        M = check_positive_int(4 * d_model if ff_hidden is None else ff_hidden, "ff_hidden")
        self.fc = nn.Linear(d_model, M, bias=bias)
        self.out = nn.Linear(M, d_model, bias=bias)
        self.act = nn.ReLU() if act == "relu" else nn.GELU()
        self.drop = nn.Dropout(dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.drop(self.out(self.act(self.fc(x))))


class GPTBlock(nn.Module):
    """Sequential pre-LN GPT-2 block (the corrected eq. 4).

    ``forward(x)`` returns the block's output stream ``x' + MLP(LN2 x')`` with
    ``x' = x + Attn(LN1 x)`` (B, L, D): the residuals and norms are inside, stack it as
    ``x = block(x)``.

    :param d_model: the width ``D``.
    :param n_heads: attention heads.
    :param ff_hidden: the MLP hidden width (default ``4 D``).
    :param act: the MLP activation, ``"relu"`` or ``"gelu"``.
    :param dropout: dropout in attention and MLP, in training mode.
    :param bias: biases on every linear map.
    """

    def __init__(self, d_model: int, n_heads: int, ff_hidden: int | None = None, act: str = "relu",
                 dropout: float = 0.0, bias: bool = True):
        super().__init__()
        self.ln1, self.ln2 = nn.LayerNorm(d_model), nn.LayerNorm(d_model)
        self.attn = CausalSelfAttention(d_model, n_heads, dropout, bias)
        self.mlp = MLP(d_model, ff_hidden, act, dropout, bias)

    def forward(self, x: torch.Tensor, cache: KVCache | None = None) -> torch.Tensor:
        """The block's output stream; ``cache`` (decoding) is the attention's."""
        x = x + self.attn(self.ln1(x), cache=cache)
        return x + self.mlp(self.ln2(x))

    def new_cache(self, capacity: int) -> KVCache:
        """The attention's decode cache."""
        return self.attn.new_cache(capacity)


class ParallelGPTBlock(nn.Module):
    """GPT-J-style parallel block, eq. (5): ``x + AT(LN x) + FF(LN x)`` with one shared LayerNorm.

    ``forward(x)`` returns the block's output stream (B, L, D), residual and norm inside: stack it
    as ``x = block(x)``. The options ``d_model``, ``n_heads``, ``ff_hidden``, ``act``,
    ``dropout`` and ``bias`` are :class:`GPTBlock`'s.
    """

    def __init__(self, d_model: int, n_heads: int, ff_hidden: int | None = None, act: str = "relu",
                 dropout: float = 0.0, bias: bool = True):
        super().__init__()
        self.ln = nn.LayerNorm(d_model)
        self.attn = CausalSelfAttention(d_model, n_heads, dropout, bias)
        self.mlp = MLP(d_model, ff_hidden, act, dropout, bias)

    def forward(self, x: torch.Tensor, cache: KVCache | None = None) -> torch.Tensor:
        """The block's output stream; ``cache`` (decoding) is the attention's."""
        g = self.ln(x)
        return x + self.attn(g, cache=cache) + self.mlp(g)

    def new_cache(self, capacity: int) -> KVCache:
        """The attention's decode cache."""
        return self.attn.new_cache(capacity)


RECURRENT_BLOCKS = {"parallel": ParallelGPTBlock, "sequential": GPTBlock}


class RecurrentGPT(nn.Module):
    """One block applied ``n_steps`` times with shared weights: ``block="parallel"`` is a
    :class:`ParallelGPTBlock` (the authors' ``GPT_Rec_parallel``, the paper's baseline),
    ``"sequential"`` a :class:`GPTBlock` (their ``GPT_Rec``, "RGPT").

    ``forward(x, n_steps=None)`` returns the stream after ``n_steps`` applications (default: the
    constructor's), same shape as ``x``; residuals and norms are inside the block: use it as
    ``x = rgpt(x)``.

    :param d_model: the width ``D``.
    :param n_heads: attention heads.
    :param n_steps: applications of the block (>= 1).
    :param block: ``"parallel"`` or ``"sequential"``.
    :param block_kwargs: further options of the block (``ff_hidden``, ``act``, ``dropout``, ``bias``).
    """

    def __init__(self, d_model: int, n_heads: int, n_steps: int, block: str = "parallel", **block_kwargs):
        super().__init__()
        self.n_steps = check_positive_int(n_steps, "n_steps")
        if block not in RECURRENT_BLOCKS:
            raise ValueError(f"block must be one of {tuple(RECURRENT_BLOCKS)}, got {block!r}")
        self.block_kind = block
        self.block = RECURRENT_BLOCKS[block](d_model, n_heads, **block_kwargs)

    def forward(self, x: torch.Tensor, n_steps: int | None = None, cache: list | None = None) -> torch.Tensor:
        """The stream after ``n_steps`` applications; ``cache`` (decoding) holds one decode cache
        per application (each computes its keys from a new state)."""
        n = check_positive_int(self.n_steps if n_steps is None else n_steps, "n_steps")
        if cache is not None and len(cache) != n:
            raise ValueError(f"cache holds {len(cache)} steps' caches, the block runs {n} steps")
        for t in range(n):
            x = self.block(x, cache=None if cache is None else cache[t])
        return x

    def new_cache(self, capacity: int, n_steps: int | None = None) -> list:
        """One decode cache per application of the block (``n_steps``, default the constructor's)."""
        return [self.block.new_cache(capacity) for _ in range(self.n_steps if n_steps is None else n_steps)]
