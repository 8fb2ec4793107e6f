"""Hyper-SET alternatives (Tables 4, 5, 19, 20): sign-corrected steps, gates, depth-wise LoRA."""

import math

import pytest
import torch

from cemlib.energies import hyperset as hs
from cemlib.layers.hyperset import BiSoftmaxAttention, HyperSETLayer, TiedReLUFeedForward
from cemlib.layers.hyperset_variants import (DepthwiseLoRA, GatedFeedForward, LinearAttention,
                                             SigmoidAttention, SoftmaxFeedForward)
from cemlib.testing import assert_grad_matches_autograd, autograd_grad

pytestmark = pytest.mark.usefixtures("float64")


def _x(B=2, N=5, d=8, seed=0):
    return torch.randn(B, N, d, generator=torch.Generator().manual_seed(seed))


@pytest.mark.parametrize("cls", [SigmoidAttention, LinearAttention, SoftmaxFeedForward,
                                 GatedFeedForward])
@pytest.mark.parametrize("normalize", [False, True])
def test_variant_energy_grad_matches_autograd(cls, normalize):
    torch.manual_seed(0)
    layer = cls(8, 2, normalize=normalize) if "Attention" in cls.__name__ else \
        cls(8, 12, normalize=normalize)
    x = _x()
    with torch.no_grad():
        assert_grad_matches_autograd(lambda y: layer.energy(y), lambda y: layer.energy_grad(y), x)
        if not normalize:  # the unnormalised step is exactly gradient descent
            torch.testing.assert_close(layer.descent_direction(x), -layer.energy_grad(x))


def _printed_table19(kind, x, W, H=2):
    """Table 19's "-grad E_ATTN" column, transcribed (row layout)."""
    Z = hs.split_heads(x @ W, H)
    beta = 1 / math.sqrt(Z.shape[-1])
    if kind == "sigmoid":   # sum_h W_h W_h^T X sigma(1 - sigma)(beta Z^T Z)
        s = torch.sigmoid(beta * Z @ Z.transpose(-1, -2))
        out = (s * (1 - s)) @ Z
    else:                   # sum_h W_h Phi'(Z) * (beta Phi Phi^T Phi)
        P = torch.sigmoid(Z)
        out = P * (1 - P) * (beta * P @ P.transpose(-1, -2) @ P)
    return hs.merge_heads(out) @ W.T


@pytest.mark.parametrize("cls,kind", [(SigmoidAttention, "sigmoid"), (LinearAttention, "linear")])
def test_table19_minus_grad_column_is_plus_grad(cls, kind):
    torch.manual_seed(0)
    layer = cls(8, 2, normalize=False)
    x = _x()
    g = autograd_grad(lambda y: layer.energy(y), x)
    with torch.no_grad():
        printed = _printed_table19(kind, x, layer.W)
        torch.testing.assert_close(printed, g)            # printed "-grad" is +grad: sign error
        torch.testing.assert_close(layer(x, 0.1), x - 0.1 * printed)  # the step subtracts it
        e0, e1 = layer.energy(x).sum(), layer.energy(layer(x, 1e-3)).sum()
        e_bad = layer.energy(x + 1e-3 * printed).sum()   # following the table's sign ascends
    assert e1 < e0 < e_bad


def test_linear_attention_is_linear_in_sequence_length():
    """The O(N p^2) factorisation Phi (Phi^T Phi) equals (Phi Phi^T) Phi."""
    Z = _x(N=7, d=4)
    P = torch.sigmoid(Z)
    torch.testing.assert_close(P @ (P.transpose(-1, -2) @ P), (P @ P.transpose(-1, -2)) @ P)


def test_feedforward_variants_closed_forms():
    x = _x()
    torch.manual_seed(0)
    sm, gt = SoftmaxFeedForward(8, 12, normalize=False), GatedFeedForward(8, 12, normalize=False)
    with torch.no_grad():
        torch.testing.assert_close(sm.descent_direction(x), torch.softmax(x @ sm.D, -1) @ sm.D.T)
        U = x @ gt.D
        P = torch.sigmoid(U)
        gate = P.sum(-1, keepdim=True)                     # one scalar per token
        torch.testing.assert_close(gt.descent_direction(x), (gate * P * (1 - P)) @ gt.D.T)
        misread = (P * P * (1 - P)) @ gt.D.T               # a per-unit gate (GLU-like) is wrong
        g = -gt.energy_grad(x)
    assert (misread - g).norm() > 0.1 * g.norm()


def test_depthwise_lora_weights_and_parameter_count():
    d, r, L = 8, 2, 3
    torch.manual_seed(0)
    lora = DepthwiseLoRA(d, d, d, L, r)
    assert sum(p.numel() for p in lora.parameters()) == 4 * d * r * L   # G.2 / Table 5
    attn, ff = BiSoftmaxAttention(d, 2), TiedReLUFeedForward(d, d)
    layer = HyperSETLayer(attn, ff, step_size=0.2, lora=lora)
    x = _x()
    with torch.no_grad():
        W1 = attn.W + 4.0 * lora.A_W[1] @ lora.B_W[1]
        D1 = ff.D + 4.0 * lora.A_D[1] @ lora.B_D[1]
        ref = ff(attn(x, 0.2, W=W1), 0.2, D=D1)
        torch.testing.assert_close(layer(x, 1), ref)
        assert (layer(x, 0) - layer(x, 1)).norm() > 0   # iterations differ
        ea, ef = layer.energies(x, 1)
        torch.testing.assert_close(ea, attn.energy(x, W=W1))
        torch.testing.assert_close(ef, ff.energy(x, D=D1))
    with pytest.raises(ValueError, match="iterations 0..2"):
        layer(x, 3)
    with pytest.raises(ValueError, match="rank"):
        DepthwiseLoRA(d, d, d, L, 0)
