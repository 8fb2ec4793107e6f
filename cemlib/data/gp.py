"""Gaussian-process regression data for the CEM recursion experiment (CEM Table 3).

Table 3 of the CEM paper (Xu et al. 2026, arXiv:2605.07588v1, App. E; also Table 3 of its ICLR 2026
submission version) trains small regressors on "synthetic data sampled from Gaussian processes with
10 input dimensions" and reports train/test RMSE per kernel. The paper gives no sample size,
lengthscale, noise or Matérn order, so these are our choices (all arguments):

* inputs ``x ~ Uniform[-1, 1]^d`` with ``d = 10``;
* one function ``f ~ GP(0, k)`` drawn *jointly* at the train and test inputs (so the test set
  measures interpolation of the same function), unit signal variance, lengthscale ``sqrt(d)``
  (typical input distances are about ``sqrt(2d/3)``, so neighbouring points stay correlated);
* targets ``y = f(x) + noise_std * eps``, with ``noise_std = 0`` by default (the RBF RMSEs of
  Table 3, ~0.007, are below any sensible noise floor);
* kernels (Table 3's five): :func:`rbf_kernel` ``k = exp(-r^2 / 2)``, :func:`matern_kernel` of
  order ``nu`` in {1/2, 3/2, 5/2} (default 3/2), :func:`rational_quadratic_kernel`
  ``(1 + r^2 / (2 alpha))^(-alpha)``, :func:`periodic_kernel` (the product over input dimensions of
  MacKay's periodic kernel, positive definite in any dimension) and :func:`nonstationary_kernel`
  (Gibbs' kernel with a lengthscale that grows along the first input coordinate), with
  ``r = |x - x'| / lengthscale``. The paper names the last three but does not define them
  ("Periodic", "Rational Quadratic", "Non-Stationary"); the forms and the defaults
  ``period = 2`` (the side of the input cube: each coordinate sweeps one period) and ``alpha = 1``
  are our choices.

The draw uses the Cholesky factor of ``K + jitter I`` (``jitter = 1e-8``, raised by factors of
10 only if the factorisation fails), all in float64. Layout: :class:`GPRegressionData` with
``x_train`` ``(n_train, d)``, ``y_train`` ``(n_train, 1)``, ``x_test``, ``y_test``, all float64;
``.train_dataset()`` / ``.test_dataset()`` wrap them in ``TensorDataset``.
"""

from __future__ import annotations

import math
import numbers
from dataclasses import dataclass

import torch
from torch.utils.data import TensorDataset

from cemlib.utils import check_positive_int, check_tensor

__all__ = ["rbf_kernel", "matern_kernel", "rational_quadratic_kernel", "periodic_kernel", "nonstationary_kernel",
           "gibbs_lengthscale", "KERNELS", "sample_gp", "GPRegressionData", "make_gp_regression"]

#: kernel names accepted by :func:`sample_gp` and :func:`make_gp_regression` (Table 3's order)
KERNELS = ("rbf", "matern", "periodic", "rq", "nonstationary")


def _scaled_dist(x1: torch.Tensor, x2: torch.Tensor, lengthscale: float) -> torch.Tensor:
    check_tensor(x1, "x1", ndim=2, finite=True)
    check_tensor(x2, "x2", ndim=2, last_dim=x1.shape[-1], finite=True)
    if not lengthscale > 0:
        raise ValueError(f"lengthscale must be positive, got {lengthscale}")
    d2 = (x1[:, None, :] - x2[None, :, :]).pow(2).sum(-1)  # exact, no cancellation
    return d2.sqrt() / lengthscale


def rbf_kernel(x1: torch.Tensor, x2: torch.Tensor, lengthscale: float = 1.0) -> torch.Tensor:
    """Squared-exponential kernel ``exp(-|x - x'|^2 / (2 l^2))``, shape ``(n1, n2)``."""
    r = _scaled_dist(x1, x2, lengthscale)
    return torch.exp(-0.5 * r * r)


def matern_kernel(x1: torch.Tensor, x2: torch.Tensor, lengthscale: float = 1.0,
                  nu: float = 1.5) -> torch.Tensor:
    """Matérn kernel of order ``nu`` in {0.5, 1.5, 2.5} (closed forms), shape ``(n1, n2)``.

    nu=1/2: ``exp(-r)``; nu=3/2: ``(1 + sqrt3 r) exp(-sqrt3 r)``;
    nu=5/2: ``(1 + sqrt5 r + 5 r^2 / 3) exp(-sqrt5 r)``, with ``r = |x - x'| / l``.
    """
    r = _scaled_dist(x1, x2, lengthscale)
    if nu == 0.5:
        return torch.exp(-r)
    if nu == 1.5:
        a = math.sqrt(3.0) * r
        return (1.0 + a) * torch.exp(-a)
    if nu == 2.5:
        a = math.sqrt(5.0) * r
        return (1.0 + a + a * a / 3.0) * torch.exp(-a)
    raise ValueError(f"nu must be 0.5, 1.5 or 2.5 (closed-form Matérn orders), got {nu}")


def rational_quadratic_kernel(x1: torch.Tensor, x2: torch.Tensor, lengthscale: float = 1.0,
                              alpha: float = 1.0) -> torch.Tensor:
    """Rational quadratic kernel ``(1 + r^2 / (2 alpha))^(-alpha)``, a scale mixture of RBF kernels
    (``alpha -> inf`` gives the RBF kernel), shape ``(n1, n2)``."""
    if not alpha > 0:
        raise ValueError(f"alpha must be positive, got {alpha}")
    r = _scaled_dist(x1, x2, lengthscale)
    return (1.0 + r * r / (2.0 * alpha)).pow(-alpha)


def periodic_kernel(x1: torch.Tensor, x2: torch.Tensor, lengthscale: float = 1.0,
                    period: float = 2.0) -> torch.Tensor:
    """Periodic kernel ``exp(-2 sum_k sin^2(pi |x_k - x'_k| / period) / l^2)``, shape ``(n1, n2)``.

    The product over coordinates of MacKay's 1-D periodic kernel, hence positive definite in any
    dimension (the form with the Euclidean distance inside the sine is not, for d > 1); for d = 1
    it equals scikit-learn's ``ExpSineSquared(l, period)``.
    """
    _scaled_dist(x1, x2, lengthscale)  # validates shapes and the lengthscale
    if not period > 0:
        raise ValueError(f"period must be positive, got {period}")
    s = torch.sin(math.pi * (x1[:, None, :] - x2[None, :, :]).abs() / period)
    return torch.exp(-2.0 * s.pow(2).sum(-1) / lengthscale**2)


def gibbs_lengthscale(x: torch.Tensor, lengthscale: float = 1.0) -> torch.Tensor:
    """The input-dependent lengthscale of :func:`nonstationary_kernel`:
    ``l(x) = lengthscale * (0.75 + 0.25 x_1)``, from ``l / 2`` at ``x_1 = -1`` to ``l`` at ``x_1 = 1``."""
    return lengthscale * (0.75 + 0.25 * x[..., 0])


def nonstationary_kernel(x1: torch.Tensor, x2: torch.Tensor, lengthscale: float = 1.0) -> torch.Tensor:
    """Gibbs' non-stationary kernel with the isotropic lengthscale ``l(x)`` of :func:`gibbs_lengthscale`:

    ``k(x, x') = (2 l(x) l(x') / (l(x)^2 + l(x')^2))^(d/2) exp(-|x - x'|^2 / (l(x)^2 + l(x')^2))``,

    positive definite for any positive ``l(x)`` (Gibbs 1997; Rasmussen & Williams eq. 4.32). It
    reduces to the RBF kernel when ``l`` is constant. ``l(x)`` must stay positive: inputs need
    ``x_1 > -3`` (the data use ``[-1, 1]``).
    """
    r = _scaled_dist(x1, x2, lengthscale) * lengthscale  # |x - x'|, validated
    l1, l2 = gibbs_lengthscale(x1, lengthscale), gibbs_lengthscale(x2, lengthscale)
    if not (bool((l1 > 0).all()) and bool((l2 > 0).all())):
        raise ValueError("nonstationary_kernel needs x[:, 0] > -3 so that the lengthscale is positive")
    s = l1[:, None] ** 2 + l2[None, :] ** 2
    d = x1.shape[-1]
    return (2.0 * l1[:, None] * l2[None, :] / s).pow(d / 2.0) * torch.exp(-r * r / s)


def _kernel(name: str, lengthscale: float, nu: float, period: float = 2.0, alpha: float = 1.0):
    if name == "rbf":
        return lambda a, b: rbf_kernel(a, b, lengthscale)
    if name == "matern":
        return lambda a, b: matern_kernel(a, b, lengthscale, nu)
    if name == "periodic":
        return lambda a, b: periodic_kernel(a, b, lengthscale, period)
    if name == "rq":
        return lambda a, b: rational_quadratic_kernel(a, b, lengthscale, alpha)
    if name == "nonstationary":
        return lambda a, b: nonstationary_kernel(a, b, lengthscale)
    raise ValueError(f"kernel must be one of {KERNELS}, got {name!r}")


def sample_gp(x: torch.Tensor, kernel: str = "rbf", lengthscale: float = 1.0, nu: float = 1.5,
              generator: torch.Generator | None = None, jitter: float = 1e-8,
              num_draws: int | None = None, period: float = 2.0, alpha: float = 1.0) -> torch.Tensor:
    """Draws ``f ~ N(0, K(x, x))`` at the rows of ``x`` (float64): shape ``(n,)``, or
    ``(num_draws, n)`` when ``num_draws`` is given."""
    x = check_tensor(x, "x", ndim=2, finite=True).to(torch.float64)
    K = _kernel(kernel, lengthscale, nu, period, alpha)(x, x)
    eye = torch.eye(len(x), dtype=torch.float64)
    for _ in range(8):
        Lc, info = torch.linalg.cholesky_ex(K + jitter * eye)
        if int(info) == 0:
            break
        jitter *= 10.0
    else:
        raise RuntimeError(f"the {kernel} kernel matrix is not positive definite even with jitter {jitter}")
    if num_draws is None:
        return Lc @ torch.randn(len(x), dtype=torch.float64, generator=generator)
    z = torch.randn(check_positive_int(num_draws, "num_draws"), len(x), dtype=torch.float64,
                    generator=generator)
    return z @ Lc.T


@dataclass
class GPRegressionData:
    x_train: torch.Tensor
    y_train: torch.Tensor
    x_test: torch.Tensor
    y_test: torch.Tensor
    kernel: str

    def train_dataset(self) -> TensorDataset:
        return TensorDataset(self.x_train, self.y_train)

    def test_dataset(self) -> TensorDataset:
        return TensorDataset(self.x_test, self.y_test)


def make_gp_regression(kernel: str = "rbf", n_train: int = 1000, n_test: int = 200, d: int = 10,
                       lengthscale: float | None = None, nu: float = 1.5, noise_std: float = 0.0,
                       seed: int = 0, period: float = 2.0, alpha: float = 1.0) -> GPRegressionData:
    """Train/test data from one GP draw, deterministic in ``seed`` (see the module docstring)."""
    n_train, n_test = check_positive_int(n_train, "n_train"), check_positive_int(n_test, "n_test")
    d = check_positive_int(d, "d")
    if not (isinstance(noise_std, (int, float)) and math.isfinite(noise_std) and noise_std >= 0):
        raise ValueError(f"noise_std must be a non-negative finite number, got {noise_std}")
    if lengthscale is not None and not (isinstance(lengthscale, (int, float)) and math.isfinite(lengthscale)
                                        and lengthscale > 0):
        raise ValueError(f"lengthscale must be a positive finite number (or None: sqrt(d)), got {lengthscale}")
    if isinstance(seed, bool) or not isinstance(seed, numbers.Integral) or seed < 0:
        raise ValueError(f"seed must be a non-negative integer, got {seed!r}")
    seed = int(seed)
    _kernel(kernel, 1.0, nu, period, alpha)  # validate the name early
    ell = math.sqrt(d) if lengthscale is None else float(lengthscale)
    g = torch.Generator().manual_seed(int(seed))
    x = 2.0 * torch.rand(n_train + n_test, d, dtype=torch.float64, generator=g) - 1.0
    f = sample_gp(x, kernel, ell, nu, generator=g, period=period, alpha=alpha)
    y = (f + noise_std * torch.randn(len(f), dtype=torch.float64, generator=g)).unsqueeze(-1)
    return GPRegressionData(x[:n_train], y[:n_train], x[n_train:], y[n_train:], kernel)
