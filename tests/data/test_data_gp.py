"""GP regression data (CEM [ICLR] Table 3): kernels against scikit-learn, sample covariance, seeds."""

import numpy as np
import pytest
import torch
from sklearn.gaussian_process.kernels import RBF, Matern

from cemlib.data.gp import make_gp_regression, matern_kernel, rbf_kernel, sample_gp


def test_kernels_match_scikit_learn():
    g = torch.Generator().manual_seed(0)
    x1 = torch.randn(7, 10, dtype=torch.float64, generator=g)
    x2 = torch.randn(5, 10, dtype=torch.float64, generator=g)
    for ell in (0.7, 3.0):
        ref = RBF(length_scale=ell)(x1.numpy(), x2.numpy())
        np.testing.assert_allclose(rbf_kernel(x1, x2, ell).numpy(), ref, rtol=1e-12, atol=1e-14)
        for nu in (0.5, 1.5, 2.5):
            ref = Matern(length_scale=ell, nu=nu)(x1.numpy(), x2.numpy())
            got = matern_kernel(x1, x2, ell, nu).numpy()
            np.testing.assert_allclose(got, ref, rtol=1e-12, atol=1e-14)
    assert torch.allclose(matern_kernel(x1, x1, 1.0).diagonal(), torch.ones(7, dtype=torch.float64))


def test_sample_covariance_matches_the_kernel():
    x = torch.linspace(-1, 1, 4, dtype=torch.float64)[:, None].repeat(1, 10)
    g = torch.Generator().manual_seed(1)
    for kernel in ("rbf", "matern"):
        draws = sample_gp(x, kernel, 3.0, generator=g, num_draws=4000)
        assert draws.shape == (4000, 4)
        emp = draws.T @ draws / len(draws)
        K = rbf_kernel(x, x, 3.0) if kernel == "rbf" else matern_kernel(x, x, 3.0)
        assert (emp - K).abs().max() < 0.1  # 4000 draws: standard error ~0.02


@pytest.mark.parametrize("kernel", ["rbf", "matern"])
def test_layout_determinism_and_seed(kernel):
    a = make_gp_regression(kernel, n_train=150, n_test=40, seed=2)
    b = make_gp_regression(kernel, n_train=150, n_test=40, seed=2)
    c = make_gp_regression(kernel, n_train=150, n_test=40, seed=3)
    assert a.x_train.shape == (150, 10) and a.y_train.shape == (150, 1)
    assert a.x_test.shape == (40, 10) and a.y_test.shape == (40, 1)
    for t in (a.x_train, a.y_train, a.x_test, a.y_test):
        assert t.dtype == torch.float64 and torch.isfinite(t).all()
    assert a.x_train.abs().max() <= 1.0
    assert torch.equal(a.y_train, b.y_train) and torch.equal(a.x_test, b.x_test)
    assert not torch.equal(a.y_train, c.y_train)
    x, y = a.train_dataset()[0]
    assert x.shape == (10,) and y.shape == (1,)


def test_rbf_function_is_smoother_than_matern():
    # same inputs and noise draw; nearest-neighbour differences are larger for the rougher Matérn
    def roughness(kernel):
        d = make_gp_regression(kernel, n_train=300, n_test=1, seed=0, nu=0.5)
        dist = torch.cdist(d.x_train, d.x_train) + torch.eye(300, dtype=torch.float64) * 1e9
        nn = dist.argmin(1)
        return ((d.y_train - d.y_train[nn]).pow(2).mean() / d.y_train.var()).item()
    assert roughness("matern") > 2 * roughness("rbf")


def test_noise_and_bad_arguments():
    clean = make_gp_regression("rbf", n_train=50, n_test=10, seed=0)
    noisy = make_gp_regression("rbf", n_train=50, n_test=10, seed=0, noise_std=0.1)
    assert torch.equal(clean.x_train, noisy.x_train)
    assert 0.05 < (noisy.y_train - clean.y_train).std() < 0.2
    with pytest.raises(ValueError, match="kernel"):
        make_gp_regression("cosine")
    with pytest.raises(ValueError, match="nu"):
        matern_kernel(clean.x_train, clean.x_train, 1.0, nu=2.0)
    with pytest.raises(ValueError, match="lengthscale"):
        rbf_kernel(clean.x_train, clean.x_train, 0.0)
    with pytest.raises(ValueError, match="last dimension"):
        rbf_kernel(clean.x_train, clean.x_train[:, :3])
    with pytest.raises(ValueError, match="NaN"):
        sample_gp(torch.full((3, 10), float("nan"), dtype=torch.float64))


# ---------------------------------------------------------------- the three kernels Table 3 names without defining
from sklearn.gaussian_process.kernels import ExpSineSquared, RationalQuadratic  # noqa: E402

from cemlib.data.gp import (KERNELS, gibbs_lengthscale, nonstationary_kernel, periodic_kernel,  # noqa: E402
                            rational_quadratic_kernel)


def test_rational_quadratic_and_periodic_match_scikit_learn():
    g = torch.Generator().manual_seed(4)
    x1 = 2 * torch.rand(6, 10, dtype=torch.float64, generator=g) - 1
    x2 = 2 * torch.rand(5, 10, dtype=torch.float64, generator=g) - 1
    for ell, a in ((0.7, 0.5), (3.0, 2.0)):
        ref = RationalQuadratic(length_scale=ell, alpha=a)(x1.numpy(), x2.numpy())
        np.testing.assert_allclose(rational_quadratic_kernel(x1, x2, ell, a).numpy(), ref, rtol=1e-12)
    # large alpha: the RBF kernel (a scale mixture whose scales concentrate)
    assert (rational_quadratic_kernel(x1, x2, 1.5, 1e7) - rbf_kernel(x1, x2, 1.5)).abs().max() < 1e-6
    # 1-D: MacKay's periodic kernel is scikit-learn's ExpSineSquared
    for ell, p in ((0.8, 1.0), (2.0, 0.5)):
        ref = ExpSineSquared(length_scale=ell, periodicity=p)(x1[:, :1].numpy(), x2[:, :1].numpy())
        np.testing.assert_allclose(periodic_kernel(x1[:, :1], x2[:, :1], ell, p).numpy(), ref, rtol=1e-12)
    # d-D: the product of the 1-D kernels over coordinates, periodic in every coordinate
    prod = torch.ones(6, 5, dtype=torch.float64)
    for k in range(10):
        prod = prod * periodic_kernel(x1[:, k:k + 1], x2[:, k:k + 1], 2.0, 0.7)
    assert torch.allclose(periodic_kernel(x1, x2, 2.0, 0.7), prod, rtol=1e-12)
    shift = torch.zeros(10, dtype=torch.float64)
    shift[3] = 0.7
    assert torch.allclose(periodic_kernel(x1 + shift, x2, 2.0, 0.7), periodic_kernel(x1, x2, 2.0, 0.7), atol=1e-12)
    with pytest.raises(ValueError, match="period"):
        periodic_kernel(x1, x2, 1.0, 0.0)
    with pytest.raises(ValueError, match="alpha"):
        rational_quadratic_kernel(x1, x2, 1.0, -1.0)


def test_nonstationary_kernel_is_gibbs():
    g = torch.Generator().manual_seed(5)
    x1 = 2 * torch.rand(6, 10, dtype=torch.float64, generator=g) - 1
    x2 = 2 * torch.rand(4, 10, dtype=torch.float64, generator=g) - 1
    ell = 3.0
    # entry by entry, Gibbs' formula (Rasmussen & Williams eq. 4.32) with a per-point lengthscale
    for i in range(6):
        for j in range(4):
            li, lj = 3.0 * (0.75 + 0.25 * x1[i, 0]), 3.0 * (0.75 + 0.25 * x2[j, 0])
            s = li**2 + lj**2
            ref = (2 * li * lj / s) ** 5 * torch.exp(-((x1[i] - x2[j]) ** 2).sum() / s)
            assert torch.allclose(nonstationary_kernel(x1, x2, ell)[i, j], ref, rtol=1e-12)
    assert torch.allclose(gibbs_lengthscale(torch.tensor([[-1.0], [1.0]]), 2.0), torch.tensor([1.0, 2.0]))
    # unit diagonal, symmetric, positive definite on a large random set
    x = 2 * torch.rand(300, 10, dtype=torch.float64, generator=g) - 1
    K = nonstationary_kernel(x, x, ell)
    assert torch.allclose(K.diagonal(), torch.ones(300, dtype=torch.float64))
    assert torch.allclose(K, K.T)
    assert torch.linalg.eigvalsh(K).min() > -1e-10
    # non-stationary: the same displacement correlates more where the lengthscale is long
    d = torch.zeros(1, 10, dtype=torch.float64)
    d[0, 1] = 0.8
    left, right = torch.zeros(1, 10, dtype=torch.float64), torch.zeros(1, 10, dtype=torch.float64)
    left[0, 0], right[0, 0] = -0.9, 0.9
    assert nonstationary_kernel(left, left + d, ell) < nonstationary_kernel(right, right + d, ell)
    with pytest.raises(ValueError, match="-3"):
        nonstationary_kernel(left - 3, left, ell)


@pytest.mark.parametrize("kernel", KERNELS)
def test_every_table3_kernel_samples(kernel):
    a = make_gp_regression(kernel, n_train=200, n_test=50, seed=1)
    b = make_gp_regression(kernel, n_train=200, n_test=50, seed=1)
    assert torch.equal(a.y_train, b.y_train) and torch.isfinite(a.y_train).all()
    assert 0.05 < a.y_train.std() < 5.0
    x = torch.linspace(-1, 1, 5, dtype=torch.float64)[:, None].repeat(1, 10)
    draws = sample_gp(x, kernel, 3.0, generator=torch.Generator().manual_seed(0), num_draws=4000)
    emp = draws.T @ draws / len(draws)
    from cemlib.data.gp import _kernel
    assert (emp - _kernel(kernel, 3.0, 1.5)(x, x)).abs().max() < 0.1
