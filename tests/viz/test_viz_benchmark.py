"""Tests of chapter 10's benchmark figures and explorer (Agg), on the stored ListOps sweep."""

import matplotlib

matplotlib.use("Agg")

from pathlib import Path  # noqa: E402

import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402

from cemlib.train.presets.bench import WIDTHS as BENCH_WIDTHS  # noqa: E402
from cemlib.train.results import load_runs  # noqa: E402
from cemlib.viz import benchmark as V  # noqa: E402

LISTOPS = Path(__file__).resolve().parents[2] / "book" / "results" / "bench_listops_cpu"


@pytest.fixture(scope="module")
def sweep():
    return load_runs(LISTOPS, by="model")


def _stored_seeds(model: str) -> list[int]:
    """The seeds of the stored files of one model, read from their names (``...__seed<k>.json``)."""
    return sorted(int(p.stem.rsplit("seed", 1)[1]) for p in LISTOPS.glob(f"bench_listops_{model}__seed*.json"))


def test_load_sweep_groups_runs_by_model_and_seed(sweep, tmp_path):
    assert set(sweep) == set(BENCH_WIDTHS["listops"])
    for m, runs in sweep.items():
        assert len(runs) >= 5
        assert [r["config"]["train"]["seed"] for r in runs] == _stored_seeds(m)       # sorted by seed
        assert all(r["experiment"] == f"bench-listops-{m}" for r in runs)
    with pytest.raises(FileNotFoundError):
        load_runs(tmp_path, by="model")


def test_sweep_curves_end_at_the_final_metrics(sweep):
    runs = sweep["cem"]
    xs, Y = V.sweep_curves(runs, "test_accuracy")
    assert Y.shape == (len(runs), len(xs)) and xs[0] == 0 and xs[-1] == runs[0]["metrics"]["steps"]
    np.testing.assert_array_equal(Y[:, -1], [r["metrics"]["final"]["test_accuracy"] for r in runs])
    xt, _ = V.sweep_curves(runs, "test_accuracy", x="tokens")
    assert xt[-1] == runs[0]["metrics"]["tokens"]
    with pytest.raises(ValueError, match="x must be"):
        V.sweep_curves(runs, "test_accuracy", x="seconds")
    with pytest.raises(KeyError, match="nope"):
        V.sweep_curves(runs, "nope")
    shifted = [dict(runs[0]), runs[1]]
    shifted[0]["curves"] = {"eval": [dict(e, step=e["step"] + 1) for e in runs[0]["curves"]["eval"]]}
    with pytest.raises(ValueError, match="different steps"):
        V.sweep_curves(shifted, "test_accuracy")


def test_curves_small_multiples_and_energy_depth(sweep):
    fig, ax = plt.subplots()
    V.plot_sweep_curves(ax, sweep, "test_accuracy", ["cem", "gpt"], seeds="all")
    assert len(ax.lines) == 2 + len(sweep["cem"]) + len(sweep["gpt"])   # a mean and one line per seed
    with pytest.raises(ValueError, match="seeds"):
        V.plot_sweep_curves(ax, sweep, "test_accuracy", seeds="some")
    plt.close(fig)
    fig = V.bench_small_multiples(sweep, "test_accuracy", ncols=4)
    visible = [a for a in fig.axes if a.get_visible()]
    assert len(visible) == len(sweep) and "±" in visible[0].get_title()
    plt.close(fig)
    fig, ax = plt.subplots()
    layered = {"one_energy": False, "before_mean": [-2.0, 5.0, 1.0], "after_mean": [-3.0, 4.0, 0.5]}
    V.plot_energy_depth(ax, layered, label="layered", offset=0.2)
    heights = [p.get_height() for p in ax.patches]
    np.testing.assert_allclose(heights, [-0.5, -0.2, -0.5])          # relative change of each step's energy
    assert ax.patches[0].get_x() + ax.patches[0].get_width() / 2 == pytest.approx(1.2)
    shared = {"one_energy": True, "before_mean": [4.0, 3.0], "after_mean": [3.0, 2.0],
              "trajectory_mean": [4.0, 3.0, 2.0, 2.5, 2.2, 2.1, 2.0], "trained_steps": 2}
    V.plot_energy_depth(ax, shared)
    assert len(ax.lines) == 2 and list(ax.lines[0].get_ydata()) == [1.0, 0.75, 0.5, 0.625, 0.55, 0.525, 0.5]
    plt.close(fig)


def test_png_and_explorer(sweep):
    png = V.render_bench_png(sweep, "test_accuracy", ["cem", "llama"], zoom_from=0.5)
    assert png[:8] == b"\x89PNG\r\n\x1a\n"
    pytest.importorskip("ipywidgets")
    sweeps = {"listops": sweep, "other": {"cem": sweep["cem"]}}
    ex = V.bench_explorer(sweeps, {"listops": ["test_accuracy", "val_loss"], "other": ["val_loss"]})
    assert repr(ex) == "BenchExplorer(task='listops', metric='test_accuracy', models=6, seeds='band')"
    from cemlib.viz.widgets import fits_beside
    assert fits_beside(ex.image.value)                   # plot and controls side by side at 1366 px
    assert ex.info.value.startswith("final: CEM 0.511 ± 0.009")
    ex.task.value = "other"
    assert ex.metric.value == "val_loss" and ex.models.value == ("cem",)
    ex.models.value = ()
    assert ex.info.value == "choose at least one model"
    with pytest.raises(ValueError, match="same"):
        V.bench_explorer(sweeps, {"listops": ["val_loss"]})
    with pytest.raises(ValueError, match="task must be"):
        V.bench_explorer(sweeps, {"listops": ["val_loss"], "other": ["val_loss"]}, task="sudoku")

