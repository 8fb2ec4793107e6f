"""Tests of the errata appendix's figures and explorer (cemlib.viz.errata; Agg backend)."""

import matplotlib

matplotlib.use("Agg")

import numpy as np  # noqa: E402
import pytest  # noqa: E402

from cemlib.viz import errata as V  # noqa: E402

# three starts over four steps: start 0 descends, start 1 rises at step 2, start 2 rises at steps 1 and 4
E = np.array([[0.0, 0.0, 0.0],
              [-1.0, -1.0, 0.5],
              [-2.0, -0.5, 0.2],
              [-3.0, -0.7, 0.1],
              [-4.0, -0.9, 0.3]])


def test_rises_marks_exactly_the_steps_that_raised_the_energy():
    up = V.rises(E)
    assert up.shape == (4, 3)
    assert list(zip(*np.nonzero(up))) == [(0, 2), (1, 1), (3, 2)]
    assert V.rises(E, tol=0.25).sum() == 2          # the rise of 0.2 at step 4 is within the tolerance
    with pytest.raises(ValueError):
        V.rises(E[:1])
    with pytest.raises(ValueError):
        V.rises(E[:, 0])


def test_panel_draws_every_start_and_a_dot_per_rise():
    from matplotlib.figure import Figure

    ax = Figure().subplots()
    n = V.plot_energy_steps(ax, E, "c = 1")
    assert n == 3
    lines = ax.get_lines()
    assert len(lines) == 3 + 1                        # one line per start, one set of red dots
    dots = lines[-1]
    np.testing.assert_allclose(dots.get_xdata(), [1, 2, 4])
    np.testing.assert_allclose(dots.get_ydata(), [0.5, -0.5, 0.3])   # relative to each start
    assert ax.get_title() == "c = 1"


def test_multiples_one_panel_per_run_with_a_shared_axis():
    fig = V.energy_steps_multiples({"a": E, "b": E[:, :2], "c": -E})
    axes = fig.axes
    assert len(axes) == 3 and [a.get_title() for a in axes] == ["a", "b", "c"]
    assert axes[0].get_ylabel() and axes[0].get_shared_y_axes().joined(axes[0], axes[2])


def test_explorer_redraws_with_the_slider_values():
    pytest.importorskip("ipywidgets")
    calls = []

    def run(c, steps):
        calls.append((c, steps))
        t = np.arange(steps + 1)[:, None]
        return -c * t * np.ones((1, 2))               # two starts, always descending

    ex = V.step_size_explorer(run, c=0.5, steps=5, c_range=(0.01, 10.0))
    assert calls[-1] == (pytest.approx(0.5), 5)
    assert ex.image.value[:8] == b"\x89PNG\r\n\x1a\n"
    assert ex.info.value.startswith("0 of 10 steps raised")
    ex.steps.value = 7
    assert calls[-1][1] == 7
    assert "StepSizeExplorer(c=0.5, steps=7)" == repr(ex)
    with pytest.raises(ValueError):
        V.step_size_explorer(run, c=20.0, c_range=(0.01, 10.0))
