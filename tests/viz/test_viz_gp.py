"""cemlib.viz.gp.plot_table3_panels: Table 3 of CEM beside our sweeps, one panel per kernel and split
(Chapter 6's figure of the recorded sweeps)."""

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402

from cemlib.viz.gp import SWEEP_STYLES, plot_table3_panels  # noqa: E402

KERNELS = ("rbf", "matern")
MODELS = ("Gated", "CEM-T1", "CEM-T2", "CEM-T4", "CEM-T8")


def _paper():
    # train mean, train std, test mean, test std: distinct numbers per cell, to find them again
    return {k: {m: (0.01 * (i + 1) + j, 0.001, 0.02 * (i + 1) + j, 0.002) for i, m in enumerate(MODELS)}
            for j, k in enumerate(KERNELS)}


def _ours():
    full = {(k, m, s): (0.03 * (i + 1) + j + (s == "test"), 0.004)
            for j, k in enumerate(KERNELS) for i, m in enumerate(MODELS) for s in ("train", "test")}
    part = {key: (v[0] + 0.5, v[1]) for key, v in full.items() if key[1] in ("Gated", "CEM-T1", "CEM-T2")}
    return {"first": full, "second": part}


def _lines_y(ax):
    return [tuple(np.round(np.asarray(line.get_ydata(), dtype=float), 6)) for line in ax.get_lines()]


def test_each_panel_draws_the_paper_and_every_sweep_where_it_has_points():
    paper, ours = _paper(), _ours()
    fig, axes = plot_table3_panels(paper, ours, kernels=KERNELS)
    try:
        assert axes.shape == (2, len(KERNELS))                  # rows: test, train
        for j, k in enumerate(KERNELS):
            for i, (split, col) in enumerate((("test", 2), ("train", 0))):
                ys = _lines_y(axes[i, j])
                want_paper = tuple(round(paper[k][f"CEM-T{T}"][col], 6) for T in (1, 2, 4, 8))
                assert want_paper in ys                          # the paper's CEM curve
                assert (round(paper[k]["Gated"][col], 6),) * 2 in ys   # its gated line
                for label, sweep in ours.items():
                    have = [T for T in (1, 2, 4, 8) if (k, f"CEM-T{T}", split) in sweep]
                    want = tuple(round(sweep[(k, f"CEM-T{T}", split)][0], 6) for T in have)
                    assert want in ys, (label, k, split)
                    assert (round(sweep[(k, "Gated", split)][0], 6),) * 2 in ys
            assert axes[1, j].get_xlabel() == r"recursion steps $T$"
        assert axes[0, 0].get_ylabel().startswith("test RMSE") and axes[1, 0].get_ylabel().startswith("train RMSE")
        # the second sweep has T = 1, 2 only: its CEM line has two points, in its own colour
        second = [line for line in axes[0, 0].get_lines() if line.get_marker() == SWEEP_STYLES[1][1]
                  and line.get_color() == SWEEP_STYLES[1][0]]
        assert [list(line.get_xdata()) for line in second] == [[1, 2]]
        assert len(second) == 1
        labels = fig.legends[0].get_texts()
        assert {t.get_text() for t in labels} >= {"CEM, paper (± std)", "CEM, first", "gated, second"}
    finally:
        plt.close(fig)


def test_too_many_sweeps_are_refused():
    ours = {f"s{i}": _ours()["first"] for i in range(len(SWEEP_STYLES) + 1)}
    with pytest.raises(ValueError, match="at most"):
        plot_table3_panels(_paper(), ours, kernels=KERNELS)
