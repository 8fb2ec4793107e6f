"""Helmholtz free energy and attention as one GD step ("Transformers as intrinsic optimizers",
ICLR 2026 submission, Theorems 1 and 3), float64."""

import math

import pytest
import torch

from cemlib.energies import helmholtz as fe
from cemlib.layers.helmholtz import (LinearAttentionStep, MeanShiftAttentionStep,
                                     SoftmaxAttentionStep, value_matrix)
from cemlib.testing import assert_grad_matches_autograd, autograd_grad

pytestmark = pytest.mark.usefixtures("float64")


def _data(B=3, N=5, d=4, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(B, d, generator=g), torch.randn(B, N, d, generator=g), \
        torch.randn(d, d, generator=g) / math.sqrt(d)


def _sphere_data(B=3, N=5, d=4, rho=1.5, seed=1):
    """z and every W h_i on the sphere of radius rho (Theorem 1's assumption), W orthogonal."""
    g = torch.Generator().manual_seed(seed)
    W = torch.linalg.qr(torch.randn(d, d, generator=g))[0]
    z = torch.randn(B, d, generator=g)
    h = torch.randn(B, N, d, generator=g)
    return rho * z / z.norm(dim=-1, keepdim=True), rho * h / h.norm(dim=-1, keepdim=True), W


def test_lemma1_boltzmann_minimises_helmholtz():
    g = torch.Generator().manual_seed(0)
    E, T = torch.randn(6, generator=g), 0.7
    p_star = fe.boltzmann(E, T)
    F_star = fe.helmholtz(p_star, E, T)
    torch.testing.assert_close(F_star, fe.free_energy(E, T))
    for _ in range(20):  # any other point of the simplex is higher
        p = torch.softmax(torch.randn(6, generator=g) * 2, -1)
        assert fe.helmholtz(p, E, T) > F_star
    # the paper's A.2 restatement "-T sum_i exp(-E_i/T)" (log dropped) is not F*
    assert not torch.allclose(-T * torch.exp(-E / T).sum(), F_star)


@pytest.mark.parametrize("T", [0.5, 1.0, 3.0])
@pytest.mark.parametrize("masked", [False, True])
def test_free_energy_gradients_and_hessians(T, masked):
    z, h, W = _data()
    mask = torch.rand(3, 5, generator=torch.Generator().manual_seed(2)) > 0.4 if masked else None
    if masked:
        mask[:, 0] = True
    for F, dF, HF in [(fe.elastic_free_energy, fe.elastic_free_energy_grad,
                       fe.elastic_free_energy_hessian),
                      (fe.inner_free_energy, fe.inner_free_energy_grad,
                       fe.inner_free_energy_hessian),
                      (fe.quadratic_energy, fe.quadratic_energy_grad, fe.quadratic_energy_hessian)]:
        assert_grad_matches_autograd(lambda x: F(x, h, W, T, mask),
                                     lambda x: dF(x, h, W, T, mask), z)
        for b in range(3):
            hess = torch.autograd.functional.hessian(
                lambda x: F(x, h[b], W, T, None if mask is None else mask[b]), z[b])
            torch.testing.assert_close(HF(z, h, W, T, mask)[b], hess)


def test_inner_free_energy_is_concave_and_elastic_convex_at_high_T():
    z, h, W = _sphere_data(rho=1.0)
    assert torch.linalg.eigvalsh(fe.inner_free_energy_hessian(z, h, W, 0.3)).max() <= 1e-12
    # [NOT IN PAPER] F* is convex everywhere once T >= rho^2 (here ||W h_i|| = 1)
    zz = 3 * torch.randn(50, 4, generator=torch.Generator().manual_seed(3))
    hh = h[:1].expand(50, -1, -1)
    assert torch.linalg.eigvalsh(fe.elastic_free_energy_hessian(zz, hh, W, 1.0)).min() >= -1e-12
    # ... but not at low T (Lemma 2's non-convexity is conditional)
    assert torch.linalg.eigvalsh(fe.elastic_free_energy_hessian(zz, hh, W, 0.05)).min() < -1.0


@pytest.mark.parametrize("T", [0.5, 2.0, 4.0])
def test_attention_is_gd_on_inner_free_energy_with_corrected_tying(T):
    z, h, _ = _data(d=6, N=7)
    layer = SoftmaxAttentionStep(6, T=T, eta=0.3).double()
    with torch.no_grad():
        out = layer(z, h)
    gF = autograd_grad(lambda x: layer.energy(x, h), z)
    torch.testing.assert_close(out, z - 0.3 * gF)
    assert_grad_matches_autograd(lambda x: layer.energy(x, h), lambda x: layer.energy_grad(x, h), z)


@pytest.mark.parametrize("T", [0.5, 2.0, 4.0])
def test_paper_tying_is_off_by_T(T):
    z, h, _ = _data(d=6, N=7)
    good = SoftmaxAttentionStep(6, T=T, eta=0.3).double()
    bad = SoftmaxAttentionStep(6, T=T, eta=0.3, tying="paper").double()
    bad.load_state_dict(good.state_dict())
    with torch.no_grad():
        dz_good, dz_bad = good(z, h) - z, bad(z, h) - z
    torch.testing.assert_close(dz_bad, T * dz_good)  # exactly a factor T too large
    assert (dz_bad - dz_good).norm() > 0.1 * abs(T - 1) * dz_good.norm()


def test_theorem1_on_the_sphere_gradients_differ_by_z():
    z, h, W = _sphere_data(rho=1.5)
    T = 0.8
    # on the sphere F* = F~* + rho^2 ...
    torch.testing.assert_close(fe.elastic_free_energy(z, h, W, T),
                               fe.inner_free_energy(z, h, W, T) + 1.5**2)
    # ... but their gradients differ by exactly z (ISSUE 2): the radial component
    gF = autograd_grad(lambda x: fe.elastic_free_energy(x, h, W, T), z)
    gFt = autograd_grad(lambda x: fe.inner_free_energy(x, h, W, T), z)
    torch.testing.assert_close(gF - gFt, z)


def test_mean_shift_step_is_eq8_and_descends_for_eta_up_to_2():
    z, h, _ = _data(N=9)
    layer = MeanShiftAttentionStep(4, T=0.5, eta=1.0).double()
    with torch.no_grad():
        gF = autograd_grad(lambda x: layer.energy(x, h), z)
        torch.testing.assert_close(layer(z, h), z - gF)
        for eta in (0.5, 1.0, 1.9, 2.0):  # majorisation: F*((1-eta) z + eta h_bar) <= F*(z)
            layer.eta = eta
            assert (layer.energy(layer(z, h), h) <= layer.energy(z, h) + 1e-12).all()
        layer.eta = 4.0                    # beyond eta = 2 the step can raise the energy
        assert (layer.energy(layer(z, h), h) > layer.energy(z, h)).any()


@pytest.mark.parametrize("T", [0.5, 3.0])
def test_linear_attention_is_gd_on_quadratic_energy(T):
    z, h, _ = _data(d=5, N=6)
    layer = LinearAttentionStep(5, T=T, eta=0.2).double()
    with torch.no_grad():
        out = layer(z, h)
    torch.testing.assert_close(out, z - 0.2 * autograd_grad(lambda x: layer.energy(x, h), z))
    # the proof of Theorem 3 (App. A.3) omits the factor T in the gradient; the gradient has it
    gF = autograd_grad(lambda x: layer.energy(x, h), z)
    m = h @ layer.W.detach().T
    u4 = -((z.unsqueeze(-2) * m).sum(-1, keepdim=True) * m).sum(-2)
    torch.testing.assert_close(gF, T * u4)


def test_linear_attention_iterated_diverges():
    z, h, _ = _data(d=4, N=6)
    layer = LinearAttentionStep(4, T=1.0, eta=0.5).double()
    norms = []
    with torch.no_grad():
        for _ in range(30):
            z = layer(z, h)
            norms.append(z.norm().item())
    assert norms[-1] > 1e6 * norms[0]


def test_causal_mask_matches_per_prefix_computation():
    g = torch.Generator().manual_seed(5)
    X = torch.randn(2, 4, 3, generator=g)
    layer = SoftmaxAttentionStep(3, T=0.9, eta=0.5).double()
    causal = torch.ones(4, 4, dtype=torch.bool).tril()
    with torch.no_grad():
        out = layer(X, X.unsqueeze(-3), causal)
        for i in range(4):
            torch.testing.assert_close(out[:, i], layer(X[:, i], X[:, : i + 1]))


def test_bad_input():
    z, h, W = _data()
    layer = SoftmaxAttentionStep(4).double()
    with pytest.raises(ValueError, match="width mismatch"):
        layer(z[:, :3], h)
    with pytest.raises(ValueError, match="NaN"):
        layer(z.masked_fill(z > 1, float("nan")), h)
    with pytest.raises(ValueError, match="T must be"):
        fe.elastic_free_energy(z, h, W, 0.0)
    with pytest.raises(ValueError, match="empty set"):
        layer(z, h, torch.zeros(3, 5, dtype=torch.bool))
    with pytest.raises(ValueError, match="does not broadcast"):
        layer(z, h, torch.ones(3, 4, dtype=torch.bool))
    with pytest.raises(TypeError, match="bool"):
        layer(z, h, torch.ones(3, 5))
    with pytest.raises(ValueError, match="tying"):
        SoftmaxAttentionStep(4, tying="eta*T")
    with pytest.raises(ValueError, match="tying"):
        value_matrix(W, 1.0, 1.0, "wrong")
    with pytest.raises(ValueError, match="d must be"):
        SoftmaxAttentionStep(0)
    with pytest.raises(ValueError, match="W must be"):
        fe.elastic_free_energy(z, h, W[:3], 1.0)


def test_theorem2_multihead_attention_is_gd_with_eta_over_H_not_eta_T_over_H():
    """MHA (11) with W_O,h W_V,h = (eta/H) W1_h^T W2_h is one GD step on the multi-head
    inner-product free energy -(1/H) sum_h T log sum_i exp(q_h^T k_ih / T); the paper's eta T / H
    is off by T (and its printed exponent sign and W1_h h_i in eq. 20 are wrong)."""
    g = torch.Generator().manual_seed(7)
    H, dh, d, N, T, eta = 2, 3, 6, 5, 2.5, 0.4
    W1, W2 = torch.randn(H, dh, d, generator=g), torch.randn(H, dh, d, generator=g)
    z, h = torch.randn(d, generator=g), torch.randn(N, d, generator=g)

    def Ft(x):
        s = torch.einsum("hcd,d,hce,ne->hn", W1, x, W2, h) / T
        return -(T * torch.logsumexp(s, -1)).mean()

    def mha(x, scale):
        out = x.clone()
        for k in range(H):
            p = torch.softmax((W1[k] @ x) @ (W2[k] @ h.T) / T, -1)
            out = out + scale * (W1[k].T @ W2[k] @ h.T) @ p
        return out

    step = z - eta * autograd_grad(Ft, z)
    torch.testing.assert_close(mha(z, eta / H), step)
    torch.testing.assert_close(mha(z, eta * T / H) - z, T * (step - z))


def test_residual_attention_iterated_without_normalisation_grows():
    """ISSUE 3: F~* is concave and unbounded below; iterating the residual step makes ||z|| grow."""
    z, h, _ = _data(B=1, N=4, d=3)
    layer = SoftmaxAttentionStep(3, T=1.0, eta=1.0).double()
    with torch.no_grad():
        layer.W_Q.copy_(torch.eye(3))
        layer.W_K.copy_(torch.eye(3))
        norms = [z.norm().item()]
        for _ in range(50):
            z = layer(z, h)
            norms.append(z.norm().item())
    assert norms[-1] > 10 * norms[0] and norms[-1] > norms[-2]


def test_rbf_softmax_is_dot_product_softmax_with_key_norm_bias():
    z, h, W = _data()
    m = h @ W.T
    T = 0.7
    rbf = fe.boltzmann(fe.elastic_energies(z, m), T)
    dot = torch.softmax(((z.unsqueeze(-2) * m).sum(-1) - 0.5 * m.pow(2).sum(-1)) / T, -1)
    torch.testing.assert_close(rbf, dot)
    assert not torch.allclose(rbf, fe.boltzmann(fe.inner_product_energies(z, m), T))
