"""Layer arguments that used to be accepted silently: step sizes eta that are NaN, Inf or negative,
negative (or non-finite) normalisation epsilons, negative fixed Hyper-SET step sizes; and inputs
that used to fail with raw errors (an empty sequence into NRGPTBlock, a wrong width into the
single-head Helmholtz / Newton layers). The checks run where the argument arrives (``__init__``),
so the forward pass costs nothing more."""

import math

import pytest
import torch

from cemlib.layers.blocks import LlamaBlock
from cemlib.layers.cem_attention import CEMAttention
from cemlib.layers.cem_mlp import CEMMLP
from cemlib.layers.helmholtz import LinearAttentionStep, MeanShiftAttentionStep, SoftmaxAttentionStep
from cemlib.layers.hyperset import BiSoftmaxAttention, HyperSETLayer, TiedReLUFeedForward
from cemlib.layers.hyperset_variants import SigmoidAttention, SoftmaxFeedForward
from cemlib.layers.newton import MHA2nd, Att2nd, Att2nd1st
from cemlib.layers.norm import RMSNorm
from cemlib.layers.nrgpt import NRGPTBlock
from cemlib.layers.reuse import ResidualSublayer
from cemlib.models.hyperset import HyperSETModel
from cemlib.models.lm import LMConfig

BAD_STEPS = [float("nan"), float("inf"), -float("inf"), -0.5]
BAD_EPS = [-1e-6, float("nan"), float("inf")]

STEP_LAYERS = {
    "CEMAttention": lambda eta: CEMAttention(8, 2, eta=eta),
    "CEMAttention(learn_eta)": lambda eta: CEMAttention(8, 2, eta=eta, learn_eta=True),
    "CEMMLP": lambda eta: CEMMLP(8, 16, eta=eta),
    "CEMMLP(learn_eta)": lambda eta: CEMMLP(8, 16, eta=eta, learn_eta=True),
    "SoftmaxAttentionStep": lambda eta: SoftmaxAttentionStep(4, eta=eta),
    "MeanShiftAttentionStep": lambda eta: MeanShiftAttentionStep(4, eta=eta),
    "LinearAttentionStep": lambda eta: LinearAttentionStep(4, eta=eta),
    "Att2nd": lambda eta: Att2nd(4, eta=eta),
    "Att2nd1st": lambda eta: Att2nd1st(4, eta=eta),
    "MHA2nd": lambda eta: MHA2nd(8, 2, eta=eta),
    "LMConfig.eta_attn": lambda eta: LMConfig(10, 8, 8, 1, 2, attn="cem", mlp="cem", eta_attn=eta),
    "LMConfig.eta_mlp": lambda eta: LMConfig(10, 8, 8, 1, 2, attn="cem", mlp="cem", eta_mlp=eta),
}


@pytest.mark.parametrize("bad", BAD_STEPS, ids=repr)
@pytest.mark.parametrize("name", list(STEP_LAYERS))
def test_step_sizes_must_be_finite_and_nonnegative(name, bad):
    with pytest.raises(ValueError, match=r"eta(_attn|_mlp)? must be a finite step size >= 0"):
        STEP_LAYERS[name](bad)


@pytest.mark.parametrize("name", list(STEP_LAYERS))
def test_zero_and_positive_step_sizes_are_accepted(name):
    STEP_LAYERS[name](0.0)
    STEP_LAYERS[name](0.7)


@pytest.mark.parametrize("bad", [-0.1, float("nan"), float("inf")], ids=repr)
def test_fixed_hyperset_step_size_must_be_nonnegative(bad):
    with pytest.raises(ValueError, match="step_size must be a finite step size >= 0"):
        HyperSETLayer(BiSoftmaxAttention(8, 2), TiedReLUFeedForward(8), step_size=bad)
    with pytest.raises(ValueError, match="step_size must be a finite step size >= 0"):
        HyperSETModel(d=8, n_heads=2, n_iter=2, n_classes=3, n_positions=4, vocab_size=5, step_size=bad)
    HyperSETLayer(BiSoftmaxAttention(8, 2), TiedReLUFeedForward(8), step_size=0.25)  # fine


EPS_LAYERS = {
    "RMSNorm": lambda e: RMSNorm(8, eps=e),
    "CEMAttention": lambda e: CEMAttention(8, 2, norm_eps=e),
    "CEMMLP": lambda e: CEMMLP(8, 16, norm_eps=e),
    "LlamaBlock": lambda e: LlamaBlock(8, 2, 16, norm_eps=e),
    "ResidualSublayer": lambda e: ResidualSublayer(torch.nn.Identity(), 8, e),
    "NRGPTBlock": lambda e: NRGPTBlock(8, 2, norm_eps=e),
    "LMConfig": lambda e: LMConfig(10, 8, 8, 1, 2, norm_eps=e),
    "BiSoftmaxAttention": lambda e: BiSoftmaxAttention(8, 2, eps=e),
    "TiedReLUFeedForward": lambda e: TiedReLUFeedForward(8, eps=e),
    "SigmoidAttention": lambda e: SigmoidAttention(8, 2, eps=e),
    "SoftmaxFeedForward": lambda e: SoftmaxFeedForward(8, eps=e),
}


@pytest.mark.parametrize("bad", BAD_EPS, ids=repr)
@pytest.mark.parametrize("name", list(EPS_LAYERS))
def test_norm_eps_must_be_finite_and_nonnegative(name, bad):
    with pytest.raises(ValueError, match=r"(norm_)?eps.* must be a finite number >= 0"):
        EPS_LAYERS[name](bad)


@pytest.mark.parametrize("name", list(EPS_LAYERS))
def test_zero_norm_eps_is_accepted(name):
    EPS_LAYERS[name](0.0)


def test_checks_keep_the_stored_values():
    """Validation only: the layers hold exactly what they were given (numbers unchanged)."""
    assert CEMAttention(8, 2, eta=0.3).eta == 0.3 and CEMMLP(8, 16, eta=2).eta == 2.0
    assert RMSNorm(8, eps=0).eps == 0 and NRGPTBlock(8, 2, norm_eps=1e-5).norm_eps == 1e-5
    assert math.isclose(SoftmaxAttentionStep(4, eta=0.25).eta, 0.25)


def test_nrgpt_block_rejects_an_empty_sequence():
    b = NRGPTBlock(8, 2)
    with pytest.raises(ValueError, match=r"x is an empty sequence \(shape \(2, 0, 8\)\)"):
        b(torch.randn(2, 0, 8))
    with pytest.raises(ValueError, match="empty sequence"):
        b.energy(torch.randn(0, 8))


@pytest.mark.parametrize("cls", [SoftmaxAttentionStep, MeanShiftAttentionStep, LinearAttentionStep,
                                 Att2nd, Att2nd1st])
def test_single_head_layers_name_a_wrong_width(cls):
    m = cls(4)
    with pytest.raises(ValueError, match=rf"width mismatch: {cls.__name__} has d=4, but z has shape "
                                         r"\(2, 5\) \(last dimension must be 4\)"):
        m(torch.randn(2, 5), torch.randn(2, 3, 5))
    with pytest.raises(ValueError, match=r"but h has shape \(2, 3, 5\)"):
        m(torch.randn(2, 4), torch.randn(2, 3, 5))
    assert m(torch.randn(2, 4), torch.randn(2, 3, 4)).shape == (2, 4)
