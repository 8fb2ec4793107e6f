"""Tests of the CEM Transformer chapter's figures (cemlib.viz.cem_transformer), on the Agg backend:
each figure draws what it is given (seeds, means, baselines, optima), and refuses data it cannot
label."""

import matplotlib

matplotlib.use("Agg")

import numpy as np  # noqa: E402
import pytest  # noqa: E402
from matplotlib.figure import Figure  # noqa: E402

from cemlib.evidence.lr_search import akima_optimum  # noqa: E402
from cemlib.viz import cem_transformer as V  # noqa: E402


def _run(seed, losses, steps=(0, 50, 100)):
    return {"config": {"train": {"seed": seed}},
            "curves": {"eval": [{"step": s, "val_loss": v, "train_loss": v - 0.1}
                                for s, v in zip(steps, losses)]}}


def test_eval_curve_is_the_mean_and_sample_std_over_seeds():
    runs = [_run(0, [4.0, 2.0, 1.0]), _run(1, [4.2, 2.4, 1.2])]
    steps, mean, std = V.eval_curve(runs)
    assert list(steps) == [0, 50, 100]
    np.testing.assert_allclose(mean, [4.1, 2.2, 1.1])
    np.testing.assert_allclose(std, np.std([[4.0, 2.0, 1.0], [4.2, 2.4, 1.2]], axis=0, ddof=1))
    np.testing.assert_allclose(V.eval_curve(runs, "train_loss")[1], [4.0, 2.1, 1.0])
    np.testing.assert_allclose(V.eval_curve(runs[:1])[2], 0.0)          # one run: no spread
    with pytest.raises(ValueError):
        V.eval_curve([])
    with pytest.raises(ValueError, match="different steps"):
        V.eval_curve([runs[0], _run(1, [4.2, 2.4, 1.2], steps=(0, 60, 100))])


def test_ablation_figure_draws_every_seed_mean_and_the_baseline():
    values = {"llama": [1.80, 1.82, 1.81], "cem": [1.85, 1.84, 1.86], "llama-reuse": [1.9, 1.92, 1.91]}
    labels = {"llama": "Llama", "cem": "CEM", "llama-reuse": "Llama, reuse"}
    fig = V.ablation_figure(values, [("a", ["cem"]), ("b", ["llama-reuse", "cem"])], labels, "llama",
                            xlim=(1.7, 2.0))
    assert isinstance(fig, Figure) and len(fig.axes) == 2
    top, bottom = fig.axes
    crosses = [line for line in bottom.lines if line.get_marker() == "x"]
    assert len(crosses) == 2 and sorted(crosses[0].get_xdata()) == sorted(values["llama-reuse"])
    dashed = [line for line in top.lines if line.get_linestyle() == "--"]
    assert len(dashed) == 1 and dashed[0].get_xdata()[0] == pytest.approx(1.81)
    assert [t.get_text() for t in bottom.get_yticklabels()] == ["Llama, reuse", "CEM"]   # top first
    assert bottom.get_xlim() == (1.7, 2.0) and "nats per character" in bottom.get_xlabel()
    assert fig.get_facecolor()[:3] == (1.0, 1.0, 1.0)
    with pytest.raises(ValueError, match="without a label"):
        V.ablation_figure(values, [("a", ["cem"])], {"cem": "CEM"}, "llama")
    matplotlib.pyplot.close("all")


def test_curves_figure_bands_zoom_and_dashed_baseline():
    x = np.array([0, 50, 100])
    curves = {"llama": (x, np.array([4.0, 2.0, 1.8]), np.array([0.0, 0.1, 0.05])),
              "cem": (x, np.array([4.0, 2.2, 1.9]), np.array([0.0, 0.1, 0.05]))}
    fig = V.curves_figure(curves, {"llama": "Llama", "cem": "CEM"}, baseline_prefix="llama",
                          ylim=(1.5, 4.5), zoom=((50, 100), (1.7, 2.3)))
    assert len(fig.axes) == 2
    full, zoom = fig.axes
    assert [line.get_linestyle() for line in full.lines] == ["--", "-"]
    assert zoom.get_xlim() == (50, 100) and full.get_ylim() == (1.5, 4.5)
    assert len(full.collections) == 2                                   # one band per curve
    assert len(V.curves_figure(curves, {"llama": "L", "cem": "C"}).axes) == 1
    with pytest.raises(ValueError):
        V.curves_figure(curves, {"llama": "Llama"})
    matplotlib.pyplot.close("all")


def test_lr_sweep_figure_marks_the_given_optimum():
    lrs = [0.001, 0.002, 0.004, 0.008, 0.016]
    losses = [2.0, 1.9, 1.85, 1.88, 2.1]
    sweep = akima_optimum(lrs, losses)
    fig = V.lr_sweep_figure({"a": dict(zip(lrs, losses)), "b": {0.001: 2.0, 0.002: 1.9}},
                            {"a": "A", "b": "B"}, {"a": sweep}, colors={"a": "C1"})
    ax = fig.axes[0]
    stars = [line for line in ax.lines if line.get_marker() == "*"]
    assert len(stars) == 1 and stars[0].get_xdata()[0] == pytest.approx(sweep.best_lr)
    assert len([line for line in ax.lines if line.get_marker() == "o"]) == 2
    assert ax.get_xscale() == "log" and len(ax.get_xticks()) == 5
    assert len(V.lr_sweep_figure({"b": {0.001: 2.0}}, {"b": "B"}).axes[0].lines) == 1
    with pytest.raises(ValueError, match="without points"):
        V.lr_sweep_figure({"b": {0.001: 2.0}}, {"b": "B"}, {"a": sweep})
    matplotlib.pyplot.close("all")


def test_compute_figure_one_panel_per_comparison_and_blank_leftovers():
    x = np.array([0.0, 1.0, 2.0])
    c = {k: (x, np.array([3.0, 2.0, 1.9]), np.zeros(3)) for k in ("llama", "a", "b", "c")}
    labels = {"llama": "Llama", "a": "A", "b": "B", "c": "C"}
    fig = V.compute_figure(c, [("one", ["a"]), ("two", ["b", "c"]), ("three", ["c"])], labels, "llama")
    axes = fig.axes
    assert len(axes) == 4 and not axes[3].axison                       # 3 panels on a 2 x 2 grid
    assert [line.get_linestyle() for line in axes[1].lines] == ["--", "-", "-"]
    assert axes[0].get_xlabel() == "training compute (TFLOPs)"
    with pytest.raises(ValueError):
        V.compute_figure(c, [("one", ["d"])], labels, "llama")
    matplotlib.pyplot.close("all")


def test_interval_figure_draws_means_intervals_and_the_trained_setting():
    x = [1, 2, 4, 8]
    series = {"trained with T = 1": (x, [1.8, 2.4, 3.4, 3.8], [1.79, 2.3, 3.3, 3.6],
                                     [1.81, 2.5, 3.5, 4.0]),
              "trained with T = 2": (x, [2.6, 1.9, 2.2, 2.7], [2.5, 1.89, 2.1, 2.5],
                                     [2.7, 1.91, 2.3, 2.9])}
    fig = V.interval_figure([
        {"title": "steps", "xlabel": "T at inference", "series": series, "logx": True,
         "marks": {"trained with T = 1": 1, "trained with T = 2": 2}},
        {"title": "step size", "xlabel": "eta", "series": {"a": ([0.5, 1.0], [2.0, 1.8],
                                                                  [1.9, 1.7], [2.1, 1.9])}}])
    left, right = fig.axes[:2]
    stars = [line for line in left.lines if line.get_marker() == "*"]
    assert [tuple(s.get_xydata()[0]) for s in stars] == [(1.0, 1.8), (2.0, 1.9)]
    assert left.get_xscale() == "log" and right.get_xscale() == "linear"
    assert left.get_ylabel() == "validation loss (nats per character)"
    assert [t.get_text() for t in left.get_legend().get_texts()] == list(series)
    with pytest.raises(ValueError, match="contain the mean"):
        V.interval_figure([{"series": {"a": ([1], [2.0], [2.1], [2.2])}}])
    with pytest.raises(ValueError, match="not drawn"):
        V.interval_figure([{"series": {"a": ([1], [2.0], [1.9], [2.2])}, "marks": {"b": 1}}])
    with pytest.raises(ValueError, match="one shape"):
        V.interval_figure([{"series": {"a": ([1, 2], [2.0], [1.9], [2.2])}}])
    with pytest.raises(ValueError):
        V.interval_figure([])
    matplotlib.pyplot.close("all")
