"""Float64 tests of the associative-memory energies (cemlib.energies.hopfield) and patterns."""

import math

import pytest
import torch

from cemlib.data.patterns import digit_patterns, flip_bits, occlude, overlap, random_binary_patterns
from cemlib.energies import hopfield as H
from cemlib.testing import assert_grad_matches_autograd, autograd_grad

f64 = torch.float64


@pytest.fixture
def gen():
    g = torch.Generator()
    g.manual_seed(0)
    return g


def _cont(gen, *shape):
    return torch.randn(*shape, generator=gen, dtype=f64)


# ----------------------------------------------------------------- gradients against autograd
@pytest.mark.parametrize("beta", [0.3, 1.0, 8.0])
def test_modern_grad_matches_autograd(gen, beta):
    X, xi = _cont(gen, 6, 4), _cont(gen, 3, 5, 4)
    assert_grad_matches_autograd(lambda z: H.modern_energy(z, X, beta),
                                 lambda z: H.modern_energy_grad(z, X, beta), xi)


@pytest.mark.parametrize("beta", [0.5, 3.0])
def test_modern_hessian_matches_autograd(gen, beta):
    X = _cont(gen, 5, 3)
    for xi in _cont(gen, 4, 3):
        auto = torch.autograd.functional.hessian(lambda z: H.modern_energy(z, X, beta), xi)
        torch.testing.assert_close(H.modern_energy_hessian(xi, X, beta), auto, rtol=1e-10, atol=1e-12)
        lse_auto = torch.autograd.functional.hessian(lambda z: H.lse(z @ X.T, beta), xi)
        torch.testing.assert_close(H.lse_hessian(xi, X, beta), lse_auto, rtol=1e-10, atol=1e-12)


def test_hessian_batched_shape(gen):
    X, xi = _cont(gen, 5, 3), _cont(gen, 2, 4, 3)
    Hm = H.modern_energy_hessian(xi, X, 1.0)
    assert Hm.shape == (2, 4, 3, 3)
    torch.testing.assert_close(Hm[1, 2], H.modern_energy_hessian(xi[1, 2], X, 1.0))


@pytest.mark.parametrize("kind,n", [("poly", 2), ("poly", 3), ("rectpoly", 3), ("exp", 1)])
def test_dense_grad_matches_autograd(gen, kind, n):
    X, s = _cont(gen, 5, 6) / 2, _cont(gen, 4, 6) / 2
    assert_grad_matches_autograd(lambda z: H.dense_energy(z, X, kind, n),
                                 lambda z: H.dense_energy_grad(z, X, kind, n), s)


def test_classical_grad_matches_autograd(gen):
    W = H.hebbian_weights(_cont(gen, 3, 7))
    assert_grad_matches_autograd(lambda z: H.classical_energy(z, W),
                                 lambda z: H.classical_energy_grad(z, W), _cont(gen, 4, 7))


# ----------------------------------------------------------------- concavity: CEM App. C is wrong
def test_neg_lse_is_concave_not_convex(gen):
    """CEM App. C ([arXiv] = [ICLR]) calls -tau log sum exp(h_j^T x / tau) convex in x. Its Hessian
    is -beta X (diag p - p p^T) X^T: all eigenvalues <= 0, and some < 0, so it is concave and not convex."""
    X, xi = _cont(gen, 6, 4), _cont(gen, 50, 4)
    for beta in (0.5, 2.0):
        eig = torch.linalg.eigvalsh(-H.lse_hessian(xi, X, beta))
        assert eig.max() <= 1e-12
        assert eig.min() < -1e-3  # strictly negative curvature: "convex" would need all >= 0
    # Midpoint test on the CEM form itself (tau = 1/beta): f((a+b)/2) >= (f(a)+f(b))/2 (concavity),
    # and strictly so somewhere, which a convex function cannot satisfy.
    f = lambda z: -H.lse(z @ X.T, 1.0)  # noqa: E731
    a, b = _cont(gen, 100, 4), _cont(gen, 100, 4)
    gap = f((a + b) / 2) - (f(a) + f(b)) / 2
    assert bool((gap >= -1e-12).all()) and bool((gap > 1e-3).any())


def test_cem_form_unbounded_below_modern_form_bounded(gen):
    X = _cont(gen, 4, 3)
    direction = X[0] / X[0].norm()
    t = torch.tensor([1.0, 10.0, 100.0], dtype=f64).unsqueeze(-1)
    cem = -H.lse((t * direction) @ X.T, 1.0)  # CEM [arXiv] eq. 2 = [ICLR] eq. 1, one head, A = I
    assert bool((cem[1:] < cem[:-1]).all()) and cem[-1] < -50
    # Ramsauer's form: E >= 0 everywhere, E <= 2 M^2 on the ball ||xi|| <= M.
    M = X.norm(dim=-1).max()
    xi = _cont(gen, 500, 3) * 3
    assert bool((H.modern_energy(xi, X, 2.0) >= 0).all())
    ball = xi / xi.norm(dim=-1, keepdim=True) * M * torch.rand(500, 1, generator=gen, dtype=f64)
    assert bool((H.modern_energy(ball, X, 2.0) <= 2 * M**2 + 1e-12).all())


# ----------------------------------------------------------------- CCCP and gradient steps
def test_cccp_is_unit_gradient_step_and_fixed_point_condition(gen):
    X, xi = _cont(gen, 5, 3), _cont(gen, 7, 3)
    torch.testing.assert_close(H.cccp_step(xi, X, 2.0), H.gradient_step(xi, X, 2.0, eta=1.0), rtol=0, atol=1e-15)
    # CCCP: grad(1/2||xi'||^2) = -grad(-lse)(xi) = X softmax(beta X^T xi)
    p = torch.softmax(2.0 * xi @ X.T, -1)
    torch.testing.assert_close(H.cccp_step(xi, X, 2.0), p @ X)


def test_cem_appendix_c_cccp_needs_the_quadratic_term(gen):
    """CEM App. C pairs the energy -tau lse(h_j^T x / tau) (no 1/2||x||^2) with the CCCP update
    x' = sum_j softmax_j h_j. A unit gradient step on that energy is x + X^T p instead (a residual);
    x' = X^T p is the unit step, and the CCCP step, only of Ramsauer's form with 1/2||x||^2."""
    X, x = _cont(gen, 5, 3), _cont(gen, 6, 3)
    cem_grad = autograd_grad(lambda z: -H.lse(z @ X.T, 1.0), x)
    torch.testing.assert_close(x - cem_grad, x + H.cccp_step(x, X, 1.0))
    assert (x - cem_grad - H.cccp_step(x, X, 1.0)).norm() > 0.1
    modern_grad = autograd_grad(lambda z: H.modern_energy(z, X, 1.0), x)
    torch.testing.assert_close(x - modern_grad, H.cccp_step(x, X, 1.0))


@pytest.mark.parametrize("rule,eta", [("cccp", 1.0), ("gradient", 0.3), ("gradient", 1.9)])
def test_energy_decreases_along_retrieval(gen, rule, eta):
    X, xi = _cont(gen, 6, 4), _cont(gen, 10, 4) * 2
    traj = H.modern_retrieve(xi, X, 1.5, rule=rule, eta=eta, steps=15)
    E = H.modern_energy(traj, X, 1.5)
    assert traj.shape == (16, 10, 4)
    assert bool((E[1:] <= E[:-1] + 1e-12).all())


def test_descent_lemma_bound_and_large_step_divergence(gen):
    """Hessian <= I, so E(xi - eta g) <= E(xi) - eta (1 - eta/2) ||g||^2; eta > 2 can blow up."""
    X, xi = _cont(gen, 5, 3), _cont(gen, 20, 3)
    for eta in (0.5, 1.0, 1.5):
        g = H.modern_energy_grad(xi, X, 1.0)
        lhs = H.modern_energy(xi - eta * g, X, 1.0)
        rhs = H.modern_energy(xi, X, 1.0) - eta * (1 - eta / 2) * (g * g).sum(-1)
        assert bool((lhs <= rhs + 1e-12).all())
    assert bool((torch.linalg.eigvalsh(H.modern_energy_hessian(xi, X, 1.0)) <= 1 + 1e-12).all())
    traj = H.modern_retrieve(xi, X, 1.0, rule="gradient", eta=2.5, steps=30)
    assert traj[-1].norm(dim=-1).min() > 1e3


def test_large_beta_retrieves_stored_pattern(gen):
    X = _cont(gen, 8, 16)
    xi = X + 0.2 * _cont(gen, 8, 16)
    out = H.modern_retrieve(xi, X, 10.0, steps=3)[-1]
    torch.testing.assert_close(out, X, rtol=0, atol=1e-8)


# ----------------------------------------------------------------- discrete dynamics
def test_classical_async_never_increases_energy_and_stores_few_patterns(gen):
    X = random_binary_patterns(3, 60, generator=gen)
    W = H.hebbian_weights(X)
    assert torch.all(torch.diagonal(W) == 0) and torch.equal(W, W.T)
    s = flip_bits(X, 0.1, generator=gen)
    energies = [H.classical_energy(s, W)]
    for _ in range(4):
        s = H.classical_update(s, W, sweeps=1, generator=gen)
        energies.append(H.classical_energy(s, W))
    E = torch.stack(energies)
    assert bool((E[1:] <= E[:-1] + 1e-12).all())
    assert torch.equal(s, X)


def test_classical_sync_can_oscillate():
    # Two units coupled negatively, both +1: a synchronous update flips both, forever (a 2-cycle);
    # an asynchronous one flips only the first and stops at a minimum.
    W = torch.tensor([[0.0, -1.0], [-1.0, 0.0]], dtype=f64)
    s0 = torch.tensor([1.0, 1.0], dtype=f64)
    s1 = H.classical_update(s0, W, mode="sync")
    s2 = H.classical_update(s1, W, mode="sync")
    assert torch.equal(s1, -s0) and torch.equal(s2, s0)
    assert not torch.equal(H.classical_update(s0, W, mode="async", order="sequential"), s1)


@pytest.mark.parametrize("kind,n", [("poly", 3), ("rectpoly", 4), ("exp", 1)])
def test_dense_update_descends_and_beats_classical(gen, kind, n):
    N, P = 40, 20  # P/N = 0.5: far beyond the classical network's capacity
    X = random_binary_patterns(P, N, generator=gen)
    s = flip_bits(X, 0.1, generator=gen)
    e0 = H.dense_energy(s, X, kind, n)  # overlaps <= 40: exp() does not overflow here
    out = H.dense_update(s, X, kind, n, sweeps=3, generator=gen)
    assert bool((H.dense_energy(out, X, kind, n) <= e0 * (1 - 1e-12) + 1e-9).all())
    assert overlap(out, X).mean() > 0.99
    classical = H.classical_update(s, H.hebbian_weights(X), sweeps=3, generator=gen)
    assert overlap(classical, X).mean() < overlap(out, X).mean()


def test_dense_exp_update_is_overflow_free():
    X = random_binary_patterns(5, 1000, generator=torch.Generator().manual_seed(1))
    out = H.dense_update(X.clone(), X, "exp", sweeps=1, order="sequential")
    assert torch.equal(out, X)  # overlaps of 1000 would overflow exp() in float64


def test_dense_poly2_matches_classical_update(gen):
    """F(z) = z^2: sum_mu F(r_mu + x_mu,i) - F(r_mu - x_mu,i) = 4 d sum_j W_ij s_j, Hopfield's field."""
    X = random_binary_patterns(4, 30, generator=gen)
    s = flip_bits(X, 0.2, generator=gen)
    a = H.dense_update(s, X, "poly", 2, order="sequential")
    b = H.classical_update(s, H.hebbian_weights(X), order="sequential")
    assert torch.equal(a, b)


# ----------------------------------------------------------------- patterns and bad input
def test_digit_patterns_and_corruption(gen):
    X, y = digit_patterns(per_class=2)
    assert X.shape == (20, 64) and X.dtype == f64 and y.tolist() == [c for c in range(10) for _ in (0, 1)]
    assert set(X.unique().tolist()) == {-1.0, 1.0}
    Z = flip_bits(X, 0.25, generator=gen)
    assert bool(((Z != X).sum(-1) == 16).all())
    O = occlude(X, rows=4)
    assert torch.equal(O.reshape(20, 8, 8)[:, 4:], -torch.ones(20, 4, 8, dtype=f64))
    assert torch.equal(O.reshape(20, 8, 8)[:, :4], X.reshape(20, 8, 8)[:, :4])
    torch.testing.assert_close(overlap(X, X), torch.ones(20, dtype=f64))


def test_bad_input_gives_clear_errors():
    X = torch.randn(4, 3, dtype=f64)
    with pytest.raises(ValueError, match="last dimension 3"):
        H.modern_energy(torch.zeros(5, dtype=f64), X)
    with pytest.raises(ValueError, match="beta"):
        H.modern_energy(torch.zeros(3, dtype=f64), X, beta=0.0)
    with pytest.raises(ValueError, match="NaN"):
        H.modern_energy_grad(torch.tensor([0.0, math.nan, 0.0], dtype=f64), X)
    with pytest.raises(ValueError, match="steps"):
        H.modern_retrieve(torch.zeros(3, dtype=f64), X, steps=0)
    with pytest.raises(ValueError, match="rule"):
        H.modern_retrieve(torch.zeros(3, dtype=f64), X, rule="newton")
    with pytest.raises(TypeError, match="dtype"):
        H.modern_energy(torch.zeros(3, dtype=torch.float32), X)
    with pytest.raises(ValueError, match="-1 and \\+1"):
        H.dense_update(torch.zeros(3, dtype=f64), X.sign())
    with pytest.raises(ValueError, match="kind"):
        H.dense_energy(torch.ones(3, dtype=f64), X, kind="cubic")
    with pytest.raises(ValueError, match="square"):
        H.classical_energy(torch.ones(3, dtype=f64), torch.ones(3, 4, dtype=f64))
    with pytest.raises(ValueError, match="mode"):
        H.classical_update(torch.ones(3, dtype=f64), torch.zeros(3, 3, dtype=f64), mode="parallel")
    with pytest.raises(ValueError, match="fraction"):
        flip_bits(torch.ones(3, dtype=f64), 1.5)
