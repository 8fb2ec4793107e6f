"""The closed-form PyTorch attention (cemlib.kernels.attention_torch), the CPU default:
the reference's outputs and every gradient, in float64, and how dispatch routes to it."""

import pytest
import torch

from cemlib.kernels import attention_torch, dispatch, reference
from cemlib.layers.cem_attention import CEMAttention

f64 = torch.float64


@pytest.fixture(autouse=True)
def _restore_backend():
    yield
    dispatch.set_backend(None)


def _inputs(extra, values, head_sum, biases=True, B=2, K=3, L=7, R=4, De=5, dtype=f64, seed=0):
    g = torch.Generator().manual_seed(seed)
    t = {"q": torch.randn(B, K, L, R, generator=g, dtype=dtype),
         "kv": torch.randn(B, K, L, R, generator=g, dtype=dtype)}
    if biases:
        t["self_bias"] = torch.randn(K, generator=g, dtype=dtype)
        t["cross_bias"] = torch.randn(K, generator=g, dtype=dtype)
    if extra:
        t["q_extra"] = torch.randn(*((B, L, De) if extra == "shared" else (B, K, L, De)),
                                   generator=g, dtype=dtype)
        t["k_extra"] = torch.randn(B, L, De, generator=g, dtype=dtype)
    for v in t.values():
        v.requires_grad_()
    kw = dict(scale=0.37, alibi=reference.alibi_slopes(K).to(dtype), extra_values=values,
              extra_head_sum=head_sum)
    return t, kw


CASES = [  # (extra pair, extra values, head sum, self/cross biases)
    (None, False, False, True), (None, False, False, False), ("shared", False, False, True),
    ("shared", True, False, True), ("shared", True, True, True), ("per_head", True, False, True),
    ("per_head", True, True, False), ("per_head", False, False, True)]


def _run(fn, t, kw, weights):
    """Outputs, and the gradient of a random linear function of all outputs (lse included)."""
    out = fn(t["q"], t["kv"], **{k: v for k, v in t.items() if k not in ("q", "kv")}, **kw)
    loss = sum((w * o).sum() for w, o in zip(weights, out))
    return out, torch.autograd.grad(loss, list(t.values()))


@pytest.mark.parametrize("extra, values, head_sum, biases", CASES)
def test_outputs_and_gradients_are_the_references(extra, values, head_sum, biases):
    t, kw = _inputs(extra, values, head_sum, biases)
    ref_out = reference.tied_attention(t["q"], t["kv"],
                                       **{k: v for k, v in t.items() if k not in ("q", "kv")}, **kw)
    g = torch.Generator().manual_seed(1)
    weights = [torch.randn(o.shape, generator=g, dtype=f64) for o in ref_out]
    want_out, want_grad = _run(reference.tied_attention, t, kw, weights)
    got_out, got_grad = _run(attention_torch.tied_attention, t, kw, weights)
    assert len(got_out) == len(want_out)
    for a, b in zip(got_out, want_out):
        torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-12)
    for name, a, b in zip(t, got_grad, want_grad):
        torch.testing.assert_close(a, b, rtol=1e-11, atol=1e-11, msg=name)


@pytest.mark.slow
def test_gradcheck_including_unused_outputs():
    """torch's finite-difference check of the hand-written backward, once with every output in
    the loss and once with only ``o`` (the layers' forward: lse and o_extra get no gradient)."""
    t, kw = _inputs("shared", True, True, B=1, K=2, L=5, R=3, De=4)
    names = list(t)

    def every(*xs):
        d = dict(zip(names, xs))
        return attention_torch.tied_attention(d.pop("q"), d.pop("kv"), **d, **kw)

    assert torch.autograd.gradcheck(every, tuple(t.values()))
    assert torch.autograd.gradcheck(lambda *xs: every(*xs)[0], tuple(t.values()))


def test_lse_is_exact_when_the_diagonal_weight_underflows():
    """lse is read off the diagonal of the log-softmax, which stays exact where p_ii = 0."""
    t, kw = _inputs(None, False, False)
    with torch.no_grad():
        t["self_bias"].fill_(-800.0)   # exp(-800) underflows even in float64
        got = attention_torch.tied_attention(t["q"], t["kv"], self_bias=t["self_bias"],
                                                  cross_bias=t["cross_bias"], **kw)
        want = reference.tied_attention(t["q"], t["kv"], self_bias=t["self_bias"],
                                        cross_bias=t["cross_bias"], **kw)
    assert torch.isfinite(got[1][..., 1:]).all()
    torch.testing.assert_close(got[1], want[1], rtol=1e-12, atol=1e-12)


def test_float32_agrees_with_the_reference():
    t, kw = _inputs("shared", True, True, dtype=torch.float32, L=16, R=8, De=12)
    rest = {k: v for k, v in t.items() if k not in ("q", "kv")}
    for a, b in zip(attention_torch.tied_attention(t["q"], t["kv"], **rest, **kw),
                    reference.tied_attention(t["q"], t["kv"], **rest, **kw)):
        assert a.dtype == b.dtype == torch.float32
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)


def test_second_derivatives_raise_and_the_reference_gives_them():
    t, kw = _inputs(None, False, False)
    q = t["q"]
    o, _ = attention_torch.tied_attention(q, t["kv"], **kw)
    (g,) = torch.autograd.grad(o.square().sum(), q, create_graph=True)
    with pytest.raises(RuntimeError, match="once_differentiable|differentiate"):
        torch.autograd.grad(g.sum(), q)
    with dispatch.use_backend("reference"):
        o, _ = dispatch.tied_attention(q, t["kv"], **kw)
    (g,) = torch.autograd.grad(o.square().sum(), q, create_graph=True)
    assert torch.isfinite(torch.autograd.grad(g.sum(), q)[0]).all()


def test_dispatch_routes_cpu_attention_here(monkeypatch):
    monkeypatch.delenv(dispatch.ENV_VAR, raising=False)
    calls = []
    real = attention_torch.tied_attention
    monkeypatch.setattr(attention_torch, "tied_attention",
                        lambda *a, **k: calls.append(a[0].dtype) or real(*a, **k))
    q, kv = torch.randn(2, 1, 2, 5, 3)
    dispatch.tied_attention(q, kv, scale=0.5)                     # auto, float32 on the CPU
    dispatch.tied_attention(q.double(), kv.double(), scale=0.5)   # auto, float64
    dispatch.tied_attention(q.bfloat16(), kv.bfloat16(), scale=0.5)  # bf16: the reference
    with dispatch.use_backend("reference"):
        dispatch.tied_attention(q, kv, scale=0.5)
    assert calls == [torch.float32, f64]
    slopes = reference.alibi_slopes(2).float().requires_grad_()
    dispatch.tied_attention(q, kv, scale=0.5, alibi=slopes)       # learned slopes: the reference
    assert len(calls) == 2
    dispatch.set_backend("torch")
    dispatch.tied_attention(q, kv, scale=0.5)
    assert len(calls) == 3
    with pytest.raises(ValueError, match="backend 'torch' takes float32/float64"):
        dispatch.tied_attention(q.half(), kv.half(), scale=0.5)
    with pytest.raises(ValueError, match="slopes that require grad"):
        dispatch.tied_attention(q, kv, scale=0.5, alibi=slopes)


@pytest.mark.parametrize("diag, T, precond", [("shared", 2, "none"), ("per_head", 1, "diag"),
                                               ("none", 1, "none")])
def test_cem_layer_trains_identically_on_both_paths(diag, T, precond):
    """A CEM attention layer's output and every parameter gradient, in float64, on the default
    CPU path and on the reference."""
    torch.manual_seed(0)
    layer = CEMAttention(16, 4, T=T, diag=diag, preconditioner=precond, init_std=0.3).double()
    with torch.no_grad():
        for p in (layer.d, layer.self_bias, layer.cross_bias):
            if p is not None:
                p.normal_()
    x = torch.randn(2, 9, 16, dtype=f64)
    results = []
    for backend in ("auto", "reference"):
        with dispatch.use_backend(backend):
            layer.zero_grad()
            y = layer(x)
            y.square().sum().backward()
        results.append([y.detach()] + [p.grad.clone() for p in layer.parameters()])
    for a, b in zip(*results):
        torch.testing.assert_close(a, b, rtol=1e-11, atol=1e-11)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA not available")
def test_forced_torch_backend_on_cuda_matches_the_reference():
    """'torch' forced on CUDA tensors (auto keeps CUDA float32 on the reference): the same
    outputs and gradients as the reference there, in float64."""
    t, kw = _inputs("shared", True, True)
    t = {k: v.detach().cuda().requires_grad_() for k, v in t.items()}
    kw["alibi"] = kw["alibi"].cuda()
    g = torch.Generator().manual_seed(2)
    weights = None
    results = []
    for backend in ("torch", "reference"):
        with dispatch.use_backend(backend):
            out = dispatch.tied_attention(t["q"], t["kv"],
                                          **{k: v for k, v in t.items() if k not in ("q", "kv")}, **kw)
        if weights is None:
            weights = [torch.randn(o.shape, generator=g, dtype=f64).cuda() for o in out]
        loss = sum((w * o).sum() for w, o in zip(weights, out))
        results.append(list(out) + list(torch.autograd.grad(loss, list(t.values()))))
    for a, b in zip(*results):
        torch.testing.assert_close(a, b, rtol=1e-11, atol=1e-11)
