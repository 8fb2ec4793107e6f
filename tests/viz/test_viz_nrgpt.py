"""Tests of the NRGPT token-energy trajectories, their small multiples and the live explorer (Agg)."""

import matplotlib

matplotlib.use("Agg")

import pytest  # noqa: E402
import torch  # noqa: E402

from cemlib.viz import nrgpt as V  # noqa: E402

f64 = torch.float64


def test_random_block_is_seeded_and_sets_the_gain():
    b1, x1 = V.random_block(d_model=8, n_tokens=4, gamma_spread=1.0, seed=3)
    b2, x2 = V.random_block(d_model=8, n_tokens=4, gamma_spread=1.0, seed=3)
    assert x1.shape == (1, 4, 8) and x1.dtype == f64
    torch.testing.assert_close(x1, x2)
    torch.testing.assert_close(b1.J, b2.J)
    assert not torch.allclose(b1.gain, torch.ones(8, dtype=f64))
    b0, _ = V.random_block(d_model=8, n_tokens=4, gamma_spread=0.0, seed=3)
    torch.testing.assert_close(b0.gain, torch.ones(8, dtype=f64))
    with pytest.raises(ValueError):
        V.random_block(gamma_spread=-1.0)


def test_trajectories_match_the_block_run_with_the_chosen_rate():
    b, x0 = V.random_block(d_model=8, n_tokens=5, gamma_spread=0.7, seed=1)
    E = V.token_energy_trajectories(b, x0, 0.2, 6, "gamma")
    assert E.shape == (7, 5)
    torch.testing.assert_close(b.eta, 0.2 * torch.diag(b.gain))
    x = x0
    with torch.no_grad():
        for t in range(6):
            torch.testing.assert_close(E[t], b.energy(x)[0])
            x = x - b.grad_g(b.normalize(x)) @ (0.2 * torch.diag(b.gain)).T
    V.token_energy_trajectories(b, x0, 0.2, 2, "identity")
    torch.testing.assert_close(b.eta, 0.2 * torch.eye(8, dtype=f64))
    with pytest.raises(ValueError):
        V.token_energy_trajectories(b, x0, 0.2, 2, "other")
    with pytest.raises(ValueError):
        V.token_energy_trajectories(b, x0, -1.0, 2)


def test_count_rises():
    E = torch.tensor([[0.0, 1.0], [-1.0, 2.0], [-1.0, 1.5]], dtype=f64)
    r = V.count_rises(E)
    assert r.tolist() == [[False, True], [False, False]]


def test_small_multiples_panels_and_counts():
    fig, rises = V.token_energy_small_multiples([0.01, 1.0], gamma_spread=0.0, steps=5, d_model=8, n_tokens=4)
    panels = [ax for ax in fig.axes if ax.get_visible()]
    assert len(panels) == 4
    assert set(rises) == {"gamma", "identity"}
    # with a uniform gain the two rates are the same matrix, so the counts agree
    assert rises["gamma"] == rises["identity"]
    assert all(len(ax.lines) >= 4 for ax in panels)
    assert "step" in panels[-1].get_xlabel()


def test_explorer_reacts_to_sliders():
    pytest.importorskip("ipywidgets")
    w = V.token_energy_explorer(c=0.05, gamma_spread=0.0, steps=5, d_model=8, n_tokens=4)
    png0 = w.image.value
    assert png0[:4] == b"\x89PNG" and "rose" in w.info.value
    assert repr(w) == "TokenEnergyExplorer(c=0.05, spread=0, steps=5, rate='gamma')"
    w.spread.value = 1.5
    w.rate.value = "identity"
    assert w.image.value != png0
    with pytest.raises(ValueError):
        V.token_energy_explorer(rate="bad")


def test_first_token_rises_counts_and_restores_the_step_size():
    from cemlib.layers.nrgpt import NRGPTBlock
    torch.manual_seed(0)
    b = NRGPTBlock(8, 1, ff="ff2w", rate="gamma", rate_scale=0.05, learn_gain=False, init_std=0.5).double()
    x = torch.randn(6, 4, 8, generator=torch.Generator().manual_seed(2), dtype=f64)
    c0 = b.log_c.detach().clone()
    first, every = V.first_token_rises(b, x, [0.01, 100.0], steps=10)
    torch.testing.assert_close(b.log_c.detach(), c0)
    assert first[0] == 0.0 and every[0] < every[1]                 # small steps: the first token descends
    assert first[1] > 0                                             # a huge step overshoots
    # the fractions agree with a direct count at one step size
    with torch.no_grad():
        b.log_c.fill_(torch.log(torch.tensor(100.0, dtype=f64)).item())
        _, E = b.run(x, 10, return_energies=True)
        b.log_c.copy_(c0)
    r = V.count_rises(E.flatten(1)).view(10, 6, 4)
    assert first[1] == r[..., 0].any(0).double().mean().item() and every[1] == r.double().mean().item()
    with pytest.raises(ValueError):
        V.first_token_rises(b, x, [-1.0], steps=2)
    with pytest.raises(ValueError):
        V.first_token_rises(NRGPTBlock(8, 1, rate="matrix"), x.float(), [0.1], steps=2)


def test_relaxation_figures_have_their_panels():
    T, N, D = 6, 5, 4
    E = torch.linspace(0, -1, T + 1, dtype=f64)[:, None].repeat(1, N)
    E[3, 2] = 1.0                                                   # one rise, marked in red
    X = torch.randn(T + 1, N, D, generator=torch.Generator().manual_seed(0), dtype=f64)
    fig = V.plot_relaxation(E, X / X.norm(dim=-1, keepdim=True), X)
    panels = fig.axes[:3]
    assert [len(ax.lines) for ax in panels] == [N + 1, N, N]
    assert "step" in panels[0].get_xlabel() and "x" in panels[2].get_ylabel()
    with pytest.raises(ValueError):
        V.plot_relaxation(E[:-1], X, X)
    fig2 = V.plot_trained_relaxation(E, n_tokens=3, trained_steps=2)
    assert len(fig2.axes) == 2 and len(fig2.axes[0].lines) == 3 + 1
    import numpy as np
    import matplotlib.pyplot as plt
    fig3, ax = plt.subplots()
    curves = {"a": np.array([[8, 1e3, 0.3, 0.01], [16, 3e3, 0.4, 0.02]]),
              "b": np.array([[8, 2e3, 0.2, 0.01], [16, 5e3, 0.5, 0.02]])}
    V.plot_accuracy_vs_parameters(ax, curves, {"a": 2e3}, majority=0.1)
    assert ax.get_xscale() == "log" and ax.get_ylim() == (0, 100)
    assert len(ax.get_legend().get_texts()) == 2
