"""Hyper-SET metrics: effective rank (eq. 17), average angle (eq. 18), energy per iteration."""

import math

import pytest
import torch

from cemlib.layers.hyperset import BiSoftmaxAttention
from cemlib.metrics import (average_angle, effective_rank, energy_per_iteration,
                            separation_per_iteration, subspace_tokens)

pytestmark = pytest.mark.usefixtures("float64")


def test_effective_rank_definition():
    torch.testing.assert_close(effective_rank(torch.eye(5)), torch.tensor(5.0))
    u = torch.randn(6, 1, generator=torch.Generator().manual_seed(0))
    torch.testing.assert_close(effective_rank(u @ torch.ones(1, 4)), torch.tensor(1.0))
    X = torch.diag(torch.tensor([3.0, 1.0, 0.0]))  # singular values normalised by their sum
    p = torch.tensor([0.75, 0.25])
    torch.testing.assert_close(effective_rank(X), torch.exp(-(p * p.log()).sum()))
    Y = torch.randn(2, 7, 4, generator=torch.Generator().manual_seed(1))
    torch.testing.assert_close(effective_rank(3.0 * Y), effective_rank(Y))   # scale invariant
    assert effective_rank(Y).shape == (2,)


def test_average_angle_definition():
    torch.testing.assert_close(average_angle(torch.eye(4)), torch.tensor(90.0))
    torch.testing.assert_close(average_angle(torch.ones(3, 5)), torch.tensor(0.0), atol=1e-5,
                               rtol=0)
    # arccos of the mean cosine, not the mean of the angles
    X = torch.tensor([[1.0, 0.0], [0.0, 1.0], [1.0, 0.0]])
    torch.testing.assert_close(average_angle(X, degrees=False),
                               torch.tensor(math.acos(1.0 / 3.0)))
    assert abs(average_angle(X).item() - 60.0) > 5.0  # the mean angle would be 60 degrees


def test_energy_per_iteration_and_subspace_separation_under_gradient_flow():
    """Claim H3: exact gradient flow on E_ATTN lowers the energy and spreads clustered tokens in
    each subspace (effective rank and average angle rise)."""
    torch.manual_seed(0)
    layer = BiSoftmaxAttention(8, 2, normalize=False)
    g = torch.Generator().manual_seed(3)
    X = torch.randn(1, 8) + 0.1 * torch.randn(12, 8, generator=g)   # clustered tokens
    states = [X]
    with torch.no_grad():
        for _ in range(40):
            states.append(layer(states[-1], 0.05))
    E = energy_per_iteration(states, layer.energy)
    assert E.shape == (41,)
    assert (E[1:] < E[:-1]).all()
    Z0, Z1 = (subspace_tokens(s, layer.W.detach(), 2) for s in (states[0], states[-1]))
    assert Z0.shape == (2, 12, 4)
    assert (effective_rank(Z1) > effective_rank(Z0)).all()
    assert (average_angle(Z1) > average_angle(Z0) + 10).all()
    sep = separation_per_iteration(states, layer.W.detach(), 2)
    assert sep["erank"].shape == sep["angle"].shape == (41, 2)
    torch.testing.assert_close(sep["angle"][-1], average_angle(Z1))
    torch.testing.assert_close(sep["full_erank"][0], effective_rank(X))


def test_bad_input():
    with pytest.raises(ValueError, match="N >= 2"):
        average_angle(torch.ones(1, 3))
    with pytest.raises(ValueError, match="zero token"):
        average_angle(torch.zeros(2, 3))
    with pytest.raises(ValueError, match="all-zero"):
        effective_rank(torch.zeros(3, 3))
    with pytest.raises(ValueError, match="NaN"):
        effective_rank(torch.tensor([[float("nan"), 1.0]]))
    with pytest.raises(ValueError, match="empty"):
        energy_per_iteration([], lambda x: x.sum(-1))
    with pytest.raises(ValueError, match="empty"):
        separation_per_iteration([], torch.ones(8, 4), 2)
    with pytest.raises(ValueError, match="last dimension 8"):
        subspace_tokens(torch.ones(3, 4), torch.ones(8, 4), 2)
