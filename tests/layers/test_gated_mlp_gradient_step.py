"""Helpers used by the chapter "The gated MLP is a gradient step": the 2-D landscape of the
element-wise energy (CEM eq. 7) and of its Appendix-C sign variant (:mod:`cemlib.viz.energy2d`)."""

import pytest
import torch

from cemlib.energies import cem
from cemlib.testing import autograd_grad
from cemlib.viz import energy2d as E2

f64 = torch.float64
V = torch.tensor([[1.0, 0.2], [-0.5, 1.0], [0.3, -0.8]], dtype=f64)
GAMMA = torch.tensor([0.8, -1.1, 0.5], dtype=f64)


@pytest.mark.parametrize("variant", ["standard", "sign"])
@pytest.mark.parametrize("phi", ["silu", "gelu", "relu2"])
def test_mlp_landscape_energy_and_gradient(variant, phi):
    gamma = GAMMA
    land = E2.cem_mlp_landscape(V, gamma, phi, variant)
    x = torch.randn(3, 5, 2, dtype=f64, generator=torch.Generator().manual_seed(0))
    fn = cem.elementwise_energy if variant == "standard" else cem.sign_variant_energy
    torch.testing.assert_close(land.energy(x), fn(x, gamma.expand(3, 5, 3), V, phi))
    torch.testing.assert_close(land.gradient(x), autograd_grad(land.energy, x), rtol=1e-12, atol=1e-12)
    with pytest.raises(ValueError, match="variant"):
        E2.cem_mlp_landscape(V, gamma, phi, "convex")


def test_sign_variant_landscape_with_convex_phi_is_concave():
    land = E2.cem_mlp_landscape(V, GAMMA, "relu2", "sign")
    x = 2 * torch.randn(50, 2, dtype=f64, generator=torch.Generator().manual_seed(1))
    for p in x:
        H = torch.autograd.functional.hessian(land.energy, p)
        assert torch.linalg.eigvalsh(H).max() <= 1e-12
    # the standard energy with the same weights has both signs of curvature somewhere
    std = E2.cem_mlp_landscape(V, GAMMA, "relu2", "standard")
    eigs = torch.stack([torch.linalg.eigvalsh(torch.autograd.functional.hessian(std.energy, p)) for p in x])
    assert eigs.max() > 0 and eigs.min() < 0
