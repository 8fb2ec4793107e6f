"""Llama baselines with the same conventions as the CEM layers: untied attention (RoPE or ALiBi)
and the SwiGLU gated MLP (CEM eq. 1 and eq. 6).

Both return the *sublayer output* (the residual branch), to be wrapped by
:class:`cemlib.layers.reuse.ResidualSublayer` (``x + f(RMSNorm(x))``), whereas the CEM layers
return the updated stream. Attention scale ``1/sqrt(D_r)`` ([arXiv] eq. 1); ALiBi with
``-m_k|i-j|``, ``m_k = 2^{-8k/K}`` for every K (as in CEM attention); RoPE in the Llama/HF "rotate-half" layout.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from cemlib.kernels.reference import alibi_slopes, attention_bias, refresh_alibi_buffer
from cemlib.layers.cache import KVCache
from cemlib.positional import apply_rope, rope_angles  # re-exported: the baseline's RoPE
from cemlib.utils import check_positive_int, check_tensor, resolve_head_dim

__all__ = ["rope_angles", "apply_rope", "LlamaAttention", "SwiGLU"]

POSITIONS = ("rope", "alibi", "none")


class LlamaAttention(nn.Module):
    """Causal multi-head attention with untied ``W_Q, W_K, W_V, W_O`` (CEM eq. 1).

    ``forward(x)`` takes the *normalised* stream (B, L, D_h) and returns only the attention output
    (B, L, D_h), the residual branch. In a standard pre-norm block:
    ``x = x + attn(norm(x))``, which is what :class:`~cemlib.layers.reuse.ResidualSublayer` does.

    :param d_model: the width ``D_h``.
    :param n_heads: heads ``K``.
    :param head_dim: per-head width ``D_r`` (default ``D_h / K``).
    :param pos: ``"rope"`` (rotary, the default), ``"alibi"`` or ``"none"``.
    :param rope_base: the RoPE frequency base.
    :param init_std: standard deviation of the initial weights.
    """

    def __init__(self, d_model: int, n_heads: int, head_dim: int | None = None, *,
                 pos: str = "rope", rope_base: float = 10000.0, init_std: float = 0.02):
        super().__init__()
        head_dim = resolve_head_dim(d_model, n_heads, head_dim)
        if pos not in POSITIONS:
            raise ValueError(f"pos must be one of {POSITIONS}, got {pos!r}")
        if pos == "rope" and head_dim % 2:
            raise ValueError(f"RoPE needs an even head_dim, got {head_dim}")
        self.d_model, self.n_heads, self.head_dim, self.pos = d_model, n_heads, head_dim, pos
        self.rope_base = rope_base
        inner = n_heads * head_dim
        self.W_Q = nn.Parameter(torch.randn(inner, d_model) * init_std)
        self.W_K = nn.Parameter(torch.randn(inner, d_model) * init_std)
        self.W_V = nn.Parameter(torch.randn(inner, d_model) * init_std)
        self.W_O = nn.Parameter(torch.randn(inner, d_model) * init_std)  # enters as W_O^T (eq. 1)
        if pos == "alibi":
            self.register_buffer("alibi", alibi_slopes(n_heads).to(torch.get_default_dtype()),
                                 persistent=False)

    def _apply(self, fn, recurse=True):
        super()._apply(fn, recurse)
        refresh_alibi_buffer(self)  # exact slopes in the new dtype (see CEMAttention)
        return self

    def forward(self, x: torch.Tensor, cache: KVCache | None = None) -> torch.Tensor:
        """``sum_k W_O^kT sum_j alpha_kij v_j^k`` for normalised input ``x`` (B, L, D_h).

        ``cache`` (decoding): ``x`` holds the tokens at positions ``cache.length ...``; their
        rotated keys and values are kept, and their queries attend to every kept token."""
        check_tensor(x, "x", ndim=3, last_dim=self.d_model, finite=False)
        B, L, _ = x.shape
        K, R = self.n_heads, self.head_dim
        start = 0 if cache is None else cache.length
        q, k, v = ((x @ W.T).view(B, L, K, R).transpose(1, 2) for W in (self.W_Q, self.W_K, self.W_V))
        if self.pos == "rope":
            cos, sin = rope_angles(start + L, R, self.rope_base, device=x.device, dtype=x.dtype)
            q, k = apply_rope(q, cos[start:], sin[start:]), apply_rope(k, cos[start:], sin[start:])
        if cache is not None:
            kept = cache.append(k=k, v=v)
            if start > 0:  # the new queries against every kept key
                mask = attention_bias(start + L, K if self.pos == "alibi" else 1,
                                      alibi=self.alibi if self.pos == "alibi" else None,
                                      dtype=x.dtype, device=x.device, n_queries=L)
                o = F.scaled_dot_product_attention(q, kept["k"], kept["v"], attn_mask=mask[None])
                return o.transpose(1, 2).reshape(B, L, K * R) @ self.W_O
        if self.pos == "alibi":
            mask = attention_bias(L, K, alibi=self.alibi, dtype=x.dtype, device=x.device)
            o = F.scaled_dot_product_attention(q, k, v, attn_mask=mask[None])
        else:
            o = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return o.transpose(1, 2).reshape(B, L, K * R) @ self.W_O

    def new_cache(self, capacity: int) -> KVCache:
        """An empty :class:`~cemlib.layers.cache.KVCache` for :meth:`forward`: the rotated keys
        ``k`` and the values ``v`` (2 K D_r per token)."""
        return KVCache(capacity)

    def extra_repr(self) -> str:
        return f"d_model={self.d_model}, n_heads={self.n_heads}, head_dim={self.head_dim}, pos={self.pos!r}"


class SwiGLU(nn.Module):
    """Llama gated MLP ``W_down (SiLU(W_gate x) * W_up x)`` (CEM eq. 6 with sigma = SiLU, Llama
    naming: the SiLU acts on ``gate``; CEM eq. 6 calls that branch "up").

    ``forward(x)`` takes the normalised stream (..., D_h) and returns only the MLP output
    (..., D_h), the residual branch: ``x = x + mlp(norm(x))`` in a pre-norm block.

    :param d_model: the width ``D_h``.
    :param d_ff: the hidden width.
    :param init_std: standard deviation of the initial weights.
    """

    def __init__(self, d_model: int, d_ff: int, *, init_std: float = 0.02):
        super().__init__()
        check_positive_int(d_model, "d_model")
        check_positive_int(d_ff, "d_ff")
        self.d_model, self.d_ff = d_model, d_ff
        self.W_gate = nn.Parameter(torch.randn(d_ff, d_model) * init_std)
        self.W_up = nn.Parameter(torch.randn(d_ff, d_model) * init_std)
        self.W_down = nn.Parameter(torch.randn(d_model, d_ff) * init_std)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        check_tensor(x, "x", last_dim=self.d_model, finite=False)
        return (F.silu(x @ self.W_gate.T) * (x @ self.W_up.T)) @ self.W_down.T

    def extra_repr(self) -> str:
        return f"d_model={self.d_model}, d_ff={self.d_ff}"
