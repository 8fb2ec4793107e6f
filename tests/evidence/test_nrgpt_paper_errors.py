"""The remaining derivation problems of NRGPT (Dehmamy et al. 2025), each checked
numerically: eq. (4), the transpose in (32)-(35), eq. (37), discrete vs continuous time,
drift of x in the Jacobian's null space, the App. E.2 bound, and unboundedness without a norm.
(Eq. 12 partial gradient, FF1, eq. 24, eq. 28 and the eta = I case are in the other test files.)"""

import math

import pytest
import torch

from cemlib.energies import nrgpt as en
from cemlib.layers.gpt import GPTBlock
from cemlib.layers.nrgpt import NRGPTBlock, norm_jacobian

DT = torch.float64


def test_eq4_as_printed_drops_the_attention_residual():
    torch.manual_seed(0)
    blk = GPTBlock(8, 2).double()
    x = torch.randn(2, 5, 8, dtype=DT)
    printed = x + blk.mlp(blk.ln2(x + blk.attn(blk.ln1(x))))  # eq. (4) as printed
    a = x + blk.attn(blk.ln1(x))
    torch.testing.assert_close(blk(x), a + blk.mlp(blk.ln2(a)))
    torch.testing.assert_close(blk(x) - printed, blk.attn(blk.ln1(x)))  # exactly the missing term


def test_transpose_in_eqs_32_35_matters_for_x_dependent_eta():
    """eta = M P Gamma makes Gamma P eta PSD (chain rule of eq. 27), but not the printed
    Gamma P eta^T."""
    D = 6
    gen = torch.Generator().manual_seed(0)
    gamma = torch.tensor([0.1, 3.0, 0.2, 2.0, 0.5, 4.0], dtype=DT)
    x = torch.randn(D, generator=gen, dtype=DT)
    A = torch.randn(D, D, generator=gen, dtype=DT)
    M = A @ A.T
    r = x.var(unbiased=False).sqrt()
    GP = norm_jacobian(x, "layernorm", gamma, eps=0.0) * r  # Gamma P (exact P)
    eta = M @ (GP / gamma[:, None]) @ torch.diag(gamma)
    sym = lambda m: (m + m.T) / 2  # noqa: E731
    assert torch.linalg.eigvalsh(sym(GP @ eta)).min() > -1e-10
    assert torch.linalg.eigvalsh(sym(GP @ eta.T)).min() < -1.0


def test_eq37_needs_a_minus_sign_and_eta_inverse_transpose():
    gen = torch.Generator().manual_seed(1)
    D = 5
    dE = torch.randn(D, generator=gen, dtype=DT)
    P = norm_jacobian(torch.randn(D, generator=gen, dtype=DT), "rmsnorm", eps=0.0)
    eta = torch.randn(D, D, generator=gen, dtype=DT) + 3 * torch.eye(D, dtype=DT)  # not symmetric
    xdot = -eta @ dE
    lhs = -dE @ P @ eta @ dE
    torch.testing.assert_close(lhs, -xdot @ torch.linalg.inv(eta).T @ P @ xdot)
    assert not torch.isclose(lhs, -xdot @ torch.linalg.inv(eta) @ P @ xdot)  # eta^{-1}: wrong
    assert not torch.isclose(lhs, dE @ P @ eta @ dE)  # eq. (37)'s middle term lacks the minus


@pytest.mark.parametrize("c,monotone", [(0.01, True), (2.0, False)])
def test_prop_2_1_is_continuous_time_large_steps_break_descent(c, monotone):
    """Same model and first-token states, eta = c Gamma: small c descends at every step, c = 2
    raises E_1 at some step (the descent lemma needs c < 2/L)."""
    torch.manual_seed(1)
    b = NRGPTBlock(8, 1, ff="ff2w", rate="gamma", rate_scale=c, init_std=0.5).to(DT)
    _, E = b.run(torch.randn(4, 1, 8, dtype=DT), 30, return_energies=True)
    rises = (E[1:, :, 0] - E[:-1, :, 0]).max()  # first token: no predecessors
    assert (rises < 0) if monotone else (rises > 1e-3)


def test_x_drifts_in_the_null_space_while_g_does_not_move():
    """§2.3: the LayerNorm-invariant mean component of the step moves x but not g."""
    torch.manual_seed(0)
    b = NRGPTBlock(8, 1, rate="matrix", init_std=0.3).to(DT)
    with torch.no_grad():
        b.eta.add_(0.3 * torch.randn(8, 8, dtype=DT))
        x = torch.randn(1, 4, 8, dtype=DT)
        step = b(x) - x
        mean_part = step.mean(-1, keepdim=True).expand_as(step)
        assert mean_part.abs().min() > 1e-4
        torch.testing.assert_close(b.normalize(x + mean_part), b.normalize(x))


def test_app_e2_attention_bound_corrected():
    """g = y_hat + delta with unit y_hat: |g_A^T J g_B| <= ||J||_2 (1 + ||delta||)^2, and
    E^AT_A lies in [-(log(A-1) + b), b]. The paper's (1 + 2||delta||)||J||_2 fails."""
    gen = torch.Generator().manual_seed(0)
    D, N = 6, 7
    delta = torch.randn(D, generator=gen, dtype=DT)
    delta = 0.5 * delta / delta.norm()
    J = torch.randn(1, D, D, generator=gen, dtype=DT)
    Jn = torch.linalg.matrix_norm(J[0], 2)
    b = Jn * 1.5**2
    y = torch.randn(200, N, D, generator=gen, dtype=DT)
    g = y / y.norm(dim=-1, keepdim=True) + delta
    E = en.attention_energy(g, J, torch.ones(1, dtype=DT), beta=1.0)[:, 1:]
    logA1 = torch.log(torch.arange(1, N, dtype=DT))
    assert (E <= b).all() and (E >= -(logA1 + b)).all()
    # counterexample to the paper's bound: J = I, every y_hat parallel to delta
    g_bad = (delta / delta.norm() + delta).expand(1, N, D)
    E_bad = en.attention_energy(g_bad, torch.eye(D, dtype=DT)[None], torch.ones(1, dtype=DT), 1.0)
    assert float(g_bad[0, 0] @ g_bad[0, 1]) == pytest.approx(2.25)
    paper_b = 1 + 2 * 0.5
    assert (E_bad[0, 1:] < -(logA1 + paper_b)).all()


def test_no_normalisation_energy_is_unbounded_below():
    """Prop. 2.2 gives descent but no convergence: with g = x the energy runs to -infinity."""
    torch.manual_seed(0)
    b = NRGPTBlock(6, 1, ff="ff1", norm="none", rate="psd_skew").to(DT)
    x = torch.randn(1, 3, 6, dtype=DT)
    with torch.no_grad():
        E = torch.stack([b.energy(s * x)[0, 0] for s in (1.0, 10.0, 100.0, 1000.0)])
    assert (E[1:] < E[:-1]).all() and E[-1] < -1e3 * abs(float(E[0])) - 1.0
    assert math.isfinite(float(E[-1]))
    with torch.no_grad():  # while LayerNorm makes it scale-invariant (bounded)
        ln = NRGPTBlock(6, 1, ff="ff1", norm_eps=0.0).to(DT)
        torch.testing.assert_close(ln.energy(1000.0 * x), ln.energy(x), rtol=1e-6, atol=1e-8)
