"""GPT baselines (cemlib.layers.gpt) and the model wrappers (cemlib.models.nrgpt): shapes,
causality, parameter accounting (paper Tables 1, 5), trajectories, gradients, bad input."""

import math

import pytest
import torch
import torch.nn.functional as F

from cemlib.layers.gpt import CausalSelfAttention, ParallelGPTBlock, RecurrentGPT
from cemlib.models.nrgpt import GPTModel, NRGPTModel, RecurrentGPTModel

V, L, D = 11, 12, 16


def _models():
    torch.manual_seed(0)
    return {
        "nrgpt": NRGPTModel(V, L, D, n_heads=2, n_steps=3, ff="ff2w"),
        "nrgpt_ff1_rms_gamma": NRGPTModel(V, L, D, 2, 3, ff="ff1", norm="rmsnorm", rate="gamma"),
        "nrgpt_dam_none_skew": NRGPTModel(V, L, D, 1, 2, ff="dam", act="relu", norm="none",
                                          rate="psd_skew", mask="inclusive"),
        "recgpt": RecurrentGPTModel(V, L, D, n_heads=2, n_steps=3),
        "gpt": GPTModel(V, L, D, n_heads=2, n_layers=2),
    }


def _idx(B=3, T=L, seed=0):
    return torch.randint(0, V, (B, T), generator=torch.Generator().manual_seed(seed))


@pytest.mark.parametrize("name", list(_models()))
def test_forward_shape_causality_and_gradients(name):
    model = _models()[name].eval()
    idx = _idx()
    logits = model(idx)
    assert logits.shape == (3, L, V) and torch.isfinite(logits).all()
    idx2 = idx.clone()
    idx2[:, 7:] = (idx2[:, 7:] + 1) % V
    with torch.no_grad():
        torch.testing.assert_close(model(idx2)[:, :7], logits[:, :7].detach(), rtol=1e-5, atol=1e-6)
        assert not torch.allclose(model(idx2)[:, 7:], logits[:, 7:])
    assert model(idx[:, :5]).shape == (3, 5, V)
    # training through the closed-form forward reaches every parameter (no double backward needed)
    F.cross_entropy(logits.reshape(-1, V), idx.reshape(-1)).backward()
    missing = [n for n, p in model.named_parameters() if p.grad is None or not torch.isfinite(p.grad).all()]
    assert not missing, missing


def test_num_parameters_and_nrgpt_growth_with_heads():
    models = _models()
    for m in models.values():
        assert m.num_parameters() == sum(p.numel() for p in m.parameters())
        assert m.num_parameters(non_embedding=True) == m.num_parameters() - (V + L) * D
    n1 = NRGPTModel(V, L, D, n_heads=1).num_parameters()
    n4 = NRGPTModel(V, L, D, n_heads=4).num_parameters()
    assert n4 - n1 == 3 * (D * D + 1)  # one full D x D J_h and one alpha_h per extra head (App. D)
    g1, g4 = (GPTModel(V, L, D, n_heads=h).num_parameters() for h in (1, 4))
    assert g1 == g4
    r2, r8 = (RecurrentGPTModel(V, L, D, n_steps=s).num_parameters() for s in (2, 8))
    assert r2 == r8  # steps share weights
    tied = NRGPTModel(V, L, D, tie_embeddings=True).num_parameters()
    assert n1 - tied == V * D


def test_paper_parameter_counts_tables_1_and_5():
    """Untied heads reproduce Table 1's 85M / 90M at width 768; tied embeddings Table 5's counts."""
    with torch.device("meta"):
        kw = dict(vocab_size=50257, block_size=1024)
        counts = {
            "nrgpt_768": NRGPTModel(d_model=768, n_heads=12, ff="ff2w", **kw).num_parameters(),
            "recpar_768": RecurrentGPTModel(d_model=768, n_heads=12, **kw).num_parameters(),
            "gpt_768_tied": GPTModel(d_model=768, n_heads=12, n_layers=12, tie_embeddings=True,
                                     **kw).num_parameters(),
            "nrgpt_1536_tied": NRGPTModel(d_model=1536, n_heads=12, ff="ff2w", tie_embeddings=True,
                                          **kw).num_parameters(),
            "recpar_1740_tied": RecurrentGPTModel(d_model=1740, n_heads=12, tie_embeddings=True,
                                                  **kw).num_parameters(),
        }
    rounded = {k: round(v / 1e6) for k, v in counts.items()}
    assert rounded == {"nrgpt_768": 90, "recpar_768": 85, "gpt_768_tied": 124,
                       "nrgpt_1536_tied": 128, "recpar_1740_tied": 126}


def test_energy_trajectory():
    model = _models()["nrgpt"]
    idx = _idx(B=2)
    E = model.energy_trajectory(idx)
    assert E.shape == (4, 2, L)
    E10 = model.energy_trajectory(idx, n_steps=10)
    assert E10.shape == (11, 2, L)
    torch.testing.assert_close(E10[:4], E)
    with torch.no_grad():
        torch.testing.assert_close(E[0], model.block.energy(model.embed(idx)))


def test_recurrent_gpt_is_one_parallel_block_applied_n_times():
    torch.manual_seed(0)
    rec = RecurrentGPT(D, 2, n_steps=3)
    x = torch.randn(2, L, D)
    y = x
    for _ in range(3):
        y = rec.block(y)
    torch.testing.assert_close(rec(x), y)
    blk = rec.block
    g = blk.ln(x)
    torch.testing.assert_close(blk(x), x + blk.attn(g) + blk.mlp(g))


def test_causal_self_attention_matches_naive():
    torch.manual_seed(0)
    att = CausalSelfAttention(D, 4).double()
    x = torch.randn(2, L, D, dtype=torch.float64)
    q, k, v = att.qkv(x).split(D, -1)
    heads = lambda t: t.view(2, L, 4, D // 4).transpose(1, 2)  # noqa: E731
    q, k, v = heads(q), heads(k), heads(v)
    s = q @ k.transpose(-1, -2) / math.sqrt(D // 4)
    s = s.masked_fill(torch.ones(L, L, dtype=torch.bool).triu(1), float("-inf"))
    o = (s.softmax(-1) @ v).transpose(1, 2).reshape(2, L, D)
    torch.testing.assert_close(att(x), att.proj(o))


def test_bad_input():
    model = _models()["nrgpt"]
    with pytest.raises(TypeError, match="LongTensor"):
        model(torch.zeros(2, 3))
    with pytest.raises(ValueError, match=r"shape \(B, L\)"):
        model(torch.zeros(5, dtype=torch.long))
    with pytest.raises(ValueError, match="block_size=12"):
        model(torch.zeros(1, L + 1, dtype=torch.long))
    with pytest.raises(ValueError, match=r"token ids must lie in \[0, 11\)"):
        model(torch.full((1, 3), V, dtype=torch.long))
    with pytest.raises(ValueError, match="n_steps"):
        NRGPTModel(V, L, D, n_steps=0)
    with pytest.raises(ValueError, match="n_layers"):
        GPTModel(V, L, D, n_layers=0)
    with pytest.raises(ValueError, match="divisible"):
        ParallelGPTBlock(D, 3)
    with pytest.raises(ValueError, match="tie_embeddings"):
        RecurrentGPTModel(V, L, D, n_outputs=3, tie_embeddings=True)
    with pytest.raises(ValueError, match="rate must be"):
        NRGPTModel(V, L, D, rate="unit")
