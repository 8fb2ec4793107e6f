"""Llama baselines (untied attention with RoPE / ALiBi, SwiGLU), plain layer reuse, blocks."""

import math

import pytest
import torch
import torch.nn.functional as F

from cemlib.kernels.reference import alibi_slopes
from cemlib.layers.blocks import CEMBlock, LlamaBlock
from cemlib.layers.llama import LlamaAttention, SwiGLU, apply_rope, rope_angles
from cemlib.layers.reuse import LayerReuse, ResidualSublayer

B, L, D, K = 2, 6, 16, 4


pytestmark = pytest.mark.usefixtures("float64_seeded")


def manual_attention(m, x):
    """Eq. 1 written out: softmax_j(q_i.k_j / sqrt(D_r) + bias) v_j, summed through W_O^T."""
    R = m.head_dim
    q, k, v = (torch.einsum("krd,bld->bklr", W.view(K, R, D), x) for W in (m.W_Q, m.W_K, m.W_V))
    if m.pos == "rope":
        cos, sin = rope_angles(L, R)
        q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
    s = torch.einsum("bkir,bkjr->bkij", q, k) / math.sqrt(R)
    i = torch.arange(L)
    dist = (i[:, None] - i[None, :]).double()
    if m.pos == "alibi":
        s = s - alibi_slopes(K)[:, None, None] * dist
    s = s.masked_fill(dist < 0, float("-inf"))
    o = torch.einsum("bkij,bkjr->bkir", torch.softmax(s, -1), v)
    return torch.einsum("bkir,krd->bid", o, m.W_O.view(K, R, D))


@pytest.mark.parametrize("pos", ["rope", "alibi", "none"])
def test_attention_matches_manual(pos):
    m = LlamaAttention(D, K, pos=pos, init_std=0.3)
    x = torch.randn(B, L, D)
    with torch.no_grad():
        torch.testing.assert_close(m(x), manual_attention(m, x))


def test_rope_scores_depend_only_on_offset():
    R = 8
    cos, sin = rope_angles(12, R)
    q, k = torch.randn(R), torch.randn(R)
    rq = apply_rope(q.expand(12, R), cos, sin)
    rk = apply_rope(k.expand(12, R), cos, sin)
    torch.testing.assert_close(rq[5] @ rk[2], rq[9] @ rk[6])     # offset 3 at two places
    torch.testing.assert_close(rq[0] @ rk[0], q @ k)


@pytest.mark.parametrize("pos", ["rope", "alibi"])
def test_attention_causality(pos):
    m = LlamaAttention(D, K, pos=pos, init_std=0.3)
    x = torch.randn(B, L, D)
    x2 = x.clone()
    x2[:, 3] += 1.0
    with torch.no_grad():
        torch.testing.assert_close(m(x)[:, :3], m(x2)[:, :3], rtol=0, atol=1e-14)


def test_swiglu_matches_eq6():
    m = SwiGLU(D, 24, init_std=0.3)
    x = torch.randn(B, L, D)
    with torch.no_grad():
        ref = (F.silu(x @ m.W_gate.T) * (x @ m.W_up.T)) @ m.W_down.T
        torch.testing.assert_close(m(x), ref)


def test_plain_reuse_applies_the_residual_sublayer_t_times():
    sub = ResidualSublayer(SwiGLU(D, 24, init_std=0.3), D)
    x = torch.randn(B, L, D)
    with torch.no_grad():
        torch.testing.assert_close(LayerReuse(sub, 3)(x), sub(sub(sub(x))))


def test_reuse_differs_from_cem_recursion():
    """Reuse recomputes keys/values/gamma from the moved stream; CEM recursion keeps them fixed."""
    blk = CEMBlock(D, K, 24, T_attn=2, T_mlp=2)
    with torch.no_grad():
        for p in blk.parameters():
            p.add_(0.3 * torch.randn_like(p))
    one = CEMBlock(D, K, 24)
    one.load_state_dict(blk.state_dict())
    x = torch.randn(B, L, D)
    with torch.no_grad():
        rec = blk.mlp(blk.attn(x))
        reuse = LayerReuse(one.mlp, 2)(LayerReuse(one.attn, 2)(x))
        assert (rec - reuse).abs().max() > 1e-3
        e = blk.energies(x)
        assert set(e) == {"attn", "mlp"} and e["attn"][0].shape == (B, L)


def test_llama_block_shapes_and_reuse():
    blk = LlamaBlock(D, K, 24, pos="alibi", reuse_attn=2)
    assert isinstance(blk.attn, LayerReuse) and blk.attn.T == 2
    assert blk(torch.randn(B, L, D)).shape == (B, L, D)


@pytest.mark.parametrize("kwargs, match", [
    (dict(d_model=D, n_heads=5), "not divisible"),
    (dict(d_model=D, n_heads=K, pos="learned"), "pos must be"),
    (dict(d_model=12, n_heads=4, pos="rope"), "even head_dim"),
])
def test_bad_construction(kwargs, match):
    with pytest.raises(ValueError, match=match):
        LlamaAttention(**kwargs)


def test_bad_input():
    with pytest.raises(ValueError, match="last dimension 16"):
        LlamaAttention(D, K)(torch.randn(B, L, D + 1))
    with pytest.raises(ValueError, match="3 dimensions"):
        LlamaAttention(D, K)(torch.randn(L, D))
    with pytest.raises(ValueError, match="T must be"):
        LayerReuse(SwiGLU(D, 8), 0)
