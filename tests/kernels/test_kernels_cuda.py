"""bf16 kernel tests on CUDA with the FlashAttention criterion; skipped without a GPU.

Criterion (FlashAttention's test suite): the kernel's error against a float64 reference is at
most twice the error of the PyTorch reference computed in the same dtype (plus a small floor
for results that the reference gets exactly right).
"""

import pytest
import torch

if not torch.cuda.is_available():
    pytest.skip("CUDA not available", allow_module_level=True)
pytest.importorskip("triton")

from cemlib.kernels import attention, dispatch, dplr, gated_mlp, reference  # noqa: E402

DEV = "cuda"


def rel_err(a, b):
    a, b = a.detach().double(), b.detach().double()
    return ((a - b).abs().max() / b.abs().max().clamp_min(1e-30)).item()


def run(fn, inputs, kwargs, seed=1):
    leaves = [x.clone().requires_grad_() if x is not None else None for x in inputs]
    outs = fn(*leaves, **kwargs)
    outs = outs if isinstance(outs, tuple) else (outs,)
    g = torch.Generator(device=DEV).manual_seed(seed)
    loss = sum((o.double() * torch.randn(o.shape, generator=g, device=DEV, dtype=torch.float64))
               .sum() for o in outs)
    loss.backward()
    return list(outs) + [x.grad for x in leaves if x is not None]


def check_flash_criterion(fn_kernel, fn_ref, inputs, kwargs, dtype, floor=1e-3):
    low = [x.to(dtype) for x in inputs]
    got = run(fn_kernel, low, kwargs)
    ref = run(fn_ref, low, kwargs)
    exact = run(fn_ref, [x.to(torch.float64) for x in low], kwargs)
    for i, (a, r, e) in enumerate(zip(got, ref, exact)):
        assert rel_err(a, e) <= 2 * rel_err(r, e) + floor, (i, rel_err(a, e), rel_err(r, e))


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("B,K,L,D", [(2, 3, 37, 64), (1, 12, 256, 64), (1, 2, 1000, 48),
                                     (2, 1, 129, 128)])
def test_attention_cuda(B, K, L, D, dtype):
    g = torch.Generator(device=DEV).manual_seed(0)
    q, kv = torch.randn(2, B, K, L, D, generator=g, device=DEV, dtype=torch.float64)
    al = reference.alibi_slopes(K).to(DEV)
    sb, cb = torch.randn(2, K, generator=g, device=DEV, dtype=torch.float64)
    check_flash_criterion(
        lambda q, kv, sb, cb, **kw: attention.tied_attention(q, kv, self_bias=sb, cross_bias=cb,
                                                             **kw),
        lambda q, kv, sb, cb, **kw: reference.tied_attention(q, kv, self_bias=sb, cross_bias=cb,
                                                             **kw),
        [q, kv, sb, cb], dict(scale=D ** -0.5, alibi=al), dtype)


@pytest.mark.parametrize("per_head", [False, True])
def test_attention_cuda_extra_pair_bf16(per_head):
    """A narrow extra pair with its values: head-summed for a shared pair (the kernel), per head
    for a per-head pair (the dispatcher's PyTorch path, here the reference)."""
    B, K, L, D, De = 2, 4, 200, 64, 96
    g = torch.Generator(device=DEV).manual_seed(1)
    q, kv = torch.randn(2, B, K, L, D, generator=g, device=DEV, dtype=torch.float64)
    qe = 0.3 * torch.randn(*((B, K, L, De) if per_head else (B, L, De)), generator=g, device=DEV,
                           dtype=torch.float64)
    ke = 0.3 * torch.randn(B, L, De, generator=g, device=DEV, dtype=torch.float64)
    check_flash_criterion(attention.tied_attention, reference.tied_attention, [q, kv],
                          dict(scale=0.125, q_extra=None, k_extra=None), torch.bfloat16)
    with dispatch.use_backend("triton"):
        check_flash_criterion(
            lambda q, kv, qe, ke, **kw: dispatch.tied_attention(q, kv, q_extra=qe, k_extra=ke, **kw),
            lambda q, kv, qe, ke, **kw: reference.tied_attention(q, kv, q_extra=qe, k_extra=ke,
                                                                 **kw),
            [q, kv, qe, ke], dict(scale=0.125, extra_values=True, extra_head_sum=not per_head),
            torch.bfloat16)


@pytest.mark.parametrize("impl", ["accumulate_dv", "separate_dv"])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("N,Dh,Dv", [(37, 96, 200), (512, 768, 2048)])
def test_gated_mlp_step_cuda(N, Dh, Dv, dtype, impl):
    def step(u, V, gamma):
        return gated_mlp.tied_gated_mlp_step(u, V, gamma, dv_products=impl[:-3])
    g = torch.Generator(device=DEV).manual_seed(2)
    u = torch.randn(N, Dh, generator=g, device=DEV, dtype=torch.float64)
    V = torch.randn(Dv, Dh, generator=g, device=DEV, dtype=torch.float64) / Dh ** 0.5
    gam = torch.randn(N, Dv, generator=g, device=DEV, dtype=torch.float64)
    check_flash_criterion(step, reference.tied_gated_mlp_step, [u, V, gam], {}, dtype)


def test_dplr_precondition_cuda_bf16():
    g = torch.Generator(device=DEV).manual_seed(3)
    x = torch.randn(300, 768, generator=g, device=DEV, dtype=torch.float64)
    d = torch.randn(768, generator=g, device=DEV, dtype=torch.float64)
    U, V = torch.randn(2, 768, 16, generator=g, device=DEV, dtype=torch.float64) / 768 ** 0.5
    check_flash_criterion(dplr.dplr_precondition, reference.dplr_precondition, [x, d, U, V], {},
                          torch.bfloat16)


def _count_calls(monkeypatch, module_name, attr, owner=None):
    """Wrap ``cemlib.kernels.<module_name>.<owner>.<attr>`` (the module itself without ``owner``)
    so that every call appends to the returned list."""
    import importlib
    module = importlib.import_module(f"cemlib.kernels.{module_name}")
    target = getattr(module, owner) if owner else module
    calls, real = [], getattr(target, attr)
    monkeypatch.setattr(target, attr, lambda *a, **k: calls.append(1) or real(*a, **k))
    return calls


@pytest.mark.parametrize("backend", ["auto", "triton"])
def test_auto_dispatch_uses_triton_on_cuda(monkeypatch, backend):
    monkeypatch.setenv(dispatch.ENV_VAR, backend)
    calls = _count_calls(monkeypatch, "attention", "forward")
    q = torch.randn(1, 2, 16, 32, device=DEV, dtype=torch.float16)
    dispatch.tied_attention(q, q.clone(), scale=0.2)
    # below compute capability 8.0 (a T4) "auto" leaves attention to cuBLAS: Triton's products
    # would run on the FMA units there; a forced backend still runs the kernels
    fused = backend != "auto" or dispatch.dots_on_tensor_cores(q.device)
    assert calls == ([1] if fused else [])


def test_attention_cuda_shared_logits_bf16():
    """The default CEM layer's call at GPT-2 width: a head-shared extra pair of width 768 with
    head-summed values."""
    B, K, L, D, De = 2, 12, 300, 64, 768
    assert dispatch.attention_covers(torch.empty(B, K, L, D), torch.empty(B, L, De), True, True)
    g = torch.Generator(device=DEV).manual_seed(2)
    q, kv = torch.randn(2, B, K, L, D, generator=g, device=DEV, dtype=torch.float64)
    qe, ke = 0.05 * torch.randn(2, B, L, De, generator=g, device=DEV, dtype=torch.float64)
    sb, cb = torch.randn(2, K, generator=g, device=DEV, dtype=torch.float64)
    kw = dict(scale=D ** -0.5, alibi=reference.alibi_slopes(K).to(DEV), extra_values=True,
              extra_head_sum=True)
    check_flash_criterion(
        lambda q, kv, qe, ke, sb, cb, **k: attention.tied_attention(
            q, kv, q_extra=qe, k_extra=ke, self_bias=sb, cross_bias=cb, **k),
        lambda q, kv, qe, ke, sb, cb, **k: reference.tied_attention(
            q, kv, q_extra=qe, k_extra=ke, self_bias=sb, cross_bias=cb, **k),
        [q, kv, qe, ke, sb, cb], kw, torch.bfloat16)


@pytest.mark.parametrize("backend", ["auto", "triton"])
def test_auto_dispatch_fuses_the_default_cem_layer(monkeypatch, backend):
    """The default CEM layer (head-shared diagonal, head-summed values) reaches the fused head
    sum of the kernel, forward and backward."""
    monkeypatch.setenv(dispatch.ENV_VAR, backend)
    from cemlib.layers.cem_attention import CEMAttention
    calls = _count_calls(monkeypatch, "attention", "head_sum", "_Call")
    layer = CEMAttention(768, 12, T=2).to(DEV, torch.bfloat16)
    x = torch.randn(2, 64, 768, device=DEV, dtype=torch.bfloat16, requires_grad=True)
    layer(x).float().square().sum().backward()
    assert len(calls) >= 2 and torch.isfinite(x.grad).all()
