"""The pointwise potentials phi of the element-wise energy: phi = ∫_{-inf}^x sigma (CEM eq. 11).

The element-wise energy ``xi = -gamma^T phi(V x)`` (CEM eq. 7) turns into a gated MLP with
nonlinearity ``sigma = phi'``. cemlib ships the closed forms (our derivations:
the paper gives only the integral, eq. 11; checked in ``tests/energies/test_cem_energies.py``):

- SiLU:  ``phi(x) = x log(1+e^x) + Li2(-e^x)``; ``phi(0) = -pi^2/12``, ``phi(-inf) = 0``,
  ``phi(x) ~ x^2/2 - pi^2/6`` for large x. Not convex: ``phi'' = SiLU' < 0`` for x < -1.2785.
- GELU:  ``phi(x) = (x^2-1)/2 Phi(x) + x/2 varphi(x)`` (Phi, varphi: standard normal cdf, pdf).
- ReLU:  ``phi(x) = ReLU(x)^2 / 2`` (convex; used to show the Appendix-C "convex" variant is
  concave).

Each potential comes with ``phi'`` (= sigma) and ``phi''``; :data:`PHI` maps a name to the triple.
"""

from __future__ import annotations

import math
from typing import Callable, NamedTuple

import torch
import torch.nn.functional as F

from cemlib.energies.dilog import dilog

__all__ = ["phi_silu", "phi_gelu", "phi_relu2", "gelu_exact", "d2_silu", "d2_gelu", "d2_relu2",
           "Potential", "PHI", "get_phi"]

_PI2_6 = math.pi**2 / 6
_INV_SQRT_2PI = 1.0 / math.sqrt(2.0 * math.pi)


def phi_silu(x: torch.Tensor) -> torch.Tensor:
    """``∫_{-inf}^x z sigmoid(z) dz = x log(1+e^x) + Li2(-e^x)`` (CEM eq. 11 with sigma = SiLU).

    Overflow-free form: for x <= 0 as written (``Li2`` argument in [-1, 0)); for x > 0 through the
    inversion formula, ``phi = x^2/2 + x log(1+e^-x) - pi^2/6 - Li2(-e^-x)``.
    """
    a = -torch.exp(-x.abs())                   # in [-1, 0): a safe Li2 argument on both branches
    sp = torch.log1p(-a)                       # log(1 + e^{-|x|})
    neg = x * sp + dilog(a)                    # x <= 0: a = -e^x
    pos = 0.5 * x * x + x * sp - _PI2_6 - dilog(a)
    return torch.where(x > 0, pos, neg)


def gelu_exact(x: torch.Tensor) -> torch.Tensor:
    """``x Phi(x)`` (exact GELU, not the tanh approximation)."""
    return x * torch.special.ndtr(x)


def phi_gelu(x: torch.Tensor) -> torch.Tensor:
    """``∫_{-inf}^x z Phi(z) dz = (x^2-1)/2 Phi(x) + x/2 varphi(x)`` (CEM eq. 11, sigma = GELU)."""
    pdf = _INV_SQRT_2PI * torch.exp(-0.5 * x * x)
    return 0.5 * (x * x - 1.0) * torch.special.ndtr(x) + 0.5 * x * pdf


def phi_relu2(x: torch.Tensor) -> torch.Tensor:
    """``ReLU(x)^2 / 2`` (sigma = ReLU); convex, unlike phi_SiLU and phi_GELU."""
    return 0.5 * F.relu(x) ** 2


def d2_silu(x: torch.Tensor) -> torch.Tensor:
    """``phi_SiLU'' = SiLU'(x) = s(x) (1 + x (1 - s(x)))``, s = sigmoid."""
    s = torch.sigmoid(x)
    return s * (1.0 + x * (1.0 - s))


def d2_gelu(x: torch.Tensor) -> torch.Tensor:
    """``phi_GELU'' = Phi(x) + x varphi(x)``."""
    return torch.special.ndtr(x) + x * _INV_SQRT_2PI * torch.exp(-0.5 * x * x)


def d2_relu2(x: torch.Tensor) -> torch.Tensor:
    """``phi_ReLU'' = 1[x > 0]``."""
    return (x > 0).to(x.dtype)


class Potential(NamedTuple):
    """A potential ``phi`` with its first derivative ``sigma = phi'`` and second ``phi''``."""
    phi: Callable[[torch.Tensor], torch.Tensor]
    sigma: Callable[[torch.Tensor], torch.Tensor]
    d2: Callable[[torch.Tensor], torch.Tensor]


PHI: dict[str, Potential] = {
    "silu": Potential(phi_silu, F.silu, d2_silu),
    "gelu": Potential(phi_gelu, gelu_exact, d2_gelu),
    "relu2": Potential(phi_relu2, F.relu, d2_relu2),
}


def get_phi(name: str) -> Potential:
    """Look up a potential by name (``"silu"``, ``"gelu"``, ``"relu2"``)."""
    if name not in PHI:
        raise ValueError(f"unknown phi {name!r}; choose one of {sorted(PHI)}")
    return PHI[name]
