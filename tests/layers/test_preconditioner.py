"""Preconditioners (CEM eq. 13, D.4): initialisation, P g against the dense matrix, the
indefiniteness counterexample to the [ICLR] claim "softplus guarantees P > 0", and the safeguard."""

import math

import pytest
import torch
import torch.nn.functional as F

from cemlib.layers.precondition import Preconditioner


pytestmark = pytest.mark.usefixtures("float64_seeded")


def _randomise(P, scale=1.0):
    with torch.no_grad():
        for p in P.parameters():
            p.normal_(0.0, scale)
    return P


@pytest.mark.parametrize("kind", ["diag", "dplr"])
@pytest.mark.parametrize("heads", [None, 3])
def test_d4_initialisation_is_softplus1_identity(kind, heads):
    P = Preconditioner(16, kind, rank=4, n_heads=heads)
    assert torch.allclose(math.sqrt(16) * P.p, torch.ones_like(P.p))        # d = sqrt(D) p = 1
    eye = torch.eye(16).expand(P.matrix().shape)
    torch.testing.assert_close(P.matrix(), math.log1p(math.e) * eye)          # softplus(1) I
    if kind == "dplr":
        assert (P.V == 0).all() and 0.01 < P.U.std() < 0.03


def test_none_is_identity():
    g = torch.randn(2, 3, 4, 5)
    assert Preconditioner(5, "none", n_heads=3)(g) is g


@pytest.mark.parametrize("kind", ["diag", "dplr"])
@pytest.mark.parametrize("heads", [None, 3])
@pytest.mark.parametrize("safeguard", [False, True])
def test_apply_equals_dense_matrix(kind, heads, safeguard):
    P = _randomise(Preconditioner(6, kind, rank=2, n_heads=heads, safeguard=safeguard))
    g = torch.randn(2, 3, 4, 6) if heads else torch.randn(5, 4, 6)
    M = P.matrix()
    ref = torch.einsum("kde,bkle->bkld", M, g) if heads else g @ M.T
    torch.testing.assert_close(P(g), ref)
    if not safeguard and kind == "dplr":   # eq. 13 written out
        U, V = P.U, P.V
        S = torch.diag_embed(F.softplus(math.sqrt(6) * P.p))
        torch.testing.assert_close(M, S + U @ V.transpose(-1, -2) + V @ U.transpose(-1, -2))


def test_rank1_spectrum_formula():
    """eig(u v^T + v u^T) = {u.v +- |u||v|, 0, ...}: why CEM eq. 13 need not be positive definite."""
    u, v = torch.randn(7), torch.randn(7)
    ev = torch.linalg.eigvalsh(torch.outer(u, v) + torch.outer(v, u))
    pm = torch.stack([u @ v - u.norm() * v.norm(), u @ v + u.norm() * v.norm()])
    torch.testing.assert_close(ev[[0, -1]], pm)
    torch.testing.assert_close(ev[1:-1], torch.zeros(5), atol=1e-12, rtol=0)


def test_counterexample_p_is_not_positive_definite():
    """[ICLR] says softplus "guarantees P > 0"; with U = -V = 1.5 e_1, lambda_min = softplus(1) - 4.5."""
    P = Preconditioner(4, "dplr", rank=1)
    with torch.no_grad():
        P.U.zero_()
        P.U[0, 0] = 1.5
        P.V.copy_(-P.U)
    lam = P.lambda_min()
    torch.testing.assert_close(lam, torch.tensor(math.log1p(math.e) - 4.5))
    assert lam < 0
    # a direction along which the preconditioned "descent" step goes uphill: g^T P g < 0
    g = torch.tensor([1.0, 0.0, 0.0, 0.0])
    assert g @ P(g) < 0
    # random trained-looking factors are indefinite too
    assert (_randomise(Preconditioner(16, "dplr", rank=4, n_heads=4)).lambda_min() < 0).all()


def test_safeguard_makes_p_positive_definite():
    for seed in range(5):
        torch.manual_seed(seed)
        P = _randomise(Preconditioner(10, "dplr", rank=4, n_heads=3, safeguard=True), 1.5)
        s_min = P.diagonal().min(-1).values
        assert (P.lambda_min() >= P.delta * s_min - 1e-10).all()
        P.safeguard = False
        assert (P.lambda_min() < 0).any()          # the unguarded P was indefinite
    # near initialisation the safeguard is inactive: identical P
    P = Preconditioner(10, "dplr", rank=4, safeguard=True)
    Q = Preconditioner(10, "dplr", rank=4)
    Q.load_state_dict(P.state_dict())
    torch.testing.assert_close(P.matrix(), Q.matrix())


@pytest.mark.parametrize("kwargs, match", [
    (dict(dim=4, kind="lowrank"), "kind"),
    (dict(dim=4, kind="dplr", rank=0), "rank"),
    (dict(dim=0), "dim"),
    (dict(dim=4, n_heads=0), "n_heads"),
    (dict(dim=4, delta=1.5), "delta"),
])
def test_bad_construction(kwargs, match):
    with pytest.raises(ValueError, match=match):
        Preconditioner(**kwargs)


def test_bad_shapes():
    P = Preconditioner(4, "diag", n_heads=2)
    with pytest.raises(ValueError, match="K=2"):
        P(torch.randn(1, 3, 5, 4))
    with pytest.raises(ValueError, match="width is 4"):
        Preconditioner(4, "dplr")(torch.randn(3, 5))


def test_per_head_preconditioning_is_not_a_descent_direction():
    """CEM eq. 14: with P_k > 0 for every head, sum_k P_k g_k can still point uphill for
    eps = sum_k eps_k, because the heads' gradients g_k are preconditioned separately."""
    P = Preconditioner(3, "diag", n_heads=2)
    with torch.no_grad():                       # s_1 = softplus(1) ~ 1.31, s_2 = softplus(10) ~ 10
        P.p[1].fill_(10.0 / math.sqrt(3))
    assert (P.lambda_min() > 0).all()
    g_heads = torch.tensor([[1.0, 0.0, 0.0], [-0.5, 0.0, 0.0]]).view(1, 2, 1, 3)
    g = g_heads.sum(1)                           # the gradient of eps
    step = P(g_heads).sum(1)                     # eq. 14's direction
    assert (g * step).sum() < 0                  # x - eta * step increases eps to first order
