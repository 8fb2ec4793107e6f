"""Positions: rotary position embeddings (RoPE; Su et al. 2021), shared by the Llama baseline
(:mod:`cemlib.layers.llama`) and the RoPE form of the CEM interaction energy
(:mod:`cemlib.energies.cem`, CEM Appendix B), and the additive logit biases of CEM attention --
ALiBi slopes (Press et al. 2022), the self/cross biases and the causal mask -- used by the CEM
energy, the attention layers and the kernels' reference (:mod:`cemlib.kernels.reference`).

This module imports nothing from cemlib, so every layer of the package can use it."""

from __future__ import annotations

import math

import torch

__all__ = ["rope_angles", "apply_rope", "ALIBI_RECIPES", "alibi_slopes", "refresh_alibi_buffer",
           "attention_bias"]


def rope_angles(L: int, dim: int, base: float = 10000.0, device=None, dtype=torch.float32):
    """``(cos, sin)`` of shape (L, dim) for rotary embeddings (frequencies ``base^{-2m/dim}``)."""
    if dim % 2:
        raise ValueError(f"RoPE needs an even head dimension, got {dim}")
    inv = base ** (-torch.arange(0, dim, 2, device=device, dtype=torch.float64) / dim)
    ang = torch.arange(L, device=device, dtype=torch.float64)[:, None] * inv[None, :]
    ang = torch.cat([ang, ang], dim=-1)
    return ang.cos().to(dtype), ang.sin().to(dtype)


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate ``x`` (..., L, D) position-wise: ``x cos + rotate_half(x) sin``."""
    x1, x2 = x.chunk(2, dim=-1)
    return x * cos + torch.cat([-x2, x1], dim=-1) * sin


ALIBI_RECIPES = ("geometric", "interleaved")


def alibi_slopes(n_heads: int, recipe: str = "geometric") -> torch.Tensor:
    """ALiBi slopes ``m_k`` of heads ``k = 1..K`` as a float64 tensor of shape (K,).

    ``recipe="geometric"`` (cemlib's choice, used by every layer): ``m_k = 2^(-8k/K)`` for every
    ``K``, the geometric sequence that starts at ``2^(-8/K)`` with that same ratio -- the rule the
    ALiBi paper states for any number of heads (Press et al. 2022, section 3) and the "geometric
    sequence" of CEM Appendix B (whose example ``2^-k`` is this rule at ``K = 8`` only).

    ``recipe="interleaved"``: the workaround of the ALiBi reference code (also used by BLOOM and
    MPT) for ``K`` not a power of two: the geometric slopes of the largest power of two
    ``p < K``, followed by every other slope of ``2p`` heads. It equals ``"geometric"`` when ``K``
    is a power of two and differs otherwise (by up to 0.49 at ``K = 6`` and 0.69 at ``K = 12``).
    """
    if isinstance(n_heads, bool) or int(n_heads) != n_heads or n_heads < 1:
        raise ValueError(f"n_heads must be a positive integer, got {n_heads!r}")
    n_heads = int(n_heads)
    if recipe not in ALIBI_RECIPES:
        raise ValueError(f"recipe must be one of {ALIBI_RECIPES}, got {recipe!r}")

    def geometric(n):
        return [2.0 ** (-8.0 * k / n) for k in range(1, n + 1)]

    if recipe == "geometric" or math.log2(n_heads).is_integer():
        s = geometric(n_heads)
    else:
        p = 2 ** math.floor(math.log2(n_heads))
        s = geometric(p) + geometric(2 * p)[0::2][: n_heads - p]
    return torch.tensor(s, dtype=torch.float64)


def refresh_alibi_buffer(module) -> None:
    """Recompute ``module.alibi`` (slopes of ``module.n_heads`` heads) in the buffer's current
    dtype and device, so that a layer converted to float64 holds the float64 slopes, not float32
    slopes widened (which are off by about 1e-8 relative). Layers call it after ``_apply``."""
    buf = getattr(module, "alibi", None)
    if isinstance(buf, torch.Tensor) and buf.is_floating_point() and buf.device.type != "meta":
        module.alibi = alibi_slopes(module.n_heads).to(dtype=buf.dtype, device=buf.device)


def attention_bias(L: int, n_heads: int, *, alibi: torch.Tensor | None = None,
                   self_bias: torch.Tensor | None = None, cross_bias: torch.Tensor | None = None,
                   dtype=torch.float32, device=None, n_queries: int | None = None) -> torch.Tensor:
    """Additive logit bias of shape (K, L, L), ``-inf`` above the diagonal (causal mask).

    ``n_queries``: the queries are the last ``n_queries`` of the ``L`` positions (decoding with a
    cache: new tokens against every kept key); the result is then (K, n_queries, L), the last
    ``n_queries`` rows of the square bias."""
    n = L if n_queries is None else n_queries
    if n_queries is not None and (isinstance(n, bool) or not isinstance(n, int) or not 1 <= n <= L):
        raise ValueError(f"n_queries must be an integer in 1..L={L}, got {n_queries!r}")
    i, j = torch.arange(L - n, L, device=device), torch.arange(L, device=device)
    dist = (i[:, None] - j[None, :]).to(dtype)  # i - j >= 0 on the allowed part
    bias = torch.zeros(n_heads, n, L, dtype=dtype, device=device)
    if alibi is not None:
        bias = bias - alibi.to(dtype=dtype, device=device)[:, None, None] * dist.abs()
    eye = i[:, None] == j[None, :]
    if self_bias is not None:
        b_self = self_bias.to(dtype=dtype, device=device)[:, None, None]
        bias = bias + torch.where(eye, b_self, bias.new_zeros(()))
    if cross_bias is not None:
        b_cross = cross_bias.to(dtype=dtype, device=device)[:, None, None]
        bias = bias + torch.where(eye, bias.new_zeros(()), b_cross)
    return bias.masked_fill(dist < 0, float("-inf"))
