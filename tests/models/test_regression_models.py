"""MLPRegressor (CEM [ICLR] Table 3 models): parameter counts, the CEM-T block as T closed-form
steps, equivalence with a tied SwiGLU at T = 1, and FLOPs affine in T."""

import pytest
import torch
import torch.nn.functional as F

from cemlib.layers.cem_mlp import CEMMLP
from cemlib.kernels.costs import count_flops
from cemlib.models.regression import MLPRegressor, regressor_matmul_flops

f64 = torch.float64


def n_params(m):
    return sum(p.numel() for p in m.parameters())


def block_weights(m):
    return sum(p.numel() for n, p in m.blocks.named_parameters() if p.dim() == 2)


@pytest.mark.parametrize("d,d_ff", [(64, 172), (64, 170), (32, 48)])
def test_cem_block_weights_are_two_thirds_of_gated(d, d_ff):
    gated = MLPRegressor(10, 1, d, d_ff, "gated")
    cem = MLPRegressor(10, 1, d, d_ff, "cem", T=4)
    assert block_weights(gated) == 3 * d * d_ff and block_weights(cem) == 2 * d * d_ff
    assert 3 * block_weights(cem) == 2 * block_weights(gated)
    # the parameter count does not depend on T (recursion adds no parameters)
    assert n_params(cem) == n_params(MLPRegressor(10, 1, d, d_ff, "cem", T=1))


def test_table3_parameter_counts():
    # d_model 64, d_ff 170, 10 inputs: Table 3's 33.94K (gated), 22.66K (CEM), 33.98K (plain, d_ff 256)
    assert n_params(MLPRegressor(10, 1, 64, 170, "gated", bias=True)) == 33_941
    assert n_params(MLPRegressor(10, 1, 64, 170, "cem", T=8)) == 22_657
    assert n_params(MLPRegressor(10, 1, 64, 256, "plain")) == 33_985
    with pytest.raises(ValueError, match="bias"):
        MLPRegressor(10, 1, 64, 170, "cem", bias=True)


@pytest.mark.parametrize("T", [1, 2, 5])
def test_cem_block_is_T_closed_form_steps(T):
    torch.manual_seed(0)
    m = MLPRegressor(10, 1, 16, 24, "cem", T=T).to(f64)
    with torch.no_grad():
        for p in m.parameters():
            p.normal_(0, 0.4)  # large enough that every step moves the state
    blk = m.blocks[0]
    assert isinstance(blk, CEMMLP)
    x = torch.randn(7, 10, dtype=f64)

    def rms(v, g):
        return v / v.pow(2).mean(-1, keepdim=True).add(blk.norm.eps).sqrt() * g

    h = m.inp(x)
    gamma = rms(h, blk.norm.weight) @ blk.W.T          # computed once from the block input
    s = h
    for _ in range(T):
        s = s + (gamma * F.silu(rms(s, blk.norm.weight) @ blk.V.T)) @ blk.V
    want = m.out(rms(s, m.norm.weight))
    assert torch.allclose(m(x), want, rtol=1e-12, atol=1e-12)
    # and each extra step changes the output (the recursion is not a no-op)
    if T > 1:
        m2 = MLPRegressor(10, 1, 16, 24, "cem", T=T - 1).to(f64)
        m2.load_state_dict(m.state_dict())
        assert not torch.allclose(m2(x), m(x), atol=1e-6)


def test_cem_T1_is_a_tied_gated_block():
    torch.manual_seed(1)
    cem = MLPRegressor(10, 1, 16, 24, "cem", T=1).to(f64)
    gated = MLPRegressor(10, 1, 16, 24, "gated").to(f64)
    with torch.no_grad():
        for p in cem.parameters():
            p.normal_(0, 0.3)
        gated.inp.load_state_dict(cem.inp.state_dict())
        gated.out.load_state_dict(cem.out.state_dict())
        gated.norm.load_state_dict(cem.norm.state_dict())
        b, c = gated.blocks[0], cem.blocks[0]
        b.norm.weight.copy_(c.norm.weight)
        b.mlp.W_gate.copy_(c.V)        # SiLU branch: V
        b.mlp.W_up.copy_(c.W)          # linear branch: W
        b.mlp.W_down.copy_(c.V.T)      # down projection: V^T
    x = torch.randn(9, 10, dtype=f64)
    assert torch.allclose(cem(x), gated(x), rtol=1e-12, atol=1e-13)


def test_flops_affine_in_T_and_closed_form():
    x = torch.randn(100, 10)
    counted = {}
    for T in (1, 2, 3, 4, 8):
        m = MLPRegressor(10, 1, 64, 170, "cem", T=T)
        counted[T] = count_flops(lambda: m(x))
        assert counted[T] == regressor_matmul_flops(10, 64, 170, "cem", T, batch=100)
    step = counted[2] - counted[1]
    assert step == 2 * 2 * 64 * 170 * 100          # V u and V^T(.) per step, 2 FLOPs per multiply-add
    for T in (3, 4, 8):
        assert counted[T] == counted[1] + (T - 1) * step
    gated = count_flops(lambda: MLPRegressor(10, 1, 64, 170, "gated", bias=True)(x))
    assert gated == counted[1]                      # CEM-T1 costs the gated block's FLOPs
    assert 3 * step == 2 * (gated - regressor_matmul_flops(10, 64, 170, "gated", batch=100)
                            + 3 * 2 * 64 * 170 * 100)  # an extra step is 2/3 of the gated block's matmuls
    plain = count_flops(lambda: MLPRegressor(10, 1, 64, 256, "plain")(x))
    assert plain == regressor_matmul_flops(10, 64, 256, "plain", batch=100)
    with pytest.raises(ValueError, match="mlp"):
        regressor_matmul_flops(10, 64, 170, "moe")
