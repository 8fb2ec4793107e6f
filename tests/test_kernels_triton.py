"""The first version of the Triton kernels against the PyTorch reference: forward and every
gradient, awkward shapes (the second version of the attention kernels: ``test_kernels_v2.py``).

On a machine without CUDA the kernels run under Triton's interpreter (``triton_interpreter.py``
explains how). Interpreted cases are kept tiny (L <= 70, B*K <= 6): the interpreter runs each
program instance in numpy, one after another. fp32 and fp16 only (the interpreter silently breaks
bf16; bf16 is tested on CUDA in ``test_kernels_cuda.py``); float64 for ``gradcheck``.
"""

import copy

import pytest
import torch

from triton_interpreter import CUDA, DEVICE, kernels_usable, rerun_in_fresh_process  # noqa: F401

triton = pytest.importorskip("triton")

from cemlib.kernels import dispatch, ops, reference  # noqa: E402
from cemlib.kernels import gated_mlp_triton, tied_attention_triton  # noqa: E402


def test_interpreted_suite_in_fresh_process():
    rerun_in_fresh_process(__file__)


TOL = {torch.float32: 2e-5, torch.float64: 1e-12}


def rel_err(a, b):
    """max |a - b| / max |b| (b the trusted value), computed in float64 on the CPU (the two may
    lie on different devices)."""
    a, b = a.detach().double().cpu(), b.detach().double().cpu()
    return ((a - b).abs().max() / b.abs().max().clamp_min(1e-30)).item()


def make_attention_inputs(B, K, L, D, De, per_head, bias, dtype, seed=0):
    g = torch.Generator().manual_seed(seed)

    def rnd(*shape, scale=1.0):
        return (scale * torch.randn(*shape, generator=g, dtype=torch.float64)).to(dtype).to(DEVICE)

    inp = dict(q=rnd(B, K, L, D), kv=rnd(B, K, L, D))
    if De:
        inp["q_extra"] = rnd(B, K, L, De, scale=0.5) if per_head else rnd(B, L, De, scale=0.5)
        inp["k_extra"] = rnd(B, L, De, scale=0.5)
    if bias:
        inp["alibi"] = reference.alibi_slopes(K).to(dtype).to(DEVICE)
        inp["self_bias"], inp["cross_bias"] = rnd(K), rnd(K)
    return inp


def attention_outputs_and_grads(fn, inp, scale, extra_values, seed=1, **kw):
    leaves = {k: v.clone().requires_grad_() for k, v in inp.items()}
    args = dict(leaves, **kw)
    outs = fn(args.pop("q"), args.pop("kv"), scale=scale, extra_values=extra_values, **args)
    g = torch.Generator().manual_seed(seed)
    cot = [torch.randn(o.shape, generator=g, dtype=torch.float64).to(o.dtype).to(DEVICE)
           for o in outs]
    loss = sum((o.to(torch.float64) * c.double()).sum() for o, c in zip(outs, cot))
    loss.backward()
    return list(outs), {k: v.grad for k, v in leaves.items()}


ATTENTION_CASES = [  # B, K, L, D, De, per_head, bias, extra_values
    (2, 3, 37, 20, 12, False, True, True),   # everything on, non-power-of-two L, D, D_e
    (1, 1, 1, 8, 0, False, True, False),     # L = 1, one head
    (1, 2, 37, 20, 12, True, True, True),    # per-head extra queries
    (1, 1, 70, 33, 0, False, False, False),  # several blocks, odd head width, plain attention
    (2, 2, 16, 64, 7, False, True, False),   # L = one block, D_e in the logits only
]


@pytest.mark.parametrize("case", ATTENTION_CASES)
def test_attention_fp32_matches_reference(case):
    B, K, L, D, De, per_head, bias, ev = case
    inp = make_attention_inputs(B, K, L, D, De, per_head, bias, torch.float32)
    got, got_g = attention_outputs_and_grads(ops.tied_attention, inp, 0.37, ev)
    ref, ref_g = attention_outputs_and_grads(reference.tied_attention, inp, 0.37, ev)
    assert len(got) == len(ref) == (3 if ev else 2)
    for name, a, b in zip(["o", "lse", "o_extra"], got, ref):
        assert a.shape == b.shape and a.dtype == b.dtype, name
        assert rel_err(a, b) < TOL[torch.float32], name
    assert set(got_g) == set(inp)
    for name in inp:
        assert got_g[name].dtype == inp[name].dtype, name
        # the cross-bias gradient is exactly zero when L = 1; compare absolutely there
        if L == 1 and name == "cross_bias":  # no pair j < i: only rounding residue of dS_00,
            assert got_g[name].abs().max() < 1e-5  # which is dp - Delta = 0 in exact arithmetic
            continue
        assert rel_err(got_g[name], ref_g[name]) < 1e-4, (name, rel_err(got_g[name], ref_g[name]))


@pytest.mark.parametrize("case, kw", [((1, 2, 33, 16, 0, False, True, False), {}),
                                      ((1, 2, 29, 24, 10, False, True, True), {}),
                                      # the shared-logits path (wide shared pair, head sum)
                                      ((1, 3, 29, 24, 136, False, True, True),
                                       {"extra_head_sum": True})])
def test_attention_fp16_flash_criterion(case, kw):
    """fp16 kernel error vs a float64 reference <= 2x the fp16 reference's own error (+ floor)."""
    B, K, L, D, De, per_head, bias, ev = case
    inp16 = make_attention_inputs(B, K, L, D, De, per_head, bias, torch.float16)
    inp64 = {k: v.double() for k, v in inp16.items()}
    got, got_g = attention_outputs_and_grads(ops.tied_attention, inp16, 0.25, ev, **kw)
    ref16, ref16_g = attention_outputs_and_grads(reference.tied_attention, inp16, 0.25, ev, **kw)
    exact, exact_g = attention_outputs_and_grads(reference.tied_attention, inp64, 0.25, ev, **kw)
    for a, r, e in zip(got, ref16, exact):
        assert rel_err(a, e) <= 2 * rel_err(r, e) + 1e-3
    for name in inp16:
        assert rel_err(got_g[name], exact_g[name]) <= 2 * rel_err(ref16_g[name], exact_g[name]) + 2e-3, name


def test_attention_gradcheck_float64():
    inp = make_attention_inputs(1, 2, 6, 3, 2, False, True, torch.float64)
    names = list(inp)

    def f(*xs):
        kw = dict(zip(names, xs))
        return ops.tied_attention(kw.pop("q"), kw.pop("kv"), scale=0.7, extra_values=True, **kw)

    xs = [inp[n].clone().requires_grad_() for n in names]
    assert torch.autograd.gradcheck(f, xs, fast_mode=True)


def test_attention_value_and_key_roles_of_kv():
    """d kv is the sum of the value-role and key-role gradients (untied reference, float64)."""
    inp = make_attention_inputs(1, 2, 21, 5, 0, False, True, torch.float64)
    q, kv = inp["q"], inp["kv"].clone().requires_grad_()
    (ops.tied_attention(q, kv, scale=0.5, alibi=inp["alibi"])[0] ** 2).sum().backward()
    k_role, v_role = inp["kv"].clone().requires_grad_(), inp["kv"].clone().requires_grad_()
    s = torch.einsum("bkid,bkjd->bkij", q, k_role) * 0.5 + reference.attention_bias(
        21, 2, alibi=inp["alibi"], dtype=torch.float64, device=DEVICE)
    (torch.einsum("bkij,bkjd->bkid", s.softmax(-1), v_role) ** 2).sum().backward()
    assert rel_err(kv.grad, k_role.grad + v_role.grad) < 1e-12
    assert rel_err(kv.grad, v_role.grad) > 1e-3  # the key role is not negligible


HEAD_SUM_CASES = [  # B, K, L, D, De, per_head, extra_values, extra_head_sum, expected path
    (2, 3, 37, 20, 140, False, True, True, "logits"),  # the default CEM layer's call, wide D_e
    (1, 2, 21, 8, 129, False, False, False, "logits"),  # logits only (diag_grad="paper")
    (1, 1, 1, 8, 136, False, True, True, "logits"),     # L = 1, one head
    (2, 2, 19, 12, 10, False, True, True, "tile"),      # narrow shared pair, head-summed
    (1, 2, 17, 8, 12, True, True, True, "tile"),        # per-head pair, head-summed
]


@pytest.mark.parametrize("case", HEAD_SUM_CASES)
def test_attention_extra_paths_match_reference(case, monkeypatch):
    """Both ways of handling the extra pair (CEM eq. 12's diagonal term): in the register tiles,
    or as precomputed head-shared logits with head-summed values; forward and every gradient."""
    B, K, L, D, De, per_head, ev, hs, path = case
    assert dispatch.extra_path(torch.empty((B, K, L, De) if per_head else (B, L, De)), ev,
                               hs) == path
    used = []
    real = tied_attention_triton._Launch.head_sum
    monkeypatch.setattr(tied_attention_triton._Launch, "head_sum",
                        lambda *a, **k: used.append(1) or real(*a, **k))
    inp = make_attention_inputs(B, K, L, D, De, per_head, True, torch.float32)
    got, got_g = attention_outputs_and_grads(ops.tied_attention, inp, 0.3, ev, extra_head_sum=hs)
    ref, ref_g = attention_outputs_and_grads(reference.tied_attention, inp, 0.3, ev,
                                             extra_head_sum=hs)
    assert bool(used) == (path == "logits")  # the dS head sum runs in every logits backward
    if hs:
        assert got[2].shape == (B, L, De)
    for name, a, b in zip(["o", "lse", "o_extra"], got, ref):
        assert a.shape == b.shape and a.dtype == b.dtype, name
        assert rel_err(a, b) < TOL[torch.float32], name
    for name in inp:
        if L == 1 and name == "cross_bias":  # no pair j < i: only rounding residue of dS_00,
            assert got_g[name].abs().max() < 1e-5  # which is dp - Delta = 0 in exact arithmetic
            continue
        assert rel_err(got_g[name], ref_g[name]) < 1e-4, (name, rel_err(got_g[name], ref_g[name]))


def test_attention_shared_logits_gradcheck_float64():
    inp = make_attention_inputs(1, 2, 6, 3, 130, False, True, torch.float64)
    names = list(inp)

    def f(*xs):
        kw = dict(zip(names, xs))
        return ops.tied_attention(kw.pop("q"), kw.pop("kv"), scale=0.7, extra_values=True,
                                  extra_head_sum=True, **kw)

    xs = [inp[n].clone().requires_grad_() for n in names]
    assert torch.autograd.gradcheck(f, xs, fast_mode=True)


def test_head_sums_of_probabilities_and_score_gradients():
    """The two head-sum kernels directly: sum_k P_k, and sum_k dS_k, against autograd (float64)."""
    B, K, L, D = 2, 3, 23, 5
    inp = make_attention_inputs(B, K, L, D, 0, False, True, torch.float64)
    q, kv = inp["q"], inp["kv"]
    bias = dict(alibi=inp["alibi"], self_bias=inp["self_bias"], cross_bias=inp["cross_bias"])
    E = torch.randn(B, L, L, dtype=torch.float64).to(DEVICE)
    # On a GPU, Triton passes Python float arguments as fp32: 0.4 would carry a 1.5e-8 relative
    # error into the logits (seen on an H100: 3.6e-9 in P). A scale exact in fp32 keeps this a
    # 1e-13 test of the head sums themselves.
    run = tied_attention_triton._Launch(q, kv, 0.5, *bias.values(), None, None, E)
    o, lse, _ = run.forward(False)
    s = (torch.einsum("bkid,bkjd->bkij", q, kv) * 0.5 + E[:, None]
         + reference.attention_bias(L, K, **bias, dtype=torch.float64, device=DEVICE))
    P = torch.softmax(s, -1)
    assert rel_err(run.head_sum(lse), P.sum(1)) < 1e-13
    do = torch.randn(B, K, L, D, dtype=torch.float64).to(DEVICE)
    dpb = torch.randn(B, L, L, dtype=torch.float64).to(DEVICE)
    dpb_rows = run.row_dot(lse, dpb)
    assert rel_err(dpb_rows, (P * dpb[:, None]).sum(-1)) < 1e-13
    s_leaf = s.clone().requires_grad_()
    Pl = torch.softmax(s_leaf, -1)
    (torch.einsum("bkij,bkjd->bkid", Pl, kv) * do).sum().add((Pl.sum(1) * dpb).sum()).backward()
    delta = ((o * do).sum(-1) + dpb_rows).contiguous()
    assert rel_err(run.head_sum(lse, do, dpb, delta), s_leaf.grad.sum(1)) < 1e-12


# leading dims (a, b), D_h, D_v; (2, 7, 33, 90): N D_v = 1260 entries, two element-wise programs
MLP_CASES = [(1, 5, 12, 40), (2, 7, 33, 17), (1, 1, 16, 64), (2, 7, 33, 90), (1, 1, 1, 1)]
# v1: Triton GEMMs with the element-wise work in their epilogues; v2 (what dispatch uses): cuBLAS
# GEMMs and two fused element-wise kernels
MLP_STEPS = {"v1": ops.tied_gated_mlp_step, "v2": gated_mlp_triton.tied_gated_mlp_step}


@pytest.mark.parametrize("impl", list(MLP_STEPS))
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize("case", MLP_CASES)
def test_gated_mlp_step_matches_reference(case, dtype, impl):
    """Output and every gradient against the float64 reference: fp32 to 1e-5 relative, fp16
    within the FlashAttention criterion (at most twice the fp16 reference's error + 1e-3)."""
    a, b, Dh, Dv = case
    g = torch.Generator().manual_seed(3)
    base = [torch.randn(a, b, Dh, generator=g, dtype=torch.float64),
            torch.randn(Dv, Dh, generator=g, dtype=torch.float64) / Dh ** 0.5,
            torch.randn(a, b, Dv, generator=g, dtype=torch.float64)]
    cot = torch.randn(a, b, Dh, generator=g, dtype=torch.float64)
    results = {}
    for key, fn, dt in (("got", MLP_STEPS[impl], dtype),
                        ("ref", reference.tied_gated_mlp_step, dtype),
                        ("exact", reference.tied_gated_mlp_step, torch.float64)):
        xs = [x.to(dt).to(DEVICE).requires_grad_() for x in base]
        y = fn(*xs)
        (y.double() * cot.to(DEVICE)).sum().backward()
        results[key] = [y] + [x.grad for x in xs]
    for i, (a_, r, e) in enumerate(zip(results["got"], results["ref"], results["exact"])):
        assert a_.dtype == dtype and a_.shape == e.shape
        if dtype == torch.float32:
            assert rel_err(a_, e) < 1e-5, i
        else:
            assert rel_err(a_, e) <= 2 * rel_err(r, e) + 1e-3, i


@pytest.mark.parametrize("u_shape,gamma_shape", [
    ((7, 6), (7, 10)),        # 2-D operands: passed on without reshaping
    ((7, 6), (10,)),          # gamma broadcast to the rows
    ((7, 6), (1, 10)),
    ((2, 3, 6), (10,)),       # leading dimensions flattened, gamma broadcast
    ((2, 3, 6), (2, 1, 10)),
    ((6,), (10,)),            # one vector
])
def test_gated_mlp_v2_step_shapes_and_a_strided_cotangent(u_shape, gamma_shape):
    """The v2 entry point's shape handling (2-D operands go through without a reshape, other
    shapes are flattened and ``gamma`` broadcast) and a cotangent that is not contiguous (the
    backward of ``y.sum()`` is an expanded tensor of stride 0): output and every gradient
    against the float64 reference, float32 to 1e-5."""
    g = torch.Generator().manual_seed(9)
    base = [torch.randn(u_shape, generator=g, dtype=torch.float64),
            torch.randn(10, 6, generator=g, dtype=torch.float64) / 6 ** 0.5,
            torch.randn(gamma_shape, generator=g, dtype=torch.float64)]
    results = []
    for fn, dt in ((gated_mlp_triton.tied_gated_mlp_step, torch.float32),
                   (reference.tied_gated_mlp_step, torch.float64)):
        xs = [x.to(dt).to(DEVICE).requires_grad_() for x in base]
        y = fn(*xs)
        y.sum().backward()
        results.append([y] + [x.grad for x in xs])
    for got, exact in zip(*results):
        assert got.shape == exact.shape
        assert rel_err(got, exact) < 1e-5


@pytest.mark.parametrize("impl", list(MLP_STEPS))
def test_gated_mlp_step_gradcheck_float64(impl):
    g = torch.Generator().manual_seed(4)
    xs = [torch.randn(3, 5, generator=g, dtype=torch.float64, device="cpu").to(DEVICE),
          torch.randn(6, 5, generator=g, dtype=torch.float64).to(DEVICE),
          torch.randn(3, 6, generator=g, dtype=torch.float64).to(DEVICE)]
    xs = [x.requires_grad_() for x in xs]
    assert torch.autograd.gradcheck(MLP_STEPS[impl], xs, fast_mode=True)


def _saved_shapes(fn, *xs):
    saved = []
    with torch.autograd.graph.saved_tensors_hooks(lambda t: saved.append(tuple(t.shape)) or t,
                                                  lambda t: t):
        fn(*xs)
    return sorted(saved)


def test_gated_mlp_step_saves_little_for_backward():
    """Activation memory: v1 keeps only its inputs for backward, v2 also h = u V^T (one (N, D_v)
    tensor); eager autograd keeps three (N, D_v) intermediates besides gamma."""
    u = torch.randn(9, 12, device=DEVICE, requires_grad=True)
    V = torch.randn(40, 12, device=DEVICE, requires_grad=True)
    gamma = torch.randn(9, 40, device=DEVICE, requires_grad=True)
    inputs = [(9, 12), (40, 12), (9, 40)]
    assert _saved_shapes(ops.tied_gated_mlp_step, u, V, gamma) == sorted(inputs)
    assert _saved_shapes(gated_mlp_triton.tied_gated_mlp_step, u, V, gamma) == \
        sorted(inputs + [(9, 40)])
    assert _saved_shapes(reference.tied_gated_mlp_step, u, V, gamma).count((9, 40)) >= 3


def test_gated_mlp_v2_backward_leaves_saved_tensors_intact():
    """The v2 backward reuses its own buffers only: a retained graph differentiates again to the
    same gradients (a backward writing into the saved h would change the second result)."""
    g = torch.Generator().manual_seed(7)
    xs = [torch.randn(*s, generator=g).to(DEVICE).requires_grad_() for s in ((4, 6, 10), (24, 10),
                                                                             (4, 6, 24))]
    y = gated_mlp_triton.tied_gated_mlp_step(*xs)
    first = torch.autograd.grad(y.square().sum(), xs, retain_graph=True)
    second = torch.autograd.grad(y.square().sum(), xs)
    for a, b in zip(first, second):
        assert torch.equal(a, b)


def _graph_nodes(t):
    seen, todo = [], [t.grad_fn]
    while todo:
        node = todo.pop()
        if node is not None and node not in seen:
            seen.append(node)
            todo.extend(n for n, _ in node.next_functions)
    return [type(n).__name__ for n in seen]


def test_gated_mlp_v2_eager_is_one_autograd_function():
    """In eager mode the v2 step is one ``autograd.Function`` over the launchers (less host time
    than its pair of ``torch.library`` operators, which serve ``torch.compile``: see the compile
    test below); its gradients are those of the operators' derivative."""
    g = torch.Generator().manual_seed(3)
    xs = [torch.randn(*s, generator=g).to(DEVICE) for s in ((5, 8), (12, 8), (5, 12))]
    leaves = [x.clone().requires_grad_() for x in xs]
    y = gated_mlp_triton.tied_gated_mlp_step(*leaves)
    names = _graph_nodes(y)
    assert "_TiedMLPStepBackward" in names and not any("tied_mlp_step" in n for n in names), names
    y.square().sum().backward()
    for a, b in zip(leaves, _operators_grads(xs, 2 * y.detach(), "accumulate")):
        assert torch.equal(a.grad, b)


def _operators_grads(xs, dy, mode):
    """``(du, dV, dgamma)`` through the forward and backward operators a compiled graph calls
    (the derivative AOTAutograd traces from the step's ``autograd.Function``)."""
    _, h = gated_mlp_triton._step_fwd(*xs)
    return gated_mlp_triton._step_bwd(dy, *xs, h, mode)


@pytest.mark.parametrize("path", ["eager", "operators"])
def test_gated_mlp_v2_forms_dV_either_way(path):
    """``dv_products``: the second half of ``dV`` added into the first's buffer (``addmm_``, the
    default) or computed apart and added; both give the float64 reference's gradients (fp32, odd
    shape), through the eager Function and through the operators that serve ``torch.compile``
    (called as the derivative dynamo traces calls them). Failing input, shown once:
    with ``"separate"`` overwriting ``dV`` instead of adding to it, ``dV`` was off by its whole
    first half (relative error ~0.7)."""
    g = torch.Generator().manual_seed(8)
    base = [torch.randn(7, 9, generator=g, dtype=torch.float64),
            torch.randn(20, 9, generator=g, dtype=torch.float64) / 3,
            torch.randn(7, 20, generator=g, dtype=torch.float64)]
    cot = torch.randn(7, 9, generator=g, dtype=torch.float64)
    exact = [x.clone().requires_grad_() for x in base]
    (reference.tied_gated_mlp_step(*exact) * cot).sum().backward()
    for mode in gated_mlp_triton.DV_PRODUCTS:
        xs = [x.float().to(DEVICE).requires_grad_() for x in base]
        if path == "eager":
            y = gated_mlp_triton.tied_gated_mlp_step(*xs, dv_products=mode)
            (y.double() * cot.to(DEVICE)).sum().backward()
            grads = [x.grad for x in xs]
        else:
            grads = _operators_grads([x.detach() for x in xs], cot.float().to(DEVICE), mode)
        for got, want in zip(grads, exact):
            assert rel_err(got, want.grad) < 1e-5, (mode, path)
    with pytest.raises(ValueError, match="dv_products"):
        gated_mlp_triton.tied_gated_mlp_step(*xs, dv_products="split")


def test_dispatch_sends_the_mlp_step_to_v2(monkeypatch):
    calls = []
    real = gated_mlp_triton.tied_gated_mlp_step
    monkeypatch.setattr(gated_mlp_triton, "tied_gated_mlp_step",
                        lambda *a: calls.append(1) or real(*a))
    u, V, gamma = torch.randn(3, 8, device=DEVICE), torch.randn(5, 8, device=DEVICE), \
        torch.randn(3, 5, device=DEVICE)
    with dispatch.use_backend("triton"):
        y = dispatch.tied_gated_mlp_step(u, V, gamma)
    assert calls == [1] and rel_err(y, reference.tied_gated_mlp_step(u, V, gamma)) < 1e-6


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize("shape", [(2, 3, 20, 4), (1, 1, 37, 16), (5, 1, 64, 1)])
def test_dplr_precondition_matches_reference(shape, dtype):
    a, b, Dh, R = shape
    g = torch.Generator().manual_seed(5)
    base = [torch.randn(a, b, Dh, generator=g, dtype=torch.float64),
            torch.randn(Dh, generator=g, dtype=torch.float64),
            torch.randn(Dh, R, generator=g, dtype=torch.float64) / Dh ** 0.5,
            torch.randn(Dh, R, generator=g, dtype=torch.float64) / Dh ** 0.5]
    cot = torch.randn(a, b, Dh, generator=g, dtype=torch.float64).to(DEVICE)
    results = {}
    for key, fn, dt in (("got", ops.dplr_precondition, dtype),
                        ("ref", reference.dplr_precondition, dtype),
                        ("exact", reference.dplr_precondition, torch.float64)):
        xs = [x.to(dt).to(DEVICE).requires_grad_() for x in base]
        y = fn(*xs)
        (y.double() * cot).sum().backward()
        results[key] = [y] + [x.grad for x in xs]
    for i, (a_, r, e) in enumerate(zip(results["got"], results["ref"], results["exact"])):
        if dtype == torch.float32:
            assert rel_err(a_, r) < 1e-5, i
        else:
            assert rel_err(a_, e) <= 2 * rel_err(r, e) + 2e-3, i


def test_dplr_precondition_gradcheck_float64():
    g = torch.Generator().manual_seed(6)
    xs = [torch.randn(4, 7, generator=g, dtype=torch.float64), torch.randn(7, generator=g,
          dtype=torch.float64), torch.randn(7, 2, generator=g, dtype=torch.float64),
          torch.randn(7, 2, generator=g, dtype=torch.float64)]
    xs = [x.to(DEVICE).requires_grad_() for x in xs]
    assert torch.autograd.gradcheck(ops.dplr_precondition, xs, fast_mode=True)
    # the backward's P dout goes through the preconditioner's autograd again: second order exact
    assert torch.autograd.gradgradcheck(ops.dplr_precondition, xs, fast_mode=True)


def test_dplr_precondition_traces_under_torch_compile():
    """While compiling, the preconditioner is one opaque operator (no graph break, fullgraph)
    with the eager function's values and gradients; in eager mode no operator is dispatched (the
    launcher is called directly). Failing input, shown once: a backward that computed ``dg`` with
    the launcher instead of the function fails the gradgradcheck above."""
    g = torch.Generator().manual_seed(7)
    base = [torch.randn(2, 5, 12, generator=g), torch.randn(12, generator=g),
            torch.randn(12, 3, generator=g) / 4, torch.randn(12, 3, generator=g) / 4]
    torch._dynamo.reset()

    def energy(x, d, U, V):
        return ops.dplr_precondition(x, d, U, V).square().sum()

    results = []
    for fn in (energy, torch.compile(energy, backend="aot_eager", fullgraph=True)):
        xs = [x.to(DEVICE).requires_grad_() for x in base]
        val = fn(*xs)
        val.backward()
        results.append([val] + [x.grad for x in xs])
    for a, b in zip(*results):
        assert rel_err(a, b) < 1e-6
    from torch.profiler import profile
    xs = [x.to(DEVICE).requires_grad_() for x in base]
    with profile() as prof:
        energy(*xs).backward()
    assert not any(e.name.startswith("cemlib::") for e in prof.events())


def test_dispatch_forced_triton_v1_runs_the_first_kernels(monkeypatch):
    inp = make_attention_inputs(1, 2, 9, 8, 0, False, True, torch.float32)
    calls = []
    real = tied_attention_triton.attention_forward
    monkeypatch.setattr(tied_attention_triton, "attention_forward",
                        lambda *a: calls.append(1) or real(*a))
    with dispatch.use_backend("triton_v1"):
        o, lse = dispatch.tied_attention(inp["q"], inp["kv"], scale=0.5, alibi=inp["alibi"])
    with dispatch.use_backend("reference"):
        o_ref, lse_ref = dispatch.tied_attention(inp["q"], inp["kv"], scale=0.5, alibi=inp["alibi"])
    assert calls == [1]
    assert rel_err(o, o_ref) < 1e-5 and rel_err(lse, lse_ref) < 1e-5


def test_custom_ops_trace_under_torch_compile():
    """The ops stay single graph nodes under torch.compile (fullgraph: no graph breaks)."""
    inp = make_attention_inputs(1, 2, 11, 8, 4, False, True, torch.float32)
    wide = make_attention_inputs(1, 2, 11, 8, 130, False, False, torch.float32, seed=5)
    torch._dynamo.reset()

    def energy_and_step(q, kv, qe, ke, qw, kw, u, V, gamma):
        o, lse = ops.tied_attention(q, kv, scale=0.5, alibi=inp["alibi"], q_extra=qe, k_extra=ke)
        # in-tile path with head-summed values, then the shared-logits path
        _, _, oe = ops.tied_attention(q, kv, scale=0.5, q_extra=qe, k_extra=ke,
                                      extra_values=True, extra_head_sum=True)
        ow, lw, oew = ops.tied_attention(q, kv, scale=0.5, q_extra=qw, k_extra=kw,
                                         extra_values=True, extra_head_sum=True)
        y = ops.tied_gated_mlp_step(u, V, gamma)
        y2 = gated_mlp_triton.tied_gated_mlp_step(u, V, gamma)  # v2: forward and backward ops
        y3 = gated_mlp_triton.tied_gated_mlp_step(u, V, gamma, dv_products="separate")
        return (-lse.sum() / 0.5 + o.square().sum() + oe.square().sum() + ow.square().sum()
                + lw.sum() + oew.square().sum() + y.square().sum() + y2.pow(3).sum()
                + y3.sin().sum())

    mlp = [torch.randn(2, 3, 6), torch.randn(10, 6), torch.randn(2, 3, 10)]
    xs = ([inp["q"], inp["kv"], inp["q_extra"], inp["k_extra"], wide["q_extra"], wide["k_extra"]]
          + [m.to(DEVICE) for m in mlp])
    results = []
    for fn in (energy_and_step, torch.compile(energy_and_step, backend="aot_eager",
                                              fullgraph=True)):
        leaves = [x.clone().requires_grad_() for x in xs]
        val = fn(*leaves)
        val.backward()
        results.append([val] + [x.grad for x in leaves])
    for a, b in zip(*results):
        assert rel_err(a, b) < 1e-6


@pytest.mark.parametrize("d_model, diag, precond", [
    (24, "none", "none"), (24, "shared", "none"), (24, "per_head", "none"),
    (136, "shared", "none"),   # D_h > MAX_TILE_EXTRA: the shared-logits path (the default layer)
    (136, "shared", "dplr"),   # per-head P_k needs per-head diagonal values: in-tile path
])
def test_cem_attention_layer_same_through_both_backends(d_model, diag, precond):
    """End to end: the CEM layer (T = 2 recursion steps) gives the same output and parameter
    gradients through the kernels as through the reference. Truth is the float64 reference; the
    fp32 kernels' error must be at most twice the fp32 reference's (+ a floor): with a strong
    diagonal the fp32 *reference* is the less accurate one (about 5e-4 against 2e-5 here, CPU)."""
    layers = pytest.importorskip("cemlib.layers.cem_attention")
    torch.manual_seed(0)
    layer = layers.CEMAttention(d_model, 2 if d_model > 100 else 3, T=2, diag=diag,
                                preconditioner=precond, init_std=0.3).to(DEVICE)
    if diag != "none":
        torch.nn.init.normal_(layer.d, std=0.5)  # zero at init: make the diagonal term count
    x = torch.randn(2, 13, d_model, device=DEVICE)
    results = []
    for backend, dtype in (("reference", torch.float64), ("reference", torch.float32),
                           ("triton", torch.float32)):
        net = copy.deepcopy(layer).to(dtype)
        with dispatch.use_backend(backend):
            y = net(x.to(dtype))
            y.square().sum().backward()
        results.append([y] + [p.grad for p in net.parameters() if p.grad is not None])
    assert len(results[0]) == len(results[1]) == len(results[2]) > 3
    # Measured against the fp32 reference's worst output: the per-head bias gradients are sums of
    # B*L^2 score gradients that cancel (the rows of dS sum to zero), and on CUDA the reference's
    # tree-ordered sums are luckier there than the kernels' tile-ordered ones (H100: 2.8e-5 and
    # 4.9e-5 against 9e-7, while both are 2e-5 to 1.2e-4 on W_Q, W_K, d and the norm weight).
    ref_worst = max(rel_err(ref, exact) for exact, ref in zip(results[0], results[1]))
    for exact, got in zip(results[0], results[2]):
        assert rel_err(got, exact) <= 2 * ref_worst + 2e-5


def test_cem_mlp_layer_same_through_both_backends():
    layers = pytest.importorskip("cemlib.layers.cem_mlp")
    torch.manual_seed(0)
    layer = layers.CEMMLP(16, 40, T=2, init_std=0.3).to(DEVICE)
    x = torch.randn(2, 5, 16, device=DEVICE)
    results = []
    for backend in ("reference", "triton"):
        layer.zero_grad()
        with dispatch.use_backend(backend):
            y = layer(x)
            y.square().sum().backward()
        results.append([y] + [p.grad for p in layer.parameters() if p.grad is not None])
    assert len(results[0]) == len(results[1]) > 2
    for a, b in zip(*results):
        assert rel_err(a, b) < 2e-5


@pytest.mark.skipif(CUDA, reason="interpreter-only guard")
def test_interpreter_refuses_bfloat16():
    x = torch.randn(1, 1, 4, 8, dtype=torch.bfloat16)
    with pytest.raises(TypeError, match="bfloat16 is not supported under TRITON_INTERPRET"):
        ops.tied_attention(x, x, scale=1.0)
    for step in MLP_STEPS.values():
        with pytest.raises(TypeError, match="bfloat16"):
            step(x[0, 0], torch.randn(3, 8, dtype=torch.bfloat16),
                 torch.randn(4, 3, dtype=torch.bfloat16))
    with pytest.raises(TypeError, match="bfloat16"):
        ops.dplr_precondition(x[0, 0], *(torch.randn(8, dtype=torch.bfloat16),
                                         torch.randn(8, 2, dtype=torch.bfloat16),
                                         torch.randn(8, 2, dtype=torch.bfloat16)))
