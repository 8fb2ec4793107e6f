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


# ------------------------------------------------------------------------------ direction and overshoot
def _central_difference(energy, x0, dx, eps=1e-6):
    return (energy(x0 + eps * dx) - energy(x0 - eps * dx)) / (2 * eps)


def test_first_order_is_the_directional_derivative_of_each_steps_energy(idx):
    """For every model kind the first-order record equals a float64 central difference of the
    step's energy along the step (a wrong sign, state or context would not), and the step ratio is
    |dx| / |x|."""
    torch.manual_seed(0)
    nr = NRGPTModel(V, L, 16, 2, n_steps=2).double().eval()
    rec = energy_along_depth(nr, idx)
    x0 = nr.embed(idx)
    with torch.no_grad():
        x1 = nr.block(x0)
        fd = _central_difference(nr.block.energy, x0, x1 - x0)
    torch.testing.assert_close(rec.first_order[0], fd, rtol=1e-6, atol=1e-8)
    torch.testing.assert_close(rec.step_ratio[0], (x1 - x0).norm(dim=-1) / x0.norm(dim=-1))
    hs = HyperSETModel(d=16, n_heads=2, n_iter=2, n_classes=V, n_positions=L, vocab_size=V).double().eval()
    with torch.no_grad():
        for p in hs.layer.step_net.parameters():
            p.add_(0.1 * torch.randn_like(p))
        X0 = hs.embed_inputs(idx)
        X1 = hs.layer(X0, 0, X0)
        fd = _central_difference(lambda s: sum(hs.layer.energies(s, 0)), X0, X1 - X0)
    torch.testing.assert_close(energy_along_depth(hs, idx).first_order[0], fd, rtol=1e-6, atol=1e-8)
    # a gradient step: the first-order change is -eta |grad E|^2 exactly
    model = _cem(n_layers=1, eta_attn=0.3, eta_mlp=0.3)
    rec = energy_along_depth(model, idx)
    x = model.tok_emb(idx)
    att = model.blocks[0].attn
    assert att.diag_grad == "exact"
    with torch.no_grad():
        g = att.energy_grad(x, x)
    # with query RMSNorm the update drops the Jacobian, so it is not -eta grad: compare with <grad, dx>
    torch.testing.assert_close(rec.first_order[0], (g * (att(x) - x)).sum(-1), rtol=1e-9, atol=1e-12)


def test_newton_direction_and_overshoot_are_told_apart(idx):
    """Tied output matrices make MHA2nd1st a descent direction at every step size: small steps
    descend; a step a thousand times longer still points downhill but overshoots. The record says
    which: the direction table puts the tokens in the overshoot cell, not in the uphill one."""
    torch.manual_seed(0)
    model = NewtonTransformer(V, L, d_model=16, n_layers=1, n_heads=2, attn="mha2nd1st").double()
    blk = model.blocks[0]
    with torch.no_grad():
        blk.attn.W_O.copy_(blk.attn.tied_output(0.1))
    small = energy_along_depth(model, idx)
    assert (small.first_order < 0).all() and (small.change < 0).all()
    assert small.direction_table(0)["downhill_descends"] == 1.0
    with torch.no_grad():
        blk.attn.W_O.copy_(blk.attn.tied_output(300.0))
    big = energy_along_depth(model, idx)
    table = big.direction_table(0)
    assert (big.first_order < 0).all()                                # still downhill
    assert table["downhill_overshoots"] > 0.5 and table["uphill_rises"] == 0.0
    assert abs(sum(table.values()) - 1.0) < 1e-12
    assert big.step_ratio.min() > 10 * small.step_ratio.max()
    with torch.no_grad():
        blk.attn.W_O.copy_(blk.attn.tied_output(-0.1))             # the reversed step: uphill
    rev = energy_along_depth(model, idx)
    assert (rev.first_order > 0).all() and rev.direction_table(0)["uphill_rises"] == 1.0


# ------------------------------------------------------------------------------ within one layer
def test_recursion_descent_theorem_needs_the_exact_gradient():
    """Chapter 4's theorem: attention with query RMSNorm, a uniform gain and the exact gradient
    lowers its energy at every step of T = 20 for every step size. Algorithm 1 as printed
    (diag_grad="paper") with a nonzero diagonal raises some tokens' energy."""
    from cemlib.layers.cem_attention import CEMAttention
    from cemlib.models.probes import energy_along_recursion
    h = torch.randn(4, 8, 16, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    shares = {}
    for grad in ("exact", "paper"):
        torch.manual_seed(0)
        att = CEMAttention(16, 4, 4, T=20, init_std=0.4, diag_grad=grad).double()
        with torch.no_grad():
            att.d.normal_(0.0, 1.0, generator=torch.Generator().manual_seed(1))
            att.self_bias.normal_(0.0, 1.0, generator=torch.Generator().manual_seed(2))
        for eta in (0.1, 2.0, 8.0):
            rec = energy_along_recursion(att, h, eta)
            assert rec.energies.shape == (21, 4, 8) and rec.eta == eta
            shares[grad, eta] = rec.share_rising
        assert att.eta == 1.0                                         # the layer is left as it was
    assert all(shares["exact", eta] == 0.0 for eta in (0.1, 2.0, 8.0))
    assert all(shares["paper", eta] > 0.1 for eta in (0.1, 2.0, 8.0))
    with pytest.raises(TypeError):
        energy_along_recursion(torch.nn.Linear(2, 2), h)
