"""Tests of the energy-landscape plots, the static companion and the live explorer (Agg backend)."""

import matplotlib

matplotlib.use("Agg")

import numpy as np  # noqa: E402
import pytest  # noqa: E402
import torch  # noqa: E402

from cemlib.energies.hopfield import modern_energy, modern_retrieve  # noqa: E402
from cemlib.viz import landscape as L  # noqa: E402
from cemlib.viz import widgets as Wd  # noqa: E402

f64 = torch.float64
PATTERNS = torch.tensor([[1.0, 1.0], [-1.2, 0.4], [0.3, -1.3]], dtype=f64)
STARTS = torch.tensor([[1.5, -1.5], [-1.5, 1.5]], dtype=f64)


def test_energy_grid_matches_energy():
    X, Y, E = L.energy_grid(PATTERNS, 2.0, n=11)
    assert X.shape == Y.shape == E.shape == (11, 11)
    i, j = 3, 7
    point = torch.tensor([X[i, j], Y[i, j]], dtype=f64)
    assert np.isclose(E[i, j], modern_energy(point, PATTERNS, 2.0).item(), rtol=1e-12)
    assert X[0, 0] == -2.0 and Y[-1, -1] == 2.0 and E.min() >= 0


def test_small_multiples_content():
    fig = L.landscape_small_multiples(PATTERNS, [0.5, 2.0, 8.0, 16.0], STARTS, steps=5, n=31, ncols=2)
    panels = [ax for ax in fig.axes if ax.get_visible() and ax.get_label() != "<colorbar>"]
    assert len(panels) == 4 and len(fig.axes) == 5  # four landscapes + one shared colour bar
    for ax, beta in zip(panels, [0.5, 2.0, 8.0, 16.0]):
        assert ax.get_title() == rf"$\beta = {beta:g}$"
        assert "$x_1$" in ax.get_xlabel() and "$x_2$" in ax.get_ylabel()
        assert len(ax.lines) == 3 * len(STARTS)  # path, start ring, end cross per trajectory
        path = ax.lines[0].get_xydata()
        traj = modern_retrieve(STARTS, PATTERNS, beta, steps=5)[:, 0].numpy()
        np.testing.assert_allclose(path, traj)
        assert len(ax.collections) >= 2  # filled contours and the pattern stars
    assert "energy" in fig.axes[-1].get_ylabel()


def test_small_multiples_hides_unused_panels():
    fig = L.landscape_small_multiples(PATTERNS, [1.0, 2.0, 4.0], STARTS[:1], steps=2, n=21, ncols=2)
    assert sum(not ax.get_visible() for ax in fig.axes) == 1


def test_animation_has_one_frame_per_beta_and_makes_jshtml():
    anim = L.landscape_animation(PATTERNS, [0.5, 4.0], STARTS[:1], steps=3, n=21, dpi=40)
    html = L.animation_html(anim, dpi=30, frame_format="png")
    assert "<script" in html and html.count("data:image/png;base64") == 2
    anim2 = L.landscape_animation(PATTERNS, [0.5, 4.0], STARTS[:1], steps=3, n=21)
    small = L.animation_html(anim2, dpi=30)
    assert small.count("data:image/jpeg;base64") == 2 and len(small) < len(html)


def test_render_png_and_explorer_react_to_sliders():
    pytest.importorskip("ipywidgets")
    png, traj = Wd.render_landscape_png(PATTERNS, STARTS[0], beta=2.0, steps=4, n=21, dpi=40)
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and traj.shape == (5, 2)
    w = Wd.landscape_explorer(PATTERNS, steps=4)
    assert repr(w) == "LandscapeExplorer(beta=2, eta=1, rule='cccp', steps=4)"
    assert w._repr_mimebundle_()["text/plain"] == repr(w)
    assert w.eta.disabled  # CCCP has no step size
    first, info = w.image.value, w.info.value
    w.rule.value = "gradient"
    w.eta.value = 0.25
    assert not w.eta.disabled and w.image.value != first and w.info.value != info
    assert repr(w) == "LandscapeExplorer(beta=2, eta=0.25, rule='gradient', steps=4)"


def test_bad_input():
    with pytest.raises(ValueError, match="last dimension 2"):
        L.energy_grid(torch.zeros(3, 4, dtype=f64), 1.0)
    with pytest.raises(ValueError, match="betas"):
        L.landscape_small_multiples(PATTERNS, [], STARTS)
    with pytest.raises(ValueError, match="rule"):
        Wd.landscape_explorer(PATTERNS, rule="adam")


def test_every_explorer_says_it_needs_a_kernel_and_wraps_at_phone_width():
    """On the static website the widgets render but nothing redraws: each explorer must say so
    itself, and its control columns must wrap instead of overlapping on a narrow screen."""
    pytest.importorskip("ipywidgets")
    from cemlib.viz import energy2d as E2

    land = lambda tau: E2.cem_attention_landscape(PATTERNS, tau=tau)
    for w in (Wd.landscape_explorer(PATTERNS, steps=2),
              E2.energy_explorer(land, {"tau": ("temperature τ", 0.1, 4.0, 0.05, 1.0)}, steps=2)):
        note = w.children[0]
        assert "needs a running Python kernel" in note.value and "website" in note.value
        controls = w.children[1]
        assert controls.layout.flex_flow == "row wrap" and len(controls.children) == 2
        assert w.image.layout.max_width == "100%"
        assert [s.description for s in (w.eta, w.steps, w.x0, w.y0)] == ["step size η", "steps",
                                                                        "start x₁", "start x₂"]


def test_gp_draws_along_the_diagonal_and_the_gp_explorer():
    from matplotlib.figure import Figure

    from cemlib.data.gp import sample_gp
    from cemlib.viz import gp as G

    s, z = G.diagonal_inputs(9, dim=3)
    assert z.shape == (9, 3) and torch.equal(z[:, 2], s) and s[0] == -1 and s[-1] == 1
    fig = Figure()
    ax = fig.subplots()
    d = G.plot_gp_draws(ax, "periodic", 0.7, seed=4, num_draws=2, n=9, dim=3, period=1.5)
    ref = sample_gp(z, "periodic", 0.7, generator=torch.Generator().manual_seed(4), num_draws=2, period=1.5)
    assert torch.equal(d, ref) and len(ax.lines) == 2 and ax.get_title() == "periodic"
    with pytest.raises(ValueError, match="kernel"):
        G.plot_gp_draws(ax, "cosine", 1.0)
    pytest.importorskip("ipywidgets")
    w = G.gp_slice_explorer("matern", 1.0)
    assert repr(w) == "GPSliceExplorer(kernel='matern', lengthscale=1, seed=0)"
    assert "needs a running Python kernel" in w.children[0].value
    first = w.image.value
    w.seed.value = 3
    assert w.image.value[:8] == b"\x89PNG\r\n\x1a\n" and w.image.value != first


def test_explorer_frame_natural_size_legend_busy_and_frozen_layout():
    """Every explorer: the kernel note, the image at its PNG's own width (never stretched), a legend,
    sliders with a fixed description width, no busy sign after a redraw; the second drawing reuses
    the first one's layout (the axes do not move)."""
    pytest.importorskip("ipywidgets")
    from cemlib.viz.roofline import roofline_explorer
    from cemlib.viz.style import _LAYOUTS, png_size

    for w in (Wd.landscape_explorer(PATTERNS, steps=4), roofline_explorer(phase="forward", L=1024)):
        note, row, legend, info = w.children
        assert "needs a running Python kernel" in note.value
        image, panel = row.children
        assert image is w.image and image.layout.width == f"{png_size(w.image.value)[0]}px"
        assert image.layout.max_width == "100%" and image.layout.height == "auto"
        assert "·" in legend.value and w.status.value == ""
        sliders = [c for c in panel.children if hasattr(c, "readout")]
        assert sliders and all(s.style.description_width == Wd.DESCRIPTION_WIDTH for s in sliders)
    before = {k: v for k, v in _LAYOUTS.items() if k[0] is w.layout_key or
              (isinstance(k[0], tuple) and k[0][0] is w.layout_key)}
    assert before
    w.logL.value = 14                                  # a redraw with the same layout key
    after = {k: v for k, v in _LAYOUTS.items() if k in before}
    assert after == before


def test_every_explorer_fits_beside_its_controls_on_a_laptop():
    """At 1366 px the plot and the column of controls sit side by side (nothing below the fold of
    a 768 px high screen): every explorer's PNG is narrow enough. The benchmark explorer is checked
    in test_viz_benchmark.py."""
    pytest.importorskip("ipywidgets")
    from cemlib.viz import energy2d as E2
    from cemlib.viz.gp import gp_slice_explorer
    from cemlib.viz.hyperset import circle_flow_explorer
    from cemlib.viz.nrgpt import token_energy_explorer
    from cemlib.viz.roofline import roofline_explorer

    land = lambda tau: E2.cem_attention_landscape(PATTERNS, tau=tau)
    explorers = [Wd.landscape_explorer(PATTERNS, steps=2),
                 E2.energy_explorer(land, {"tau": ("temperature τ", 0.1, 4.0, 0.05, 1.0)}, steps=2),
                 roofline_explorer(phase="forward", L=1024), gp_slice_explorer("rbf", 1.0),
                 token_energy_explorer(c=0.05, steps=3, d_model=8, n_tokens=4),
                 circle_flow_explorer("cem", steps=3)]
    for w in explorers:
        assert Wd.fits_beside(w.image.value), (type(w).__name__, w.image.layout.width)
    wide = Wd.render_landscape_png(PATTERNS, torch.tensor([1.0, 1.0], dtype=f64), figsize=(6.0, 3.8))[0]
    assert not Wd.fits_beside(wide)                                   # 480 px + 12 + 320 > 755


def test_leaves_frame():
    assert not Wd.leaves_frame(torch.tensor([[0.0, 0.0], [1.9, -1.9]]), (-2, 2), (-2, 2))
    assert Wd.leaves_frame(torch.tensor([[0.0, 0.0], [2.5, 0.0]]), (-2, 2), (-2, 2))
    w = Wd.landscape_explorer(PATTERNS, start=(1.9, 1.9), rule="gradient", eta=2.5, steps=3)
    assert ("leaves the plotted square" in w.info.value) == Wd.leaves_frame(
        modern_retrieve(torch.tensor([1.9, 1.9], dtype=f64), PATTERNS, 2.0, rule="gradient", eta=2.5, steps=3),
        (-2, 2), (-2, 2))


def test_render_png_frozen_layout_keeps_axes_positions():
    from cemlib.viz.style import render_png

    def draw(fig, title):
        ax = fig.subplots()
        ax.plot([0, 1], [0, 1])
        ax.set_title(title)
        return ax.get_position(original=True).bounds

    key = object()
    png1, pos1 = render_png(lambda f: draw(f, "a"), (3, 2), 50, layout_key=key)
    png2, pos2 = render_png(lambda f: draw(f, "b"), (3, 2), 50, layout_key=key)
    fig_positions = render_png(lambda f: draw(f, "b"), (3, 2), 50, layout_key=key)
    assert png1 != png2 and fig_positions[0] == png2
    from cemlib.viz.style import _LAYOUTS
    assert _LAYOUTS[(key, (3, 2), 50)][0].bounds != (0.125, 0.11, 0.775, 0.77)   # constrained, not the default
