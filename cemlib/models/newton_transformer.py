"""Decoder-only Transformer with standard or Newton attention, for LIS (Transformers as intrinsic
optimizers, §5 and App. A.9).

Token embedding plus absolute sinusoidal positions, ``n_layers`` pre-LayerNorm blocks, final
LayerNorm and a linear head (logits ``(B, L, vocab)``). Each block is attention, then (unless
``ffn=False``, the paper's "attention-only" ablation) a ReLU MLP of width ``4 d``:

- ``attn="mha"``: causal multi-head softmax attention with ``W_Q, W_K, W_V, W_O`` (4 d^2 weights),
  :class:`~cemlib.layers.gpt.CausalSelfAttention`;
- ``attn="mha2nd1st"``: :class:`~cemlib.layers.newton.MHA2nd1st` (eqs. 30-31; no ``W_V``: 3 d^2
  weights plus one temperature per head), causal. The layer returns the stepped state
  ``z'``; the block adds its *update* ``z' - g`` (``g = LN(x)``) to the residual stream, as a
  pre-norm block adds an attention output. The block computes that update with
  :func:`causal_mha2nd1st_update`, the same numbers as ``MHA2nd1st(g, g, causal mask) - g`` from
  ``(L, L)`` matrix products (the RBF logits ``-|q - k|^2 / 2T`` become ``(q.k - |k|^2 / 2) / T``,
  the same softmax), instead of ``(B, L, H, L, d_h)`` difference tensors: several times faster.

Dropout (0.1 in the paper) acts on each block's attention and MLP outputs. The paper does not say
where its normalisation sits; pre-LN is ours.
"""

from __future__ import annotations

import torch
from torch import nn

from cemlib import linalg
from cemlib.layers.cache import DecodeCache, KVCache, visible_keys
from cemlib.layers.gpt import MLP, CausalSelfAttention
from cemlib.layers.newton import MHA2nd1st
from cemlib.models.generation import GenerationMixin, check_decoding
from cemlib.models.hyperset import sinusoidal_positions
from cemlib.utils import check_positive_int, check_token_ids

__all__ = ["NewtonTransformer", "ATTENTIONS", "causal_mha2nd1st_update"]

ATTENTIONS = ("mha", "mha2nd1st")


def causal_mha2nd1st_update(att: MHA2nd1st, g: torch.Tensor, cache: KVCache | None = None) -> torch.Tensor:
    """``att(g, g.unsqueeze(1), causal) - g`` for a sequence ``g`` (B, L, d), by matrix products.

    Per head: ``p = softmax_j((q_i.k_j - |k_j|^2 / 2) / T_h)`` over ``j <= i`` (equal to the RBF
    softmax of ``-|q_i - k_j|^2 / 2T_h``, since ``|q_i|^2`` is constant in ``j``), ``v = q - k_bar``,
    ``Cov_p(k) u = sum_j p_j k_j (k_j.u) - k_bar (k_bar.u)`` (eq. 31); then the corrected update
    ``-sum_h W_O,h (v + Cov v / T_h)`` or the paper's ``+sum_h W_O,h (v + b_h)``.

    ``cache`` (decoding): ``g`` holds the tokens that follow the ``cache.length`` kept ones; their
    keys ``k`` (also the values: ``k_bar`` and ``Cov`` are weighted sums of them) are kept, and
    their queries attend to every kept key.
    """
    q = torch.einsum("hcd,bld->bhlc", att.W_Q, g)                    # (B, H, n, d_h)
    k = torch.einsum("hcd,bld->bhlc", att.W_K, g)
    if cache is not None:
        decoding = cache.length > 0
        kept = cache.append(k=k)["k"]
        if decoding:
            k = kept                                                 # (B, H, L, d_h)
    t = att.T.to(g.dtype).view(1, -1, 1, 1)
    logits = (q @ k.transpose(-1, -2) - 0.5 * k.pow(2).sum(-1).unsqueeze(-2)) / t
    causal = visible_keys(q.shape[2], k.shape[2], device=g.device)
    p = torch.softmax(logits.masked_fill(~causal, float("-inf")), dim=-1)
    kbar = p @ k
    v = q - kbar

    def cov_times(u):
        return (p * (u @ k.transpose(-1, -2))) @ k - kbar * (kbar * u).sum(-1, keepdim=True)

    if att.form == "corrected":
        return -torch.einsum("hdc,bhlc->bld", att.W_O, v + cov_times(v) / t)
    G = att.gram
    u = torch.einsum("hce,bhle->bhlc", G, v)
    b = linalg.solve(G.unsqueeze(1), (cov_times(u) / t).unsqueeze(-1)).squeeze(-1)
    return torch.einsum("hdc,bhlc->bld", att.W_O, v + b)


class _Block(nn.Module):
    def __init__(self, d: int, n_heads: int, attn: str, ffn: bool, dropout: float, form: str):
        super().__init__()
        self.kind = attn
        self.ln1 = nn.LayerNorm(d)
        if attn == "mha":
            self.attn = CausalSelfAttention(d, n_heads, dropout=0.0)
        else:
            self.attn = MHA2nd1st(d, n_heads, form=form)
        self.ln2 = nn.LayerNorm(d) if ffn else None
        self.mlp = MLP(d, 4 * d, act="relu") if ffn else None
        self.drop = nn.Dropout(dropout)

    def forward(self, x: torch.Tensor, cache: KVCache | None = None) -> torch.Tensor:
        g = self.ln1(x)
        if self.kind == "mha":
            upd = self.attn(g, cache=cache)
        else:
            upd = causal_mha2nd1st_update(self.attn, g, cache)
        x = x + self.drop(upd)
        if self.mlp is not None:
            x = x + self.drop(self.mlp(self.ln2(x)))
        return x


class NewtonTransformer(GenerationMixin, nn.Module):
    """``forward(idx (B, L)) -> logits (B, L, vocab_size)``; ``generate`` samples text
    (:func:`cemlib.models.generation.generate`).

    Each block is pre-LayerNorm: ``x = x + attention update of LN(x)`` then ``x = x + MLP(LN(x))``;
    for ``attn="mha2nd1st"`` the update is the Newton layer's stepped state minus its input,
    computed by :func:`causal_mha2nd1st_update`.

    :param vocab_size: token ids ``0 .. vocab_size - 1``.
    :param block_size: the longest sequence (sinusoidal positions).
    :param d_model: the width ``d``.
    :param n_layers: blocks.
    :param n_heads: attention heads.
    :param attn: ``"mha"`` (standard softmax attention) or ``"mha2nd1st"`` (first-order Newton
        attention, :class:`~cemlib.layers.newton.MHA2nd1st`).
    :param ffn: a ReLU MLP of width ``4 d`` after the attention (``False``: attention only).
    :param dropout: dropout on the embeddings and on each block's attention and MLP outputs.
    :param form: ``MHA2nd1st``'s ``form``, ``"corrected"`` or ``"paper"``.
    """

    def __init__(self, vocab_size: int, block_size: int, d_model: int = 64, n_layers: int = 3,
                 n_heads: int = 4, attn: str = "mha", ffn: bool = True, dropout: float = 0.1,
                 form: str = "corrected"):
        super().__init__()
        for v, n in ((vocab_size, "vocab_size"), (block_size, "block_size"), (d_model, "d_model"),
                     (n_layers, "n_layers"), (n_heads, "n_heads")):
            check_positive_int(v, n)
        if attn not in ATTENTIONS:
            raise ValueError(f"attn must be one of {ATTENTIONS}, got {attn!r}")
        self.block_size = block_size
        self.emb = nn.Embedding(vocab_size, d_model)
        self.register_buffer("pos", sinusoidal_positions(block_size, d_model), persistent=False)
        self.drop = nn.Dropout(dropout)
        self.blocks = nn.ModuleList(_Block(d_model, n_heads, attn, ffn, dropout, form)
                                    for _ in range(n_layers))
        self.ln_f, self.head = nn.LayerNorm(d_model), nn.Linear(d_model, vocab_size, bias=False)

    @property
    def context_length(self) -> int:
        """The longest sequence :meth:`forward` accepts (``block_size``)."""
        return self.block_size

    @property
    def vocab_size(self) -> int:
        """The number of token ids (rows of the embedding)."""
        return self.emb.num_embeddings

    def embed(self, idx: torch.Tensor, start: int = 0) -> torch.Tensor:
        """Token embeddings plus sinusoidal positions ``start, start + 1, ...``, then dropout: the
        first block's input."""
        if idx.dim() != 2 or start + idx.shape[1] > self.block_size:
            raise ValueError(f"idx must be (B, L) with {start} + L <= {self.block_size}, got "
                             f"{tuple(idx.shape)}")
        check_token_ids(idx, self.emb.num_embeddings)
        pos = self.pos[start:start + idx.shape[1]]
        return self.drop(self.emb(idx) + pos.to(self.emb.weight.dtype))

    def forward(self, idx: torch.Tensor, cache: DecodeCache | None = None) -> torch.Tensor:
        """Logits (B, L, vocab_size). ``cache`` (decoding, eval mode; :meth:`new_cache`): ``idx``
        holds the tokens that follow the ``cache.length`` kept ones; they are kept and their
        logits returned."""
        start = 0
        if cache is not None:
            check_decoding(self, idx)
            start = cache.position(idx.shape[1], n_layers=len(self.blocks))
        x = self.embed(idx, start)
        for i, blk in enumerate(self.blocks):
            x = blk(x) if cache is None else blk(x, cache=cache.layers[i])
        return self.head(self.ln_f(x))

    def new_cache(self) -> DecodeCache:
        """An empty :class:`~cemlib.layers.cache.DecodeCache`: per block, the keys of its
        attention (``mha2nd1st``: ``k``, H d_h per token; ``mha``: ``k`` and ``v``, 2 d)."""
        return DecodeCache([blk.attn.new_cache(self.block_size) if blk.kind == "mha"
                            else KVCache(self.block_size) for blk in self.blocks], self.block_size)

    def attention_parameters(self) -> int:
        """Weights of the attention layers alone (the paper's "1/4 fewer" is about these)."""
        return sum(p.numel() for b in self.blocks for p in b.attn.parameters())
