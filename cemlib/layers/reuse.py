"""Residual sublayers and the "plain layer reuse" baseline (CEM §4.4, Figs. 3c and 4).

Plain reuse applies the *same residual sublayer* T times, ``x <- x + f(RMSNorm(x))``, recomputing
everything (keys, values, gamma) from the updated stream each time. CEM recursion (eqs. 16-17)
instead keeps the context ``h_{1:i}`` -- hence keys, values and gamma -- fixed and only moves the
query state ``x_i``. :class:`LayerReuse` also wraps CEM layers (``step`` maps stream -> stream).
"""

from __future__ import annotations

import torch
from torch import nn

from cemlib.layers.cache import KVCache
from cemlib.layers.norm import RMSNorm
from cemlib.utils import check_positive_int

__all__ = ["ResidualSublayer", "LayerReuse", "IncrementDropout"]


class ResidualSublayer(nn.Module):
    """Pre-norm residual sublayer ``x + Dropout(f(RMSNorm(x)))`` (Llama convention).

    ``forward(x)`` returns the updated residual stream (same shape as ``x``): this is the pre-norm
    wrapper that turns a branch module (:class:`~cemlib.layers.llama.LlamaAttention`,
    :class:`~cemlib.layers.llama.SwiGLU`, ...) into a stream -> stream step; use it as
    ``x = sublayer(x)``. Do not wrap the CEM layers in it: they already return ``x`` plus their
    update and normalise their own query.

    :param fn: the branch ``f``, mapping normalised input (..., D) to an update (..., D).
    :param d_model: the width ``D`` (of the RMSNorm).
    :param norm_eps: the RMSNorm's epsilon.
    :param dropout: dropout on the branch output ``f(RMSNorm(x))``.
    """

    def __init__(self, fn: nn.Module, d_model: int, norm_eps: float = 1e-6, dropout: float = 0.0):
        super().__init__()
        self.norm = RMSNorm(d_model, eps=norm_eps)
        self.fn = fn
        self.drop = nn.Dropout(dropout)

    def forward(self, x: torch.Tensor, cache: KVCache | None = None) -> torch.Tensor:
        """``x + Dropout(f(RMSNorm(x)))``; ``cache`` goes to ``f`` (an attention branch)."""
        g = self.norm(x)
        return x + self.drop(self.fn(g) if cache is None else self.fn(g, cache=cache))

    def new_cache(self, capacity: int):
        """The decode cache of the branch ``f`` (an attention layer)."""
        return self.fn.new_cache(capacity)


class IncrementDropout(nn.Module):
    """``x + Dropout(step(x) - x)`` for a stream -> stream ``step`` (a CEM layer): dropout on the
    layer's total update, the analogue of residual-branch dropout. Identity wrapper in eval mode.

    ``forward(x)`` returns the updated stream (same shape as ``x``); use it as ``x = wrapped(x)``.

    :param step: the stream -> stream layer whose update is dropped out.
    :param dropout: the dropout probability.
    """

    def __init__(self, step: nn.Module, dropout: float):
        super().__init__()
        self.step = step
        self.drop = nn.Dropout(dropout)

    def forward(self, x: torch.Tensor, cache: KVCache | None = None) -> torch.Tensor:
        """``x + Dropout(step(x) - x)``; ``cache`` goes to ``step`` (an attention layer)."""
        return x + self.drop((self.step(x) if cache is None else self.step(x, cache=cache)) - x)

    def new_cache(self, capacity: int):
        """The decode cache of ``step`` (an attention layer)."""
        return self.step.new_cache(capacity)


class LayerReuse(nn.Module):
    """Apply ``step`` (a stream -> stream module) ``T`` times with the same weights.

    ``forward(x)`` returns ``step(step(...step(x)))`` (``T`` applications, same shape as ``x``).
    ``step`` must already include its residual and norm (a :class:`ResidualSublayer`, or a CEM
    layer); use it as ``x = reuse(x)``.

    :param step: the stream -> stream module applied repeatedly.
    :param T: the number of applications (>= 1).
    """

    def __init__(self, step: nn.Module, T: int = 1):
        super().__init__()
        self.step = step
        self.T = check_positive_int(T, "T")

    def forward(self, x: torch.Tensor, cache: list | None = None) -> torch.Tensor:
        """``T`` applications of ``step``; ``cache`` (decoding) holds one decode cache per
        application: each pass computes its keys from a new state."""
        for t in range(self.T):
            x = self.step(x) if cache is None else self.step(x, cache=cache[t])
        return x

    def new_cache(self, capacity: int) -> list:
        """One decode cache of ``step`` per application (``T`` of them)."""
        return [self.step.new_cache(capacity) for _ in range(self.T)]

    def extra_repr(self) -> str:
        return f"T={self.T}"
