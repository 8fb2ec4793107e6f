"""Newton attention (Att2nd, Att2nd1st, MHA2nd, MHA2nd1st) against autograd gradients/Hessians."""

import math

import pytest
import torch

from cemlib.energies import helmholtz as fe
from cemlib.layers.newton import MHA2nd, MHA2nd1st, Att2nd, Att2nd1st, neumann_truncation_error
from cemlib.testing import autograd_grad

pytestmark = pytest.mark.usefixtures("float64")
hessian = torch.autograd.functional.hessian


def _data(B=2, N=6, d=4, seed=0, scale=1.0):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(B, d, generator=g), scale * torch.randn(B, N, d, generator=g)


@pytest.mark.parametrize("T", [2.0, 8.0])
def test_att2nd_is_newton_step_of_autograd_hessian(T):
    z, h = _data()
    layer = Att2nd(4, T=T, eta=0.7).double()
    with torch.no_grad():
        out = layer(z, h)
    for b in range(2):
        f = lambda x: layer.energy(x, h[b])  # noqa: E731
        g = autograd_grad(f, z[b])
        H = hessian(f, z[b])
        torch.testing.assert_close(layer.hessian(z[b], h[b]).detach(), H)
        torch.testing.assert_close(out[b], z[b] - 0.7 * torch.linalg.solve(H, g))


def test_att2nd1st_is_first_order_neumann_and_truncation_is_second_order():
    z, h = _data(seed=1)
    for T in [4.0, 16.0, 64.0]:
        torch.manual_seed(0)  # same W for every T
        l2, l1 = Att2nd(4, T=T, eta=1.0).double(), Att2nd1st(4, T=T, eta=1.0).double()
        l1.load_state_dict(l2.state_dict())
        f = lambda x: l2.energy(x, h[0])  # noqa: E731
        g, H = autograd_grad(f, z[0]), hessian(f, z[0])
        A = torch.eye(4) - H  # = C / T
        with torch.no_grad():
            d1 = z[0] - l1(z[0], h[0])
            d2 = z[0] - l2(z[0], h[0])
        torch.testing.assert_close(d1, (torch.eye(4) + A) @ g)  # first-order truncation
        err = d2 - d1
        torch.testing.assert_close(err, neumann_truncation_error(A, g))  # predicted exactly
        a = torch.linalg.matrix_norm(A, 2)
        assert err.norm() <= a**2 / (1 - a) * g.norm() + 1e-15  # the Neumann tail bound
    # measured order on the family A_s = s A: ||(I - sA)^{-1} - (I + sA)|| ~ s^2 ||A||^2
    s = torch.tensor([0.4, 0.2, 0.1, 0.05, 0.025])
    e = torch.stack([torch.linalg.matrix_norm(torch.linalg.inv(torch.eye(4) - si * A)
                                              - torch.eye(4) - si * A, 2) for si in s])
    slopes = torch.log(e[:-1] / e[1:]) / math.log(2.0)
    assert ((slopes > 1.9) & (slopes < 2.6)).all(), slopes
    assert abs(slopes[-1] - 2) < 0.1, slopes


def test_att2nd1st_always_descends_while_newton_can_ascend():
    # two particles at +-a e_1, z between them: C = a^2 e_1 e_1^T (p ~ 1/2 each); with a^2 > T the
    # Hessian 1 - a^2/T < 0 along e_1, the Neumann series diverges and Newton points uphill
    a, T = 1.5, 0.5
    h = torch.zeros(2, 3)
    h[0, 0], h[1, 0] = a, -a
    z = torch.tensor([0.05, 0.02, -0.01])
    newton, first = Att2nd(3, T=T, eta=1e-3).double(), Att2nd1st(3, T=T, eta=1e-3).double()
    with torch.no_grad():
        for layer in (newton, first):
            layer.W_Q.copy_(torch.eye(3))
            layer.W_K.copy_(torch.eye(3))
        assert torch.linalg.eigvalsh(newton.hessian(z, h)).min() < 0
        g = newton.energy_grad(z, h)
        assert (g * first.direction(z, h)).sum() > 0                       # descent
        assert (g * newton.direction(z, h)).sum() < 0                      # ascent
        assert newton.energy(newton(z, h), h) > newton.energy(z, h)
        assert first.energy(first(z, h), h) < first.energy(z, h)


def _mh(cls, d=6, H=2, T=1.5, seed=0, **kw):
    torch.manual_seed(seed)
    return cls(d, H, T=T, **kw).double()


def test_multihead_energy_grad_and_head_hessians():
    z, h = _data(d=6, N=5)
    layer = _mh(MHA2nd)
    f = lambda x: layer.energy(x, h)  # noqa: E731
    with torch.no_grad():
        torch.testing.assert_close(layer.energy_grad(z, h), autograd_grad(f, z))
        Hh = layer.head_hessians(z, h)
    for b in range(2):
        for k in range(2):
            fk = lambda x: fe.multihead_head_free_energies(  # noqa: E731
                x, h[b], layer.W_Q, layer.W_K, layer.T)[k]
            torch.testing.assert_close(Hh[b, k], hessian(fk, z[b]).detach())
            assert torch.linalg.matrix_rank(Hh[b, k]) == 3  # singular in R^d: rank d_h


def _head_autograd(layer, z, h):
    """Per head: autograd gradient and Hessian of F_h* at one token."""
    out = []
    for k in range(layer.n_heads):
        fk = lambda x: fe.multihead_head_free_energies(  # noqa: E731
            x, h, layer.W_Q.detach(), layer.W_K.detach(), layer.T.detach())[k]
        out.append((autograd_grad(fk, z), hessian(fk, z)))
    return out


def test_mha2nd_corrected_equals_pseudo_inverse_newton():
    z, h = _data(d=6, N=5)
    layer = _mh(MHA2nd, eta=0.4, T=3.0)
    with torch.no_grad():
        out = layer(z, h)
    for b in range(2):
        step = sum(torch.linalg.pinv(H) @ g for g, H in _head_autograd(layer, z[b], h[b]))
        torch.testing.assert_close(out[b], z[b] - 0.4 / 2 * step)


def test_footnote9_pseudo_inverse_needs_orthonormal_rows():
    g = torch.Generator().manual_seed(4)
    W = torch.randn(2, 5, generator=g)
    C = torch.randn(2, 2, generator=g)
    C = C @ C.T + torch.eye(2)
    paper = W.T @ torch.linalg.inv(W @ W.T) @ torch.linalg.inv(C) @ W
    G = torch.linalg.inv(W @ W.T)
    correct = W.T @ G @ torch.linalg.inv(C) @ G @ W
    torch.testing.assert_close(correct, torch.linalg.pinv(W.T @ C @ W))
    assert (paper - correct).norm() > 1e-2 * correct.norm()
    Q = torch.linalg.qr(W.T)[0].T  # orthonormal rows: the footnote holds
    torch.testing.assert_close(Q.T @ torch.linalg.inv(C) @ Q, torch.linalg.pinv(Q.T @ C @ Q))


def test_mha2nd_paper_form_has_wrong_sign():
    z, h = _data(d=6, N=5)
    good = _mh(MHA2nd, eta=0.01, T=50.0)        # high T: every C_h positive definite
    bad = _mh(MHA2nd, eta=0.01, T=50.0, form="paper")
    with torch.no_grad():
        # orthonormal rows per head: the paper's pseudo-inverse is then right, only the sign is not
        Q = torch.linalg.qr(torch.randn(6, 6))[0].T.reshape(2, 3, 6)
        for layer in (good, bad):
            layer.W_Q.copy_(Q)
        torch.testing.assert_close(bad(z, h) - z, -(good(z, h) - z))
        assert (good.energy(good(z, h), h) < good.energy(z, h)).all()
        assert (bad.energy(bad(z, h), h) > bad.energy(z, h)).all()  # "+" ascends


def test_mha2nd1st_tied_output_is_first_order_range_space_newton():
    z, h = _data(d=6, N=5)
    layer = _mh(MHA2nd1st, T=2.0)
    eta = 0.3
    with torch.no_grad():
        layer.W_O.copy_(layer.tied_output(eta))
        out = layer(z, h)
    for b in range(2):
        step = torch.zeros(6)
        for k, (g, H) in enumerate(_head_autograd(layer, z[b], h[b])):
            W = layer.W_Q[k].detach()
            Gi = torch.linalg.inv(W @ W.T)
            C = Gi @ W @ H @ W.T @ Gi          # recover C_h from the autograd Hessian W^T C W
            v = Gi @ W @ g                       # grad F_h* = W^T v
            step += W.T @ Gi @ (2 * torch.eye(3) - C) @ v   # (I - A)^{-1} ~ I + A, A = I - C
        torch.testing.assert_close(out[b], z[b] - eta / 2 * step)


def test_mha2nd1st_paper_form_eq30_31_and_its_sign():
    z, h = _data(d=6, N=5)
    layer = _mh(MHA2nd1st, T=40.0, form="paper")
    eta = 0.01
    with torch.no_grad():
        layer.W_O.copy_(layer.tied_output(eta))
        out = layer(z, h)
        # eq. (29) written out with the explicit d_i: P_h = W^T (WW^T)^{-1} [I + Cov/T] WW^T
        q, k, _, p, t, _ = fe.head_statistics(z, h, layer.W_Q, layer.W_K, layer.T, None)
        kbar = (p.unsqueeze(-1) * k).sum(-2)
        dev = k - kbar.unsqueeze(-2)
        cov = torch.einsum("bhi,bhic,bhie->bhce", p, dev, dev)
        G = layer.gram
        Wt = layer.W_Q.transpose(-1, -2)
        P = Wt @ torch.linalg.inv(G) @ (torch.eye(3) + cov / t.unsqueeze(-1)) @ G
        ref = z + eta / 2 * (P @ (q - kbar).unsqueeze(-1)).squeeze(-1).sum(1)
        torch.testing.assert_close(out, ref)
        # the "+" sign: a first-order step of the paper's form raises the energy at high T
        assert (layer.energy(out, h) > layer.energy(z, h)).all()
        good = _mh(MHA2nd1st, T=40.0)
        good.load_state_dict(layer.state_dict())
        good.W_O.copy_(good.tied_output(eta))
        assert (good.energy(good(z, h), h) < good.energy(z, h)).all()


def test_mha2nd1st_parameters_and_learnable_temperature():
    layer = MHA2nd1st(8, 2)
    n = sum(p.numel() for p in layer.parameters())
    assert n == 3 * 8 * 8 + 2  # W_Q, W_K, W_O, per-head T: one quarter fewer than 4 d^2
    torch.testing.assert_close(layer.T, torch.full((2,), 4.0, dtype=layer.T.dtype))  # init d_h
    z, h = _data(d=8, N=3)
    layer(z, h).sum().backward()
    assert layer.log_T.grad is not None and layer.W_O.grad is not None


def test_bad_input():
    with pytest.raises(ValueError, match="divisible"):
        MHA2nd1st(6, 4)
    with pytest.raises(ValueError, match="form"):
        MHA2nd(6, 2, form="plus")
    with pytest.raises(ValueError, match="n_heads"):
        MHA2nd(6, 0)
    with pytest.raises(ValueError, match="T must be"):
        Att2nd(4, T=-1.0)
    z, h = _data(d=6)
    with pytest.raises(ValueError, match="width mismatch"):
        MHA2nd1st(6, 2).double()(z[:, :4], h)
    with pytest.raises(ValueError, match="one entry per head"):
        fe.multihead_free_energy(z, h, torch.randn(2, 3, 6), torch.randn(2, 3, 6), torch.ones(3))
    with pytest.raises(ValueError, match="same shape"):
        fe.multihead_free_energy(z, h, torch.randn(2, 3, 6), torch.randn(3, 2, 6), 1.0)


@pytest.mark.parametrize("cls", [MHA2nd, MHA2nd1st])
def test_multihead_causal_mask_matches_per_prefix(cls):
    g = torch.Generator().manual_seed(8)
    X = torch.randn(2, 4, 6, generator=g)
    layer = _mh(cls, T=2.0)
    causal = torch.ones(4, 4, dtype=torch.bool).tril()
    with torch.no_grad():
        out = layer(X, X.unsqueeze(-3), causal)
        for i in range(4):
            torch.testing.assert_close(out[:, i], layer(X[:, i], X[:, : i + 1]))
