"""Language models: the four families, causality, Table 1 parameter counts on the meta device,
the "half the attention, two-thirds of the MLP" claim, FLOP counting, and bad input."""

import pytest
import torch

from cemlib.models.lm import LanguageModel, LMConfig, default_d_ff
from cemlib.models.params import (TABLE1, count_parameters, flops_per_token, meta_model,
                                  parameter_breakdown, sublayer_ratios, table1_config,
                                  table1_report)

FAMILIES = [("llama", "llama"), ("cem", "llama"), ("llama", "cem"), ("cem", "cem")]


def small(**kw):
    base = dict(vocab_size=50, context_length=16, d_model=32, n_layers=2, n_heads=4)
    base.update(kw)
    return LMConfig(**base)


@pytest.mark.parametrize("attn, mlp", FAMILIES)
def test_forward_backward_and_causality(attn, mlp):
    torch.manual_seed(0)
    cfg = small(attn=attn, mlp=mlp, T_attn=2 if attn == "cem" else 1,
                T_mlp=2 if mlp == "cem" else 1, precond_attn="dplr", precond_mlp="dplr")
    model = LanguageModel(cfg)
    idx = torch.randint(0, 50, (2, 12))
    logits = model(idx)
    assert logits.shape == (2, 12, 50) and model.config is cfg
    logits.logsumexp(-1).mean().backward()
    assert all(torch.isfinite(p.grad).all() for p in model.parameters() if p.grad is not None)
    idx2 = idx.clone()
    idx2[:, 7] = (idx2[:, 7] + 1) % 50
    with torch.no_grad():
        diff = (model(idx2) - model(idx)).abs().amax((0, 2))
    assert (diff[:7] < 1e-5).all() and diff[7] > 0


def test_tied_embeddings_and_num_parameters():
    untied, tied = LanguageModel(small()), LanguageModel(small(tie_embeddings=True))
    assert untied.num_parameters() - tied.num_parameters() == 50 * 32
    assert tied.head_weight is tied.tok_emb.weight
    assert untied.num_parameters(exclude_embeddings=True) == tied.num_parameters(exclude_embeddings=True)
    assert untied.num_parameters(True) == untied.num_parameters() - 2 * 50 * 32


@pytest.mark.parametrize("name", list(TABLE1))
def test_table1_llama_sizes(name):
    """Table 1 labels truncate to 1M: nominal <= count < nominal + 1M (162.81M is labelled 162M)."""
    d, n_layers, _, d_ff, nominal = TABLE1[name]
    n = count_parameters(table1_config(name))
    assert nominal <= n < nominal + 1_000_000
    V = 32_000
    assert n == 2 * V * d + n_layers * (4 * d * d + 3 * d * d_ff + 2 * d) + d   # CEM Table 1 counting
    assert next(meta_model(table1_config(name)).parameters()).is_meta


def test_table1_cem_variants_follow_the_closed_form():
    """Attention 4 D^2 -> 2 D^2 + D (shared diagonal); MLP 3 D D_m -> 2 D D_m; DPLR preconditioners
    add K D (1 + 2 R_att) + D (1 + 2 R_mlp) per layer (CEM eqs. 5, 11, 13)."""
    expected_millions = {"86M": (79.15, 76.74, 69.52, 70.08), "108M": (97.22, 93.60, 82.77, 83.91),
                         "134M": (119.96, 115.23, 101.08, 102.38),
                         "162M": (144.91, 138.93, 121.02, 122.48)}      # our counts, Table 1 configs
    for row in table1_report():
        d, n_layers, K, d_ff, _ = TABLE1[row["model"]]
        dattn = n_layers * (2 * d * d - d)
        dmlp = n_layers * d * d_ff
        assert row["cem_attn"] == row["llama"] - dattn
        assert row["cem_mlp"] == row["llama"] - dmlp
        assert row["cem_full"] == row["llama"] - dattn - dmlp
        assert row["cem_full_dplr"] == row["cem_full"] + n_layers * (K * d * 9 + d * 33)
        got = tuple(round(row[k] / 1e6, 2) for k in ("cem_attn", "cem_mlp", "cem_full", "cem_full_dplr"))
        assert got == expected_millions[row["model"]]


@pytest.mark.parametrize("name", list(TABLE1))
def test_half_attention_two_thirds_mlp(name):
    r = sublayer_ratios(name)
    assert abs(r["attention"] - 0.5) < 1e-3
    assert r["mlp"] == pytest.approx(2 / 3, abs=1e-12)
    matched = parameter_breakdown(meta_model(table1_config(name, mlp="cem", d_v=3 * TABLE1[name][3] // 2)))
    llama = parameter_breakdown(meta_model(table1_config(name)))
    assert matched["mlp"] == llama["mlp"]        # parameter-matched D_v = 1.5 D_m


def test_flops_per_token():
    cfg = small(context_length=64)
    D, L, V, n, F = 32, 64, 50, 2, default_d_ff(32)
    assert flops_per_token(cfg) == n * (8 * D * D + 4 * L * D + 6 * D * F) + 2 * D * V
    # CEM MLP: affine in T, each extra step costs 2/3 of the gated MLP's matmuls (CEM Table 3 FLOPs)
    f = [flops_per_token(small(context_length=64, mlp="cem", T_mlp=T)) for T in (1, 2, 4)]
    assert f[0] == flops_per_token(cfg) and f[1] - f[0] == n * 4 * D * F and f[2] - f[1] == 2 * (f[1] - f[0])
    # CEM attention at T=1, no diagonal: one projection fewer than untied attention (V = K)
    fa = [flops_per_token(small(context_length=64, attn="cem", diag="none", T_attn=T)) for T in (1, 2)]
    assert fa[0] == flops_per_token(cfg) - n * 2 * D * D
    assert fa[1] - fa[0] == n * (4 * D * D + 4 * L * D)     # W_Q u, W_Q^T o, scores, values
    assert flops_per_token(small(context_length=64, reuse_mlp=2)) == f[0] + n * 6 * D * F


@pytest.mark.parametrize("kwargs", [
    dict(), dict(attn="cem", mlp="cem"), dict(attn="cem", mlp="cem", diag="per_head"),
    dict(attn="cem", mlp="cem", diag="none"), dict(attn="cem", mlp="cem", diag_grad="paper"),
    dict(attn="cem", mlp="cem", T_attn=3, T_mlp=2),
    dict(attn="cem", mlp="cem", precond_attn="dplr", precond_mlp="dplr", T_attn=2, T_mlp=2),
    dict(attn="cem", reuse_attn=2), dict(mlp="cem", reuse_mlp=2)])
def test_flops_per_token_equals_the_counted_matmuls(kwargs):
    """The formula against PyTorch's count of every matrix product of one forward pass (at the full
    context, as the formula assumes); the shared diagonal's value path is computed once for the head
    sum when there is no preconditioner, and counted so."""
    from cemlib.kernels.costs import count_flops
    cfg = small(context_length=16, n_heads=4, **kwargs)
    model = LanguageModel(cfg)
    idx = torch.zeros(2, 16, dtype=torch.long)
    assert flops_per_token(cfg) == count_flops(lambda: model(idx)) / idx.numel()


def test_config_roundtrip_and_defaults():
    cfg = small(attn="cem", mlp="cem", T_attn=2)
    assert LMConfig.from_dict(cfg.to_dict()) == cfg
    assert cfg.d_ff == default_d_ff(32) and cfg.d_v == cfg.d_ff
    assert [default_d_ff(d) for d in (672, 768, 864)] == [1792, 2048, 2304]


@pytest.mark.parametrize("kwargs, match", [
    (dict(attn="mamba"), "attn must be"), (dict(mlp="moe"), "mlp must be"),
    (dict(T_attn=2), "needs attn='cem'"), (dict(T_mlp=0), "T_mlp must be"),
    (dict(n_heads=5), "not divisible"), (dict(tau="x"), "tau"), (dict(n_layers=0), "n_layers"),
])
def test_bad_config(kwargs, match):
    with pytest.raises(ValueError, match=match):
        small(**kwargs)


def test_bad_idx():
    model = LanguageModel(small())
    with pytest.raises(TypeError, match="integer tensor"):
        model(torch.zeros(2, 4))
    with pytest.raises(ValueError, match=r"\(B, L\)"):
        model(torch.zeros(4, dtype=torch.long))
    with pytest.raises(ValueError, match="exceeds context_length 16"):
        model(torch.zeros(1, 17, dtype=torch.long))
    with pytest.raises(ValueError, match=r"\[0, 50\)"):
        model(torch.full((1, 4), 50))
    with pytest.raises(TypeError, match="LMConfig"):
        LanguageModel({"vocab_size": 3})


@pytest.mark.parametrize("attn, mlp", [("llama", "llama"), ("cem", "cem")])
def test_dropout_is_identity_in_eval_mode(attn, mlp):
    torch.manual_seed(0)
    plain = LanguageModel(small(attn=attn, mlp=mlp))
    dropped = LanguageModel(small(attn=attn, mlp=mlp, dropout=0.3))
    dropped.load_state_dict(_remap(plain, dropped))
    idx = torch.randint(0, 50, (2, 10))
    dropped.eval()
    with torch.no_grad():
        torch.testing.assert_close(dropped(idx), plain(idx))
        dropped.train()
        assert (dropped(idx) - plain(idx)).abs().max() > 1e-4
    with pytest.raises(ValueError, match="dropout"):
        small(dropout=1.0)


def _remap(src, dst):
    """Copy parameters in order (the CEM layers sit one module deeper under IncrementDropout)."""
    keys = list(dst.state_dict())
    vals = list(src.state_dict().values())
    assert len(keys) == len(vals)
    return dict(zip(keys, vals))
