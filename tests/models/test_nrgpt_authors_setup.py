"""The options that reproduce the NRGPT authors' released code (github bhoov/nrgpt): the FF2
energy, the learnable feed-forward scale, the normally initialised rate matrix, dropout on the
attention weights and update, no head weights, the output-head bias and the sequential recurrent
GPT. Each is checked in float64 against autograd of its energy or against the authors' forward
pass, written here from their code independently of cemlib's closed forms."""

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from cemlib.energies import nrgpt as en
from cemlib.layers.gpt import GPTBlock, RecurrentGPT
from cemlib.layers.nrgpt import NRGPTBlock
from cemlib.models.nrgpt import AUTHORS_BASELINE, AUTHORS_NRGPT, GPTModel, NRGPTModel, RecurrentGPTModel
from cemlib.testing import autograd_grad, relative_error

pytestmark = pytest.mark.usefixtures("float64")
D, N, H = 6, 5, 2


def _g(seed=0, shape=(3, N, D)):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed))


@pytest.mark.parametrize("act", ["gelu", "relu"])
@pytest.mark.parametrize("bias", [True, False])
def test_ff2_grad_is_autograd_of_its_energy(act, bias):
    torch.manual_seed(1)
    D1, M = 4, 9
    W1, W2 = torch.randn(D1, D), torch.randn(M, D1)
    b1, b2 = (torch.randn(D1), torch.randn(M)) if bias else (None, None)
    g = _g()
    auto = autograd_grad(lambda t: en.ff2_energy(t, W1, W2, act, b1, b2).sum(), g)
    assert relative_error(en.ff2_grad(g, W1, W2, act, b1, b2), auto) < 1e-12


def test_ff2_energy_is_the_authors_two_layer_net():
    """Their GradFeedForward_2Lay: Linear(D, D) -> GELU -> Linear(D, 4D) -> GELU, energy
    -(net(x)**2).sum(), update = torch.func.grad of it (per token, the sum separates)."""
    torch.manual_seed(2)
    net = nn.Sequential(nn.Linear(D, D), nn.GELU(), nn.Linear(D, 4 * D), nn.GELU()).double()
    g = _g()
    theirs = -(net(g) ** 2).sum(-1)
    args = (net[0].weight, net[2].weight, "gelu", net[0].bias, net[2].bias)
    assert relative_error(en.ff2_energy(g, *args).detach(), theirs.detach()) < 1e-13
    their_grad = torch.func.grad(lambda t: -(net(t) ** 2).sum())(g)
    assert relative_error(en.ff2_grad(g, *args).detach(), their_grad.detach()) < 1e-12


def test_ff2_block_shapes_and_exact_energy_gradient():
    torch.manual_seed(3)
    blk = NRGPTBlock(D, H, ff="ff2", ff2_hidden=3, ff_hidden=10, mask="inclusive").double()
    assert blk.W1.shape == (3, D) and blk.W2.shape == (10, 3) and blk.b1.shape == (3,) and blk.b2.shape == (10,)
    x = _g(4)
    auto = autograd_grad(lambda t: blk.energy(t).sum(), x)
    assert relative_error(blk.energy_grad(x), auto) < 1e-11
    assert NRGPTBlock(D, H, ff="ff2").W1.shape == (D, D)  # the authors' first layer is D -> D


def test_learnable_ff_scale_scales_energy_and_update():
    torch.manual_seed(4)
    blk = NRGPTBlock(D, H, learn_ff_scale=True).double()
    base = NRGPTBlock(D, H).double()
    base.load_state_dict({k: v for k, v in blk.state_dict().items() if k != "ff_scale"})
    assert blk.ff_scale.requires_grad and float(blk.ff_scale.detach()) == 1.0
    with torch.no_grad():
        blk.ff_scale.fill_(0.3)
    x = _g(5)
    g = blk.normalize(x)
    e_at, e_ff = base.energy_parts_g(g)
    assert relative_error(blk.energy_g(g), e_at + 0.3 * e_ff) < 1e-13
    expected = en.attention_query_grad(g, blk.J, blk.alpha, blk.beta) + 0.3 * base.ff_grad_g(g)
    assert relative_error(blk.grad_g(g), expected) < 1e-13
    # still an exact x-gradient of the scaled energy (keys fixed), with the norm's Jacobian
    auto = autograd_grad(lambda t: blk.energy(t, x.detach()).sum(), x)
    assert relative_error(blk.energy_grad(x, x), auto) < 1e-11
    # the scale learns: it receives a gradient through the update
    blk(x).sum().backward()
    assert blk.ff_scale.grad is not None and blk.ff_scale.grad.abs() > 0


def test_rate_init_normal_is_the_authors_proj_linear():
    torch.manual_seed(5)
    blk = NRGPTBlock(32, 1, rate_init="normal", init_std=0.02)
    eta = blk.rate_matrix().detach()
    assert not torch.allclose(eta, torch.eye(32))
    assert 0.015 < float(eta.std()) < 0.025 and abs(float(eta.mean())) < 0.005
    x = _g(6, (2, N, 32))
    # x - proj(v) with proj = Linear(D, D, bias=False) whose weight is eta
    assert relative_error(blk(x), x - F.linear(blk.grad_g(blk.normalize(x)), eta)) < 1e-13
    with pytest.raises(ValueError, match="rate='matrix' only"):
        NRGPTBlock(D, H, rate="gamma", rate_init="normal")
    with pytest.raises(ValueError, match="rate_init"):
        NRGPTBlock(D, H, rate_init="zeros")


def test_attention_dropout_matches_the_authors_forward():
    """Training mode: their EnergyHead drops the weights, MultiHeadEnergyAttention drops the
    head sum; the FF gradient is not dropped. Eval mode (and p = 0) is the exact update."""
    torch.manual_seed(6)
    p = 0.3
    blk = NRGPTBlock(D, H, attn_dropout=p, learn_alpha=False, beta=1.0, mask="inclusive").double()
    x = _g(7)
    blk.eval()
    assert relative_error(blk(x), x - blk.grad_g(blk.normalize(x)) @ blk.rate_matrix().T) < 1e-14
    blk.train()
    torch.manual_seed(11)
    out = blk(x)
    # the authors' computation with the same random draws, written from their code
    torch.manual_seed(11)
    g = blk.normalize(x)
    masks = []
    for h in range(H):
        xH = g @ blk.J[h]  # their H(x) = x W^T with W = J_h^T, so x_B^T J_h x_A = logits
        wei = (g @ xH.transpose(-2, -1)).masked_fill(~torch.ones(N, N, dtype=torch.bool).tril(), float("-inf"))
        masks.append(wei)
    probs = torch.stack([F.softmax(w, -1) for w in masks], dim=-3)  # (B, H, N, N)
    probs = F.dropout(probs, p, training=True)
    o = torch.einsum("...hab,...bi->...hai", probs, g)
    att = -torch.einsum("h,hji,...haj->...ai", blk.alpha, blk.J, o)
    att = F.dropout(att, p, training=True)
    v = att + blk.ff_grad_g(g)
    assert relative_error(out, x - v @ blk.rate_matrix().T) < 1e-13
    assert relative_error(out, blk.eval()(x)) > 1e-3  # dropout did something
    with pytest.raises(ValueError, match="attn_dropout"):
        NRGPTBlock(D, H, attn_dropout=1.0)


def test_no_head_weights():
    blk = NRGPTBlock(D, H, learn_alpha=False)
    assert "alpha" not in dict(blk.named_parameters()) and torch.equal(blk.alpha, torch.ones(H))
    assert sum(q.numel() for q in blk.parameters()) == \
        sum(q.numel() for q in NRGPTBlock(D, H).parameters()) - H


def test_head_bias_is_zero_initialised_and_counted():
    V, L = 11, 8
    for cls, kw in ((NRGPTModel, {}), (RecurrentGPTModel, {}), (GPTModel, {})):
        torch.manual_seed(0)
        a = cls(V, L, D, **kw)
        torch.manual_seed(0)
        b = cls(V, L, D, head_bias=True, **kw)
        assert b.num_parameters() == a.num_parameters() + V
        assert torch.equal(b.head.bias, torch.zeros(V))
        idx = torch.randint(0, V, (2, L))
        assert torch.allclose(a(idx), b(idx))  # same initialisation otherwise


def test_sequential_recurrent_gpt_is_one_gpt_block_iterated():
    torch.manual_seed(7)
    rec = RecurrentGPT(D, H, n_steps=3, block="sequential").double()
    assert isinstance(rec.block, GPTBlock)
    x = _g(8)
    y = x
    for _ in range(3):
        y = rec.block(y)
    assert torch.equal(rec(x), y)
    with pytest.raises(ValueError, match="block must be one of"):
        RecurrentGPT(D, H, 2, block="interleaved")


def _authors_nrgpt_ff2w_count(V, L, D, H):
    """Parameter count of the authors' NRGPT_H_FF2W (their nn.Module, every parameter counted,
    including BareLayerNorm's frozen weight): embeddings, H bias-free D x D heads, FF2W with biases,
    BareLayerNorm (weight + bias), proj D x D, scale_ff, final LayerNorm, lm_head with bias."""
    return (V * D + L * D) + H * D * D + (D * 4 * D + 4 * D + 4 * D * D + D) + 2 * D + D * D + 1 \
        + 2 * D + (D * V + V)


@pytest.mark.parametrize("H_", [1, 4])
def test_authors_setup_parameter_count(H_):
    V, L, Dm = 65, 32, 24
    m = NRGPTModel(V, L, Dm, n_heads=H_, n_steps=2, **AUTHORS_NRGPT)
    frozen = sum(b.numel() for n, b in m.named_buffers() if n.endswith("gain"))
    assert m.num_parameters() + frozen == _authors_nrgpt_ff2w_count(V, L, Dm, H_)
    g = GPTModel(V, L, Dm, n_heads=4, n_layers=2, **AUTHORS_BASELINE)
    # nanoGPT-style GPT with biases everywhere and a head bias
    per_block = 4 * Dm + (3 * Dm * Dm + 3 * Dm) + (Dm * Dm + Dm) + (8 * Dm * Dm + 5 * Dm)
    assert g.num_parameters() == V * Dm + L * Dm + 2 * per_block + 2 * Dm + Dm * V + V


def test_frozen_rate_scale_fixes_eta_at_the_identity():
    """rate='gamma', learn_gain=False, learn_rate_scale=False: eta = I, no trainable rate (claim 10)."""
    import torch
    from cemlib.layers.nrgpt import NRGPTBlock
    blk = NRGPTBlock(8, 1, rate="gamma", learn_gain=False, learn_rate_scale=False).double()
    torch.testing.assert_close(blk.rate_matrix(), torch.eye(8, dtype=torch.float64))
    names = {n for n, _ in blk.named_parameters()}
    assert "log_c" not in names and "log_c" in dict(blk.named_buffers())
    assert "learn_rate_scale=False" in repr(blk)
    x = torch.randn(2, 5, 8, dtype=torch.float64)
    blk(x).sum().backward()                                   # trains without a rate parameter
    assert "log_c" in {n for n, _ in NRGPTBlock(8, 1, rate="gamma").named_parameters()}
    with pytest.raises(ValueError, match="applies to rate='gamma' only"):
        NRGPTBlock(8, 1, rate="matrix", learn_rate_scale=False)
    with pytest.raises(ValueError, match="must be a bool"):
        NRGPTBlock(8, 1, rate="gamma", learn_rate_scale="no")
