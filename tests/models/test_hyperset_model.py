"""The recurrent-depth Hyper-SET model wrapper (Sudoku tokens and image patches)."""

import pytest
import torch

from cemlib.models.hyperset import HyperSETModel

pytestmark = pytest.mark.usefixtures("float64")


def _sudoku(**kw):
    torch.manual_seed(0)
    cfg = dict(d=16, n_heads=2, n_iter=3, n_classes=10, n_positions=81, vocab_size=10, ff_dim=32,
               freq_dim=8)
    cfg.update(kw)
    return HyperSETModel(**cfg)


def _boards(B=2):
    return torch.randint(0, 10, (B, 81), generator=torch.Generator().manual_seed(1))


def _perturb_step_net(model, std=0.05):
    with torch.no_grad():
        torch.nn.init.normal_(model.layer.step_net.out.weight, std=std)


def test_sudoku_per_cell_logits_and_identity_at_init():
    model = _sudoku()
    x = _boards()
    assert model(x).shape == (2, 81, 10)
    tr = model.trajectory(x)
    assert tr["states"].shape == (4, 2, 81, 16)
    # zero-initialised step sizes: every iteration is the identity, energies are constant
    torch.testing.assert_close(tr["states"][3], tr["states"][0])
    torch.testing.assert_close(tr["attention_energy"][3], tr["attention_energy"][0])
    torch.testing.assert_close(tr["logits"], model(x))


def test_trajectory_records_each_iteration_and_matches_forward():
    model = _sudoku()
    _perturb_step_net(model)
    x = _boards()
    tr = model.trajectory(x, n_iter=5)   # test-time extrapolation beyond n_iter=3
    assert tr["states"].shape[0] == 6
    assert (tr["states"][1] - tr["states"][0]).abs().max() > 0
    with torch.no_grad():
        torch.testing.assert_close(tr["logits"], model(x, n_iter=5))
        X2 = tr["states"][2]
        ea, ef = model.layer.energies(X2, 2)
    torch.testing.assert_close(tr["attention_energy"][2], ea.sum(-1))
    torch.testing.assert_close(tr["ff_energy"][2], ef.sum(-1))


@pytest.mark.parametrize("pool", ["mean", "cls"])
def test_patch_classifier(pool):
    torch.manual_seed(0)
    model = HyperSETModel(d=16, n_heads=4, n_iter=2, n_classes=10, n_positions=16, patch_dim=4,
                          pool=pool, positional="sinusoidal", condition="xt", freq_dim=8)
    x = torch.randn(3, 16, 4)
    assert model(x).shape == (3, 10)
    _perturb_step_net(model)
    model(x).sum().backward()
    assert all(p.grad is not None for p in model.parameters() if p.requires_grad)
    if pool == "cls":
        assert model.trajectory(x)["states"].shape == (3, 3, 17, 16)


def test_num_parameters_counts_each_part():
    d, M, f = 16, 32, 8
    model = _sudoku(d=d, ff_dim=M, freq_dim=f)
    step_net = f * d + d + d * d + d + d * 2 * d + 2 * d
    expected = 10 * d + 81 * d + d * d + d * M + step_net + 2 * d + d * 10 + 10
    assert model.num_parameters() == expected
    fixed = _sudoku(d=d, ff_dim=M, freq_dim=f, step_size=0.1)
    assert model.num_parameters() - fixed.num_parameters() == step_net
    lora = _sudoku(d=d, ff_dim=d, lora_rank=2)
    assert lora.num_parameters() - _sudoku(d=d, ff_dim=d).num_parameters() == 4 * d * 2 * 3


def test_variants_build_and_run():
    x = _boards()
    for attention in ("sigmoid", "linear"):
        for feedforward in ("softmax", "gated"):
            m = _sudoku(attention=attention, feedforward=feedforward, step_size=0.1)
            out = m(x)
            assert out.shape == (2, 81, 10) and torch.isfinite(out).all()


def test_lora_fixes_the_depth():
    m = _sudoku(ff_dim=16, lora_rank=2)
    with pytest.raises(ValueError, match="iterations 0..2"):
        m(_boards(), n_iter=4)


def test_bad_input():
    m = _sudoku()
    with pytest.raises(ValueError, match="token ids"):
        m(torch.full((1, 81), 10))
    with pytest.raises(ValueError, match="expected 81 tokens"):
        m(torch.zeros(1, 80, dtype=torch.long))
    with pytest.raises(ValueError, match="integer tensor"):
        m(torch.zeros(1, 81))
    with pytest.raises(ValueError, match="n_iter"):
        m(_boards(), n_iter=0)
    with pytest.raises(ValueError, match="exactly one"):
        HyperSETModel(d=8, n_heads=2, n_iter=1, n_classes=2, n_positions=4)
    with pytest.raises(ValueError, match="pool"):
        _sudoku(pool="max")
    with pytest.raises(ValueError, match="unknown attention"):
        _sudoku(attention="cosine")
    with pytest.raises(ValueError, match="last dimension 4"):
        HyperSETModel(d=8, n_heads=2, n_iter=1, n_classes=2, n_positions=4,
                      patch_dim=4)(torch.randn(1, 4, 3))
