"""Every line of the CEM paper's Algorithm 1 (ICLR version, "Transformer block as energy updates")
is one line of cemlib, named here: the map the CEM Transformer chapter's readable version of the
algorithm stands on. A snippet that disappears, or appears twice, in the method that should hold it
fails the test, so the map cannot drift from the code. (The chapter checks the block's numbers
against the algorithm written out with autograd, in float64.)"""

import inspect

import pytest

from cemlib.layers.blocks import Block
from cemlib.layers.cem_attention import CEMAttention
from cemlib.layers.cem_mlp import CEMMLP
from cemlib.models.lm import LanguageModel

ALGORITHM_1 = [  # (part, line of Algorithm 1 [ICLR], cemlib object, snippet of its source)
    ("block", "h_1:i <- RMSNorm(h_1:i)", CEMAttention.context, "hn = self.norm(h)"),
    ("block", "k_1:i <- W_K h_1:i ; v_1:i <- W_K h_1:i", CEMAttention.context, "kv = split_heads"),
    ("MHA", "for t = 0 .. T_eps - 1", CEMAttention.forward, "for t in range(self.T)"),
    ("MHA", "u_i <- RMSNorm(x_i)", CEMAttention.query, "return self.norm(x)"),
    ("MHA", "q_i^k <- W_k^Q u_i", CEMAttention._attend, "q = split_heads"),
    ("MHA", "a_ijk <- (k_j^T q_i^k + h_j^T D_k u_i) / tau", CEMAttention._attend, "qe = self.d * u"),
    ("MHA", "o_i^k <- sum_j softmax_j(a_ijk) v_j^k", CEMAttention._attend, "dispatch.tied_attention"),
    ("MHA", "W_k^QT o_i^k  (per head)", CEMAttention.head_grads, 'g = -torch.einsum("bklr,krh->bklh"'),
    ("MHA", "sum_k P_k W_k^QT o_i^k", CEMAttention.direction, "return self.P(self.head_grads("),
    ("MHA", "x_i <- x_i + eta_eps sum_k P_k W_k^QT o_i^k", CEMAttention.forward,
     "x = _step(x, self.eta, self.direction"),
    ("block", "h_i <- RMSNorm(h_i)", CEMMLP.forward, "hn = self.norm(x)"),
    ("MLP", "gamma <- W h_i", CEMMLP.forward, "gamma = hn @ self.W.T"),
    ("MLP", "u_i <- RMSNorm(x_i)", CEMMLP.forward, "u = hn if t == 0"),
    ("MLP", "g_i <- V^T (gamma * phi'(V u_i))", CEMMLP.neg_grad, "return dispatch.tied_gated_mlp_step("),
    ("MLP", "x_i <- x_i + eta_xi P_mlp g_i", CEMMLP.forward, "x = x + self.eta * self.P("),
    ("block", "h'_i <- MLP(MHA(h_1:i))", Block.forward, "return self.mlp(self.attn(x)"),
    ("model", "blocks between embedding and head", LanguageModel.forward, "in enumerate(self.blocks)"),
]


def source_lines(obj, snippet):
    """The lines of ``obj``'s source that contain ``snippet`` (stripped)."""
    return [line.strip() for line in inspect.getsource(obj).splitlines() if snippet in line]


@pytest.mark.parametrize("part, line, obj, snippet", ALGORITHM_1, ids=[a[1] for a in ALGORITHM_1])
def test_each_line_of_algorithm_1_is_exactly_one_line_of_cemlib(part, line, obj, snippet):
    found = source_lines(obj, snippet)
    assert len(found) == 1, (obj.__qualname__, snippet, found)


def test_the_map_covers_both_loops_and_can_fail():
    parts = [p for p, *_ in ALGORITHM_1]
    assert parts.count("MHA") >= 7 and parts.count("MLP") >= 4
    assert source_lines(CEMAttention.forward, "no such line of code") == []
    assert len(source_lines(CEMAttention.forward, "self")) > 1          # 'exactly one' is a real test
