"""The kernel contract (reference functions) and the dispatch switch; no Triton needed."""

import importlib.util
import math
import warnings

import pytest
import torch

from cemlib.kernels import dispatch, reference


@pytest.fixture(autouse=True)
def _restore_backend():
    yield
    dispatch.set_backend(None)


def brute_force_attention(q, kv, scale, alibi, self_bias, cross_bias, q_extra, k_extra):
    """The book's formula, one (batch, head, query) at a time, in float64."""
    B, K, L, _ = q.shape
    o = torch.zeros_like(q)
    lse = torch.zeros(B, K, L, dtype=q.dtype)
    oe = torch.zeros(B, K, L, k_extra.shape[-1], dtype=q.dtype)
    for b in range(B):
        for k in range(K):
            qe = q_extra[b] if q_extra.dim() == 3 else q_extra[b, k]
            for i in range(L):
                s = torch.stack([scale * (q[b, k, i] @ kv[b, k, j] + qe[i] @ k_extra[b, j])
                                 - alibi[k] * (i - j)
                                 + (self_bias[k] if i == j else cross_bias[k])
                                 for j in range(i + 1)])
                p = torch.softmax(s, 0)
                o[b, k, i] = p @ kv[b, k, : i + 1]
                oe[b, k, i] = p @ k_extra[b, : i + 1]
                lse[b, k, i] = torch.logsumexp(s, 0)
    return o, lse, oe


@pytest.mark.parametrize("per_head", [False, True])
def test_reference_attention_is_the_formula(per_head):
    g = torch.Generator().manual_seed(0)
    B, K, L, D, De = 2, 3, 7, 4, 5
    q, kv = torch.randn(2, B, K, L, D, generator=g, dtype=torch.float64)
    qe = torch.randn(*((B, K, L, De) if per_head else (B, L, De)), generator=g, dtype=torch.float64)
    ke = torch.randn(B, L, De, generator=g, dtype=torch.float64)
    al, sb, cb = reference.alibi_slopes(K), torch.randn(K, generator=g, dtype=torch.float64), \
        torch.randn(K, generator=g, dtype=torch.float64)
    got = reference.tied_attention(q, kv, scale=0.4, alibi=al, self_bias=sb, cross_bias=cb,
                                   q_extra=qe, k_extra=ke, extra_values=True)
    want = brute_force_attention(q, kv, 0.4, al, sb, cb, qe, ke)
    for a, b in zip(got, want):
        torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-12)


def test_energy_gradient_is_minus_the_attention_output():
    """d(-tau lse_i)/dq_i = -o_i and d(-tau lse_i)/dqe_i = -o_extra_i (scale = 1/tau): the saved
    LSE is the energy whose gradient the kernel's output is (CEM [arXiv] eq. 3 = [ICLR] eq. 2)."""
    g = torch.Generator().manual_seed(1)
    tau = 2.5
    q, kv = torch.randn(2, 1, 2, 6, 3, generator=g, dtype=torch.float64)
    qe = torch.randn(1, 2, 6, 4, generator=g, dtype=torch.float64).requires_grad_()
    ke = torch.randn(1, 6, 4, generator=g, dtype=torch.float64)
    q.requires_grad_()
    o, lse, oe = reference.tied_attention(q, kv, scale=1 / tau, alibi=reference.alibi_slopes(2),
                                          q_extra=qe, k_extra=ke, extra_values=True)
    gq, gqe = torch.autograd.grad((-tau * lse).sum(), (q, qe))
    torch.testing.assert_close(gq, -o.detach(), rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(gqe, -oe.detach(), rtol=1e-12, atol=1e-12)


def test_alibi_slopes():
    torch.testing.assert_close(reference.alibi_slopes(8),
                               torch.tensor([2.0 ** -(k + 1) for k in range(8)], dtype=torch.float64))
    s12 = reference.alibi_slopes(12)  # K = 12 (the paper's 108M-162M models) is not 2^-k
    assert s12.shape == (12,) and bool((s12 > 0).all()) and len(set(s12.tolist())) == 12
    assert not torch.allclose(s12, torch.tensor([2.0 ** -(k + 1) for k in range(12)],
                                                dtype=torch.float64))
    bias = reference.attention_bias(5, 12, alibi=s12, dtype=torch.float64)
    assert bool((bias[:, 4, :4].diff(dim=-1) > 0).all())  # nearer keys get the larger logit


def test_dplr_reference_is_the_dense_matrix_and_not_positive_definite():
    """CEM eq. 13; [ICLR] claims softplus makes P positive definite. It does not: rank 1,
    u = -v gives the eigenvalue softplus(d) - 2|u|^2 < 0 along u."""
    g = torch.Generator().manual_seed(2)
    Dh, R = 6, 2
    d = torch.randn(Dh, generator=g, dtype=torch.float64)
    U, V = torch.randn(2, Dh, R, generator=g, dtype=torch.float64)
    x = torch.randn(4, 3, Dh, generator=g, dtype=torch.float64)
    P = torch.diag(torch.nn.functional.softplus(d)) + U @ V.T + V @ U.T
    torch.testing.assert_close(reference.dplr_precondition(x, d, U, V), x @ P.T)
    torch.testing.assert_close(P, P.T)
    u = torch.zeros(Dh, 1, dtype=torch.float64)
    u[0] = 1.0
    P_bad = torch.diag(torch.nn.functional.softplus(torch.zeros(Dh, dtype=torch.float64))) \
        - 2 * u @ u.T
    eig_min = torch.linalg.eigvalsh(P_bad).min().item()
    assert eig_min == pytest.approx(math.log(2) - 2, abs=1e-12) and eig_min < 0
    torch.testing.assert_close(reference.dplr_precondition(u.T, torch.zeros(Dh, dtype=torch.float64),
                                                           u, -u), (u.T @ P_bad))


def test_backend_switch_and_env_var(monkeypatch):
    monkeypatch.delenv(dispatch.ENV_VAR, raising=False)
    assert dispatch.get_backend() == "auto"
    monkeypatch.setenv(dispatch.ENV_VAR, "reference")
    assert dispatch.get_backend() == "reference"
    dispatch.set_backend("triton")
    assert dispatch.get_backend() == "triton"  # set_backend wins over the environment
    with dispatch.use_backend("auto"):
        assert dispatch.get_backend() == "auto"
    assert dispatch.get_backend() == "triton"
    dispatch.set_backend(None)
    assert dispatch.get_backend() == "reference"
    with pytest.raises(ValueError, match="backend must be one of"):
        dispatch.set_backend("cuda")
    monkeypatch.setenv(dispatch.ENV_VAR, "fast")
    with pytest.raises(ValueError, match="CEMLIB_KERNELS"):
        dispatch.get_backend()


def _attn_inputs(B=1, K=2, L=5, D=3):
    g = torch.Generator().manual_seed(3)
    return torch.randn(2, B, K, L, D, generator=g)


def test_auto_on_cpu(monkeypatch):
    """On the CPU "auto" gives attention to the closed-form path (the reference's values; its
    own tests are in test_kernels_torch.py) and the MLP step and preconditioner to the
    reference."""
    monkeypatch.delenv(dispatch.ENV_VAR, raising=False)
    q, kv = _attn_inputs()
    al = reference.alibi_slopes(2)
    for got, want in zip(dispatch.tied_attention(q, kv, scale=0.5, alibi=al),
                         reference.tied_attention(q, kv, scale=0.5, alibi=al)):
        torch.testing.assert_close(got, want, rtol=1e-6, atol=1e-6)
    u, V, gam = torch.randn(4, 6), torch.randn(5, 6), torch.randn(4, 5)
    assert torch.equal(dispatch.tied_gated_mlp_step(u, V, gam),
                       reference.tied_gated_mlp_step(u, V, gam))
    d, U, W = torch.randn(6), torch.randn(6, 2), torch.randn(6, 2)
    assert torch.equal(dispatch.dplr_precondition(u, d, U, W),
                       reference.dplr_precondition(u, d, U, W))


def test_forced_triton_on_cpu_needs_the_interpreter(monkeypatch):
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    q, kv = _attn_inputs()
    dispatch.set_backend("triton")
    with pytest.raises(RuntimeError, match="TRITON_INTERPRET=1"):
        dispatch.tied_attention(q, kv, scale=1.0)
    monkeypatch.setattr(dispatch, "triton_available", lambda: False)
    with pytest.raises(RuntimeError, match="triton is not installed"):
        dispatch.tied_gated_mlp_step(torch.randn(2, 3), torch.randn(4, 3), torch.randn(2, 4))


def test_triton_is_looked_up_once_not_at_every_call(monkeypatch):
    """The layers ask :func:`dispatch.triton_available` at every attention and MLP call, also
    while ``torch.compile`` traces them; ``importlib.util.find_spec`` is a function dynamo refuses
    to trace (torch 2.11 broke a compiled CEM model's graph there at every call: 10 breaks in
    the H100 train-step run). The answer is looked up once, at import. Failing input: a
    ``triton_available`` that calls ``find_spec`` (the call is recorded here)."""
    calls = []
    monkeypatch.setattr(importlib.util, "find_spec", lambda *a, **k: calls.append(a))
    answers = {dispatch.triton_available() for _ in range(3)}
    assert calls == [] and len(answers) == 1


class _OnCuda:
    """Stands in for a CUDA tensor where dispatch only asks where it lives."""
    is_cuda = True

    def __init__(self, index=0):
        self.device = torch.device("cuda", index)


def _fake_gpus(monkeypatch, capabilities):
    """``torch.cuda.get_device_properties`` answering ``capabilities[index]``; returns the list
    of devices asked about."""
    asked = []

    def props(index):
        asked.append(index)
        major, minor = capabilities[index]
        name = {(7, 5): "T4", (8, 0): "A100", (8, 6): "RTX 3090", (9, 0): "H100"}[major, minor]
        return type("Props", (), dict(major=major, minor=minor, name=name))()
    monkeypatch.setattr(torch.cuda, "get_device_properties", props)
    monkeypatch.setattr(dispatch, "_dots_on_tensor_cores", {})
    monkeypatch.setattr(dispatch, "_TRITON_INSTALLED", True)
    return asked


def test_auto_leaves_matrix_product_kernels_to_cublas_without_tensor_core_dots(monkeypatch):
    """Below compute capability 8.0 (a T4 is 7.5) Triton computes ``tl.dot`` on the FMA units
    (``benchmarks/results/compile_dots.json``: 2048 FFMA and no HMMA per thread for one 64^3
    product on sm_75): "auto" gives attention and the preconditioner to the PyTorch path there,
    and keeps the MLP step's element-wise kernel; a forced "triton" still runs them all. The
    capability is asked once per device. Failing input: the gate removed, the T4 row reads
    True for the attention."""
    monkeypatch.delenv(dispatch.ENV_VAR, raising=False)
    asked = _fake_gpus(monkeypatch, {0: (7, 5), 1: (8, 0), 2: (9, 0), 3: (8, 6)})
    said = ("cemlib: T4 (compute capability 7.5) runs attention and the DPLR preconditioner on "
            "the PyTorch path (cuBLAS, tensor cores): below compute capability 8.0 Triton "
            "computes matrix products on the FMA units, several times slower; the MLP step's "
            "kernel still runs. CEMLIB_KERNELS=triton forces the kernels.")
    for i, (index, want) in enumerate(((0, False), (1, True), (2, True), (3, True), (0, False))):
        x = _OnCuda(index)
        with warnings.catch_warnings(record=True) as caught:  # said once, for the T4 only
            warnings.simplefilter("always")
            assert dispatch._use_triton(x, True) is want  # attention, preconditioner
        assert [str(w.message) for w in caught] == ([said] if i == 0 else [])
        assert dispatch._use_triton(x, True, dots=False) is True  # MLP step's element-wise kernel
        assert dispatch._use_triton(x, False) is False  # a call the kernels do not take
    assert asked == [0, 1, 2, 3]
    dispatch.set_backend("triton")
    assert dispatch._use_triton(_OnCuda(0), True) is True
    dispatch.set_backend("reference")
    assert dispatch._use_triton(_OnCuda(2), True) is False


def test_the_tensor_core_question_is_a_constant_to_torch_compile(monkeypatch):
    """The layers ask at every attention call, also while ``torch.compile`` traces a training
    step: the answer must not break the graph (as ``find_spec`` once did, see above).
    ``fullgraph=True`` raises at any break."""
    _fake_gpus(monkeypatch, {0: (7, 5), 1: (9, 0)})
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 1)  # for a device without index
    torch._dynamo.reset()

    def step(x):  # (x.device: a traced tensor's device, no index here, as "cuda" can be)
        slow = dispatch.dots_on_tensor_cores(torch.device("cuda", 0))
        fast = dispatch.dots_on_tensor_cores(x.device)
        return x * (2 if fast and not slow else 3)

    with pytest.warns(UserWarning, match="compute capability 7.5"):  # (device 0, said once)
        got = torch.compile(step, backend="eager", fullgraph=True)(torch.ones(3))
    assert torch.equal(got, torch.full((3,), 2.0))


@pytest.mark.parametrize("kwargs, match", [
    (dict(q=torch.randn(2, 5, 3)), "q must be a 4-D tensor"),
    (dict(kv=torch.randn(1, 2, 6, 3)), "same shape"),
    (dict(scale=0.0), "scale"),
    (dict(scale=float("nan")), "scale"),
    (dict(alibi=torch.ones(3)), r"alibi must have shape \(2,\)"),
    (dict(q_extra=torch.randn(1, 5, 4)), "given together"),
    (dict(extra_values=True), "extra_values=True needs"),
    (dict(q_extra=torch.randn(1, 5, 4), k_extra=torch.randn(1, 5, 4), extra_head_sum=True),
     "extra_head_sum=True needs extra_values=True"),
    (dict(q_extra=torch.randn(1, 5, 4), k_extra=torch.randn(1, 4, 4)), "k_extra must have shape"),
    (dict(q_extra=torch.randn(1, 3, 5, 4), k_extra=torch.randn(1, 5, 4)), "q_extra must have shape"),
])
def test_attention_rejects_bad_input(kwargs, match):
    q, kv = _attn_inputs()
    args = dict(q=q, kv=kv, scale=1.0)
    args.update(kwargs)
    with pytest.raises(ValueError, match=match):
        dispatch.tied_attention(args.pop("q"), args.pop("kv"), **args)


def test_mlp_and_preconditioner_reject_bad_input():
    with pytest.raises(ValueError, match="V must have shape"):
        dispatch.tied_gated_mlp_step(torch.randn(2, 3), torch.randn(4, 5), torch.randn(2, 4))
    with pytest.raises(ValueError, match="gamma must have last dimension"):
        dispatch.tied_gated_mlp_step(torch.randn(2, 3), torch.randn(4, 3), torch.randn(2, 5))
    with pytest.raises(ValueError, match="does not broadcast"):
        dispatch.tied_gated_mlp_step(torch.randn(2, 3), torch.randn(4, 3), torch.randn(3, 4))
    with pytest.raises(ValueError, match="share a dtype"):
        dispatch.tied_gated_mlp_step(torch.randn(2, 3), torch.randn(4, 3).double(), torch.randn(2, 4))
    with pytest.raises(ValueError, match=r"need d \(3,\)"):
        dispatch.dplr_precondition(torch.randn(2, 3), torch.randn(4), torch.randn(3, 1),
                                   torch.randn(3, 1))


def test_reference_head_sum_is_the_sum_of_the_per_head_extra_values():
    g = torch.Generator().manual_seed(4)
    B, K, L, D, De = 2, 3, 9, 4, 6
    q, kv = torch.randn(2, B, K, L, D, generator=g, dtype=torch.float64)
    qe, ke = torch.randn(2, B, L, De, generator=g, dtype=torch.float64)
    kw = dict(scale=0.6, alibi=reference.alibi_slopes(K), q_extra=qe, k_extra=ke,
              extra_values=True)
    o, lse, oe = reference.tied_attention(q, kv, **kw)
    o2, lse2, oe_sum = reference.tied_attention(q, kv, extra_head_sum=True, **kw)
    assert torch.equal(o, o2) and torch.equal(lse, lse2) and oe_sum.shape == (B, L, De)
    torch.testing.assert_close(oe_sum, oe.sum(1), rtol=1e-13, atol=1e-13)


@pytest.mark.parametrize("shape, values, head_sum, covered", [
    (None, False, False, True),                # no extra pair
    ((2, 9, 128), True, False, False),         # per-head extra values of a shared pair
    ((2, 3, 9, 64), True, True, False),        # per-head pair, narrow
    ((2, 9, 768), True, True, True),           # the default CEM layer at D_h = 768
    ((2, 9, 768), False, False, True),         # diag_grad="paper": logits only
    ((2, 9, 768), True, False, False),         # per-head values at width 768
    ((2, 3, 9, 768), True, True, False),       # per-head diagonal at width 768
])
def test_extra_pair_routing(shape, values, head_sum, covered):
    """Which calls the attention kernel takes, and whether "auto" sends them to it on CUDA."""
    q = torch.empty(2, 3, 9, 64, dtype=torch.bfloat16)
    qe = None if shape is None else torch.empty(shape, dtype=torch.bfloat16)
    assert dispatch.attention_covers(q, qe, values, head_sum) == covered
    assert dispatch.attention_fused(q, qe, values, head_sum) == covered
    assert not dispatch.attention_fused(q.double(), qe, values, head_sum)  # no float64 kernels
    assert not dispatch.attention_fused(q.float(), qe, values, head_sum)  # fp32 spills: cuBLAS
    assert not dispatch.attention_fused(torch.empty(2, 3, 9, 136, dtype=torch.bfloat16), None)
    assert dispatch.attention_fused(torch.empty(2, 3, 9, 128, dtype=torch.float16), None)


def test_default_cem_layer_calls_the_fusable_attention(monkeypatch):
    """The default CEM attention layer (shared diagonal, exact, no preconditioner) at GPT-2
    width asks for head-summed diagonal values, which "auto" fuses on CUDA; with a per-head
    preconditioner it needs per-head values, which go to the PyTorch path."""
    from cemlib.layers.cem_attention import CEMAttention
    seen = []
    real = dispatch.tied_attention

    def spy(q, kv, **kw):
        seen.append(dispatch.attention_fused(q.to(torch.bfloat16), kw.get("q_extra"),
                                             kw.get("extra_values", False),
                                             kw.get("extra_head_sum", False)))
        return real(q, kv, **kw)

    monkeypatch.setattr(dispatch, "tied_attention", spy)
    x = torch.randn(1, 4, 768)
    with torch.no_grad():
        CEMAttention(768, 12)(x)
        CEMAttention(768, 12, preconditioner="dplr")(x)
    assert seen == [True, False]
