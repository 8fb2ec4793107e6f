"""Hyper-SET paper errors (Hu et al. 2025, arXiv:2502.11646) that no other test file shows, each
checked in float64.

The full list of items, and which test shows each one, is the registry ``cemlib.evidence.errata``, rendered
and proved by the book's appendix ``book/errata.ipynb``.
Here: the radius of Assumption 2 vs eq. (4), the vMF alignment term (eq. 15) vs eq. (5), the 1/2 of
the dense associative memory (App. B), feasibility of the constraints of eq. (6), the sign of the
learned step alpha_t (eq. 9), "non-decreasing g" of eq. (20) for the gated FF, and the untied W^O
of the shared-QKV baseline (F.3). Equation numbers are the paper's.
"""

import math

import numpy as np
import pytest
import torch
from scipy.optimize import least_squares

from cemlib.energies import hyperset as hs
from cemlib.energies.hopfield import classical_energy
from cemlib.layers.hyperset import BiSoftmaxAttention
from cemlib.layers.norm import rms_norm
from cemlib.testing import autograd_grad

pytestmark = pytest.mark.usefixtures("float64")


def _gen(seed=0):
    return torch.Generator().manual_seed(seed)


def test_radius_sqrt_p_is_a_temperature_change_not_only_a_scale():
    """Eq. (4)/(8) put z on the sphere of radius sqrt(p), Assumption 2 on S^{p-1}. With
    u = z / sqrt(p) on the unit sphere, E(z; beta) = p E(u; beta p): at beta = 1/sqrt(p) the
    unit-sphere energy has inverse temperature sqrt(p), not 1/sqrt(p). Read literally on the unit
    sphere with beta = 1/sqrt(p), the softmax weights, hence the update direction, differ."""
    p, N = 4, 6
    Z = torch.randn(N, p, generator=_gen())
    U = rms_norm(Z, eps=0.0)                      # eq. (8): ||U_i|| = sqrt(p), not 1
    torch.testing.assert_close(U.norm(dim=-1), torch.full((N,), math.sqrt(p)))
    u = U / math.sqrt(p)                          # on S^{p-1}
    beta = 1 / math.sqrt(p)
    torch.testing.assert_close(hs.bisoftmax_energy(U, beta), p * hs.bisoftmax_energy(u, beta * p))
    G = lambda V, b: torch.softmax(b * V @ V.T, -1)  # noqa: E731
    torch.testing.assert_close(G(U, beta), G(u, math.sqrt(p)))
    assert (G(U, beta) - G(u, beta)).abs().max() > 1e-2


def test_vmf_mixture_alignment_is_the_softmax_ff_not_relu_squared():
    """Eq. (15): -log p(x) = -log (1/M) sum_m C exp(kappa mu_m^T x) is Table 20's softmax FF energy
    with D = kappa [mu_m] (plus a constant); its gradient is not eq. (10)'s ReLU FF."""
    d, M, kappa = 5, 7, 3.0
    mu = torch.randn(d, M, generator=_gen())
    mu = mu / mu.norm(dim=0)
    x = torch.randn(4, d, generator=_gen(1))
    log_C = 1.234  # any normaliser C_d(kappa): constant in x
    nll = lambda y: -(torch.logsumexp(kappa * y @ mu, -1) + log_C - math.log(M))  # noqa: E731
    D = kappa * mu
    diff = nll(x) - hs.ff_energy(x, D, normalize=False, kind="softmax")
    torch.testing.assert_close(diff, torch.full_like(diff, math.log(M) - log_C))
    g = autograd_grad(nll, x)
    torch.testing.assert_close(g, hs.ff_energy_grad(x, D, normalize=False, kind="softmax"))
    relu = hs.ff_energy_grad(x, D, normalize=False, kind="relu")
    assert (g - relu).norm() > 0.1 * g.norm()


def test_dam_half_is_the_classical_energy_krotov_has_twice_it():
    """App. B: E = -1/2 sum_i f(xi_i^T x), f(x) = x^2, equals the classical -1/2 x^T W x with
    W = sum_i xi_i xi_i^T; Krotov-Hopfield's -sum_i F(xi_i^T x) is twice that. Harmless: the
    update sign(W x) and the minimisers are the same."""
    xi = torch.randn(3, 8, generator=_gen()).sign()
    x = torch.randn(10, 8, generator=_gen(1)).sign()
    W = xi.T @ xi
    paper = -0.5 * (x @ xi.T).pow(2).sum(-1)
    torch.testing.assert_close(paper, classical_energy(x, W))
    krotov = -(x @ xi.T).pow(2).sum(-1)
    torch.testing.assert_close(krotov, 2 * paper)
    torch.testing.assert_close(torch.sign(x @ W), torch.sign(2 * x @ W))


def test_eq6_constraints_can_be_infeasible_but_generic_bases_are_feasible():
    """Eq. (6) asks ||W_h^T x|| = sqrt(p) for all h and ||D^T x|| = sqrt(M) at once. Two heads
    with W_2 = 2 W_1 make this impossible (||W_2^T x||^2 = 4 ||W_1^T x||^2); for random bases with
    d > H + 1 a solution exists (found here to 1e-12), so infeasibility is not the generic case."""
    d, H, p, M = 8, 2, 2, 32
    rng = np.random.default_rng(0)
    W = rng.standard_normal((d, H * p)) / math.sqrt(d)
    D = rng.standard_normal((d, M)) / math.sqrt(d)

    def residuals(x, W):
        r = [np.sum((W[:, k * p:(k + 1) * p].T @ x) ** 2) - p for k in range(H)]
        return np.array(r + [np.sum((D.T @ x) ** 2) - M])

    sol = least_squares(residuals, rng.standard_normal(d), args=(W,), xtol=1e-15, ftol=1e-15,
                        gtol=1e-15)
    assert np.abs(residuals(sol.x, W)).max() < 1e-12
    W_bad = np.concatenate([W[:, :p], 2 * W[:, :p]], 1)
    bad = least_squares(residuals, rng.standard_normal(d), args=(W_bad,))
    assert np.abs(residuals(bad.x, W_bad)).max() > 0.1
    # the per-token bound: the two head constraints differ by a factor 4, whatever x is
    x = rng.standard_normal((100, d))
    sq = lambda cols: ((x @ W_bad[:, cols]) ** 2).sum(-1)  # noqa: E731
    np.testing.assert_allclose(sq(slice(p, None)), 4 * sq(slice(None, p)))


def test_sign_unconstrained_channel_steps_can_ascend():
    """Eq. (9) with a learned channel-wise alpha of free sign: x - alpha * grad E changes E by
    -sum_c alpha_c sum_i g_ic^2 at first order, so alpha >= 0 descends, and a step with negative
    channels can raise E (exact gradient flow here, normalize=False)."""
    torch.manual_seed(0)
    layer = BiSoftmaxAttention(8, 2, normalize=False)
    x = torch.randn(2, 5, 8, generator=_gen())
    with torch.no_grad():
        g = layer.energy_grad(x)
        E0 = layer.energy(x).sum()
        alpha_pos = torch.full((8,), 1e-3)
        alpha_mixed = 1e-3 * torch.where(torch.arange(8) % 2 == 0, -3.0, 1.0)
        assert layer.energy(layer(x, alpha_pos)).sum() < E0
        first_order = -(alpha_mixed * g.pow(2).sum((0, 1))).sum()
        assert first_order > 0
        assert layer.energy(layer(x, alpha_mixed)).sum() > E0


def test_gated_ff_g_is_not_non_decreasing_only_positive_phi_saves_it():
    """Eq. (20) asks for non-decreasing g; the gated FF has g(s) = s^2/2 (g'(s) = s < 0 for s < 0).
    With Phi = sigmoid, s = sum_m Phi(d_m^T x) > 0 and the descent direction raises every Phi_m
    (alignment). With an odd Phi (tanh) s can be negative and descent lowers s further: the
    update pushes x away from the directions it should align with."""
    d, M = 6, 9
    D = torch.randn(d, M, generator=_gen()) / math.sqrt(d)
    x = torch.randn(20, d, generator=_gen(1))
    U = x @ D
    assert (torch.sigmoid(U).sum(-1) > 0).all()
    s_sig = lambda y: torch.sigmoid(y @ D).sum(-1)  # noqa: E731
    step = -hs.ff_energy_grad(x, D, normalize=False, kind="gated")
    ds = (autograd_grad(s_sig, x) * step).sum(-1)
    assert (ds > 0).all()                                       # sigmoid: s always increases

    def gated_tanh(y):
        return -0.5 * torch.tanh(y @ D).sum(-1).pow(2)

    s_tanh = lambda y: torch.tanh(y @ D).sum(-1)  # noqa: E731
    neg = s_tanh(x) < 0
    assert neg.any()
    ds = (autograd_grad(s_tanh, x) * -autograd_grad(gated_tanh, x)).sum(-1)
    assert (ds[neg] < 0).all()                                  # tanh, s < 0: s decreases


def test_shared_qkv_output_matrix_absorbs_the_sign_flip():
    """F.3: a shared-QKV attention x + A(x) W_O with an untied W_O. The "reversed" update
    x - A(x) W_O is the same layer with W_O -> -W_O, so the two are one model family."""
    d, N = 6, 5
    Wqkv = torch.randn(d, d, generator=_gen()) / math.sqrt(d)
    W_O = torch.randn(d, d, generator=_gen(1)) / math.sqrt(d)
    x = torch.randn(2, N, d, generator=_gen(2))

    def attn(y):
        q = y @ Wqkv
        return torch.softmax(q @ q.transpose(-1, -2) / math.sqrt(d), -1) @ q

    torch.testing.assert_close(x - attn(x) @ W_O, x + attn(x) @ (-W_O))
