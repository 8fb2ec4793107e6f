"""cemlib.viz.free_energy: Chapter 8's landscapes, descents and timings of free-energy layers."""

import math

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402
import pytest  # noqa: E402
import torch  # noqa: E402

from cemlib.energies import helmholtz as fe  # noqa: E402
from cemlib.layers.helmholtz import MeanShiftAttentionStep  # noqa: E402
from cemlib.layers.newton import Att2nd  # noqa: E402
from cemlib.viz import free_energy as V  # noqa: E402

f64 = torch.float64


def _eq8(d, T, eta):
    layer = MeanShiftAttentionStep(d, T=T, eta=eta).double()
    with torch.no_grad():
        layer.W_Q.copy_(torch.eye(d, dtype=f64))
        layer.W_K.copy_(torch.eye(d, dtype=f64))
    return layer


def test_circle_particles_are_evenly_spaced_on_the_unit_circle():
    pts = V.circle_particles(5, phase=0.3)
    assert pts.shape == (5, 2) and pts.dtype == f64
    torch.testing.assert_close(pts.norm(dim=-1), torch.ones(5, dtype=f64))
    assert math.isclose(math.atan2(pts[0, 1], pts[0, 0]), 0.3, abs_tol=1e-12)
    gaps = (pts - pts.roll(1, 0)).norm(dim=-1)
    torch.testing.assert_close(gaps, gaps[0].expand(5))
    with pytest.raises(ValueError, match="n_particles"):
        V.circle_particles(0)


def test_circle_landscape_is_the_elastic_free_energy_and_its_gradient():
    land = V.circle_landscape(0.3, 4)
    x = torch.tensor([[0.2, -0.1], [1.5, 0.7]], dtype=f64)
    pts, eye = V.circle_particles(4), torch.eye(2, dtype=f64)
    torch.testing.assert_close(land.energy(x), fe.elastic_free_energy(x, pts, eye, 0.3))
    x.requires_grad_(True)
    auto = torch.autograd.grad(land.energy(x).sum(), x)[0]
    torch.testing.assert_close(land.gradient(x.detach()), auto)
    with pytest.raises(ValueError, match="temperature"):
        V.circle_landscape(0.0)


def test_outline_nonconvex_measures_the_indefinite_region():
    fig, ax = plt.subplots()
    try:
        cold = V.outline_nonconvex(ax, V.circle_landscape(0.1, 3), 0.1, n=41)
        drawn = len(ax.collections)
        warm = V.outline_nonconvex(ax, V.circle_landscape(1.0, 3), 1.0, n=41)
    finally:
        plt.close(fig)
    assert 0 < cold < 1 and drawn >= 1          # low T: a non-convex web, outlined
    assert warm == 0                            # T >= rho^2 = 1: convex everywhere


def test_descend_records_gradient_norms_and_rises():
    gen = torch.Generator().manual_seed(0)
    pts = torch.randn(6, 3, generator=gen, dtype=f64)
    starts = 3 * torch.randn(5, 3, generator=gen, dtype=f64)
    gn, rose = V.descend(_eq8(3, 0.5, 1.0), pts, starts, iters=30)
    assert gn.shape == (31, 5) and rose.shape == (5,)
    assert not rose.any() and (gn[-1] < 1e-3 * gn[0]).all()      # mean shift: descends, converges
    layer = _eq8(3, 0.5, 1.0)
    torch.testing.assert_close(gn[0], layer.energy_grad(starts, pts).norm(dim=-1))
    _, rose_big = V.descend(_eq8(3, 0.5, 4.0), pts, starts, iters=30)
    assert rose_big.any()                                          # eta > 2 can climb


def test_plot_convergence_draws_the_median_per_method():
    grads = {(T, name): torch.rand(4, 3, dtype=f64) + k for T in (0.5, 1.0)
             for k, name in enumerate(("a", "b"))}
    fig = V.plot_convergence(grads, (0.5, 1.0), ["a", "b"])
    try:
        axes = fig.axes
        assert len(axes) == 2 and axes[0].get_title() == r"$T=0.5$"
        for ax, T in zip(axes, (0.5, 1.0)):
            for line, name in zip(ax.get_lines(), ("a", "b")):
                torch.testing.assert_close(torch.as_tensor(line.get_ydata()), grads[(T, name)].median(1).values)
    finally:
        plt.close(fig)


def test_best_times_runs_every_function_in_turn_and_keeps_the_best():
    order = []
    fns = [lambda: order.append("a"), lambda: order.append("b")]
    best = V.best_times(fns, reps=3)
    assert order == ["a", "b"] * 3
    assert len(best) == 2 and all(0 <= t < 1 for t in best)
    with pytest.raises(ValueError, match="reps"):
        V.best_times(fns, reps=0)


def test_plot_cost_draws_milliseconds_against_each_axis():
    sweeps = {"N": [(8, 4), (8, 16)], "d": [(4, 8), (16, 8)]}
    times = {(axis, name, d, n): (d * n + (name == "y")) * 1e-6
             for axis, grid in sweeps.items() for d, n in grid for name in ("x", "y")}
    fig = V.plot_cost(times, sweeps, ["x", "y"], tokens=7)
    try:
        left, right = fig.axes
        assert list(left.get_lines()[0].get_xdata()) == [4, 16]
        assert list(right.get_lines()[1].get_xdata()) == [4, 16]
        assert list(left.get_lines()[1].get_ydata()) == pytest.approx([1e-3 * 33, 1e-3 * 129])
        assert left.get_ylabel() == "wall time for 7 tokens (ms)"
        assert "$d=8$" in left.get_xlabel() and "$N=8$" in right.get_xlabel()
    finally:
        plt.close(fig)


def test_descend_matches_a_newton_layer_step_by_step():
    gen = torch.Generator().manual_seed(1)
    pts = torch.randn(5, 2, generator=gen, dtype=f64)
    start = torch.randn(1, 2, generator=gen, dtype=f64)
    layer = Att2nd(2, T=2.0).double()
    gn, _ = V.descend(layer, pts, start, iters=2)
    with torch.no_grad():
        z1 = layer(start, pts)
        torch.testing.assert_close(gn[1], layer.energy_grad(z1, pts).norm(dim=-1))
