"""NRGPT energies (cemlib.energies.nrgpt): closed-form gradients against autograd in float64,
first-token behaviour, and the paper's FF errors (FF1 activation, eq. 24)."""

import math

import pytest
import torch

from cemlib.energies import nrgpt as en
from cemlib.testing import assert_grad_matches_autograd, autograd_grad, relative_error

DT = torch.float64


def _attn(H=2, D=6, N=5, batch=(3,), seed=0):
    gen = torch.Generator().manual_seed(seed)
    g = torch.randn(*batch, N, D, generator=gen, dtype=DT)
    J = torch.randn(H, D, D, generator=gen, dtype=DT) / math.sqrt(D)
    alpha = torch.rand(H, generator=gen, dtype=DT) + 0.5
    return g, J, alpha, 1.0 / math.sqrt(D / H)


@pytest.mark.parametrize("mask", en.MASKS)
@pytest.mark.parametrize("H", [1, 3])
@pytest.mark.parametrize("batch", [(), (2,)])
def test_query_grad_is_autograd_of_energy_with_keys_fixed(mask, H, batch):
    """Eq. (12): the NRGPT attention direction is the gradient of sum_A E_A(g_A | keys fixed)."""
    g, J, alpha, beta = _attn(H=H, batch=batch)
    keys = g.clone()
    assert_grad_matches_autograd(
        lambda q: en.attention_energy(q, J, alpha, beta, mask, context=keys),
        lambda q: en.attention_query_grad(q, J, alpha, beta, mask, context=keys), g)


@pytest.mark.parametrize("mask", en.MASKS)
def test_global_gradient_adds_the_key_side_term(mask):
    """grad of the global energy sum_A E_A = query part + key part (the ET gradient); the key part
    is what NRGPT drops, and it is not small."""
    g, J, alpha, beta = _attn(H=2)
    glob = autograd_grad(lambda q: en.attention_energy(q, J, alpha, beta, mask), g)
    q = en.attention_query_grad(g, J, alpha, beta, mask)
    k = en.attention_key_grad(g, J, alpha, beta, mask)
    torch.testing.assert_close(q + k, glob, rtol=1e-9, atol=1e-10)
    assert relative_error(q, glob) > 0.1


def test_strict_first_token_energy_zero_and_no_nan():
    g, J, alpha, beta = _attn(H=2)
    E = en.attention_energy(g, J, alpha, beta, "strict")
    assert torch.all(E[..., 0] == 0)
    p = en.attention_weights(g, J, beta, "strict")
    assert torch.all(p[..., 0, :] == 0)
    torch.testing.assert_close(p[..., 1:, :].sum(-1), torch.ones_like(p[..., 1:, 0]))
    assert torch.all(p.triu(0) == 0)  # strict: no B >= A
    grad = autograd_grad(lambda q: en.attention_energy(q, J, alpha, beta, "strict"), g)
    assert torch.isfinite(grad).all()
    assert torch.all(en.attention_query_grad(g, J, alpha, beta, "strict")[..., 0, :] == 0)
    # the second token attends only to the first: E_2 = -(1/beta) sum_h alpha_h beta g_1^T J_h g_2
    e2 = -(alpha * torch.einsum("...i,hij,...j->...h", g[..., 0, :], J, g[..., 1, :])).sum(-1)
    torch.testing.assert_close(E[..., 1], e2)


def test_inclusive_first_token_is_self_attention():
    g, J, alpha, beta = _attn(H=2)
    E = en.attention_energy(g, J, alpha, beta, "inclusive")
    self_term = -(alpha * torch.einsum("...i,hij,...j->...h", g[..., 0, :], J, g[..., 0, :])).sum(-1)
    torch.testing.assert_close(E[..., 0], self_term)


def test_energy_is_causal():
    g, J, alpha, beta = _attn(H=2, N=6)
    g2 = g.clone()
    g2[..., 3:, :] += 1.0
    for mask in en.MASKS:
        E1, E2 = (en.attention_energy(t, J, alpha, beta, mask) for t in (g, g2))
        torch.testing.assert_close(E1[..., :3], E2[..., :3], rtol=0, atol=0)
        assert not torch.allclose(E1[..., 3:], E2[..., 3:])


def _ff(M=12, D=6, seed=1):
    gen = torch.Generator().manual_seed(seed)
    g = torch.randn(3, 4, D, generator=gen, dtype=DT)
    W1 = torch.randn(M, D, generator=gen, dtype=DT) / math.sqrt(D)
    W2 = torch.randn(D, M, generator=gen, dtype=DT) / math.sqrt(M)
    b1 = torch.randn(M, generator=gen, dtype=DT)
    b2 = torch.randn(D, generator=gen, dtype=DT)
    return g, W1, W2, b1, b2


@pytest.mark.parametrize("act", en.ACTIVATIONS)
def test_activation_primitive_and_derivative(act):
    u = torch.linspace(-3, 3, 61, dtype=DT)
    assert_grad_matches_autograd(lambda v: en.activation_primitive(v, act),
                                 lambda v: en.activation(v, act), u)
    assert float(en.activation_primitive(torch.zeros((), dtype=DT), act)) == pytest.approx(0, abs=1e-15)
    assert_grad_matches_autograd(lambda v: en.activation(v, act),
                                 lambda v: en.activation_grad(v, act), u)


@pytest.mark.parametrize("act", en.ACTIVATIONS)
@pytest.mark.parametrize("bias", [False, True])
def test_ff_gradients_match_autograd(act, bias):
    g, W1, W2, b1, b2 = _ff()
    b1, b2 = (b1, b2) if bias else (None, None)
    assert_grad_matches_autograd(lambda x: en.ff_dam_energy(x, W1, act, b1),
                                 lambda x: en.ff_dam_grad(x, W1, act, b1), g)
    assert_grad_matches_autograd(lambda x: en.ff1_energy(x, W1, act, b1),
                                 lambda x: en.ff1_grad(x, W1, act, b1), g)
    assert_grad_matches_autograd(lambda x: en.ff2w_energy(x, W1, W2, act, b1, b2),
                                 lambda x: en.ff2w_grad(x, W1, W2, act, b1, b2), g)


def test_dam_relu_is_a_tied_relu_mlp():
    """Eqs. (14)-(16): -grad of -1^T relu(W g)^2/2 is W^T relu(W g)."""
    g, W1, *_ = _ff()
    torch.testing.assert_close(-en.ff_dam_grad(g, W1, "relu"), torch.relu(g @ W1.T) @ W1)


def test_ff1_is_not_eq14_with_gelu():
    """FF1 = -||sigma(W g)||^2 is *not* 'the same as eq. 14': its activation is 2 sigma sigma'."""
    g, W1, *_ = _ff()
    ff1 = -en.ff1_grad(g, W1, "gelu")
    eq14 = -en.ff_dam_grad(g, W1, "gelu")  # W^T GELU(W g)
    assert relative_error(ff1, eq14) > 0.1
    u = g @ W1.T
    two_ss = 2 * torch.nn.functional.gelu(u) * en.activation_grad(u, "gelu")
    torch.testing.assert_close(ff1, two_ss @ W1)
    # for ReLU sigma sigma' = sigma, so FF1 is exactly twice the DAM/ReLU update
    torch.testing.assert_close(en.ff1_grad(g, W1, "relu"), 2 * en.ff_dam_grad(g, W1, "relu"))


def test_ff2w_paper_eq24_is_wrong():
    """Eq. (24) has the wrong sign and a wrong second term; the corrected form equals autograd."""
    g, W1, W2, *_ = _ff()
    exact = autograd_grad(lambda x: en.ff2w_energy(x, W1, W2, "gelu"), g)
    paper = en.ff2w_grad_paper(g, W1, W2, "gelu")
    assert relative_error(paper, exact) > 0.5
    assert relative_error(-paper, exact) > 0.05  # not just a sign slip
    # first terms agree up to the sign; the second term differs by sigma applied to W2^T g
    u = g @ W1.T
    first = torch.nn.functional.gelu(u) @ W2.T
    torch.testing.assert_close(exact, -(first + (en.activation_grad(u, "gelu") * (g @ W2)) @ W1))
    torch.testing.assert_close(paper - first, (en.activation_grad(u, "gelu")
                                               * torch.nn.functional.gelu(g @ W2)) @ W1)
    # the paper's sign matches App. D's energy +g^T W2 sigma(W1 g): its grad is -exact
    torch.testing.assert_close(autograd_grad(lambda x: -en.ff2w_energy(x, W1, W2, "gelu"), g), -exact)


def test_eq3_ff_sum_over_all_tokens_changes_value_not_gradient():
    """Eq. (3) puts sum_B of the FF energy inside E_A; per token cemlib keeps B = A only. The
    gradient w.r.t. g_A is the same, the value of E_A is not."""
    g, W1, W2, *_ = _ff()
    per_token = en.ff2w_energy(g, W1, W2)
    eq3 = per_token.sum(-1, keepdim=True).expand_as(per_token)
    own = torch.stack([autograd_grad(lambda x: en.ff2w_energy(x, W1, W2)[..., a], g)[..., a, :]
                       for a in range(g.shape[-2])], -2)
    own_eq3 = torch.stack([autograd_grad(lambda x: en.ff2w_energy(x, W1, W2).sum(-1), g)[..., a, :]
                           for a in range(g.shape[-2])], -2)
    torch.testing.assert_close(own, own_eq3)
    assert not torch.allclose(per_token, eq3)


def test_bad_input_is_rejected_with_clear_errors():
    g, J, alpha, beta = _attn(H=2)
    with pytest.raises(ValueError, match="alpha has 3 heads but J has 2"):
        en.attention_energy(g, J, torch.ones(3, dtype=DT), beta)
    with pytest.raises(ValueError, match="J must have shape"):
        en.attention_energy(g, J[:, :4, :], alpha, beta)
    with pytest.raises(ValueError, match="last dimension"):
        en.attention_energy(g[..., :5], J, alpha, beta)
    with pytest.raises(ValueError, match="mask must be one of"):
        en.attention_energy(g, J, alpha, beta, mask="causal")
    with pytest.raises(ValueError, match="context shape"):
        en.attention_energy(g, J, alpha, beta, context=g[..., :3, :])
    bad = g.clone()
    bad[0, 1, 2] = float("nan")
    with pytest.raises(ValueError, match="NaN"):
        en.attention_energy(bad, J, alpha, beta)
    ff = _ff()
    with pytest.raises(ValueError, match=r"W must have shape \(M, 6\)"):
        en.ff1_energy(ff[0], ff[1].T)
    with pytest.raises(ValueError, match="W2 must have shape"):
        en.ff2w_energy(ff[0], ff[1], ff[2][:, :5])
    with pytest.raises(ValueError, match="activation must be one of"):
        en.ff1_energy(ff[0], ff[1], act="tanh")
