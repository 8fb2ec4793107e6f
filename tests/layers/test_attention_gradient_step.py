"""Helpers added for the chapter "Attention is a gradient step": ALiBi slopes (one rule for every
head count, exact in the layer's dtype), the KV-cache count, and the 2-D energy landscapes
(:mod:`cemlib.viz.energy2d`) with their static companions and explorer."""

import math

import matplotlib

matplotlib.use("Agg")

import numpy as np  # noqa: E402
import pytest  # noqa: E402
import torch  # noqa: E402

from cemlib.energies import cem  # noqa: E402
from cemlib.kernels.reference import alibi_slopes  # noqa: E402
from cemlib.layers.cem_attention import CEMAttention  # noqa: E402
from cemlib.layers.llama import LlamaAttention  # noqa: E402
from cemlib.models.lm import LMConfig  # noqa: E402
from cemlib.models.params import kv_cache_bytes_per_token  # noqa: E402
from cemlib.testing import autograd_grad  # noqa: E402
from cemlib.viz import energy2d as E2  # noqa: E402

f64 = torch.float64


# ------------------------------------------------------------------------------ ALiBi slopes
@pytest.mark.parametrize("K", range(1, 17))
def test_geometric_slopes_are_two_to_minus_8k_over_K_for_every_K(K):
    s = alibi_slopes(K)
    exact = torch.tensor([2.0 ** (-8.0 * k / K) for k in range(1, K + 1)], dtype=f64)
    assert s.dtype == f64 and s.shape == (K,)
    torch.testing.assert_close(s, exact, rtol=0, atol=0)
    assert bool((s[1:] < s[:-1]).all()) and s[-1].item() == 2.0 ** -8   # geometric, ends at 2^-8
    ratios = s[1:] / s[:-1]
    torch.testing.assert_close(ratios, torch.full_like(ratios, 2.0 ** (-8.0 / K)), rtol=1e-14, atol=0)


def test_interleaved_recipe_equals_geometric_only_for_powers_of_two():
    for K in (1, 2, 4, 8, 16, 32):
        torch.testing.assert_close(alibi_slopes(K, "interleaved"), alibi_slopes(K), rtol=0, atol=0)
    # K = 12: the 8 slopes of 8 heads, then every other slope of 16 heads (ALiBi reference code)
    inter = alibi_slopes(12, "interleaved")
    torch.testing.assert_close(inter[:8], alibi_slopes(8), rtol=0, atol=0)
    torch.testing.assert_close(inter[8:], alibi_slopes(16)[0::2][:4], rtol=0, atol=0)
    gaps = {K: (alibi_slopes(K, "interleaved") - alibi_slopes(K)).abs().max().item() for K in (6, 12)}
    assert math.isclose(gaps[6], 0.5 - 2.0 ** (-8 * 5 / 6), rel_tol=1e-12)     # 0.490
    assert math.isclose(gaps[12], 2.0 ** -0.5 - 2.0 ** (-8 * 9 / 12), rel_tol=1e-12)  # 0.691
    # the CEM paper's example 2^-k is the rule at K = 8 only
    for K in (4, 6, 8, 12):
        paper = torch.tensor([2.0 ** -k for k in range(1, K + 1)], dtype=f64)
        assert torch.equal(paper, alibi_slopes(K)) == (K == 8)


def test_alibi_slopes_rejects_bad_input():
    for bad in (0, -3, 2.5, True):
        with pytest.raises(ValueError, match="n_heads"):
            alibi_slopes(bad)
    with pytest.raises(ValueError, match="recipe"):
        alibi_slopes(4, "bloom")


@pytest.mark.parametrize("make", [lambda: CEMAttention(24, 12), lambda: LlamaAttention(24, 12, pos="alibi")])
def test_slope_buffer_is_exact_in_the_layers_dtype(make):
    exact = alibi_slopes(12)
    m = make()
    assert m.alibi.dtype == torch.float32 and torch.equal(m.alibi, exact.float())
    widened = exact.float().double()
    assert ((widened - exact) / exact).abs().max().item() > 1e-9          # the error the fix removes
    for convert in (lambda mod: mod.double(), lambda mod: mod.to(torch.float64)):
        m = convert(make())
        assert m.alibi.dtype == f64 and torch.equal(m.alibi, exact)
    m = make().double().float()                                           # and back: float32 again
    assert m.alibi.dtype == torch.float32 and torch.equal(m.alibi, exact.float())
    assert "alibi" not in m.state_dict()                                  # not saved in checkpoints
    old = torch.get_default_dtype()
    torch.set_default_dtype(f64)
    try:
        assert torch.equal(make().alibi, exact)                           # built in float64
    finally:
        torch.set_default_dtype(old)


def test_float64_layer_matches_the_energy_with_exact_slopes():
    torch.manual_seed(0)
    m = CEMAttention(12, 6, diag="none", query_norm=False, self_cross_bias=False, init_std=0.4).double()
    h = torch.randn(2, 9, 12, dtype=f64)
    W = m.W_Q.view(6, 2, 12), m.W_K.view(6, 2, 12)
    exact = cem.interaction_energy_grad(h, m.norm(h), *W, tau=m.tau, alibi=alibi_slopes(6))
    with torch.no_grad():
        torch.testing.assert_close(m(h), h - exact, rtol=1e-13, atol=1e-13)


# ------------------------------------------------------------------------------ KV cache
def test_kv_cache_bytes_per_token():
    base = dict(vocab_size=65, context_length=64, d_model=128, n_layers=2, n_heads=4)
    llama = kv_cache_bytes_per_token(LMConfig(**base), bytes_per_element=2)
    assert llama == 2 * 2 * 128 * 2                                       # K and V, 2 layers, bf16
    tied = kv_cache_bytes_per_token(LMConfig(**base, attn="cem", diag="none"), bytes_per_element=2)
    assert tied * 2 == llama                                              # K = V: half
    shared = kv_cache_bytes_per_token(LMConfig(**base, attn="cem"), bytes_per_element=2)
    assert shared == llama                                                # + RMSNorm(h_j) for the diagonal
    wide = kv_cache_bytes_per_token(LMConfig(**base, head_dim=64), bytes_per_element=4)
    assert wide == 2 * 2 * 4 * 64 * 4
    # the count agrees with the tensors the CEM layer keeps per token
    m = CEMAttention(128, 4)
    hn, kv = m.context(torch.randn(1, 5, 128))
    assert (hn.shape[-1] + kv.shape[1] * kv.shape[-1]) * 4 * 2 == kv_cache_bytes_per_token(
        LMConfig(**base, attn="cem"), bytes_per_element=4)
    with pytest.raises(ValueError, match="bytes_per_element"):
        kv_cache_bytes_per_token(LMConfig(**base), bytes_per_element=0)


# ------------------------------------------------------------------------------ 2-D landscapes
KEYS = torch.tensor([[1.2, 0.4], [-0.6, 1.0], [0.3, -1.0]], dtype=f64)


def test_attention_landscape_is_the_interaction_energy_of_the_last_token():
    land = E2.cem_attention_landscape(KEYS, tau=0.7, alibi_slope=0.5)
    x = torch.randn(4, 2, dtype=f64, generator=torch.Generator().manual_seed(0))
    eye = torch.eye(2, dtype=f64)[None]
    for p in x:
        xs = torch.cat([KEYS[:-1], p[None]])[None]
        want = cem.interaction_energy(xs, KEYS[None], eye, eye, tau=0.7,
                                      alibi=torch.tensor([0.5], dtype=f64))[0, -1]
        torch.testing.assert_close(land.energy(p), want, rtol=1e-14, atol=1e-14)
    # by hand: -tau log sum_j exp(h_j.x/tau - m (N - j))
    by_hand = -0.7 * torch.logsumexp(x @ KEYS.T / 0.7 - 0.5 * torch.tensor([2.0, 1.0, 0.0], dtype=f64), -1)
    torch.testing.assert_close(land.energy(x), by_hand, rtol=1e-14, atol=1e-14)
    torch.testing.assert_close(land.gradient(x), autograd_grad(land.energy, x), rtol=1e-12, atol=1e-12)
    hop = E2.cem_attention_landscape(KEYS, tau=0.7, quadratic=True)
    plain = E2.cem_attention_landscape(KEYS, tau=0.7)
    torch.testing.assert_close(hop.energy(x) - plain.energy(x), 0.5 * (x * x).sum(-1))
    # a unit step on the Hopfield form lands on the attention output (no residual)
    step = x - hop.gradient(x)
    torch.testing.assert_close(step, torch.softmax(x @ KEYS.T / 0.7, -1) @ KEYS)
    with pytest.raises(ValueError, match="tau"):
        E2.cem_attention_landscape(KEYS, tau=0.0)


def test_descent_path_and_grid():
    land = E2.cem_attention_landscape(KEYS, tau=1.0)
    path = E2.descent_path(land, KEYS[-1], eta=0.5, steps=4)
    assert path.shape == (5, 2) and torch.equal(path[0], KEYS[-1])
    torch.testing.assert_close(path[1], KEYS[-1] - 0.5 * land.gradient(KEYS[-1]))
    many = E2.descent_path(land, KEYS, eta=0.5, steps=4)
    assert many.shape == (5, 3, 2)
    torch.testing.assert_close(many[:, 2], path)
    X, Y, E = E2.energy_grid(land, n=11)
    assert X.shape == Y.shape == E.shape == (11, 11) and X[0, 0] == -2.0 and Y[-1, -1] == 2.0
    i, j = 4, 9
    assert np.isclose(E[i, j], land.energy(torch.tensor([X[i, j], Y[i, j]], dtype=f64)).item(), rtol=1e-13)
    lv = E2.shared_levels([land, E2.cem_attention_landscape(KEYS, tau=2.0)], count=7)
    assert lv.shape == (7,) and bool(np.all(np.diff(lv) > 0))
    with pytest.raises(ValueError):
        E2.descent_path(land, KEYS[-1], steps=0)


def test_small_multiples_and_animation():
    lands = [E2.cem_attention_landscape(KEYS, tau=t) for t in (0.5, 1.0, 2.0)]
    starts = torch.tensor([[0.3, -1.0], [-1.0, -1.0]], dtype=f64)
    fig = E2.energy_small_multiples(lands, starts, eta=1.0, steps=3, n=21, ncols=2)
    panels = [ax for ax in fig.axes if ax.get_visible() and ax.get_label() != "<colorbar>"]
    assert len(panels) == 3 and sum(not ax.get_visible() for ax in fig.axes) == 1
    for ax, land in zip(panels, lands):
        assert ax.get_title() == land.title and "$x_1$" in ax.get_xlabel()
        assert len(ax.lines) == 3 * len(starts)
        np.testing.assert_allclose(ax.lines[0].get_xydata(), E2.descent_path(land, starts[0], 1.0, 3).numpy())
    assert "energy" in fig.axes[-1].get_ylabel()
    from cemlib.viz.landscape import animation_html
    html = animation_html(E2.energy_animation(lands[:2], starts[:1], steps=2, n=15, dpi=30), dpi=30)
    assert "<script" in html and html.count("data:image/jpeg;base64") == 2
    with pytest.raises(ValueError, match="at least one"):
        E2.energy_small_multiples([], starts)


def test_explorer_reacts_and_has_a_deterministic_repr():
    pytest.importorskip("ipywidgets")
    make = lambda tau, quadratic: E2.cem_attention_landscape(KEYS, tau=tau, quadratic=quadratic == "on")
    w = E2.energy_explorer(make, {"tau": ("temperature τ", 0.1, 4.0, 0.05, 1.0),
                                  "quadratic": ("+½‖x‖²", ["off", "on"], "off")},
                           start=(1.5, 1.5), steps=4)
    assert repr(w) == "EnergyExplorer(tau=1, quadratic='off', eta=1, steps=4)"
    assert w._repr_mimebundle_()["text/plain"] == repr(w)
    assert w.image.value[:8] == b"\x89PNG\r\n\x1a\n" and "decreased at every step" in w.info.value
    first = w.image.value
    w.params["quadratic"].value = "on"
    w.eta.value = 3.0                                  # overshoots on the bounded Hopfield form
    assert w.image.value != first and "rose at some step" in w.info.value
    assert repr(w) == "EnergyExplorer(tau=1, quadratic='on', eta=3, steps=4)"
    with pytest.raises(ValueError, match="control"):
        E2.energy_explorer(make, {"tau": (0.1, 4.0)})
