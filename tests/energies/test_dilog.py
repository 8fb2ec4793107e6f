"""Li2 in torch against SciPy's spence (Li2(z) = spence(1 - z)), mpmath, and known values."""

import math

import numpy as np
import pytest
import scipy.special as sp
import torch

from cemlib.energies.dilog import dilog


def test_float64_matches_scipy_over_wide_range():
    # |z| >= 1e-6: below that, spence(1 - z) itself loses relative accuracy (1 - z rounds)
    z = np.concatenate([-np.logspace(-6, 300, 1500), np.linspace(-3.0, 1.0, 4001),
                        np.logspace(-6, 0, 500)])
    got = dilog(torch.tensor(z, dtype=torch.float64)).numpy()
    # atol: spence(1 - z) inherits the rounding of 1 - z (~1e-16 absolute in z)
    np.testing.assert_allclose(got, sp.spence(1.0 - z), rtol=2e-13, atol=4e-16)


def test_float64_small_z_against_series():
    z = torch.tensor([-1e-14, -3e-9, 2e-9, 1e-12, 5e-7], dtype=torch.float64)
    series = z + z**2 / 4 + z**3 / 9
    torch.testing.assert_close(dilog(z), series, rtol=1e-15, atol=0)


def test_float32_matches_scipy_to_ulp_level():
    z = np.concatenate([-np.logspace(-3, 38, 1500), np.linspace(-3.0, 1.0, 2001)]).astype(np.float32)
    got = dilog(torch.tensor(z)).numpy().astype(np.float64)
    assert dilog(torch.tensor(z)).dtype == torch.float32
    np.testing.assert_allclose(got, sp.spence(1.0 - z.astype(np.float64)), rtol=2.5e-7, atol=1e-30)


def test_special_values():
    z = torch.tensor([0.0, 1.0, -1.0, 0.5], dtype=torch.float64)
    ref = torch.tensor([0.0, math.pi**2 / 6, -math.pi**2 / 12,
                        math.pi**2 / 12 - math.log(2) ** 2 / 2], dtype=torch.float64)
    torch.testing.assert_close(dilog(z), ref, rtol=1e-15, atol=1e-16)


def test_gradients_first_and_second_order():
    z = torch.tensor([-1e6, -5.0, -1.0, -0.3, 0.0, 0.2, 0.5, 0.7], dtype=torch.float64,
                     requires_grad=True)
    assert torch.autograd.gradcheck(dilog, (z,))
    assert torch.autograd.gradgradcheck(dilog, (z,))
    (g,) = torch.autograd.grad(dilog(z).sum(), z)
    zz = z.detach()
    expected = torch.where(zz == 0, torch.ones_like(zz), -torch.log1p(-zz) / zz)
    torch.testing.assert_close(g, expected, rtol=1e-14, atol=0)


@pytest.mark.parametrize("bad, match", [
    (torch.tensor([0.5, 1.5]), "z <= 1"),
    (torch.tensor([0.0, float("nan")]), "NaN"),
    (torch.tensor([1, 2]), "floating-point"),
])
def test_bad_input(bad, match):
    with pytest.raises((ValueError, TypeError), match=match):
        dilog(bad)
