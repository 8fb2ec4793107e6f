"""Metrics of token dynamics (Hyper-SET §5.4, Definitions 1-2, Figs. 5-6).

- :func:`energy_per_iteration`: an energy evaluated along a trajectory of states;
- :func:`effective_rank`: eq. (17), ``exp(-sum_i p_i log p_i)`` with
  ``p_i = sigma_i / sum_j sigma_j`` (singular values normalised by their **sum**);
- :func:`average_angle`: eq. (18), ``arccos`` of the **mean pairwise cosine** (not the mean angle;
  ``of="angle"`` gives the mean pairwise angle, which is what the authors' released code computes);
- :func:`subspace_tokens`: the tokens projected into each head subspace, ``W_h^T x_i``, on which the
  paper measures rank and angle (``normalize=True``: RMS-normalised per token, ``RMSNorm(W_h^T
  x_i)``, which is what the released code measures for Fig. 6);
- :func:`separation_per_iteration`: effective rank and average angle per iteration and head (Fig. 6,
  Figs. 9-12), plus the full-space effective rank (always of the raw tokens).

Tokens are rows: ``X (..., N, d)``.
"""

from __future__ import annotations

import math
from typing import Callable, Iterable

import torch

from cemlib.energies.hyperset import check_tokens, split_heads
from cemlib.normalization import rms_norm
from cemlib.utils import check_tensor

__all__ = ["energy_per_iteration", "effective_rank", "average_angle", "subspace_tokens",
           "separation_per_iteration"]


def energy_per_iteration(states: Iterable[torch.Tensor] | torch.Tensor,
                         energy_fn: Callable[[torch.Tensor], torch.Tensor]) -> torch.Tensor:
    """``energy_fn(states[t]).sum over tokens`` for each ``t``; returns ``(T+1, ...batch)``.

    ``energy_fn`` maps ``(..., N, d)`` to per-token energies ``(..., N)``.
    """
    out = []
    for t, X in enumerate(states):
        check_tensor(X, f"states[{t}]")
        if X.dim() < 2:
            raise ValueError(f"states[{t}] must be (..., N, d), got {tuple(X.shape)}")
        with torch.no_grad():
            out.append(energy_fn(X).sum(-1))
    if not out:
        raise ValueError("states is empty")
    return torch.stack(out)


def effective_rank(X: torch.Tensor) -> torch.Tensor:
    """Eq. (17) of the token matrix ``X (..., N, d)``; returns shape ``X.shape[:-2]``."""
    check_tensor(X, "X")
    if X.dim() < 2:
        raise ValueError(f"X must be (..., N, d), got {tuple(X.shape)}")
    s = torch.linalg.svdvals(X)
    total = s.sum(-1, keepdim=True)
    if (total == 0).any():
        raise ValueError("effective rank of an all-zero matrix is undefined")
    p = s / total
    plogp = torch.where(p > 0, p * torch.log(p.clamp_min(torch.finfo(p.dtype).tiny)), 0.0)
    return torch.exp(-plogp.sum(-1))


def average_angle(X: torch.Tensor, degrees: bool = True, of: str = "cosine") -> torch.Tensor:
    """Eq. (18): ``arccos(2/(N(N-1)) sum_{i<j} cos(x_i, x_j))``; shape ``X.shape[:-2]``.

    ``of="angle"``: the mean of the pairwise angles ``2/(N(N-1)) sum_{i<j} arccos cos(x_i, x_j)``
    instead (the released code's ``compute_average_angle``); it is never below the eq. (18) value
    when all cosines are non-negative, and the two agree when every pair has the same angle."""
    if of not in ("cosine", "angle"):
        raise ValueError(f"of must be 'cosine' or 'angle', got {of!r}")
    check_tensor(X, "X")
    if X.dim() < 2 or X.shape[-2] < 2:
        raise ValueError(f"X must be (..., N, d) with N >= 2, got {tuple(X.shape)}")
    norms = X.norm(dim=-1, keepdim=True)
    if (norms == 0).any():
        raise ValueError("average angle is undefined for a zero token")
    U = X / norms
    N = X.shape[-2]
    C = U @ U.transpose(-1, -2)
    if of == "angle":
        off = ~torch.eye(N, dtype=torch.bool, device=X.device)
        ang = torch.arccos(C.clamp(-1.0, 1.0))[..., off].mean(-1)
        return ang * (180.0 / math.pi) if degrees else ang
    mean_cos = (C.sum((-1, -2)) - C.diagonal(dim1=-2, dim2=-1).sum(-1)) / (N * (N - 1))
    ang = torch.arccos(mean_cos.clamp(-1.0, 1.0))
    return ang * (180.0 / math.pi) if degrees else ang


def subspace_tokens(X: torch.Tensor, W: torch.Tensor, n_heads: int,
                    normalize: bool = False, eps: float = 1e-6) -> torch.Tensor:
    """``W_h^T x_i`` for every head: ``X (..., N, d)``, ``W (d, H p)`` -> ``(..., H, N, p)``;
    with ``normalize`` each projection is RMS-normalised (unit gain, norm ``sqrt(p)``)."""
    check_tokens(X, W.shape[0])
    Z = split_heads(X @ W, n_heads)
    return rms_norm(Z, eps=eps) if normalize else Z


def separation_per_iteration(states: Iterable[torch.Tensor] | torch.Tensor, W: torch.Tensor,
                             n_heads: int, normalize: bool = False) -> dict:
    """For each state ``(..., N, d)``: per-head effective rank and average angle (degrees) of the
    subspace tokens (RMS-normalised if ``normalize``, as the released code measures Fig. 6),
    shapes ``(T+1, ..., H)``, and the full-space effective rank of the raw tokens ``(T+1, ...)``.
    The angle does not depend on ``normalize`` (cosines ignore each token's length); the rank does."""
    erank, angle, full = [], [], []
    with torch.no_grad():
        for X in states:
            Z = subspace_tokens(X, W, n_heads, normalize=normalize)
            erank.append(effective_rank(Z))
            angle.append(average_angle(Z))
            full.append(effective_rank(X))
    if not full:
        raise ValueError("states is empty")
    return {"erank": torch.stack(erank), "angle": torch.stack(angle),
            "full_erank": torch.stack(full)}
