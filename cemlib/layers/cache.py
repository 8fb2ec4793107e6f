"""The decode cache: what a causal attention layer keeps of every token it has seen.

A causal layer's output at position ``i`` depends on the tokens ``j <= i`` only through a few
tensors per token ``j``: its keys and values (and, in CEM attention with the diagonal of eq. 12,
its normalised input ``hn_j``). Decoding with a :class:`KVCache` computes those tensors once per
token, when the token arrives, so that a new token costs one row of attention (``L`` scores per
head) instead of the whole window again (``L^2``). What each layer keeps per token, for every
sequence of the batch (``elem`` bytes a number; :func:`cemlib.kernels.costs.kv_cache_bytes_per_token`
is the formula, and the tests check it against the tensors):

=====================================  ==============================  ========================
layer                                  tensors (per token)             numbers
=====================================  ==============================  ========================
``LlamaAttention``                     ``k`` (RoPE-rotated), ``v``     ``2 K D_r``
``CEMAttention``, no diagonal          ``kv`` (keys = values, tied)    ``K D_r``
``CEMAttention``, shared or per head   ``kv``, ``hn = RMSNorm(h)``     ``K D_r + D_h``
``CausalSelfAttention`` (GPT)          ``k``, ``v``                    ``2 D``
``NRGPTBlock``                         ``g = N(x)`` (every head's      ``D``
                                       key and value)
``MHA2nd1st`` (Newton)                 ``k`` per head (also the        ``H d_h``
                                       values)
=====================================  ==============================  ========================

CEM's recursion ``x^(t+1) = x^(t) - eta grad E(x^(t) | hn_{1:i})`` (eqs. 16-17) moves only the
query; the context, hence ``kv`` and ``hn``, comes from the layer's *input*, so one entry per token
serves all ``T`` steps. Plain layer reuse, NRGPT's iterated block and the recurrent GPT recompute
keys from a new state at every pass: they keep one :class:`KVCache` per pass.

:class:`DecodeCache` is a model's set of them, one per layer of depth. ``forward(idx, cache)`` of a
cemlib language model appends the tokens ``idx`` (at positions ``cache.length ...``) and returns
their logits; the first call on an empty cache (the *prefill*) runs the same code as the uncached
forward, the later ones attend the new queries to every kept token
(:func:`tied_attention_cached`, the bias of :func:`cemlib.positional.attention_bias` with
``n_queries``).
"""

from __future__ import annotations

import torch

from cemlib.positional import attention_bias
from cemlib.utils import check_positive_int

__all__ = ["KVCache", "DecodeCache", "tied_attention_cached", "visible_keys"]


class KVCache:
    """The tensors one attention layer (one application of it) keeps for every token it has seen.

    Each named tensor has the token axis second to last, ``(B, ..., L, width)``: ``append`` writes
    the new tokens' rows into buffers of ``capacity`` tokens (allocated at the first call, in the
    dtype and on the device of what is appended) and returns every kept row.

    :param capacity: the most tokens it can hold (the model's ``context_length``).
    """

    def __init__(self, capacity: int):
        self.capacity = check_positive_int(capacity, "capacity")
        self.length = 0
        self._buffers: dict[str, torch.Tensor] = {}

    def append(self, **new: torch.Tensor) -> dict[str, torch.Tensor]:
        """Keep the rows of ``new`` (each ``(B, ..., n, width)``, the same ``B`` and ``n``) after
        those kept before; return every kept row, ``{name: (B, ..., length, width)}``."""
        if not new:
            raise ValueError("append needs at least one named tensor")
        first = next(iter(new.values()))
        n = first.shape[-2] if first.dim() >= 2 else 0
        for name, t in new.items():
            if t.dim() < 3 or t.shape[0] != first.shape[0] or t.shape[-2] != n:
                raise ValueError(f"cache entry {name!r} must have shape (B, ..., n, width) with the "
                                 f"batch {first.shape[0]} and n = {n} of the others, got {tuple(t.shape)}")
        if self.length + n > self.capacity:
            raise ValueError(f"{n} new tokens do not fit: the cache holds {self.length} of at most "
                             f"{self.capacity}")
        if not self._buffers:
            self._buffers = {name: t.new_empty(*t.shape[:-2], self.capacity, t.shape[-1])
                             for name, t in new.items()}
        for name, t in new.items():
            buf = self._buffers.get(name)
            if buf is None or buf.shape[:-2] != t.shape[:-2] or buf.shape[-1] != t.shape[-1] \
                    or buf.dtype != t.dtype or buf.device != t.device:
                kept = {k: (tuple(b.shape[:-2]) + ("L", b.shape[-1]), b.dtype) for k, b in self._buffers.items()}
                raise ValueError(f"cache entry {name!r} {tuple(t.shape)} ({t.dtype}, {t.device}) does not "
                                 f"match what this cache keeps: {kept} (a cache serves one layer and one "
                                 f"batch: start a new one with model.new_cache())")
            buf[..., self.length:self.length + n, :] = t
        self.length += n
        return self.tensors()

    def tensors(self) -> dict[str, torch.Tensor]:
        """Every kept row, ``{name: (B, ..., length, width)}`` (views of the buffers)."""
        return {name: buf[..., :self.length, :] for name, buf in self._buffers.items()}

    def bytes_per_token(self) -> int:
        """Bytes kept per token of one sequence, measured on the kept tensors: their elements
        divided by batch and length, times the element size (0 while empty)."""
        if not self.length:
            return 0
        total = sum(t.numel() * t.element_size() for t in self.tensors().values())
        batch = next(iter(self._buffers.values())).shape[0]
        return total // (batch * self.length)

    def __repr__(self) -> str:
        shapes = {k: tuple(t.shape) for k, t in self.tensors().items()}
        return f"KVCache(length={self.length}, capacity={self.capacity}, {shapes})"


def _flatten(entry) -> list[KVCache]:
    return [entry] if isinstance(entry, KVCache) else [c for e in entry for c in _flatten(e)]


class DecodeCache:
    """A model's decode state: ``layers[l]`` is layer ``l``'s :class:`KVCache`, or a list of them
    where the layer applies attention several times (plain layer reuse); all hold the same tokens.

    Built by ``model.new_cache()``; ``model(idx, cache=cache)`` appends ``idx`` and returns its
    logits.

    :param layers: one entry per layer of depth, in the order the model runs them.
    :param capacity: the most tokens it can hold (the model's ``context_length``).
    """

    def __init__(self, layers: list, capacity: int):
        self.layers = list(layers)
        self.capacity = check_positive_int(capacity, "capacity")
        if not self.entries():
            raise ValueError("a DecodeCache needs at least one KVCache")

    def entries(self) -> list[KVCache]:
        """Every :class:`KVCache`, in the order the model uses them."""
        return _flatten(self.layers)

    @property
    def length(self) -> int:
        """Tokens kept (per sequence)."""
        return self.entries()[0].length

    def position(self, n: int, *, n_layers: int) -> int:
        """The position of the first of ``n`` new tokens; ``ValueError`` if they do not fit, or if
        the cache is not one of a model with ``n_layers`` layers."""
        if len(self.layers) != n_layers:
            raise ValueError(f"this cache has {len(self.layers)} layers, the model {n_layers}: use "
                             f"the model's own model.new_cache()")
        start = self.length
        if start + n > self.capacity:
            raise ValueError(f"{n} new tokens after the {start} kept exceed the context_length "
                             f"{self.capacity}: past the window, crop it and start a new cache "
                             f"(generate does)")
        return start

    def bytes_per_token(self) -> list[int]:
        """Bytes each layer keeps per token of one sequence, measured on its tensors (a reused
        layer: the sum over its passes)."""
        return [sum(c.bytes_per_token() for c in _flatten(e)) for e in self.layers]

    def __repr__(self) -> str:
        return f"DecodeCache(length={self.length}, capacity={self.capacity}, layers={len(self.layers)})"


def visible_keys(n: int, L: int, *, strict: bool = False, device=None) -> torch.Tensor:
    """``(n, L)`` booleans: which of ``L`` keys the last ``n`` queries see (``j <= i``, or
    ``j < i`` when ``strict``). With ``n = L`` it is the causal mask of the whole sequence."""
    i, j = torch.arange(L - n, L, device=device), torch.arange(L, device=device)
    return j[None, :] < i[:, None] if strict else j[None, :] <= i[:, None]


def tied_attention_cached(q, kv, *, scale, alibi=None, self_bias=None, cross_bias=None, q_extra=None,
                          k_extra=None, extra_values=False, extra_head_sum=False):
    """:func:`cemlib.kernels.reference.tied_attention` for queries that are the *last* ``n`` of
    the ``L`` positions of ``kv``: returns ``(o, lse[, o_extra])`` for those rows.

    Shapes: ``q`` (B, K, n, D_r), ``kv`` (B, K, L, D_r), ``q_extra`` (B, n, D_e) or
    (B, K, n, D_e), ``k_extra`` (B, L, D_e); the rest as the reference. With ``n = L`` it is the
    reference's result (the test checks both).
    """
    B, K, n, R = q.shape
    if kv.dim() != 4 or kv.shape[:2] != (B, K) or kv.shape[-1] != R or kv.shape[2] < n:
        raise ValueError(f"kv must have shape ({B}, {K}, L >= {n}, {R}) for q {tuple(q.shape)}, got "
                         f"{tuple(kv.shape)}")
    L = kv.shape[2]
    s = torch.matmul(q, kv.transpose(-1, -2)) * scale
    if q_extra is not None:
        se = torch.matmul(q_extra, k_extra.transpose(-1, -2)[:, None] if q_extra.dim() == 4
                          else k_extra.transpose(-1, -2)) * scale
        s = s + (se[:, None] if q_extra.dim() == 3 else se)
    acc = torch.promote_types(s.dtype, torch.float32)
    s = s.to(acc) + attention_bias(L, K, alibi=alibi, self_bias=self_bias, cross_bias=cross_bias,
                                   dtype=acc, device=q.device, n_queries=n)
    lse = torch.logsumexp(s, dim=-1)
    p = torch.exp(s - lse[..., None])
    o = torch.matmul(p.to(kv.dtype), kv)
    if extra_values and extra_head_sum:
        return o, lse, torch.matmul(p.sum(1).to(k_extra.dtype), k_extra)
    if extra_values:
        return o, lse, torch.matmul(p.to(k_extra.dtype), k_extra[:, None])
    return o, lse
