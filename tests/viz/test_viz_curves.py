"""The stored-runs curves explorer (:mod:`cemlib.viz.curves`, chapter 5's): any x axis the caller's
curve function knows, mean ± std bands, the book's explorer frame (Agg, ipywidgets)."""

import matplotlib

matplotlib.use("Agg")

import numpy as np  # noqa: E402
import pytest  # noqa: E402

from cemlib.viz import curves as C  # noqa: E402

LABELS = {"a": "model A", "b": "model B", "c": "model C"}
CALLS = []


def curve(key, split, x):
    CALLS.append((key, split, x))
    steps = np.arange(1, 6, dtype=float)
    scale = {"step": 1.0, "compute": 1e3}[x]
    offset = {"a": 0.0, "b": 0.5, "c": 1.0}[key] + (0.1 if split == "train_loss" else 0.0)
    return steps * scale, 3.0 - 0.2 * steps + offset, np.full(5, 0.05)


def test_plot_curves_draws_mean_and_band_per_group():
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots()
    C.plot_curves(ax, curve, ["a", "b"], LABELS, "val_loss", "compute", "compute", "loss", ylim=(1, 4))
    assert [line.get_label() for line in ax.get_lines()] == ["model A", "model B"]
    assert np.allclose(ax.get_lines()[1].get_xdata(), 1e3 * np.arange(1, 6))
    assert len(ax.collections) == 2 and ax.get_ylim() == (1, 4)   # one band per group
    plt.close(fig)
    with pytest.raises(ValueError, match="three equal 1-D arrays"):
        C.plot_curves(plt.gca(), lambda k, s, x: ([1, 2], [1, 2, 3], [0, 0]), ["a"], LABELS,
                      "val_loss", "step", "", "")
    assert C.render_curves_png(curve, ["a"], LABELS, "val_loss", "step", "s", "l")[:8] == \
        b"\x89PNG\r\n\x1a\n"


def test_curves_explorer_redraws_on_every_control():
    pytest.importorskip("ipywidgets")
    from cemlib.viz.widgets import fits_beside

    CALLS.clear()
    ex = C.curves_explorer(curve, LABELS, ["a", "b"], {"training step": "step", "compute (TFLOPs)": "compute"},
                           {"validation loss": "val_loss", "training loss": "train_loss"},
                           unit="nats/char", ylim=(1.5, 3.5))
    assert repr(ex) == "CurvesExplorer(models=2, x='training step', loss='val_loss')"
    assert CALLS == [("a", "val_loss", "step"), ("b", "val_loss", "step")]
    assert fits_beside(ex.image.value)                   # plot and controls side by side at 1366 px
    first = ex.image.value
    ex.xaxis.value = "compute (TFLOPs)"
    assert CALLS[-1] == ("b", "val_loss", "compute") and ex.image.value != first
    ex.split.value = "train_loss"
    ex.pick.value = ("c",)
    assert CALLS[-1] == ("c", "train_loss", "compute")
    assert repr(ex) == "CurvesExplorer(models=1, x='compute (TFLOPs)', loss='train_loss')"
    ex.pick.value = ()                                   # nothing chosen: an empty plot, no error
    assert ex.image.value[:8] == b"\x89PNG\r\n\x1a\n"
    assert "± one standard deviation" in ex.legend.value
    with pytest.raises(ValueError, match="without a label"):
        C.curves_explorer(curve, LABELS, ["z"], {"s": "step"}, {"v": "val_loss"})
    with pytest.raises(ValueError, match="at least one"):
        C.curves_explorer(curve, LABELS, ["a"], {}, {"v": "val_loss"})
