"""Learned preconditioners for CEM updates (CEM eqs. 13-15, Appendix D.4).

    P = diag(softplus(d)) + U V^T + V U^T,    d = sqrt(D_h) p,   U, V in R^{D_h x R}     (eq. 13)

kinds: ``"none"`` (P = I, the tied Transformer), ``"diag"`` (U = V = 0), ``"dplr"`` (eq. 13).
Initialisation (D.4): ``p = 1/sqrt(D_h)`` (so ``d = 1`` and ``P = softplus(1) I ~ 1.3133 I``),
``U ~ N(0, 0.02^2)``, ``V = 0`` (LoRA-style). Ranks in the paper: 4 for attention (one ``P_k``
per head, eq. 14), 16 for the MLP (eq. 15).

P is NOT always positive definite: the [ICLR] version claims softplus "guarantees P > 0", but
``U V^T + V U^T = (A A^T - B B^T)/2`` with ``A = U + V``, ``B = U - V`` has negative eigenvalues
``u.v - |u||v|`` (rank 1); ``tests/layers/test_preconditioner.py`` exhibits ``lambda_min(P) < 0``.

Safeguard (cemlib's, not the paper's; off by default so the paper's model is the default): with
``safeguard=True`` the negative part is shrunk,

    P_safe = S + A A^T / 2 - c B B^T / 2,   S = diag(softplus d),
    c = min(1, 2 (1 - delta) / ||S^{-1/2} B||_F^2),

so that ``S - c B B^T / 2 >= delta S`` and hence ``lambda_min(P_safe) >= delta min_i s_i > 0``
(the Frobenius norm bounds the spectral norm, so the bound is conservative but smooth and costs
O(D_h R)). When P is comfortably definite already (c = 1) it changes nothing.

A single unguarded DPLR ``P`` (the MLP's) is applied through
:func:`cemlib.kernels.dispatch.dplr_precondition` (fused kernel on GPU); per-head stacks and the
safeguarded form use the einsum path here.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from cemlib.kernels import dispatch
from cemlib.utils import check_positive_int

__all__ = ["Preconditioner", "PRECONDITIONER_KINDS"]

PRECONDITIONER_KINDS = ("none", "diag", "dplr")


class Preconditioner(nn.Module):
    """``P`` of CEM eq. 13 (or a stack ``P_1..P_K`` of them, one per attention head, eq. 14).

    ``forward(g)`` returns ``P g``: for a single P, ``g`` is (..., D_h); for a stack of
    ``n_heads``, ``g`` is (B, K, L, D_h) and head ``k`` gets ``P_k``. It is not a sublayer of a
    block: the CEM layers apply it to their gradient (``preconditioner=...`` on
    :class:`~cemlib.layers.cem_attention.CEMAttention` and :class:`~cemlib.layers.cem_mlp.CEMMLP`).

    :param dim: the width ``D_h``.
    :param kind: ``"none"`` (``P = I``), ``"diag"`` or ``"dplr"`` (eq. 13).
    :param rank: the rank ``R`` of ``U`` and ``V`` (``"dplr"`` only).
    :param n_heads: ``None`` for one ``P``; ``K`` for a stack of per-head ``P_k``.
    :param safeguard: shrink the negative part so that ``P`` is positive definite (cemlib's
        option, not the paper's: ``P_safe = S + A A^T / 2 - c B B^T / 2``, ``A = U + V``,
        ``B = U - V``, ``S = diag(softplus d)``, with the largest ``c <= 1`` that guarantees
        ``lambda_min(P_safe) >= delta min_i s_i``).
    :param delta: the safeguard's margin, ``lambda_min(P) >= delta min_i s_i``, in (0, 1).
    """

    def __init__(self, dim: int, kind: str = "none", rank: int = 4, n_heads: int | None = None,
                 safeguard: bool = False, delta: float = 0.05):
        super().__init__()
        check_positive_int(dim, "dim")
        if kind not in PRECONDITIONER_KINDS:
            raise ValueError(f"preconditioner kind must be one of {PRECONDITIONER_KINDS}, got {kind!r}")
        if n_heads is not None:
            check_positive_int(n_heads, "n_heads")
        if kind == "dplr":
            check_positive_int(rank, "rank")
        if not 0.0 < delta < 1.0:
            raise ValueError(f"safeguard delta must be in (0, 1), got {delta}")
        self.dim, self.kind, self.n_heads = dim, kind, n_heads
        self.rank = rank if kind == "dplr" else 0
        self.safeguard, self.delta = safeguard, delta
        H = () if n_heads is None else (n_heads,)
        if kind in ("diag", "dplr"):
            self.p = nn.Parameter(torch.full(H + (dim,), 1.0 / math.sqrt(dim)))
        if kind == "dplr":
            self.U = nn.Parameter(torch.randn(H + (dim, rank)) * 0.02)
            self.V = nn.Parameter(torch.zeros(H + (dim, rank)))

    def diagonal(self) -> torch.Tensor:
        """``softplus(d)`` with ``d = sqrt(D_h) p`` (D.4 reparameterisation)."""
        return F.softplus(math.sqrt(self.dim) * self.p)

    def negative_scale(self) -> torch.Tensor:
        """The safeguard's factor ``c`` on ``B B^T`` (1 without safeguard); shape (K,) or ()."""
        B = self.U - self.V
        if not self.safeguard:
            return torch.ones(B.shape[:-2], dtype=B.dtype, device=B.device)
        ratio = ((B * B) / self.diagonal()[..., None]).sum((-2, -1))  # ||S^{-1/2} B||_F^2
        return torch.clamp(2.0 * (1.0 - self.delta) / ratio.clamp_min(1e-30), max=1.0)

    def forward(self, g: torch.Tensor) -> torch.Tensor:
        if self.kind == "none":
            return g
        heads = self.n_heads is not None
        if heads and (g.dim() != 4 or g.shape[1] != self.n_heads):
            raise ValueError(f"per-head preconditioner expects g of shape (B, K={self.n_heads}, L, "
                             f"D_h={self.dim}), got {tuple(g.shape)}")
        if g.shape[-1] != self.dim:
            raise ValueError(f"preconditioner width is {self.dim}, got g of shape {tuple(g.shape)}")
        if self.kind == "dplr" and not heads and not self.safeguard:   # eq. 13 as one fused op
            dt = g.dtype
            return dispatch.dplr_precondition(g, (math.sqrt(self.dim) * self.p).to(dt),
                                              self.U.to(dt), self.V.to(dt))
        s = self.diagonal()
        out = g * (s[None, :, None, :] if heads else s)
        if self.kind == "dplr":
            A, B = self.U + self.V, self.U - self.V
            c = self.negative_scale()
            eq = ("bkld,kdr->bklr", "bklr,kdr->bkld") if heads else ("...d,dr->...r", "...r,dr->...d")
            neg = torch.einsum(eq[1], torch.einsum(eq[0], g, B), B)
            out = out + 0.5 * torch.einsum(eq[1], torch.einsum(eq[0], g, A), A)
            out = out - 0.5 * (c[None, :, None, None] if heads else c) * neg
        return out

    def matrix(self) -> torch.Tensor:
        """Dense ``P`` as written in eq. 13 (safeguarded if enabled): (D_h, D_h) or (K, D_h, D_h)."""
        H = () if self.n_heads is None else (self.n_heads,)
        eye = torch.eye(self.dim)
        if self.kind == "none":
            return eye.expand(H + (self.dim, self.dim)).clone()
        P = torch.diag_embed(self.diagonal())
        if self.kind == "dplr":
            UVt = self.U @ self.V.transpose(-1, -2)
            P = P + UVt + UVt.transpose(-1, -2)
            if self.safeguard:
                B = self.U - self.V
                c = self.negative_scale()[..., None, None]
                P = P + 0.5 * (1.0 - c) * (B @ B.transpose(-1, -2))
        return P

    def lambda_min(self) -> torch.Tensor:
        """Smallest eigenvalue of each ``P`` (shape (K,) or ())."""
        return torch.linalg.eigvalsh(self.matrix().detach().double()).min(-1).values

    def extra_repr(self) -> str:
        return (f"dim={self.dim}, kind={self.kind!r}, rank={self.rank}, n_heads={self.n_heads}, "
                f"safeguard={self.safeguard}")
