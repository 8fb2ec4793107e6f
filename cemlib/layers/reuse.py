"""Residual sublayers and the "plain layer reuse" baseline (CEM §4.4, Figs. 3c and 4).

Plain reuse applies the *same residual sublayer* T times, ``x <- x + f(RMSNorm(x))``, recomputing
everything (keys, values, gamma) from the updated stream each time. CEM recursion (eqs. 16-17)
instead keeps the context ``h_{1:i}`` -- hence keys, values and gamma -- fixed and only moves the
query state ``x_i``. :class:`LayerReuse` also wraps CEM layers (``step`` maps stream -> stream).
"""

from __future__ import annotations

import torch
from torch import nn

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

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.drop(self.fn(self.norm(x)))


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

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.drop(self.step(x) - x)


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

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for _ in range(self.T):
            x = self.step(x)
        return x

    def extra_repr(self) -> str:
        return f"T={self.T}"
