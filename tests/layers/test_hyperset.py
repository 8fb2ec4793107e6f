"""Hyper-SET energies and layer (Hu et al. 2025, eqs. 3-12) against autograd, float64."""

import math

import pytest
import torch

from cemlib.energies import hyperset as hs
from cemlib.layers.hyperset import (BiSoftmaxAttention, HyperSETLayer, StepSizeNet,
                                    TiedReLUFeedForward)
from cemlib.layers.norm import rms_norm, rms_norm_vjp
from cemlib.testing import assert_grad_matches_autograd, autograd_grad

pytestmark = pytest.mark.usefixtures("float64")


def _x(B=2, N=5, d=8, seed=0):
    return torch.randn(B, N, d, generator=torch.Generator().manual_seed(seed))


def _attn(d=8, H=2, **kw):
    torch.manual_seed(1)
    return BiSoftmaxAttention(d, H, **kw)


def _ff(d=8, M=12, **kw):
    torch.manual_seed(2)
    return TiedReLUFeedForward(d, M, **kw)


@pytest.mark.parametrize("normalize", [False, True])
def test_energy_grads_match_autograd(normalize):
    x = _x()
    a, f = _attn(normalize=normalize), _ff(normalize=normalize)
    with torch.no_grad():
        assert_grad_matches_autograd(lambda y: a.energy(y), lambda y: a.energy_grad(y), x)
        assert_grad_matches_autograd(lambda y: f.energy(y), lambda y: f.energy_grad(y), x)


def test_bisoftmax_is_the_full_gradient_query_and_key_side():
    x = _x()
    a = _attn(normalize=False)
    g = autograd_grad(lambda y: a.energy(y), x)
    with torch.no_grad():
        torch.testing.assert_close(a.descent_direction(x), -g)  # eq. (7), exact
        Z = hs.split_heads(x @ a.W, 2)
        G = Z @ Z.transpose(-1, -2) / math.sqrt(4)
        row = hs.merge_heads(torch.softmax(G, -1) @ Z) @ a.W.T   # query side: ordinary attention
        col = hs.merge_heads(torch.softmax(G, -2) @ Z) @ a.W.T   # key side (dynamic keys)
    torch.testing.assert_close(row + col, g)
    assert (row - g).norm() > 0.1 * g.norm()  # the query side alone is not the gradient
    # row-softmax weights sum to 1 per token, column-softmax ones do not (not doubly stochastic)
    assert not torch.allclose(torch.softmax(G, -2).sum(-1), torch.ones_like(G[..., 0]))


def test_bisoftmax_form_needs_symmetric_scores():
    """With Q != K the energy's gradient is P K Wq^T + P^T Q Wk^T, not the bi-softmax form."""
    x = _x()
    g = torch.Generator().manual_seed(3)
    Wq, Wk = torch.randn(8, 4, generator=g), torch.randn(8, 4, generator=g)
    beta = 0.5

    def E(y):
        return torch.logsumexp(beta * (y @ Wq) @ (y @ Wk).transpose(-1, -2), -1) / beta

    gx = autograd_grad(E, x)
    Q, K = x @ Wq, x @ Wk
    P = torch.softmax(beta * Q @ K.transpose(-1, -2), -1)
    torch.testing.assert_close(P @ K @ Wq.T + P.transpose(-1, -2) @ Q @ Wk.T, gx)
    bi = hs.bisoftmax_grad(Q, beta) @ Wq.T
    assert (bi - gx).norm() > 0.1 * gx.norm()


def test_appendix_c1_single_softmax_over_all_heads_is_not_the_head_sum():
    x = _x()
    a = _attn(normalize=False)
    with torch.no_grad():
        per_head = -a.descent_direction(x)
        one = hs.bisoftmax_grad(x @ a.W, 1 / math.sqrt(4)) @ a.W.T  # C.1's last line
    assert (one - per_head).norm() > 0.1 * per_head.norm()


def test_feedforward_is_minus_grad_of_E_FF():
    x = _x()
    f = _ff(normalize=False)
    g = autograd_grad(lambda y: f.energy(y), x)
    with torch.no_grad():
        torch.testing.assert_close(f.descent_direction(x), -g)
        torch.testing.assert_close(-g, torch.relu(x @ f.D) @ f.D.T)   # eq. (10)
        torch.testing.assert_close(f(x, 0.3), x - 0.3 * g)


def test_rmsnorm_update_drops_the_jacobian_exactly():
    """Eqs. (9), (11) evaluate the gradient formula at RMSNorm(W^T x): the difference from the exact
    gradient is exactly sum_h W_h (J_h^T - I) g_h, with g_h = grad_U E at U = RMSNorm(Z_h)."""
    x = _x()
    a, f = _attn(), _ff()
    with torch.no_grad():
        Z = hs.split_heads(x @ a.W, 2)
        gU = hs.bisoftmax_grad(rms_norm(Z))
        exact = a.energy_grad(x)
        torch.testing.assert_close(exact + a.descent_direction(x),
                                   hs.merge_heads(rms_norm_vjp(Z, gU) - gU) @ a.W.T)
        assert (exact + a.descent_direction(x)).norm() > 0.1 * exact.norm()
        U = x @ f.D
        gU = -torch.relu(rms_norm(U))
        torch.testing.assert_close(f.energy_grad(x) + f.descent_direction(x),
                                   (rms_norm_vjp(U, gU) - gU) @ f.D.T)
        assert (f.energy_grad(x) + f.descent_direction(x)).norm() > 0.1 * f.energy_grad(x).norm()


def test_what_rmsnorm_preserves_and_what_it_does_not():
    x = _x()
    a = _attn(eps=0.0)  # the exact constraint (eps > 0 only guards against division by zero)
    with torch.no_grad():
        U = rms_norm(hs.split_heads(x @ a.W, 2), eps=0.0)
        # preserved: every normalised projection lies on the sphere of radius sqrt(p) (eq. 4) ...
        torch.testing.assert_close(U.norm(dim=-1), torch.full(U.shape[:-1], 2.0))
        # ... so the normalised energy is invariant to rescaling each token, and its exact gradient
        # has no radial component (x_i . grad_i = 0)
        c = torch.rand(2, 5, 1) + 0.5
        torch.testing.assert_close(a.energy(c * x), a.energy(x))
        torch.testing.assert_close((x * a.energy_grad(x)).sum(-1), torch.zeros(2, 5), atol=1e-9,
                                   rtol=0)
        # not preserved: eq. (9)'s direction has a radial component (not a Riemannian step) ...
        radial = (x * a.descent_direction(x)).sum(-1)
        assert radial.abs().max() > 1e-2
        # ... and the updated tokens leave the constraint set (X is never retracted onto it)
        x1 = a(x, 0.5)
        norms = hs.split_heads(x1 @ a.W, 2).norm(dim=-1)
        assert (norms - 2.0).abs().max() > 1e-2


def test_exact_gradient_flow_decreases_E_ATTN_and_E_FF():
    x = _x(N=6)
    a, f = _attn(normalize=False), _ff(normalize=False)
    with torch.no_grad():
        for layer in (a, f):
            e = [layer.energy(x).sum()]
            y = x
            for _ in range(10):
                y = layer(y, 1e-3)
                e.append(layer.energy(y).sum())
            assert all(e[i + 1] < e[i] for i in range(10))


def test_step_size_net_zero_init_and_shapes():
    torch.manual_seed(0)
    net = StepSizeNet(8, freq_dim=16)
    x0 = _x()
    alpha, gamma = net(3, x0)
    assert alpha.shape == gamma.shape == x0.shape
    assert (alpha == 0).all() and (gamma == 0).all()
    layer = HyperSETLayer(_attn(), _ff(), freq_dim=16)
    torch.testing.assert_close(layer(x0, 0, x0), x0)  # identity at initialisation
    n = sum(p.numel() for p in net.parameters())
    assert n == 16 * 8 + 8 + 8 * 8 + 8 + 8 * 16 + 16  # (512 d + 3 d^2 + biases) at freq 16
    with pytest.raises(ValueError, match="non-negative int"):
        net(-1, x0)


def test_layer_is_attention_then_feedforward_on_post_attention_state():
    x, x0 = _x(), _x(seed=5)
    torch.manual_seed(0)
    layer = HyperSETLayer(_attn(), _ff(), freq_dim=16)
    with torch.no_grad():
        torch.nn.init.normal_(layer.step_net.out.weight, std=0.1)
        alpha, gamma = layer.step_net(2, x0)
        xh = layer.attention(x) * 0 + x + alpha * layer.attention.descent_direction(x)
        ref = xh + gamma * layer.feedforward.descent_direction(xh)
        torch.testing.assert_close(layer(x, 2, x0), ref)
        assert (alpha != alpha[..., :1, :]).any()  # per token, per channel
    fixed = HyperSETLayer(_attn(), _ff(), step_size=0.1)
    with torch.no_grad():
        xh = fixed.attention(x, 0.1)
        torch.testing.assert_close(fixed(x, 0), fixed.feedforward(xh, 0.1))
    assert fixed.step_net is None


def test_bad_input():
    a = _attn()
    with pytest.raises(ValueError, match="last dimension 8"):
        a(_x(d=6))
    with pytest.raises(ValueError, match="NaN"):
        a(_x().masked_fill(_x() > 1.5, float("nan")))
    with pytest.raises(ValueError, match="divisible"):
        BiSoftmaxAttention(8, 3)
    with pytest.raises(ValueError, match="does not broadcast"):
        a(_x(), torch.ones(3, 8))
    with pytest.raises(ValueError, match="W must have shape"):
        a(_x(), 1.0, W=torch.ones(8, 4))
    with pytest.raises(ValueError, match="unknown attention kind"):
        hs.attention_energy(_x(), a.W, 2, kind="cosine")
    with pytest.raises(ValueError, match="width 8 != "):
        HyperSETLayer(_attn(), TiedReLUFeedForward(6))
    with pytest.raises(ValueError, match="condition"):
        HyperSETLayer(_attn(), _ff(), condition="x1")
    with pytest.raises(ValueError, match="ff_dim"):
        TiedReLUFeedForward(8, 0)
