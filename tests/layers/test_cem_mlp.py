"""CEM MLP: the T-step update against autograd of the element-wise energy (every phi, variant,
preconditioner, T), the RMSNorm dropped-Jacobian difference, the tied-SwiGLU special case, the
failure of monotone descent for xi, and bad input."""

import pytest
import torch

from cemlib.kernels import dispatch
from cemlib.layers.cem_mlp import CEMMLP
from cemlib.layers.llama import SwiGLU
from cemlib.testing import autograd_grad

B, L, D, DV = 2, 4, 8, 12


pytestmark = pytest.mark.usefixtures("float64_seeded")


def make(scale=0.3, **kw):
    m = CEMMLP(D, DV, **kw)
    with torch.no_grad():
        for p in m.parameters():
            p.add_(scale * torch.randn_like(p))
    return m


def apply_P(m, g):
    return g if m.P.kind == "none" else g @ m.P.matrix().T


@pytest.mark.parametrize("phi", ["silu", "gelu", "relu2"])
@pytest.mark.parametrize("variant", ["standard", "sign"])
@pytest.mark.parametrize("pre", ["none", "diag", "dplr"])
def test_recursion_equals_preconditioned_gradient_steps(phi, variant, pre):
    """query_norm=False: x <- x - eta P grad xi(x | gamma(h)) with the gradient from autograd (eq. 17)."""
    for T in (1, 2, 4, 8):
        m = make(phi=phi, variant=variant, preconditioner=pre, query_norm=False, T=T, eta=0.6,
                 precond_rank=3)
        h = torch.randn(B, L, D)
        x = h
        for _ in range(T):
            x = x - 0.6 * apply_P(m, autograd_grad(lambda z: m.energy(z, h), x))
        with torch.no_grad():
            torch.testing.assert_close(m(h), x, rtol=1e-10, atol=1e-11)


@pytest.mark.parametrize("variant", ["standard", "sign"])
def test_energy_grad_is_exact_with_query_norm(variant):
    m = make(variant=variant, query_norm=True)
    x, h = torch.randn(B, L, D), torch.randn(B, L, D)
    torch.testing.assert_close(m.energy_grad(x, h), autograd_grad(lambda z: m.energy(z, h), x),
                               rtol=1e-10, atol=1e-11)


def test_query_norm_update_drops_the_rmsnorm_jacobian():
    m = make(query_norm=True, T=1, preconditioner="dplr")
    m_u = make(query_norm=False, preconditioner="dplr")
    m_u.load_state_dict(m.state_dict())
    h = torch.randn(B, L, D)
    u = m.norm(h).detach()
    g = autograd_grad(lambda z: m_u.energy(z, h), u)             # grad_u xi at u = RMSNorm(h)
    with torch.no_grad():
        torch.testing.assert_close(m(h), h - apply_P(m, g), rtol=1e-10, atol=1e-11)
    true = autograd_grad(lambda z: m.energy(z, h), h)
    r = torch.sqrt(h.pow(2).mean(-1, keepdim=True) + m.norm.eps)
    gv = g * m.norm.weight.detach()
    closed = g - (gv / r - h * (h * gv).sum(-1, keepdim=True) / (D * r**3))
    torch.testing.assert_close(g - true, closed, rtol=1e-9, atol=1e-10)
    assert (g - true).norm() > 0.1 * true.norm()


def test_t1_is_pre_norm_tied_swiglu():
    """Eq. 11: T=1, P=I: x + SwiGLU(RMSNorm(x)) with gate (SiLU branch) = V, up = W, down = V^T."""
    m = make(T=1)
    ref = SwiGLU(D, DV)
    with torch.no_grad():
        ref.W_gate.copy_(m.V), ref.W_up.copy_(m.W), ref.W_down.copy_(m.V.T)
        x = torch.randn(B, L, D)
        torch.testing.assert_close(m(x), x + ref(m.norm(x)))


def test_xi_descent_is_not_guaranteed():
    """Unlike eps, xi is not concave: a small step descends, a large one can go uphill."""
    m = CEMMLP(1, 1, query_norm=False, eta=10.0)
    with torch.no_grad():
        m.V.fill_(1.0), m.W.fill_(-1.0)        # gamma = -RMSNorm(h) = -1 for h > 0
        h = torch.ones(1, 1, 1)
        assert m.energy(m(h), h) > m.energy(h, h)
        m.eta = 1e-3
        assert m.energy(m(h), h) < m.energy(h, h)


def test_per_token_and_dispatch(monkeypatch):
    calls = []
    orig = dispatch.tied_gated_mlp_step
    monkeypatch.setattr(dispatch, "tied_gated_mlp_step",
                        lambda u, V, g: calls.append(1) or orig(u, V, g))
    m = make(T=2)
    x = torch.randn(B, L, D)
    x2 = x.clone()
    x2[:, 2] += 1.0
    with torch.no_grad():
        y, y2 = m(x), m(x2)
    assert len(calls) == 4
    keep = [0, 1, 3]
    torch.testing.assert_close(y[:, keep], y2[:, keep], rtol=0, atol=0)


def test_learned_eta_and_trajectory():
    m = make(learn_eta=True, T=2)
    y, traj = m(torch.randn(B, L, D), return_trajectory=True)
    assert len(traj) == 3
    y.sum().backward()
    assert torch.isfinite(m.eta.grad)


@pytest.mark.parametrize("x, match", [
    (torch.randn(D), "at least 2 dimensions"),
    (torch.randn(B, L, D + 2), "last dimension 8"),
    (torch.full((B, L, D), float("inf")), "NaN/Inf"),
])
def test_bad_input(x, match):
    with pytest.raises(ValueError, match=match):
        make()(x)


@pytest.mark.parametrize("kwargs, match", [
    (dict(T=-1), "T must be"), (dict(phi="tanh"), "unknown phi"),
    (dict(variant="abs"), "variant"), (dict(preconditioner="full"), "kind"),
])
def test_bad_construction(kwargs, match):
    with pytest.raises(ValueError, match=match):
        CEMMLP(D, DV, **kwargs)


@pytest.mark.parametrize("T, query_norm, calls", [(1, True, 1), (3, True, 3), (2, False, 1)])
def test_step_zero_reuses_the_gate_norm(T, query_norm, calls):
    """At t = 0 the query RMSNorm(x^(0)) is the normalised context that gamma uses: computed
    once; the output equals the update that recomputes it every step."""
    layer = CEMMLP(10, 24, T=T, query_norm=query_norm, init_std=0.3)
    n = []
    layer.norm.register_forward_hook(lambda *a: n.append(1))
    x = torch.randn(2, 5, 10)
    y = layer(x)
    assert len(n) == calls
    gamma, z = layer.gamma(x), x
    for _ in range(T):
        z = z + layer.eta * layer.P(layer.neg_grad(layer.query(z), gamma))
    torch.testing.assert_close(y, z, rtol=1e-13, atol=1e-13)
