"""NRGPT paper errors (Dehmamy et al. 2025) that no other test file shows, each checked in float64.

The full list of items, and which test shows each one, is the registry ``cemlib.evidence.errata``, rendered
and proved by the book's appendix ``book/errata.ipynb``.
Here: the literal strict-mask energy of the first token (eq. 3), the ``log(A-1)`` of eqs. (42)-(43),
the App. E.2 norm and sign slips and the FF bound (48), the "< 0" of Prop. 2.1 (it is "<= 0"),
absorbing ``gamma`` into ``J`` (§2.3), and App. D's sign of the FF1 energy.
Equation numbers are the paper's.
"""

import math

import pytest
import torch

from cemlib.energies import nrgpt as en
from cemlib.layers.nrgpt import norm_jacobian

pytestmark = pytest.mark.usefixtures("float64")


def _gen(seed=0):
    return torch.Generator().manual_seed(seed)


def test_eq3_strict_mask_literal_first_token_energy_is_infinite():
    """Eq. (3)/(11) with B < A: for A = 1 the sum is empty, so -(1/beta) log 0 = +inf, and so is
    any total sum_A E_A. cemlib's convention (as the authors' code) is E^AT_1 = 0."""
    D, N, beta = 4, 3, 0.5
    g = torch.randn(N, D, generator=_gen())
    J = torch.randn(1, D, D, generator=_gen(1))
    s = beta * torch.einsum("bi,ij,aj->ab", g, J[0], g)  # s[A, B] = beta g_B^T J g_A
    strict = torch.ones(N, N, dtype=torch.bool).tril(-1)
    literal = -torch.logsumexp(s.masked_fill(~strict, float("-inf")), -1) / beta
    assert literal[0] == math.inf and torch.isfinite(literal[1:]).all()
    assert literal.sum() == math.inf
    ours = en.attention_energy(g, J, torch.ones(1), beta, "strict")
    assert ours[0] == 0
    torch.testing.assert_close(ours[1:], literal[1:])


def test_eqs_42_43_the_log_count_is_log_A_minus_1():
    """With the strict mask token A has A - 1 keys, so LSE <= max + log(A - 1), with equality when
    all scores are equal; the paper's log A is never attained."""
    D, N = 5, 6
    u = torch.randn(D, generator=_gen())
    g = (u / u.norm()).expand(N, D)  # identical tokens: equal scores s = g^T g = 1
    E = en.attention_energy(g, torch.eye(D)[None], torch.ones(1), 1.0, "strict")[1:]
    A = torch.arange(2, N + 1, dtype=torch.float64)
    torch.testing.assert_close(-E, 1.0 + torch.log(A - 1))  # LSE = max + log(A-1), attained
    assert (-E < 1.0 + torch.log(A) - 0.1).all()


def test_app_e2_norm_of_g_keeps_the_delta_squared_term():
    """g = y_hat + delta with unit y_hat: ||g||^2 = 1 + 2 delta.y_hat + ||delta||^2. (41) drops
    ||delta||^2, and its upper bound 1 + 2||delta|| fails for y_hat parallel to delta."""
    d = torch.randn(6, generator=_gen())
    delta = 0.5 * d / d.norm()
    y = torch.randn(100, 6, generator=_gen(1))
    y = y / y.norm(dim=-1, keepdim=True)
    g = y + delta
    torch.testing.assert_close(g.pow(2).sum(-1), 1 + 2 * y @ delta + 0.25)
    g_par = delta / delta.norm() + delta
    assert g_par.pow(2).sum() == pytest.approx(2.25) and 2.25 > 1 + 2 * 0.5


def test_app_e2_eq42_drops_the_minus_one_over_beta_prefactor():
    """(42) writes E^AT_A = log sum exp(...); eq. (11) is -(1/beta) log sum exp(beta ...). At
    beta = 1 they differ by the sign: for well-aligned tokens (11) is negative, (42) positive."""
    D, N = 4, 5
    g = torch.randn(N, D, generator=_gen()) * 0.1 + 1.0  # all roughly aligned with 1
    J = torch.eye(D)[None]
    E11 = en.attention_energy(g, J, torch.ones(1), 1.0, "strict")[1:]
    s = g @ g.T
    E42 = torch.stack([torch.logsumexp(s[a, :a], -1) for a in range(1, N)])
    torch.testing.assert_close(E11, -E42)
    assert (E11 < 0).all() and (E42 > 0).all()


def test_app_e2_eq48_ff_upper_bound():
    """FF1 with ReLU (L = 1, sigma(0) = 0): E^FF = -||relu(W g)||^2 lies in
    [-(||W||_2 (1 + ||delta||))^2, 0]. The paper's upper bound (48) equals its lower bound here,
    so it claims E^FF = -(||W||_2 (1+||delta||))^2 for every g; random samples violate it."""
    D, M = 6, 10
    W = torch.randn(M, D, generator=_gen()) / math.sqrt(D)
    d = torch.randn(D, generator=_gen(1))
    delta = 0.3 * d / d.norm()
    y = torch.randn(500, D, generator=_gen(2))
    g = y / y.norm(dim=-1, keepdim=True) + delta
    E = en.ff1_energy(g, W, "relu")
    b = (torch.linalg.matrix_norm(W, 2) * 1.3) ** 2
    assert (E >= -b - 1e-12).all() and (E <= 0).all()       # corrected interval
    paper_upper = -(0.0 - 1.0 * torch.linalg.matrix_norm(W, 2) * 1.3) ** 2
    assert (E > paper_upper + 1e-3).float().mean() > 0.9     # (48)'s upper bound fails


@pytest.mark.parametrize("norm,null", [("rmsnorm", "y"), ("layernorm", "ones")])
def test_prop_2_1_rate_is_zero_not_negative_in_the_jacobian_null_space(norm, null):
    """First-order rate with eta = c Gamma: dE_A = -c v^T (dg/dx) Gamma v <= 0, and = 0 whenever
    Gamma v is a null vector of P_A (x_A itself, or 1 for LayerNorm): "< 0" should read "<= 0"."""
    D, c = 6, 0.7
    gamma = torch.tensor([0.5, 1.0, 2.0, 3.0, 0.1, 1.5])
    x = torch.randn(D, generator=_gen())
    Jg = norm_jacobian(x, norm, gamma, eps=0.0)          # dg/dx, rows = dg_i
    rate = lambda v: -c * v @ Jg @ (gamma * v)  # noqa: E731   v^T (dg/dx)(-eta v), eta = c Gamma
    for v in torch.randn(20, D, generator=_gen(1)):
        assert rate(v) < 0
    n = x if null == "y" else torch.ones(D)
    assert abs(float(rate(n / gamma))) < 1e-12  # Gamma v = null vector: no change at first order


def test_absorbing_gamma_into_J_turns_eta_identity_into_eta_gamma():
    """§2.3: with g = Gamma y, E(g; J) = E(y; Gamma J Gamma), but dE/dy = Gamma dE/dg. A step with
    eta = I in the absorbed variables is eta = Gamma in the original ones: not the same update."""
    D, N, H, beta = 5, 4, 2, 0.7
    gamma = torch.tensor([0.3, 1.0, 2.5, 0.8, 1.7])
    y = torch.randn(N, D, generator=_gen())
    J = torch.randn(H, D, D, generator=_gen(1)) / math.sqrt(D)
    alpha = torch.ones(H)
    Jabs = gamma[:, None] * J * gamma  # Gamma J_h Gamma
    g = y * gamma
    torch.testing.assert_close(en.attention_energy(y, Jabs, alpha, beta),
                               en.attention_energy(g, J, alpha, beta))
    v_g = en.attention_query_grad(g, J, alpha, beta)
    v_y = en.attention_query_grad(y, Jabs, alpha, beta)
    torch.testing.assert_close(v_y, v_g * gamma)              # = Gamma dE/dg: eta = Gamma
    assert (v_y - v_g).norm() > 0.1 * v_g.norm()              # not eta = I


def test_app_d_ff1_energy_without_minus_flips_the_update():
    """App. D writes E^FF = +||sigma(W g)||^2; §3 has the minus. Only the minus gives the MLP
    update +2 W^T[sigma sigma'] (for ReLU: twice W^T relu(W g)); App. D's sign gives the
    negative."""
    D, M = 5, 8
    g = torch.randn(3, D, generator=_gen())
    W = torch.randn(M, D, generator=_gen(1)) / math.sqrt(D)
    for act in ("relu", "gelu"):
        update_main = -en.ff1_grad(g, W, act)                      # -dE/dg, E = -||sigma||^2
        gq = g.clone().requires_grad_(True)
        (dD,) = torch.autograd.grad(-en.ff1_energy(gq, W, act).sum(), gq)  # E = +||sigma||^2
        torch.testing.assert_close(-dD, -update_main)              # App. D: the opposite update
        assert update_main.norm() > 1e-3
    torch.testing.assert_close(-en.ff1_grad(g, W, "relu"), 2 * torch.relu(g @ W.T) @ W)
