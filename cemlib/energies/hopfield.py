"""Associative-memory energies: classical Hopfield, dense associative memory, modern log-sum-exp.

Notation (the book's table; chapter 1). ``patterns`` is the matrix X of shape ``(N, D)``: row mu is
the stored pattern xi^mu (Ramsauer et al. 2021 write the state as xi and the patterns as the
*columns* of X; the book uses x for the state and rows for the patterns). States ``x`` have shape
``(..., D)``; energies return one value per state, shape ``x.shape[:-1]``. Everything is
float64-safe (no hidden casts).

Three families, in historical order:

- classical Hopfield (Hopfield 1982): E(x) = -1/2 x^T W x, W = (1/D) X^T X with zero diagonal
  (book eq. ``eq-hopfield``; CEM App. C writes the same energy as -1/2 sum_j (h_j^T x)^2);
- dense associative memory (Krotov & Hopfield 2016; Demircigil et al. 2017 for F = exp):
  E(x) = -sum_mu F(xi^mu . x) (book eq. ``eq-dense``);
- modern Hopfield (Ramsauer et al. 2021, Sec. 2):
  E(x) = -lse_beta(X x) + 1/2 x^T x + beta^-1 log N + 1/2 M^2 (book eq. ``eq-lse-energy``),
  with gradient x - X^T softmax(beta X x) (``eq-lse-grad``), Hessian
  I - beta X^T (diag(p) - p p^T) X (``eq-lse-hess``) and CCCP update X^T softmax(beta X x)
  (``eq-cccp``), which is exactly the plain gradient step with step size 1.

The -lse term is *concave* in the state (its Hessian is -beta times a covariance matrix). The CEM
paper, App. C ([arXiv] and [ICLR] alike), calls -tau log sum_j exp(h_j^T x / tau) "convex in x";
that is wrong, and ``tests/energies/test_hopfield.py`` shows it.
"""

from __future__ import annotations

import math

import torch

from cemlib.utils import check_positive_int, check_tensor

__all__ = [
    "hebbian_weights", "classical_energy", "classical_energy_grad", "classical_update",
    "dense_F", "dense_energy", "dense_energy_grad", "dense_update",
    "lse", "modern_energy", "modern_energy_grad", "lse_hessian", "modern_energy_hessian",
    "cccp_step", "gradient_step", "modern_retrieve",
]


# --------------------------------------------------------------------------- input checks
def _check_patterns(patterns: torch.Tensor) -> torch.Tensor:
    check_tensor(patterns, "patterns", ndim=2)
    if patterns.shape[0] < 1 or patterns.shape[1] < 1:
        raise ValueError(f"patterns must have shape (N, D) with N, D >= 1, got {tuple(patterns.shape)}")
    return patterns


def _check_state(x: torch.Tensor, patterns: torch.Tensor, name: str = "state") -> torch.Tensor:
    check_tensor(x, name, last_dim=patterns.shape[-1])
    if x.dtype != patterns.dtype:
        raise TypeError(f"{name} has dtype {x.dtype} but patterns have dtype {patterns.dtype}")
    return x


def _check_binary(x: torch.Tensor, name: str = "state") -> torch.Tensor:
    if not bool(((x == 1) | (x == -1)).all()):
        raise ValueError(f"{name} must contain only -1 and +1 (binary Hopfield state), shape {tuple(x.shape)}")
    return x


def _check_positive(value: float, name: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value <= 0:
        raise ValueError(f"{name} must be a positive finite number, got {value!r}")
    return float(value)


def _sweep_order(D: int, order: str, generator: torch.Generator | None) -> list[int]:
    if order == "sequential":
        return list(range(D))
    if order == "random":
        return torch.randperm(D, generator=generator).tolist()
    raise ValueError(f"order must be 'sequential' or 'random', got {order!r}")


# --------------------------------------------------------------------------- classical Hopfield
def hebbian_weights(patterns: torch.Tensor) -> torch.Tensor:
    """Hebbian weights W = (1/D) sum_mu xi^mu xi^mu^T = X^T X / D with zero diagonal (Hopfield 1982,
    T_ii = 0). The 1/D scale does not change the sign dynamics; it keeps W of order one.
    """
    _check_patterns(patterns)
    D = patterns.shape[1]
    W = patterns.T @ patterns / D
    return W - torch.diag(torch.diagonal(W))


def _check_weights(W: torch.Tensor, x: torch.Tensor) -> None:
    check_tensor(W, "W", ndim=2)
    if W.shape[0] != W.shape[1] or W.shape[0] != x.shape[-1]:
        raise ValueError(f"W must be square (D, D) with D = state width {x.shape[-1]}, got {tuple(W.shape)}")


def classical_energy(x: torch.Tensor, W: torch.Tensor) -> torch.Tensor:
    """Classical Hopfield energy E(x) = -1/2 x^T W x (book eq. ``eq-hopfield``), shape ``x.shape[:-1]``."""
    check_tensor(x, "state")
    _check_weights(W, x)
    return -0.5 * torch.einsum("...i,ij,...j->...", x, W, x)


def classical_energy_grad(x: torch.Tensor, W: torch.Tensor) -> torch.Tensor:
    """Gradient -W x of :func:`classical_energy` for symmetric W (the negative local field)."""
    check_tensor(x, "state")
    _check_weights(W, x)
    if not torch.allclose(W, W.T):
        raise ValueError("W must be symmetric for -W x to be the gradient of -1/2 x^T W x")
    return -(x @ W)


def classical_update(x: torch.Tensor, W: torch.Tensor, sweeps: int = 1, mode: str = "async",
                     order: str = "random", generator: torch.Generator | None = None) -> torch.Tensor:
    """Hopfield's update x_i <- sign(sum_j W_ij x_j) (ties keep x_i), ``sweeps`` times.

    ``mode="async"`` updates one unit at a time (each flip lowers eq. ``eq-hopfield`` or leaves it
    unchanged when W is symmetric with zero diagonal); ``mode="sync"`` updates all units at once
    (not a descent method: it can oscillate in 2-cycles). States are +-1, shape ``(..., D)``.
    """
    check_tensor(x, "state")
    _check_weights(W, x)
    _check_binary(x)
    check_positive_int(sweeps, "sweeps")
    x = x.clone()
    if mode == "sync":
        for _ in range(sweeps):
            h = x @ W
            x = torch.where(h > 0, 1.0, torch.where(h < 0, -1.0, x)).to(x.dtype)
        return x
    if mode != "async":
        raise ValueError(f"mode must be 'async' or 'sync', got {mode!r}")
    for _ in range(sweeps):
        for i in _sweep_order(x.shape[-1], order, generator):
            h = x @ W[:, i]
            x[..., i] = torch.where(h > 0, 1.0, torch.where(h < 0, -1.0, x[..., i])).to(x.dtype)
    return x


# --------------------------------------------------------------------------- dense associative memory
_DENSE_KINDS = ("poly", "rectpoly", "exp")


def dense_F(z: torch.Tensor, kind: str = "poly", n: int = 3) -> tuple[torch.Tensor, torch.Tensor]:
    """The interaction function F and its derivative F' (Krotov & Hopfield 2016; Demircigil 2017).

    ``poly``: F(z) = z^n; ``rectpoly``: F(z) = max(z, 0)^n; ``exp``: F(z) = exp(z) (``n`` unused).
    n = 2 with ``poly`` gives back the classical energy (up to the diagonal and scale).
    """
    if kind not in _DENSE_KINDS:
        raise ValueError(f"kind must be one of {_DENSE_KINDS}, got {kind!r}")
    if kind == "exp":
        e = torch.exp(z)
        return e, e
    check_positive_int(n, "n")
    base = z if kind == "poly" else z.clamp_min(0)
    return base ** n, n * base ** (n - 1)


def dense_energy(x: torch.Tensor, patterns: torch.Tensor, kind: str = "poly", n: int = 3) -> torch.Tensor:
    """Dense associative memory energy E(x) = -sum_mu F(xi^mu . x) (book eq. ``eq-dense``).

    For ``kind="exp"`` overlaps above ~709 overflow float64; the update works in the log domain.
    """
    _check_patterns(patterns)
    _check_state(x, patterns)
    return -dense_F(x @ patterns.T, kind, n)[0].sum(-1)


def dense_energy_grad(x: torch.Tensor, patterns: torch.Tensor, kind: str = "poly", n: int = 3) -> torch.Tensor:
    """Gradient -sum_mu F'(xi^mu . x) xi^mu = -X^T F'(X x) of :func:`dense_energy` (continuous x)."""
    _check_patterns(patterns)
    _check_state(x, patterns)
    return -dense_F(x @ patterns.T, kind, n)[1] @ patterns


def dense_update(x: torch.Tensor, patterns: torch.Tensor, kind: str = "poly", n: int = 3, sweeps: int = 1,
                 order: str = "random", generator: torch.Generator | None = None) -> torch.Tensor:
    """Krotov & Hopfield's (2016) asynchronous update rule: unit i takes the sign that gives the lower
    energy, x_i <- sign(sum_mu [F(xi^mu_i + r_mu) - F(-xi^mu_i + r_mu)]), r_mu = sum_{j!=i} xi^mu_j x_j
    (book eq. ``eq-dense-update``).

    Ties keep x_i. Each update lowers :func:`dense_energy` or leaves it unchanged. For ``exp`` the
    two sums are compared as log-sum-exps, so large overlaps do not overflow.
    """
    _check_patterns(patterns)
    _check_state(x, patterns)
    _check_binary(x)
    check_positive_int(sweeps, "sweeps")
    if kind not in _DENSE_KINDS:
        raise ValueError(f"kind must be one of {_DENSE_KINDS}, got {kind!r}")
    x = x.clone()
    m = x @ patterns.T  # overlaps X x, shape (..., N), kept up to date
    for _ in range(sweeps):
        for i in _sweep_order(x.shape[-1], order, generator):
            col = patterns[:, i]  # (xi^1_i, ..., xi^N_i)
            r = m - x[..., i:i + 1] * col
            if kind == "exp":
                diff = torch.logsumexp(r + col, -1) - torch.logsumexp(r - col, -1)
            else:
                diff = (dense_F(r + col, kind, n)[0] - dense_F(r - col, kind, n)[0]).sum(-1)
            new = torch.where(diff > 0, 1.0, torch.where(diff < 0, -1.0, x[..., i])).to(x.dtype)
            m = r + new.unsqueeze(-1) * col
            x[..., i] = new
    return x


# --------------------------------------------------------------------------- modern Hopfield (log-sum-exp)
def lse(z: torch.Tensor, beta: float) -> torch.Tensor:
    """lse_beta(z) = beta^-1 log sum_i exp(beta z_i) over the last dimension (Ramsauer et al. 2021)."""
    beta = _check_positive(beta, "beta")
    return torch.logsumexp(beta * z, dim=-1) / beta


def _softmax_weights(x: torch.Tensor, patterns: torch.Tensor, beta: float) -> torch.Tensor:
    return torch.softmax(beta * (x @ patterns.T), dim=-1)  # p = softmax(beta X x), shape (..., N)


def modern_energy(x: torch.Tensor, patterns: torch.Tensor, beta: float = 1.0) -> torch.Tensor:
    """Modern Hopfield energy (book eq. ``eq-lse-energy``; Ramsauer et al. 2021, Sec. 2)
    E(x) = -lse_beta(X x) + 1/2 x^T x + beta^-1 log N + 1/2 M^2, M = max_mu ||xi^mu||.

    The two constants make E >= 0 everywhere and E <= 2 M^2 for ||x|| <= M (Ramsauer et al. 2021;
    both bounds are tested).
    Dropping 1/2 x^T x (as CEM [arXiv] eq. 2 = [ICLR] eq. 1 does) leaves an energy that is
    concave and unbounded below.
    """
    _check_patterns(patterns)
    _check_state(x, patterns)
    beta = _check_positive(beta, "beta")
    N = patterns.shape[0]
    M2 = (patterns * patterns).sum(-1).max()
    return -lse(x @ patterns.T, beta) + 0.5 * (x * x).sum(-1) + math.log(N) / beta + 0.5 * M2


def modern_energy_grad(x: torch.Tensor, patterns: torch.Tensor, beta: float = 1.0) -> torch.Tensor:
    """Closed-form gradient x - X^T softmax(beta X x) of :func:`modern_energy` (book eq. ``eq-lse-grad``)."""
    _check_patterns(patterns)
    _check_state(x, patterns)
    beta = _check_positive(beta, "beta")
    return x - _softmax_weights(x, patterns, beta) @ patterns


def lse_hessian(x: torch.Tensor, patterns: torch.Tensor, beta: float = 1.0) -> torch.Tensor:
    """Hessian of +lse_beta(X x) in x: beta X^T (diag(p) - p p^T) X, p = softmax(beta X x).

    diag(p) - p p^T is the covariance of a one-hot draw from p, so this is positive semidefinite:
    lse is convex and -lse (the term in every modern Hopfield / CEM energy) is concave.
    Shape ``(..., D, D)`` (book eqs. ``eq-lse-hess`` and ``eq-lse-covariance``).
    """
    _check_patterns(patterns)
    _check_state(x, patterns)
    beta = _check_positive(beta, "beta")
    p = _softmax_weights(x, patterns, beta)
    cov = torch.diag_embed(p) - p.unsqueeze(-1) * p.unsqueeze(-2)
    return beta * patterns.T @ cov @ patterns


def modern_energy_hessian(x: torch.Tensor, patterns: torch.Tensor, beta: float = 1.0) -> torch.Tensor:
    """Hessian I - beta X^T (diag(p) - p p^T) X of :func:`modern_energy` (its eigenvalues are <= 1)."""
    eye = torch.eye(patterns.shape[-1], dtype=patterns.dtype, device=patterns.device)
    return eye - lse_hessian(x, patterns, beta)


def cccp_step(x: torch.Tensor, patterns: torch.Tensor, beta: float = 1.0) -> torch.Tensor:
    """CCCP update x' = X^T softmax(beta X x) (book eq. ``eq-cccp``; Yuille & Rangarajan 2003).

    It solves grad(1/2 ||x'||^2) = -grad(-lse)(x): the convex part is minimised exactly while the
    concave part is linearised at x. It equals :func:`gradient_step` with ``eta=1``.
    """
    _check_patterns(patterns)
    _check_state(x, patterns)
    beta = _check_positive(beta, "beta")
    return _softmax_weights(x, patterns, beta) @ patterns


def gradient_step(x: torch.Tensor, patterns: torch.Tensor, beta: float = 1.0, eta: float = 0.5) -> torch.Tensor:
    """Plain gradient step x - eta grad E(x) = (1 - eta) x + eta X^T softmax(beta X x)
    (book eq. ``eq-gradient-step``).

    The Hessian of E is <= I, so for 0 < eta < 2 every step lowers E (descent lemma with L = 1).
    """
    eta = _check_positive(eta, "eta")
    return x - eta * modern_energy_grad(x, patterns, beta)


def modern_retrieve(x: torch.Tensor, patterns: torch.Tensor, beta: float = 1.0, rule: str = "cccp",
                    eta: float = 1.0, steps: int = 1) -> torch.Tensor:
    """Run ``steps`` updates of ``rule`` (``"cccp"`` or ``"gradient"``) and return the whole
    trajectory, shape ``(steps + 1, *x.shape)`` (entry 0 is the start)."""
    check_positive_int(steps, "steps")
    if rule not in ("cccp", "gradient"):
        raise ValueError(f"rule must be 'cccp' or 'gradient', got {rule!r}")
    traj = [x]
    for _ in range(steps):
        x = cccp_step(x, patterns, beta) if rule == "cccp" else gradient_step(x, patterns, beta, eta)
        traj.append(x)
    return torch.stack(traj)
