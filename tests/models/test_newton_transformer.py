"""Unit tests of the LIS Transformer with standard or Newton attention
(:mod:`cemlib.models.newton_transformer`, intrinsic-optimizers paper §5, App. A.9)."""

import pytest
import torch

from cemlib.layers.gpt import CausalSelfAttention
from cemlib.layers.newton import MHA2nd1st
from cemlib.models.newton_transformer import NewtonTransformer, causal_mha2nd1st_update

f64 = torch.float64


def _model(attn, ffn=True, d=32, heads=4, layers=2, vocab=13, block=12, seed=0):
    torch.manual_seed(seed)
    return NewtonTransformer(vocab, block, d_model=d, n_layers=layers, n_heads=heads, attn=attn,
                             ffn=ffn, dropout=0.1).double().eval()


@pytest.mark.parametrize("attn", ["mha", "mha2nd1st"])
@pytest.mark.parametrize("ffn", [True, False])
def test_causal_later_tokens_do_not_change_earlier_logits(attn, ffn):
    model = _model(attn, ffn)
    g = torch.Generator().manual_seed(1)
    idx = torch.randint(0, 13, (3, 12), generator=g)
    changed = idx.clone()
    changed[:, 7:] = (idx[:, 7:] + 1 + torch.randint(0, 11, (3, 5), generator=g)) % 13
    assert (changed[:, 7:] != idx[:, 7:]).all()
    with torch.no_grad():
        a, b = model(idx), model(changed)
    assert a.shape == (3, 12, 13)
    torch.testing.assert_close(a[:, :7], b[:, :7], rtol=0, atol=1e-12)
    assert (a[:, 7:] - b[:, 7:]).abs().max() > 1e-3     # the later positions do see the change


@pytest.mark.parametrize("d,heads", [(32, 4), (64, 4), (64, 8)])
def test_mha2nd1st_has_three_quarters_of_the_attention_weights(d, heads):
    mha, newton = _model("mha", d=d, heads=heads, layers=3), _model("mha2nd1st", d=d, heads=heads, layers=3)
    # MHA: W_Q, W_K, W_V, W_O (4 d^2) plus their biases (4 d); MHA2nd1st: W_Q, W_K, W_O (3 d^2)
    # plus one temperature per head, no W_V.
    assert mha.attention_parameters() == 3 * (4 * d * d + 4 * d)
    assert newton.attention_parameters() == 3 * (3 * d * d + heads)
    matrices = lambda m: sum(p.numel() for b in m.blocks for p in b.attn.parameters() if p.dim() >= 2)
    assert matrices(newton) * 4 == matrices(mha) * 3
    # everything outside attention (embedding, norms, MLPs, head) is identical
    rest = lambda m: sum(p.numel() for p in m.parameters()) - m.attention_parameters()
    assert rest(mha) == rest(newton)
    assert all(isinstance(b.attn, MHA2nd1st) for b in newton.blocks)
    assert all(isinstance(b.attn, CausalSelfAttention) for b in mha.blocks)
    temps = torch.stack([b.attn.T for b in newton.blocks])
    torch.testing.assert_close(temps, torch.full_like(temps, d / heads))      # initialised to d_h
    assert all(b.attn.log_T.requires_grad for b in newton.blocks)


@pytest.mark.parametrize("ffn", [False, True])
def test_block_update_is_the_mha2nd1st_step_minus_its_input(ffn):
    model = _model("mha2nd1st", ffn, d=16, heads=2, layers=1)
    blk = model.blocks[0]
    g = torch.Generator().manual_seed(2)
    x = torch.randn(2, 6, 16, generator=g, dtype=f64)
    with torch.no_grad():
        out = blk(x)
        gn = blk.ln1(x)
        expected = torch.empty_like(x)
        for i in range(6):            # token i attends to the prefix 1..i, without any mask
            step = blk.attn(gn[:, i], gn[:, : i + 1])
            expected[:, i] = x[:, i] + step - gn[:, i]
        if ffn:
            expected = expected + blk.mlp(blk.ln2(expected))
    torch.testing.assert_close(out, expected, rtol=1e-12, atol=1e-12)


def test_mha2nd1st_block_step_is_first_order_newton_for_tied_output():
    """With W_O,h = eta/H W_h^T (W_h W_h^T)^{-1}, the block's attention update is the truncated
    range-space Newton step -eta/H sum_h W_h^T (W_h W_h^T)^{-1} (I + Cov_h/T_h) (q_h - k_bar_h)."""
    model = _model("mha2nd1st", False, d=8, heads=2, layers=1)
    att = model.blocks[0].attn
    eta = 0.7
    with torch.no_grad():
        att.W_O.copy_(att.tied_output(eta))
    g = torch.Generator().manual_seed(3)
    z, h = torch.randn(8, generator=g, dtype=f64), torch.randn(5, 8, generator=g, dtype=f64)
    with torch.no_grad():
        got = att(z, h) - z
    want = torch.zeros(8, dtype=f64)
    for k in range(2):
        W1, W2, T = att.W_Q[k], att.W_K[k], att.T[k]
        q, keys = W1 @ z, h @ W2.T
        p = torch.softmax(-0.5 * (q - keys).pow(2).sum(-1) / T, 0)
        kbar = p @ keys
        cov = (p[:, None] * (keys - kbar)).T @ (keys - kbar)
        r = (torch.eye(4, dtype=f64) + cov / T) @ (q - kbar)
        want -= eta / 2 * W1.T @ torch.linalg.solve(W1 @ W1.T, r)
    torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-12)


def test_dropout_only_in_training_and_shapes():
    model = _model("mha2nd1st")
    idx = torch.randint(0, 13, (2, 12), generator=torch.Generator().manual_seed(4))
    with torch.no_grad():
        torch.testing.assert_close(model(idx), model(idx), rtol=0, atol=0)
        model.train()
        assert not torch.equal(model(idx), model(idx))
    with pytest.raises(ValueError, match="L <= 12"):
        model(torch.zeros(1, 13, dtype=torch.long))
    with pytest.raises(ValueError, match="attn must be"):
        NewtonTransformer(13, 12, attn="mha2nd")


@pytest.mark.parametrize("form", ["corrected", "paper"])
def test_causal_fast_path_equals_the_layer_with_a_causal_mask(form):
    """The block's matrix-product update equals MHA2nd1st(g, g, causal) - g (RBF softmax, eq. 31)."""
    torch.manual_seed(5)
    att = MHA2nd1st(12, 3, form=form).double()
    with torch.no_grad():
        att.log_T.copy_(torch.tensor([0.1, 1.0, 2.0], dtype=f64))        # distinct temperatures
    g = torch.randn(2, 7, 12, dtype=f64)
    causal = torch.ones(7, 7, dtype=torch.bool).tril()
    with torch.no_grad():
        want = att(g, g.unsqueeze(1), causal) - g
        got = causal_mha2nd1st_update(att, g)
    torch.testing.assert_close(got, want, rtol=1e-11, atol=1e-11)
    # gradients flow to every parameter, including the temperatures
    causal_mha2nd1st_update(att, g).pow(2).sum().backward()
    assert all(p.grad is not None and p.grad.abs().sum() > 0 for p in att.parameters())


def test_paper_form_model_builds_and_is_causal():
    torch.manual_seed(0)
    model = NewtonTransformer(13, 12, d_model=16, n_layers=2, n_heads=2, attn="mha2nd1st",
                              form="paper").double().eval()
    idx = torch.randint(0, 13, (2, 12))
    changed = idx.clone()
    changed[:, 9] = (idx[:, 9] + 1) % 13
    with torch.no_grad():
        torch.testing.assert_close(model(idx)[:, :9], model(changed)[:, :9], rtol=0, atol=1e-12)
