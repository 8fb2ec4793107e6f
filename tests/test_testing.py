"""cemlib.testing: the kernel-against-reference check of chapter 11 passes a correct
implementation, and fails one that is wrong in its forward or in one gradient."""

import pytest
import torch

from cemlib.kernels import attention_torch, reference
from cemlib.testing import float64_errors, outputs_and_grads, within_tolerance
from cemlib.testing import max_relative_error as relative_error


def _inputs(dtype, seed=0, B=1, K=2, L=9, D=4, De=6):
    g = torch.Generator().manual_seed(seed)
    rnd = lambda *s: torch.randn(*s, generator=g, dtype=torch.float64).to(dtype)  # noqa: E731
    inputs = dict(q=rnd(B, K, L, D), kv=rnd(B, K, L, D), self_bias=rnd(K), cross_bias=rnd(K),
                  q_extra=rnd(B, L, De), k_extra=rnd(B, L, De))
    kw = dict(scale=0.37, alibi=reference.alibi_slopes(K).to(dtype), extra_values=True,
              extra_head_sum=True)
    return inputs, kw


def test_a_correct_implementation_passes_in_float32():
    inputs, kw = _inputs(torch.float32)
    err, err_ref = float64_errors(attention_torch.tied_attention, reference.tied_attention,
                                  inputs, **kw)
    assert err < 1e-5 and err_ref < 1e-5
    assert within_tolerance(err, err_ref, torch.float32)


def test_a_wrong_forward_or_gradient_fails():
    inputs, kw = _inputs(torch.float32)

    def scaled(**a):                       # a forward 0.1 % off
        o, lse, oe = reference.tied_attention(**a)
        return o * 1.001, lse, oe

    err, err_ref = float64_errors(scaled, reference.tied_attention, inputs, **kw)
    assert not within_tolerance(err, err_ref, torch.float32)

    class _WrongGrad(torch.autograd.Function):   # the identity, with a gradient 1 % too large
        @staticmethod
        def forward(ctx, x):
            return x.view_as(x)

        @staticmethod
        def backward(ctx, g):
            return 1.01 * g

    def wrong_kv_grad(**a):
        return reference.tied_attention(**{**a, "kv": _WrongGrad.apply(a["kv"])})

    err, err_ref = float64_errors(wrong_kv_grad, reference.tied_attention, inputs, **kw)
    assert err > 5e-3 and not within_tolerance(err, err_ref, torch.float32)


def test_half_precision_criterion_and_inputs_untouched():
    inputs, kw = _inputs(torch.float16)
    before = {k: v.clone() for k, v in inputs.items()}
    err, err_ref = float64_errors(reference.tied_attention, reference.tied_attention, inputs, **kw)
    assert err == err_ref and within_tolerance(err, err_ref, torch.float16)
    assert not within_tolerance(3 * err_ref + 2e-3, err_ref, torch.float16)
    assert all(torch.equal(before[k], v) and v.grad is None for k, v in inputs.items())


def test_every_input_must_get_a_gradient():
    inputs, kw = _inputs(torch.float64)
    with pytest.raises(ValueError, match="no gradient reached"):
        outputs_and_grads(lambda **a: reference.tied_attention(**{**a, "kv": a["kv"].detach()}),
                          inputs, **kw)
    with pytest.raises(ValueError, match="shapes differ"):
        relative_error(torch.zeros(2), torch.zeros(3))
    with pytest.raises(ValueError, match="no tolerance"):
        within_tolerance(0.0, 0.0, torch.int32)
