"""CEM attention: the T-step update against autograd of the interaction energy (every variant),
the RMSNorm dropped-Jacobian difference, Algorithm 1's diagonal form, causality, energy descent,
the tied-MHA special case, and bad input."""

import math

import pytest
import torch

from cemlib.kernels import dispatch
from cemlib.layers.cem_attention import CEMAttention
from cemlib.layers.llama import LlamaAttention
from cemlib.layers.norm import rms_norm_vjp
from cemlib.testing import autograd_grad

B, L, D = 2, 5, 12


pytestmark = pytest.mark.usefixtures("float64_seeded")


def make(scale=0.3, **kw):
    """A layer with every parameter perturbed (non-zero diagonal, biases, P factors, norm gain)."""
    m = CEMAttention(D, kw.pop("n_heads", 3), **kw)
    with torch.no_grad():
        for p in m.parameters():
            p.add_(scale * torch.randn_like(p))
    return m


def per_head_grads(m, x, h):
    """grad_x eps_k(x | h) for each head by autograd: (B, K, L, D)."""
    return torch.stack([autograd_grad(lambda z: m.energy(z, h, per_head=True)[:, k], x)
                        for k in range(m.n_heads)], 1)


def precondition(m, G):
    if m.P.kind == "none":
        return G.sum(1)
    return torch.einsum("kde,bkle->bld", m.P.matrix(), G)   # dense P_k, independent of P.forward


@pytest.mark.parametrize("diag", ["none", "shared", "per_head"])
@pytest.mark.parametrize("pre", ["none", "diag", "dplr"])
@pytest.mark.parametrize("alibi", [False, True])
def test_recursion_equals_preconditioned_gradient_steps(diag, pre, alibi):
    """query_norm=False: x <- x - eta sum_k P_k grad eps_k(x | h), eps from autograd (eqs. 14, 16)."""
    for T, heads in ((1, 1), (2, 3), (4, 2), (8, 3)):
        m = make(diag=diag, preconditioner=pre, alibi=alibi, query_norm=False, T=T, eta=0.7,
                 n_heads=heads, self_cross_bias=True, precond_rank=2)
        h = torch.randn(B, L, D)
        x = h
        for _ in range(T):
            x = x - 0.7 * precondition(m, per_head_grads(m, x, h))
        with torch.no_grad():
            out = m(h)
        torch.testing.assert_close(out, x, rtol=1e-10, atol=1e-11)


@pytest.mark.parametrize("diag", ["none", "shared", "per_head"])
def test_energy_grad_is_exact_with_query_norm(diag):
    m = make(diag=diag, query_norm=True)
    x, h = torch.randn(B, L, D), torch.randn(B, L, D)
    torch.testing.assert_close(m.energy_grad(x, h), autograd_grad(lambda z: m.energy(z, h), x),
                               rtol=1e-10, atol=1e-11)


@pytest.mark.parametrize("pre", ["none", "dplr"])
def test_query_norm_update_drops_the_rmsnorm_jacobian(pre):
    """Algorithm 1 steps along grad_u eps at u = RMSNorm(x), not along grad_x eps(RMSNorm(x)) =
    J^T grad_u eps. The update matches the former exactly; the gap to the true gradient is
    g - J^T g with J^T v = gain*v/r - x (x.(gain*v))/(D r^3), and it is far from zero."""
    m = make(diag="shared", preconditioner=pre, query_norm=True, T=1, eta=1.0)
    h = torch.randn(B, L, D)
    u = m.norm(h).detach()
    m_u = make(diag="shared", preconditioner=pre, query_norm=False)
    m_u.load_state_dict(m.state_dict())
    G = torch.stack([autograd_grad(lambda z: m_u.energy(z, h, per_head=True)[:, k], u)
                     for k in range(m.n_heads)], 1)           # grad_u eps_k at u = RMSNorm(h)
    with torch.no_grad():
        torch.testing.assert_close(m(h), h - precondition(m, G), rtol=1e-10, atol=1e-11)
    g = G.sum(1)
    true = autograd_grad(lambda z: m.energy(z, h), h)
    r = torch.sqrt(h.pow(2).mean(-1, keepdim=True) + m.norm.eps)
    gv = g * m.norm.weight.detach()
    closed = g - (gv / r - h * (h * gv).sum(-1, keepdim=True) / (D * r**3))
    torch.testing.assert_close(g - true, closed, rtol=1e-9, atol=1e-10)
    torch.testing.assert_close(true, rms_norm_vjp(h, g, m.norm.weight.detach(), m.norm.eps))
    assert (g - true).norm() > 0.1 * true.norm()


def test_paper_diag_form_differs_by_the_diagonal_value_path():
    """diag_grad='paper' (Algorithm 1) = exact update - eta * sum_k d_k * sum_j alpha_kij hn_j."""
    kw = dict(diag="per_head", query_norm=False, T=1, eta=0.9)
    exact, paper = make(**kw), make(diag_grad="paper", **kw)
    paper.load_state_dict(exact.state_dict())
    h = torch.randn(B, L, D)
    hn = exact.norm(h).detach()
    from cemlib.energies.cem import interaction_logits
    with torch.no_grad():
        s = interaction_logits(h, hn, exact._heads(exact.W_Q), exact._heads(exact.W_K),
                               tau=exact.tau, d=exact.d, alibi=exact.alibi,
                               self_bias=exact.self_bias, cross_bias=exact.cross_bias)
        missing = torch.einsum("kh,bkij,bjh->bih", exact.d, torch.softmax(s, -1), hn)
        diff = paper(h) - exact(h)
    torch.testing.assert_close(diff, -0.9 * missing, rtol=1e-10, atol=1e-12)
    assert diff.norm() > 1e-2


def test_t1_is_pre_norm_tied_attention():
    """T=1, P=I, no diagonal, no self/cross bias: x + MHA(RMSNorm(x)) with W_V=W_K, W_O=W_Q (eq. 5)."""
    m = make(diag="none", self_cross_bias=False, alibi=True, T=1, n_heads=3)
    ref = LlamaAttention(D, 3, pos="alibi")
    with torch.no_grad():
        ref.W_Q.copy_(m.W_Q), ref.W_K.copy_(m.W_K), ref.W_V.copy_(m.W_K), ref.W_O.copy_(m.W_Q)
        x = torch.randn(B, L, D)
        torch.testing.assert_close(m(x), x + ref(m.norm(x)))
    # the literal reading of Algorithm 1 (x^(0) = RMSNorm(h)) renormalises the residual stream
    literal = m(m.norm(x)).detach()
    assert (literal - m(x)).norm() > 0.1 * x.norm()


def test_tau_choices():
    assert make(tau="head", n_heads=3).tau == pytest.approx(math.sqrt(4))
    assert make(tau="model", n_heads=3).tau == pytest.approx(math.sqrt(12))
    assert make(tau=2.5).tau == 2.5


@pytest.mark.parametrize("query_norm", [False, True])
def test_small_step_decreases_energy(query_norm):
    """P = I: eps(x - eta g) < eps(x) for small eta. Without the norm eps is concave, so it holds
    for every eta; with a unit-gain norm J is PSD, so the step is still first-order descent."""
    m = make(diag="shared", query_norm=query_norm, eta=1e-3)
    with torch.no_grad():
        m.norm.weight.fill_(1.0)
        x = torch.randn(B, L, D)
        assert (m.energy(m(x), x) < m.energy(x, x)).all()
        if not query_norm:
            big = make(diag="shared", query_norm=False, eta=50.0)
            assert (big.energy(big(x), x) < big.energy(x, x)).all()


@pytest.mark.parametrize("pre", ["none", "dplr"])
def test_causality(pre):
    m = make(diag="shared", preconditioner=pre, T=3)
    x = torch.randn(B, 7, D)
    x2 = x.clone()
    x2[:, 4] += torch.randn(B, D)
    with torch.no_grad():
        y, y2 = m(x), m(x2)
    torch.testing.assert_close(y[:, :4], y2[:, :4], rtol=0, atol=1e-13)
    assert (y[:, 4:] - y2[:, 4:]).abs().max() > 1e-3


def test_core_goes_through_dispatch(monkeypatch):
    calls = []
    orig = dispatch.tied_attention

    def spy(q, kv, **kw):
        calls.append(kw)
        return orig(q, kv, **kw)

    monkeypatch.setattr(dispatch, "tied_attention", spy)
    m = make(diag="shared", T=2)
    with torch.no_grad():
        m(torch.randn(B, L, D))
    assert len(calls) == 2 and calls[0]["extra_values"] and calls[0]["q_extra"].dim() == 3


def test_trajectory_and_learned_eta():
    m = make(learn_eta=True, T=3)
    assert isinstance(m.eta, torch.nn.Parameter)
    x = torch.randn(B, L, D)
    y, traj = m(x, return_trajectory=True)
    assert len(traj) == 4 and traj[-1] is y
    y.sum().backward()
    assert m.eta.grad is not None and torch.isfinite(m.eta.grad)


@pytest.mark.parametrize("x, match", [
    (torch.randn(L, D), "3 dimensions"),
    (torch.randn(B, L, D + 1), "last dimension 12"),
    (torch.full((B, L, D), float("nan")), "NaN"),
])
def test_bad_input(x, match):
    with pytest.raises(ValueError, match=match):
        make()(x)


@pytest.mark.parametrize("kwargs, match", [
    (dict(T=0), "T must be a positive integer"),
    (dict(n_heads=5), "not divisible by n_heads=5"),
    (dict(diag="full"), "diag must be"),
    (dict(diag_grad="approx"), "diag_grad"),
    (dict(tau="sqrt"), "tau"),
    (dict(preconditioner="chol"), "kind"),
])
def test_bad_construction(kwargs, match):
    with pytest.raises(ValueError, match=match):
        CEMAttention(D, kwargs.pop("n_heads", 3), **kwargs)


@pytest.mark.parametrize("T, query_norm, calls", [(1, True, 1), (3, True, 3), (2, False, 1)])
def test_step_zero_reuses_the_context_norm(T, query_norm, calls):
    """At t = 0 the query RMSNorm(x^(0)) is the context's hn: computed once, not twice; the
    output equals the step-by-step update that recomputes it."""
    layer = CEMAttention(12, 3, T=T, query_norm=query_norm, init_std=0.3)
    torch.nn.init.normal_(layer.d, std=0.3)
    n = []
    layer.norm.register_forward_hook(lambda *a: n.append(1))
    x = torch.randn(2, 6, 12)
    y = layer(x)
    assert len(n) == calls
    hn, kv = layer.context(x)
    z = x
    for _ in range(T):
        z = z - layer.eta * layer.direction(z, hn, kv)  # recomputes RMSNorm(z) every step
    torch.testing.assert_close(y, z, rtol=1e-13, atol=1e-13)
