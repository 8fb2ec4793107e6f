"""cemlib.viz.hyperset: tokens on a circle under Hyper-SET's and CEM's flows (the Hyper-SET chapter)."""

import matplotlib

matplotlib.use("Agg")

import pytest
import torch

from cemlib.energies import cem
from cemlib.energies.hyperset import bisoftmax_grad
from cemlib.viz.hyperset import (FLOWS, circle_anchors, circle_flow, circle_flow_animation,
                                 circle_flow_explorer, circle_flow_small_multiples, circle_tokens,
                                 render_circle_flow_png)


def test_attention_spreads_cem_collapses_ff_aligns():
    x0 = circle_tokens(12, seed=0)
    att = circle_flow(x0, "attention", 1.0, 0.1, 30)
    assert att["angle"][-1] > att["angle"][0] + 20
    assert att["attention_energy"][-1] < att["attention_energy"][0]
    cm = circle_flow(x0, "cem", 1.0, 0.1, 30)
    assert cm["angle"][-1] < cm["angle"][0] - 10
    ff = circle_flow(x0, "feedforward", 1.0, 0.1, 30)
    assert ff["ff_energy"][-1] < ff["ff_energy"][0]
    for run in (att, cm, ff):
        torch.testing.assert_close(run["states"].norm(dim=-1), torch.ones(31, 12, dtype=torch.float64))


def test_without_retraction_the_norm_drifts():
    run = circle_flow(circle_tokens(6), "attention", 1.0, 0.3, 5, retract=False)
    assert (run["states"][-1].norm(dim=-1) - 1).abs().max() > 1e-2


def test_cem_step_is_minus_the_query_half_of_the_bisoftmax_gradient_for_the_last_token():
    """CEM's causal energy of the last token (which sees every token) has gradient
    -sum_j softmax_j(beta x_N.x_j) x_j: the row-softmax half of eq. (7), with the opposite sign."""
    x = circle_tokens(7, seed=3)
    beta = 0.8
    eye = torch.eye(2, dtype=x.dtype)[None]
    g_cem = cem.interaction_energy_grad(x[None], x[None], eye, eye, tau=1 / beta)[0, -1]
    G = beta * x @ x.T
    row = torch.softmax(G, -1) @ x
    torch.testing.assert_close(g_cem, -row[-1])
    torch.testing.assert_close(bisoftmax_grad(x, beta) - row, torch.softmax(G, -2) @ x)


def test_static_companions_and_explorer():
    fig, angles = circle_flow_small_multiples(betas=(1.0,), flows=("attention", "cem"), steps=5)
    assert set(angles[1.0]) == {"attention", "cem"} and len(fig.axes) == 2
    anim = circle_flow_animation(steps=3, flows=("attention",))
    assert len(anim.to_jshtml()) > 1000
    png, run = render_circle_flow_png("both", 1.0, 0.1, 4)
    assert png[:4] == b"\x89PNG" and run["states"].shape == (5, 12, 2)
    ex = circle_flow_explorer("cem", beta=1.0, step=0.1, steps=4)
    assert repr(ex).startswith("CircleFlowExplorer(flow='cem'")
    assert ex.image.value[:4] == b"\x89PNG"


def test_bad_arguments():
    with pytest.raises(ValueError, match="flow"):
        circle_flow(circle_tokens(4), "repel")
    with pytest.raises(ValueError, match="x0"):
        circle_flow(torch.zeros(4, 3, dtype=torch.float64))
    with pytest.raises(ValueError, match="beta"):
        circle_flow(circle_tokens(4), beta=0.0)
    assert circle_anchors(4).shape == (2, 4) and set(FLOWS) == {"attention", "feedforward", "both", "cem"}
