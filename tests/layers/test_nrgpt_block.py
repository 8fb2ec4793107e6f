"""NRGPTBlock (cemlib.layers.nrgpt): which energy the update descends, inference-rate matrices
(Props. 2.1, 2.2), normalisation Jacobians (eq. 28 vs exact), corrected FF2W, trajectories,
causality, first token, bad input. float64 throughout."""

import itertools

import pytest
import torch

from cemlib.energies import nrgpt as en
from cemlib.layers.nrgpt import FF_KINDS, NORMS, RATES, NRGPTBlock, norm_jacobian
from cemlib.testing import autograd_grad, relative_error

DT = torch.float64
D, H, N = 6, 2, 5


def _block(seed=0, gain=None, **kw):
    torch.manual_seed(seed)
    kw.setdefault("init_std", 0.4)
    b = NRGPTBlock(D, H, ff_hidden=kw.pop("ff_hidden", 10), **kw).to(DT)
    with torch.no_grad():
        if b.bias is not None:
            b.bias.normal_(0, 0.3)
        if getattr(b, "b1", None) is not None:
            b.b1.normal_(0, 0.3)
        if gain is not None and b.gain is not None:
            b.gain.copy_(torch.as_tensor(gain, dtype=DT))
        elif isinstance(b.gain, torch.nn.Parameter):
            b.gain.uniform_(0.5, 2.0)
        if b.rate == "matrix":
            b.eta.add_(0.3 * torch.randn(D, D, dtype=DT))
        if b.rate == "psd_skew":
            b.U.normal_(0, 0.5)
    return b


def _x(seed=1, batch=2):
    return torch.randn(batch, N, D, generator=torch.Generator().manual_seed(seed), dtype=DT)


def _own_partials(fn, x):
    """d f_A / d x_A for every token A (other tokens held fixed), by autograd."""
    jac = torch.autograd.functional.jacobian(lambda t: fn(t).sum(0), x)  # (N, B, N, D)
    idx = torch.arange(x.shape[-2])
    return jac[idx, :, idx, :].transpose(0, 1)


ALL = list(itertools.product(FF_KINDS, NORMS, en.MASKS, RATES))


@pytest.mark.parametrize("ff,norm,mask,rate", ALL)
def test_update_is_minus_eta_times_query_slot_gradient(ff, norm, mask, rate):
    """forward(x) = x - eta grad_g sum_A E_A(g_A | keys g_B held fixed), g = N(x) (eq. 6, 12)."""
    b = _block(ff=ff, norm=norm, mask=mask, rate=rate)
    x = _x()
    g = b.normalize(x).detach()
    v = autograd_grad(lambda q: b.energy_g(q, context=g), g)
    with torch.no_grad():
        torch.testing.assert_close(b(x), x - v @ b.rate_matrix().T, rtol=1e-9, atol=1e-10)
        torch.testing.assert_close(b.grad_g(g), v, rtol=1e-9, atol=1e-10)


@pytest.mark.parametrize("ff,norm,mask", list(itertools.product(FF_KINDS, NORMS, en.MASKS)))
def test_energy_grad_matches_autograd_keys_fixed_and_global(ff, norm, mask):
    b = _block(ff=ff, norm=norm, mask=mask)
    x, h = _x(), _x(seed=2)
    for ctx in (h, x.clone(), None):  # keys fixed at another state, at x itself, or global energy
        exp = autograd_grad(lambda t: b.energy(t, ctx), x)
        with torch.no_grad():
            torch.testing.assert_close(b.energy_grad(x, ctx), exp, rtol=1e-9, atol=1e-10)


def test_update_is_neither_the_global_nor_the_x_gradient():
    """Measured gaps: (i) the key-side term of the global energy; (ii) the norm Jacobian."""
    b = _block(norm="none", rate="matrix")
    with torch.no_grad():
        b.eta.copy_(torch.eye(D, dtype=DT))
    x = _x()
    with torch.no_grad():
        step = x - b(x)  # = v, since eta = I and g = x
        torch.testing.assert_close(step, b.energy_grad(x, x.clone()))
        g = b.normalize(x)
        key = en.attention_key_grad(g, b.J, b.alpha, b.beta, b.mask)
        torch.testing.assert_close(b.energy_grad(x) - step, key)
        assert relative_error(step, b.energy_grad(x)) > 0.1
    bl = _block(norm="layernorm")
    with torch.no_grad():
        v = bl.grad_g(bl.normalize(x))
        exact_x = bl.energy_grad(x, x.clone())
        torch.testing.assert_close(exact_x, bl.norm_vjp(x, v))
        assert relative_error(v, exact_x) > 0.1


@pytest.mark.parametrize("mask", en.MASKS)
def test_which_partial_each_token_follows(mask):
    """Strict mask: v_A is the full partial dE_A/dg_A. Inclusive mask: it omits exactly the
    self-key term -sum_h alpha_h p_hAA J_h g_A."""
    b = _block(mask=mask)
    g = b.normalize(_x()).detach()
    full = _own_partials(b.energy_g, g)
    with torch.no_grad():
        v = b.grad_g(g)
        if mask == "strict":
            torch.testing.assert_close(v, full, rtol=1e-9, atol=1e-10)
        else:
            p = en.attention_weights(g, b.J, b.beta, mask).diagonal(dim1=-2, dim2=-1)  # (B, H, N)
            self_key = -torch.einsum("h,bha,hij,baj->bai", b.alpha, p, b.J, g)
            torch.testing.assert_close(full - v, self_key, rtol=1e-9, atol=1e-10)
            assert self_key.abs().max() > 1e-3


def test_rate_matrices():
    bg = _block(rate="gamma", rate_scale=0.3, gain=[0.5, 1, 2, 3, 0.1, 1.5])
    torch.testing.assert_close(bg.rate_matrix(), 0.3 * torch.diag(bg.gain).detach())
    bp = _block(rate="psd_skew", rate_rank=3)
    assert bp.U.shape == (3, D)
    eta = bp.rate_matrix().detach()
    torch.testing.assert_close((eta + eta.T) / 2, (bp.U.T @ bp.U).detach())
    assert torch.linalg.eigvalsh((eta + eta.T) / 2).min() > -1e-12
    vs = torch.randn(50, D, dtype=DT)
    torch.testing.assert_close(torch.einsum("ni,ij,nj->n", vs, eta, vs), (vs @ bp.U.detach().T).pow(2).sum(-1))
    assert (eta - eta.T).abs().max() > 1e-2  # the skew part is really there


def _rate_by_autograd(b, x):
    """d/d eps E_A(x_A - eps eta v_A) at eps = 0, other tokens fixed."""
    with torch.no_grad():
        dx = -(b.grad_g(b.normalize(x)) @ b.rate_matrix().T)
    return (_own_partials(b.energy, x) * dx).sum(-1)


def test_prop_2_2_psd_plus_skew_rate_gives_descent_without_norm():
    b = _block(norm="none", rate="psd_skew", ff="ff1")
    x = _x()
    with torch.no_grad():
        rate = b.energy_rate(x)
        v = b.grad_g(x)
        torch.testing.assert_close(rate, -(v @ b.U.T).pow(2).sum(-1))
    torch.testing.assert_close(rate, _rate_by_autograd(b, x))
    assert (rate <= 0).all()
    # a small finite step decreases the first token's energy (E_1 depends on x_1 only, strict mask)
    with torch.no_grad():
        x1 = x - 1e-3 * v @ b.rate_matrix().T
        assert (b.energy(x1)[:, 0] < b.energy(x)[:, 0]).all()
        b.U.zero_()  # pure skew eta = V - V^T: no first-order change at all
        assert b.energy_rate(x).abs().max() < 1e-12
        b.V.zero_()
        b.U.copy_(torch.eye(D, dtype=DT))
        b.V.copy_(torch.diag(torch.ones(D - 1, dtype=DT), 1) * 5)  # eta = I + 5(S - S^T)
        assert b.energy_rate(x).max() <= 0  # skew part never hurts at first order


@pytest.mark.parametrize("norm", ["layernorm", "rmsnorm"])
def test_prop_2_1_eta_c_gamma_descends_and_eta_identity_can_ascend(norm):
    gain = [0.1, 3.0, 0.2, 2.0, 0.5, 4.0]
    found_ascent = False
    for seed in range(20):
        b = _block(seed=seed, norm=norm, rate="gamma", rate_scale=0.7, gain=gain)
        x = _x(seed=seed + 100, batch=4)
        with torch.no_grad():
            assert b.energy_rate(x).max() <= 1e-12
        if seed == 0:
            torch.testing.assert_close(b.energy_rate(x), _rate_by_autograd(b, x))
        bi = _block(seed=seed, norm=norm, rate="matrix", gain=gain)
        with torch.no_grad():
            bi.eta.copy_(torch.eye(D, dtype=DT))
            found_ascent |= bool(bi.energy_rate(x).max() > 1e-6)
    assert found_ascent, "eta = I with non-uniform gamma should raise some token's energy"


@pytest.mark.parametrize("norm", ["layernorm", "rmsnorm"])
def test_energy_rate_needs_the_exact_jacobian(norm):
    b = _block(norm=norm, rate="gamma")
    x = _x()
    auto = _rate_by_autograd(b, x)
    with torch.no_grad():
        torch.testing.assert_close(b.energy_rate(x, "exact"), auto)
        assert relative_error(b.energy_rate(x, "paper"), auto) > 0.5


@pytest.mark.parametrize("norm", NORMS)
def test_norm_jacobian_exact_vs_paper_eq28(norm):
    gain = torch.tensor([0.5, 1, 2, 3, 0.1, 1.5], dtype=DT)
    x = _x()[0]
    eps = 1e-5
    b = NRGPTBlock(D, norm=norm, norm_eps=eps).to(DT)
    with torch.no_grad():
        if b.gain is not None:
            b.gain.copy_(gain)
    auto = torch.stack([torch.autograd.functional.jacobian(b.normalize, x[a]) for a in range(N)])
    exact = b.norm_jacobian(x).detach()
    torch.testing.assert_close(exact, auto)
    if norm == "none":
        return
    paper = b.norm_jacobian(x, "paper").detach()
    c = x - x.mean(-1, keepdim=True) if norm == "layernorm" else x
    r = torch.sqrt(c.pow(2).mean(-1) + eps)[:, None, None]
    y = c / r[..., 0]
    yy = y[:, :, None] * y[:, None, :]
    missing = gain[:, None] * (1 - 1 / D) * yy / r  # the 1/D factor eq. (28) drops
    if norm == "layernorm":  # ... and the centring term
        missing = missing - gain[:, None] * torch.ones(D, D, dtype=DT) / (D * r)
    torch.testing.assert_close(exact - paper, missing)


def test_norm_jacobian_ranks_at_eps_zero():
    x = _x()[0]
    ln = norm_jacobian(x, "layernorm", eps=0.0)
    rms = norm_jacobian(x, "rmsnorm", eps=0.0)
    ln_p = norm_jacobian(x, "layernorm", eps=0.0, form="paper")
    rank = lambda m: torch.linalg.matrix_rank(m, atol=1e-9)  # noqa: E731
    assert (rank(ln) == D - 2).all() and (rank(rms) == D - 1).all() and (rank(ln_p) == D).all()
    # eq. (28)'s P = I - y y^T with ||y||^2 = D is not PSD (eigenvalue 1 - D), exact P is
    r = torch.sqrt(x.pow(2).mean(-1))[:, None, None]
    P_paper = norm_jacobian(x, "rmsnorm", eps=0.0, form="paper") * r
    assert torch.linalg.eigvalsh(P_paper).min() == pytest.approx(1 - D, abs=1e-9)
    assert torch.linalg.eigvalsh(rms * r).min() > -1e-12


def test_ff2w_paper_form_switch():
    x = _x()
    be = _block(ff="ff2w", ff_bias=False)
    bp = _block(ff="ff2w", ff_bias=False, ff2w_form="paper")
    bp.load_state_dict(be.state_dict())
    g = be.normalize(x).detach()
    v = autograd_grad(lambda q: be.energy_g(q, context=g), g)
    with torch.no_grad():
        torch.testing.assert_close(x - be(x), v @ be.rate_matrix().T)
        assert relative_error(x - bp(x), v @ be.rate_matrix().T) > 0.5
        torch.testing.assert_close(bp.ff_grad_g(g), en.ff2w_grad_paper(g, bp.W1, bp.W2, bp.act))


def test_trajectory_and_first_token_descent():
    torch.manual_seed(0)
    b = NRGPTBlock(16, 2, ff="ff2w", rate="gamma", rate_scale=0.05, init_std=0.2).to(DT)
    x = torch.randn(2, 8, 16, dtype=DT)
    xT, E = b.run(x, 60, return_energies=True)
    assert E.shape == (61, 2, 8)
    with torch.no_grad():
        xs = x
        for _ in range(3):
            xs = b(xs)
        torch.testing.assert_close(E[3], b.energy(xs))
        torch.testing.assert_close(xT, b.run(x, 60))
    # E_1 depends on token 1 only (strict mask): a small step c*Gamma gives monotone descent
    assert (E[1:, :, 0] - E[:-1, :, 0]).max() < 0


def test_causality_and_first_token():
    b = _block(mask="strict")
    x = _x()
    x2 = x.clone()
    x2[:, 3:] += 1.0
    with torch.no_grad():
        for f in (b, lambda t: b.run(t, 3), b.energy):
            torch.testing.assert_close(f(x)[:, :3], f(x2)[:, :3], rtol=0, atol=0)
        # the first token's update is its feed-forward step alone
        g = b.normalize(x)
        torch.testing.assert_close((x - b(x))[:, 0], (b.ff_grad_g(g) @ b.rate_matrix().T)[:, 0])
        torch.testing.assert_close(b.energy_parts_g(g)[0][:, 0], torch.zeros(2, dtype=DT))


def test_float32_and_unbatched_input():
    b = NRGPTBlock(D, H)
    assert b(torch.randn(N, D)).shape == (N, D)
    assert b.energy(torch.randn(3, N, D)).shape == (3, N)


def test_bad_input():
    b = NRGPTBlock(D, H)
    with pytest.raises(ValueError, match="last dimension 6"):
        b(torch.randn(2, N, 5))
    with pytest.raises(ValueError, match=r"shape \(\.\.\., N, 6\)"):
        b(torch.randn(D))
    bad = torch.randn(2, N, D)
    bad[0, 0, 0] = float("inf")
    with pytest.raises(ValueError, match="NaN/Inf"):
        b(bad)
    with pytest.raises(ValueError, match="n_steps"):
        b.run(torch.randn(2, N, D), 0)
    with pytest.raises(ValueError, match="h shape"):
        b.energy_grad(torch.randn(2, N, D), torch.randn(2, N - 1, D))
    for kw, msg in [({"ff": "mlp"}, "ff must be"), ({"norm": "batch"}, "norm must be"),
                    ({"rate": "eye"}, "rate must be"), ({"mask": "full"}, "mask must be"),
                    ({"act": "tanh"}, "act must be"), ({"rate_scale": 0.0}, "rate_scale"),
                    ({"beta": -1.0}, "beta"), ({"ff2w_form": "paper"}, "ff2w_form='paper'"),
                    ({"ff_hidden": 0}, "ff_hidden"), ({"rate": "psd_skew", "rate_rank": 0}, "rate_rank")]:
        with pytest.raises(ValueError, match=msg):
            NRGPTBlock(D, H, **kw)
    with pytest.raises(ValueError, match="n_heads"):
        NRGPTBlock(D, 0)
