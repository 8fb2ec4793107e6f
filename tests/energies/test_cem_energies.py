"""CEM energies: phi closed forms, interaction / element-wise gradients against autograd, and the
paper errors they expose (Appendix C convexity, missing diagonal value term, ALiBi sign)."""

import math

import pytest
import sympy
import torch
import torch.nn.functional as F

from cemlib.energies import cem
from cemlib.energies.phi import PHI, get_phi, phi_silu
from cemlib.kernels.reference import alibi_slopes
from cemlib.layers.llama import SwiGLU
from cemlib.testing import assert_grad_matches_autograd, autograd_grad


pytestmark = pytest.mark.usefixtures("float64_seeded")


# ---------------------------------------------------------------- phi = ∫ sigma (eq. 11)
@pytest.mark.parametrize("name", sorted(PHI))
def test_phi_derivatives_match_autograd(name):
    pot = get_phi(name)
    x = torch.linspace(-40, 40, 801).requires_grad_(True)
    (g,) = torch.autograd.grad(pot.phi(x).sum(), x, create_graph=True)
    (h,) = torch.autograd.grad(g.sum(), x)
    torch.testing.assert_close(g, pot.sigma(x.detach()), rtol=1e-12, atol=1e-13)
    torch.testing.assert_close(h, pot.d2(x.detach()), rtol=1e-12, atol=1e-13)


def test_phi_silu_values_and_symbolic_derivative():
    mpmath = pytest.importorskip("mpmath")
    xs = [-30.0, -3.0, 0.0, 0.5, 5.0, 30.0]
    ref = [float(mpmath.quad(lambda z: z / (1 + mpmath.exp(-z)), [-mpmath.inf, 0, v])) for v in xs]
    torch.testing.assert_close(phi_silu(torch.tensor(xs)), torch.tensor(ref), rtol=1e-14, atol=1e-15)
    assert abs(phi_silu(torch.tensor(0.0)).item() + math.pi**2 / 12) < 1e-15
    # float32 stays finite and accurate where e^x overflows
    x32 = torch.tensor([-100.0, 100.0, 1e4])
    torch.testing.assert_close(phi_silu(x32).double(), phi_silu(x32.double()), rtol=1e-6, atol=1e-30)
    # SymPy: d/dx [x log(1+e^x) + Li2(-e^x)] = x / (1 + e^{-x})
    s = sympy.symbols("x", real=True)
    phi = s * sympy.log(1 + sympy.exp(s)) + sympy.polylog(2, -sympy.exp(s))
    dphi = sympy.expand_func(sympy.diff(phi, s))
    assert sympy.simplify(dphi - s / (1 + sympy.exp(-s))) == 0


def test_phi_silu_and_gelu_are_not_convex():
    x = torch.tensor([-2.0, 0.0])
    assert (PHI["silu"].d2(x) * torch.tensor([-1.0, 1.0]) > 0).all()   # phi'' < 0 at -2, > 0 at 0
    assert abs(PHI["silu"].d2(torch.tensor(-1.27846454))) < 1e-8     # sign change at -1.2785
    assert PHI["gelu"].d2(torch.tensor(-1.5)) < 0


# ---------------------------------------------------------------- interaction energy (eq. 2)
def _attn_args(K=3, D=8, R=4, B=2, L=6):
    x, h = torch.randn(B, L, D), torch.randn(B, L, D)
    W_Q, W_K = 0.5 * torch.randn(K, R, D), 0.5 * torch.randn(K, R, D)
    return x, h, W_Q, W_K


@pytest.mark.parametrize("diag", ["none", "shared", "per_head"])
@pytest.mark.parametrize("alibi", [False, True])
@pytest.mark.parametrize("biases", [False, True])
def test_interaction_grad_matches_autograd(diag, alibi, biases):
    x, h, W_Q, W_K = _attn_args()
    K, D = W_Q.shape[0], x.shape[-1]
    kw = dict(tau=1.7, d={"none": None, "shared": torch.randn(D), "per_head": torch.randn(K, D)}[diag],
              alibi=alibi_slopes(K) if alibi else None,
              self_bias=torch.randn(K) if biases else None, cross_bias=torch.randn(K) if biases else None)
    assert_grad_matches_autograd(lambda z: cem.interaction_energy(z, h, W_Q, W_K, **kw),
                                 lambda z: cem.interaction_energy_grad(z, h, W_Q, W_K, **kw), x)
    for k in range(K):  # per-head gradients too
        g = autograd_grad(lambda z: cem.interaction_energy(z, h, W_Q, W_K, per_head=True, **kw)[:, k], x)
        torch.testing.assert_close(cem.interaction_energy_grad(x, h, W_Q, W_K, per_head=True, **kw)[:, k],
                                   g, rtol=1e-9, atol=1e-10)


def test_algorithm1_diag_form_is_not_the_gradient():
    """CEM eq. 12 in [ICLR] Algorithm 1: the update drops d_k * sum_j alpha_kij h_j; measure that."""
    x, h, W_Q, W_K = _attn_args()
    d = torch.randn(x.shape[-1])
    exact = autograd_grad(lambda z: cem.interaction_energy(z, h, W_Q, W_K, tau=2.0, d=d), x)
    paper = cem.interaction_energy_grad(x, h, W_Q, W_K, tau=2.0, d=d, diag_value_term=False)
    alpha = torch.softmax(cem.interaction_logits(x, h, W_Q, W_K, tau=2.0, d=d), -1)
    missing = d * torch.einsum("bkij,bjh->bih", alpha, h)
    torch.testing.assert_close(paper - exact, missing, rtol=1e-9, atol=1e-10)
    assert missing.norm() > 0.1 * exact.norm()


def test_one_step_is_tied_mha():
    """[arXiv] eqs. 4-5: -grad eps at x = h is MHA with W_V = W_K, W_O = W_Q, scale 1/tau."""
    K, D, R, B, L = 2, 8, 4, 2, 5
    x, h, W_Q, W_K = _attn_args(K, D, R, B, L)
    tau = math.sqrt(R)
    g = cem.interaction_energy_grad(h, h, W_Q, W_K, tau=tau)
    q = torch.einsum("krd,bld->bklr", W_Q, h)
    k = torch.einsum("krd,bld->bklr", W_K, h)
    o = F.scaled_dot_product_attention(q, k, k, is_causal=True, scale=1 / tau)
    mha = torch.einsum("bklr,krd->bld", o, W_Q)
    torch.testing.assert_close(-g, mha, rtol=1e-10, atol=1e-12)


def test_alibi_sign_arxiv_prefers_near_tokens():
    """[arXiv] bias -m_k|i-j| favours near tokens; the [ICLR] +m_k|i-j| favours the farthest."""
    K, D, L = 2, 4, 7
    x, h = torch.randn(1, L, D), torch.randn(1, L, D)
    zero = torch.zeros(K, 1, D)
    s = cem.interaction_logits(x, h, zero, zero, tau=1.0, alibi=alibi_slopes(K))
    assert (s[0, :, -1].argmax(-1) == L - 1).all()        # arXiv: the token itself
    s_iclr = cem.interaction_logits(x, h, zero, zero, tau=1.0, alibi=-alibi_slopes(K))
    assert (s_iclr[0, :, -1].argmax(-1) == 0).all()       # ICLR sign: the most distant token


def test_self_cross_bias_only_difference_matters():
    x, h, W_Q, W_K = _attn_args()
    K = W_Q.shape[0]
    b_s, b_c, c = torch.randn(K), torch.randn(K), 0.7
    e1 = cem.interaction_energy(x, h, W_Q, W_K, tau=2.0, self_bias=b_s, cross_bias=b_c)
    e2 = cem.interaction_energy(x, h, W_Q, W_K, tau=2.0, self_bias=b_s + c, cross_bias=b_c + c)
    torch.testing.assert_close(e2, e1 - 2.0 * K * c)
    g1 = cem.interaction_energy_grad(x, h, W_Q, W_K, tau=2.0, self_bias=b_s, cross_bias=b_c)
    g2 = cem.interaction_energy_grad(x, h, W_Q, W_K, tau=2.0, self_bias=b_s + c, cross_bias=b_c + c)
    torch.testing.assert_close(g1, g2)


def test_interaction_energy_is_concave_so_every_step_descends():
    """Concavity: eps(x - eta g) <= eps(x) - eta |g|^2 for every eta > 0 (CEM App. C says convex)."""
    x, h, W_Q, W_K = _attn_args()
    d = torch.randn(x.shape[-1])
    e0 = cem.interaction_energy(x, h, W_Q, W_K, tau=2.0, d=d)
    g = cem.interaction_energy_grad(x, h, W_Q, W_K, tau=2.0, d=d)
    for eta in (1e-3, 0.1, 1.0, 10.0, 100.0):
        e1 = cem.interaction_energy(x - eta * g, h, W_Q, W_K, tau=2.0, d=d)
        assert (e1 <= e0 - eta * (g * g).sum(-1) + 1e-9).all()


# ---------------------------------------------------------------- element-wise energy (eq. 7)
@pytest.mark.parametrize("phi", sorted(PHI))
def test_elementwise_grads_match_autograd(phi):
    x, gamma, V = torch.randn(2, 5, 6), torch.randn(2, 5, 9), torch.randn(9, 6)
    assert_grad_matches_autograd(lambda z: cem.elementwise_energy(z, gamma, V, phi),
                                 lambda z: cem.elementwise_energy_grad(z, gamma, V, phi), x)
    assert_grad_matches_autograd(lambda z: cem.sign_variant_energy(z, gamma, V, phi),
                                 lambda z: cem.sign_variant_energy_grad(z, gamma, V, phi), x)


@pytest.mark.parametrize("variant", ["standard", "sign"])
def test_elementwise_hessian_matches_autograd(variant):
    x, gamma, V = torch.randn(5), torch.randn(7), torch.randn(7, 5)
    fn = cem.elementwise_energy if variant == "standard" else cem.sign_variant_energy
    H = torch.autograd.functional.hessian(lambda z: fn(z, gamma, V, "silu"), x)
    torch.testing.assert_close(cem.elementwise_hessian(x, gamma, V, "silu", variant), H)


def test_appendix_c_sign_variant_is_concave_not_convex():
    """App. C claims -|gamma|^T phi(sign(gamma) V x) is convex for convex phi; it is concave."""
    V = torch.randn(12, 5)
    worst = []
    for _ in range(20):
        x, gamma = torch.randn(5), torch.randn(12)
        ev = torch.linalg.eigvalsh(cem.elementwise_hessian(x, gamma, V, "relu2", "sign"))
        worst.append((ev.max().item(), ev.min().item()))
    assert max(w[0] for w in worst) <= 1e-12          # never a positive curvature direction
    assert min(w[1] for w in worst) < -1e-3           # and strictly concave somewhere


def test_one_step_is_tied_swiglu():
    """Eq. 11: -grad xi at x = h is SwiGLU with gate (SiLU branch) = V, up = W, down = V^T."""
    D, Dv = 6, 10
    h, W, V = torch.randn(3, D), torch.randn(Dv, D), torch.randn(Dv, D)
    mlp = SwiGLU(D, Dv)
    with torch.no_grad():
        mlp.W_gate.copy_(V), mlp.W_up.copy_(W), mlp.W_down.copy_(V.T)
    torch.testing.assert_close(-cem.elementwise_energy_grad(h, h @ W.T, V), mlp(h))


def test_hopfield_quadratic_term_removes_the_residual():
    """CEM App. C (CCCP): with +|x|^2/2 a unit step gives H^T softmax(H x) (no residual)."""
    x, H = torch.randn(4, 5), torch.randn(7, 5)
    g = autograd_grad(lambda z: cem.hopfield_energy(z, H, quadratic=True), x)
    torch.testing.assert_close(x - g, torch.softmax(x @ H.T, -1) @ H)
    g0 = autograd_grad(lambda z: cem.hopfield_energy(z, H, quadratic=False), x)
    torch.testing.assert_close(x - g0, x + torch.softmax(x @ H.T, -1) @ H)


def test_bad_input_errors():
    x, h, W_Q, W_K = _attn_args()
    with pytest.raises(ValueError, match="W_Q and W_K"):
        cem.interaction_energy(x, h, W_Q, W_K[:, :, :-1], tau=1.0)
    with pytest.raises(ValueError, match=r"x and h"):
        cem.interaction_energy(x, h[:, :-1], W_Q, W_K, tau=1.0)
    with pytest.raises(ValueError, match=r"d must have shape"):
        cem.interaction_energy(x, h, W_Q, W_K, tau=1.0, d=torch.randn(5, x.shape[-1]))
    with pytest.raises(ValueError, match="gamma"):
        cem.elementwise_energy(torch.randn(3, 4), torch.randn(3, 5), torch.randn(6, 4))
    with pytest.raises(ValueError, match="unknown phi"):
        get_phi("tanh")
    with pytest.raises(ValueError, match="variant"):
        cem.elementwise_hessian(torch.randn(4), torch.randn(6), torch.randn(6, 4), variant="x")


def test_rope_interaction_gradient_values_are_rotated_keys():
    """Appendix B with RoPE: grad = -W_Q^T R(i)^T sum_j alpha R(j) k_j (our computation): the
    aggregated values R(j) k_j do not depend on the query position, contrary to the paper's
    memory argument."""
    x, h, W_Q, W_K = _attn_args(R=4)
    kw = dict(tau=2.0, d=torch.randn(x.shape[-1]), alibi=alibi_slopes(3), rope=True)
    assert_grad_matches_autograd(lambda z: cem.interaction_energy(z, h, W_Q, W_K, **kw),
                                 lambda z: cem.interaction_energy_grad(z, h, W_Q, W_K, **kw), x)
    # RoPE really changes the energy (it is not silently ignored)
    kw.pop("rope")
    assert (cem.interaction_energy(x, h, W_Q, W_K, **kw)
            - cem.interaction_energy(x, h, W_Q, W_K, rope=True, **kw)).abs().max() > 1e-3


def test_classical_hopfield_energy_gradient():
    x, H = torch.randn(3, 5), torch.randn(4, 5)
    torch.testing.assert_close(autograd_grad(lambda z: cem.classical_hopfield_energy(z, H), x),
                               -(x @ H.T) @ H)
