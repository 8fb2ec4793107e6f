"""cemlib.models.probes.energy_along_depth: each record is the step's own energy at its input and
output, checked against the models' own energy methods and, for CEM, against a descent that a
wrong sign or a wrong context would break."""

import pytest
import torch

from cemlib.layers.blocks import CEMBlock
from cemlib.models import GPTModel, HyperSETModel, LanguageModel, LMConfig, NewtonTransformer, NRGPTModel
from cemlib.models.probes import DepthEnergies, energy_along_depth

V, L, B = 11, 7, 3


@pytest.fixture
def idx():
    return torch.randint(0, V, (B, L), generator=torch.Generator().manual_seed(0))


def _cem(n_layers=2, **kw):
    torch.manual_seed(0)
    cfg = LMConfig(vocab_size=V, context_length=L, d_model=16, n_layers=n_layers, n_heads=2,
                   attn="cem", mlp="cem", **kw)
    return LanguageModel(cfg).double()


def test_cem_records_are_the_block_energies(idx):
    model = _cem()
    rec = energy_along_depth(model, idx)
    assert rec.labels == ("layer 1 attention", "layer 1 MLP", "layer 2 attention", "layer 2 MLP")
    assert not rec.one_energy and rec.before.shape == (4, B, L)
    x = model.tok_emb(idx)
    for i, block in enumerate(model.blocks):
        e = CEMBlock.energies(block, x)          # the block's own report (CEM Algorithm 1)
        for j, name in enumerate(("attn", "mlp")):
            torch.testing.assert_close(rec.before[2 * i + j], e[name][0], rtol=1e-12, atol=1e-12)
            torch.testing.assert_close(rec.after[2 * i + j], e[name][1], rtol=1e-12, atol=1e-12)
        x = block(x)
    with pytest.raises(ValueError, match="no single trajectory"):
        rec.trajectory()


def test_cem_small_steps_descend_and_ascend_when_reversed(idx):
    """A gradient step with a small rate descends every token's energy; the reversed step (the
    same update subtracted) ascends: a record with a wrong sign or context would not show both."""
    model = _cem(n_layers=1, eta_attn=0.05, eta_mlp=0.05)
    rec = energy_along_depth(model, idx)
    assert (rec.change < 0).all()
    for layer in (model.blocks[0].attn, model.blocks[0].mlp):
        layer.eta = -layer.eta
    assert (energy_along_depth(model, idx).change[0] > 0).all()


def test_cem_reuse_and_llama_sublayers(idx):
    rec = energy_along_depth(_cem(n_layers=1, reuse_attn=2), idx)
    assert rec.labels == ("layer 1 attention (use 1)", "layer 1 attention (use 2)", "layer 1 MLP")
    mixed = LanguageModel(LMConfig(vocab_size=V, context_length=L, d_model=16, n_layers=2, n_heads=2,
                                   attn="llama", mlp="cem")).double()
    assert energy_along_depth(mixed, idx).labels == ("layer 1 MLP", "layer 2 MLP")
    llama = LanguageModel(LMConfig(vocab_size=V, context_length=L, d_model=16, n_layers=1, n_heads=2))
    with pytest.raises(ValueError, match="no CEM sublayer"):
        energy_along_depth(llama, idx)


def test_nrgpt_is_one_trajectory(idx):
    torch.manual_seed(0)
    model = NRGPTModel(V, L, 16, 2, n_steps=3).double()
    rec = energy_along_depth(model, idx)
    assert rec.one_energy and rec.labels == ("step 1", "step 2", "step 3")
    torch.testing.assert_close(rec.trajectory(), model.eval().energy_trajectory(idx), rtol=0, atol=0)
    assert energy_along_depth(model, idx, n_steps=7).trajectory().shape == (8, B, L)


def test_newton_uses_the_causal_mask_and_the_models_update(idx):
    torch.manual_seed(0)
    model = NewtonTransformer(V, L, d_model=16, n_layers=2, n_heads=2, attn="mha2nd1st").double()
    rec = energy_along_depth(model, idx)
    assert rec.labels == ("layer 1 attention", "layer 2 attention")
    blk = model.blocks[0]
    g = blk.ln1(model.emb(idx) + model.pos[:L].double())
    att = blk.attn
    with torch.no_grad():
        z1 = att(g, g.unsqueeze(1), torch.ones(L, L, dtype=torch.bool).tril())   # the layer's own step
        for i in range(L):                    # token i sees the prefix 0..i only, no mask needed
            prefix = g[:, : i + 1].unsqueeze(1)
            torch.testing.assert_close(rec.before[0][:, i], att.energy(g[:, i:i + 1], prefix)[:, 0])
            torch.testing.assert_close(rec.after[0][:, i], att.energy(z1[:, i:i + 1], prefix)[:, 0])
    # with the output matrices tied to the theoretical step (a small rate) every token descends;
    # the reversed step ascends
    for eta, sign in ((0.1, -1), (-0.1, 1)):
        with torch.no_grad():
            for b in model.blocks:
                b.attn.W_O.copy_(b.attn.tied_output(eta))
        assert (sign * energy_along_depth(model, idx).change > 0).all()
    with pytest.raises(ValueError, match="attn='mha'"):
        energy_along_depth(NewtonTransformer(V, L, 16, 1, 2, attn="mha"), idx)


def test_hyperset_matches_its_trajectory(idx):
    torch.manual_seed(0)
    model = HyperSETModel(d=16, n_heads=2, n_iter=3, n_classes=V, n_positions=L, vocab_size=V).double()
    with torch.no_grad():                      # learned step sizes start at zero: move them
        for p in model.layer.step_net.parameters():
            p.add_(0.1 * torch.randn_like(p))
    rec = energy_along_depth(model, idx)
    traj = model.trajectory(idx)
    torch.testing.assert_close(rec.trajectory().sum(-1), traj["attention_energy"] + traj["ff_energy"])
    assert rec.change.abs().max() > 0
    assert energy_along_depth(model, idx, n_steps=6).trajectory().shape == (7, B, L)


def test_misuse(idx):
    with pytest.raises(TypeError, match="must be one of"):
        energy_along_depth(GPTModel(V, L, 16, 2, 1), idx)
    model = _cem(n_layers=1)
    with pytest.raises(ValueError, match="n_steps applies"):
        energy_along_depth(model, idx, n_steps=3)
    with pytest.raises(ValueError, match="n_steps"):
        energy_along_depth(NRGPTModel(V, L, 16, 2, n_steps=3), idx, n_steps=0)
    model.train()
    energy_along_depth(model, idx)
    assert model.training                       # the mode is restored
    assert isinstance(energy_along_depth(model, idx), DepthEnergies)
