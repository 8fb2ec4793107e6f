"""Hyper-SET alternatives (Hu et al. 2025, arXiv:2502.11646, §5.5, Appendix G, Tables 4, 5, 19, 20).

Each variant is the same tied, normalised step as :mod:`cemlib.layers.hyperset`, on another energy
from :mod:`cemlib.energies.hyperset`:

- :class:`SigmoidAttention`: ``E = (2 beta)^{-1} sum_ij sigma(beta z_i^T z_j)``; the step is
  ``X - alpha sum_h sigma'(G_h) Z_h W_h^T``. Table 19 prints ``sum_h W_h W_h^T X sigma'(G)`` as
  ``-grad``; it is ``+grad`` (sign error), and the step subtracts it.
- :class:`LinearAttention`: ``E = (4 beta)^{-1} sum_ij (beta Phi_i^T Phi_j)^2``, ``Phi = sigma``;
  the step ``X - alpha sum_h [Phi'(Z) * beta Phi (Phi^T Phi)] W_h^T`` costs ``O(N p^2)``. Same sign
  error in Table 19.
- :class:`SoftmaxFeedForward`: ``E = -log sum_m exp(d_m^T x)``; step ``+gamma D softmax(U)``.
- :class:`GatedFeedForward`: ``E = -1/2 (sum_m sigma(d_m^T x))^2``; step
  ``+gamma D [(sum_m Phi_m) Phi'(U)]`` (one scalar gate per token).
- :class:`DepthwiseLoRA` (Table 5, G.2): per-iteration ``W_t = W + s A_t B_t`` and
  ``D_t = D + s A'_t B'_t``, both factors Gaussian (std 0.02), ``s = 4``; ``4 d r L`` parameters
  when ``H p = M = d``.
"""

from __future__ import annotations

import torch
from torch import nn

from cemlib.layers.hyperset import SubspaceAttention, TiedFeedForward
from cemlib.utils import check_positive_int

__all__ = ["SigmoidAttention", "LinearAttention", "SoftmaxFeedForward", "GatedFeedForward",
           "DepthwiseLoRA"]


class SigmoidAttention(SubspaceAttention):
    """Table 19, row "Sigmoid": symmetric sigmoid scores, weights ``sigma'(G)`` (not normalised).

    ``forward(x, alpha)`` returns the stepped tokens ``x + alpha * direction``, normalised inside
    (a pre-norm sublayer's replacement: ``x = attn(x, alpha)``); the options are
    :class:`~cemlib.layers.hyperset.SubspaceAttention`'s.
    """

    kind = "sigmoid"


class LinearAttention(SubspaceAttention):
    """Table 19, row "Linear Attention": ``Phi = sigmoid`` feature map, linear in ``N``.

    ``forward(x, alpha)`` returns the stepped tokens ``x + alpha * direction``, normalised inside
    (a pre-norm sublayer's replacement: ``x = attn(x, alpha)``); the options are
    :class:`~cemlib.layers.hyperset.SubspaceAttention`'s.
    """

    kind = "linear"


class SoftmaxFeedForward(TiedFeedForward):
    """Table 20, row "Softmax FF": the vMF-mixture alignment energy of eq. (15).

    ``forward(x, gamma)`` returns the stepped tokens ``x + gamma * direction``, normalised inside
    (a pre-norm sublayer's replacement: ``x = ff(x, gamma)``); the options are
    :class:`~cemlib.layers.hyperset.TiedFeedForward`'s.
    """

    kind = "softmax"


class GatedFeedForward(TiedFeedForward):
    """Table 20, row "Gated FF": ``g(x) = x^2 / 2``, ``h = sigmoid``.

    ``forward(x, gamma)`` returns the stepped tokens ``x + gamma * direction``, normalised inside
    (a pre-norm sublayer's replacement: ``x = ff(x, gamma)``); the options are
    :class:`~cemlib.layers.hyperset.TiedFeedForward`'s.
    """

    kind = "gated"


class DepthwiseLoRA(nn.Module):
    """Independent low-rank adapters on the shared ``W (d, Hp)`` and ``D (d, M)``, per iteration.

    ``forward(W, D, t)`` returns the weights of iteration ``t``, ``(W + s A_t B_t, D + s A'_t B'_t)``;
    not a sublayer (:class:`~cemlib.layers.hyperset.HyperSETLayer` calls it with ``lora=``).

    :param d: the token width ``d``.
    :param attn_width: the attention's ``H p`` (columns of ``W``).
    :param ff_dim: the feed-forward width ``M`` (columns of ``D``).
    :param n_iter: iterations with their own adapters.
    :param rank: the adapters' rank ``r``.
    :param scale: the factor ``s``.
    :param std: standard deviation of the Gaussian initial factors.
    """

    def __init__(self, d: int, attn_width: int, ff_dim: int, n_iter: int, rank: int,
                 scale: float = 4.0, std: float = 0.02):
        super().__init__()
        for v, n in ((d, "d"), (attn_width, "attn_width"), (ff_dim, "ff_dim"), (n_iter, "n_iter"),
                     (rank, "rank")):
            check_positive_int(v, n)
        self.n_iter, self.rank, self.scale = n_iter, rank, float(scale)
        self.A_W = nn.Parameter(std * torch.randn(n_iter, d, rank))
        self.B_W = nn.Parameter(std * torch.randn(n_iter, rank, attn_width))
        self.A_D = nn.Parameter(std * torch.randn(n_iter, d, rank))
        self.B_D = nn.Parameter(std * torch.randn(n_iter, rank, ff_dim))

    def forward(self, W: torch.Tensor, D: torch.Tensor, t: int):
        """``(W + s A_t B_t, D + s A'_t B'_t)`` for iteration ``t``."""
        if isinstance(t, bool) or not isinstance(t, int) or not 0 <= t < self.n_iter:
            raise ValueError(f"depth-wise LoRA has adapters for iterations 0..{self.n_iter - 1}, "
                             f"got t={t!r}")
        return (W + self.scale * self.A_W[t] @ self.B_W[t],
                D + self.scale * self.A_D[t] @ self.B_D[t])

    def extra_repr(self) -> str:
        return f"n_iter={self.n_iter}, rank={self.rank}, scale={self.scale}"
