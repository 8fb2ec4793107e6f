"""The tied gated-MLP step's kernels (:mod:`cemlib.kernels.gated_mlp`) against the PyTorch
reference: output and every gradient, awkward shapes, what it saves for backward, both forms of
``dV``, ``torch.compile``, dispatch, and the CEM MLP layer through the kernels.

On a machine without CUDA the kernels run under Triton's interpreter (``triton_interpreter.py``
explains how): fp32 and fp16 only (the interpreter silently breaks bf16; bf16 is tested on CUDA
in ``test_kernels_cuda.py``); float64 for ``gradcheck``.
"""

import pytest
import torch

from triton_interpreter import CUDA, DEVICE, kernels_usable, rerun_in_fresh_process  # noqa: F401

triton = pytest.importorskip("triton")

from cemlib.kernels import dispatch, reference  # noqa: E402
from cemlib.kernels import gated_mlp  # noqa: E402


@pytest.mark.slow
def test_interpreted_suite_in_fresh_process():
    rerun_in_fresh_process(__file__)


def rel_err(a, b):
    """max |a - b| / max |b| (b the trusted value), computed in float64 on the CPU (the two may
    lie on different devices)."""
    a, b = a.detach().double().cpu(), b.detach().double().cpu()
    return ((a - b).abs().max() / b.abs().max().clamp_min(1e-30)).item()


# leading dims (a, b), D_h, D_v; (2, 7, 33, 90): N D_v = 1260 entries, two element-wise programs
MLP_CASES = [(1, 5, 12, 40), (2, 7, 33, 17), (1, 1, 16, 64), (2, 7, 33, 90), (1, 1, 1, 1)]


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize("case", MLP_CASES)
def test_gated_mlp_step_matches_reference(case, dtype):
    """Output and every gradient against the float64 reference: fp32 to 1e-5 relative, fp16
    within the FlashAttention criterion (at most twice the fp16 reference's error + 1e-3)."""
    a, b, Dh, Dv = case
    g = torch.Generator().manual_seed(3)
    base = [torch.randn(a, b, Dh, generator=g, dtype=torch.float64),
            torch.randn(Dv, Dh, generator=g, dtype=torch.float64) / Dh ** 0.5,
            torch.randn(a, b, Dv, generator=g, dtype=torch.float64)]
    cot = torch.randn(a, b, Dh, generator=g, dtype=torch.float64)
    results = {}
    for key, fn, dt in (("got", gated_mlp.tied_gated_mlp_step, dtype),
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
def test_gated_mlp_step_shapes_and_a_strided_cotangent(u_shape, gamma_shape):
    """The entry point's shape handling (2-D operands go through without a reshape, other
    shapes are flattened and ``gamma`` broadcast) and a cotangent that is not contiguous (the
    backward of ``y.sum()`` is an expanded tensor of stride 0): output and every gradient
    against the float64 reference, float32 to 1e-5."""
    g = torch.Generator().manual_seed(9)
    base = [torch.randn(u_shape, generator=g, dtype=torch.float64),
            torch.randn(10, 6, generator=g, dtype=torch.float64) / 6 ** 0.5,
            torch.randn(gamma_shape, generator=g, dtype=torch.float64)]
    results = []
    for fn, dt in ((gated_mlp.tied_gated_mlp_step, torch.float32),
                   (reference.tied_gated_mlp_step, torch.float64)):
        xs = [x.to(dt).to(DEVICE).requires_grad_() for x in base]
        y = fn(*xs)
        y.sum().backward()
        results.append([y] + [x.grad for x in xs])
    for got, exact in zip(*results):
        assert got.shape == exact.shape
        assert rel_err(got, exact) < 1e-5


def test_gated_mlp_step_gradcheck_float64():
    g = torch.Generator().manual_seed(4)
    xs = [torch.randn(3, 5, generator=g, dtype=torch.float64, device="cpu").to(DEVICE),
          torch.randn(6, 5, generator=g, dtype=torch.float64).to(DEVICE),
          torch.randn(3, 6, generator=g, dtype=torch.float64).to(DEVICE)]
    xs = [x.requires_grad_() for x in xs]
    assert torch.autograd.gradcheck(gated_mlp.tied_gated_mlp_step, xs, fast_mode=True)


def _saved_shapes(fn, *xs):
    saved = []
    with torch.autograd.graph.saved_tensors_hooks(lambda t: saved.append(tuple(t.shape)) or t,
                                                  lambda t: t):
        fn(*xs)
    return sorted(saved)


def test_gated_mlp_step_saves_little_for_backward():
    """Activation memory: the step keeps its inputs and h = u V^T (one (N, D_v) tensor) for
    backward; eager autograd keeps three (N, D_v) intermediates besides gamma."""
    u = torch.randn(9, 12, device=DEVICE, requires_grad=True)
    V = torch.randn(40, 12, device=DEVICE, requires_grad=True)
    gamma = torch.randn(9, 40, device=DEVICE, requires_grad=True)
    inputs = [(9, 12), (40, 12), (9, 40)]
    assert _saved_shapes(gated_mlp.tied_gated_mlp_step, u, V, gamma) == \
        sorted(inputs + [(9, 40)])
    assert _saved_shapes(reference.tied_gated_mlp_step, u, V, gamma).count((9, 40)) >= 3


def test_gated_mlp_backward_leaves_saved_tensors_intact():
    """The backward reuses its own buffers only: a retained graph differentiates again to the
    same gradients (a backward writing into the saved h would change the second result)."""
    g = torch.Generator().manual_seed(7)
    xs = [torch.randn(*s, generator=g).to(DEVICE).requires_grad_() for s in ((4, 6, 10), (24, 10),
                                                                             (4, 6, 24))]
    y = gated_mlp.tied_gated_mlp_step(*xs)
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


def test_gated_mlp_eager_is_one_autograd_function():
    """In eager mode the step is one ``autograd.Function`` over the launchers (less host time
    than its pair of ``torch.library`` operators, which serve ``torch.compile``: see the compile
    test below); its gradients are those of the operators' derivative."""
    g = torch.Generator().manual_seed(3)
    xs = [torch.randn(*s, generator=g).to(DEVICE) for s in ((5, 8), (12, 8), (5, 12))]
    leaves = [x.clone().requires_grad_() for x in xs]
    y = gated_mlp.tied_gated_mlp_step(*leaves)
    names = _graph_nodes(y)
    assert "_TiedMLPStepBackward" in names and not any("tied_mlp_step" in n for n in names), names
    y.square().sum().backward()
    for a, b in zip(leaves, _operators_grads(xs, 2 * y.detach(), "accumulate")):
        assert torch.equal(a.grad, b)


def _operators_grads(xs, dy, mode):
    """``(du, dV, dgamma)`` through the forward and backward operators a compiled graph calls
    (the derivative AOTAutograd traces from the step's ``autograd.Function``)."""
    _, h = gated_mlp._step_fwd(*xs)
    return gated_mlp._step_bwd(dy, *xs, h, mode)


@pytest.mark.parametrize("path", ["eager", "operators"])
def test_gated_mlp_forms_dV_either_way(path):
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
    for mode in gated_mlp.DV_PRODUCTS:
        xs = [x.float().to(DEVICE).requires_grad_() for x in base]
        if path == "eager":
            y = gated_mlp.tied_gated_mlp_step(*xs, dv_products=mode)
            (y.double() * cot.to(DEVICE)).sum().backward()
            grads = [x.grad for x in xs]
        else:
            grads = _operators_grads([x.detach() for x in xs], cot.float().to(DEVICE), mode)
        for got, want in zip(grads, exact):
            assert rel_err(got, want.grad) < 1e-5, (mode, path)
    with pytest.raises(ValueError, match="dv_products"):
        gated_mlp.tied_gated_mlp_step(*xs, dv_products="split")


def test_dispatch_sends_the_mlp_step_to_the_kernels(monkeypatch):
    calls = []
    real = gated_mlp.tied_gated_mlp_step
    monkeypatch.setattr(gated_mlp, "tied_gated_mlp_step",
                        lambda *a: calls.append(1) or real(*a))
    u, V, gamma = torch.randn(3, 8, device=DEVICE), torch.randn(5, 8, device=DEVICE), \
        torch.randn(3, 5, device=DEVICE)
    with dispatch.use_backend("triton"):
        y = dispatch.tied_gated_mlp_step(u, V, gamma)
    assert calls == [1] and rel_err(y, reference.tied_gated_mlp_step(u, V, gamma)) < 1e-6


def test_gated_mlp_step_traces_under_torch_compile():
    """While compiling, the step runs as opaque operators (forward and backward, either form of
    ``dV``) joined by the ``autograd.Function`` dynamo traces: no graph break (fullgraph), the
    eager values and gradients."""
    torch._dynamo.reset()

    def energy(u, V, gamma):
        y2 = gated_mlp.tied_gated_mlp_step(u, V, gamma)
        y3 = gated_mlp.tied_gated_mlp_step(u, V, gamma, dv_products="separate")
        return y2.pow(3).sum() + y3.sin().sum()

    g = torch.Generator().manual_seed(5)
    xs = [torch.randn(2, 3, 6, generator=g), torch.randn(10, 6, generator=g),
          torch.randn(2, 3, 10, generator=g)]
    results = []
    for fn in (energy, torch.compile(energy, backend="aot_eager", fullgraph=True)):
        leaves = [x.to(DEVICE).requires_grad_() for x in xs]
        val = fn(*leaves)
        val.backward()
        results.append([val] + [x.grad for x in leaves])
    for a, b in zip(*results):
        assert rel_err(a, b) < 1e-6


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
    x = torch.randn(4, 8, dtype=torch.bfloat16)
    with pytest.raises(TypeError, match="bfloat16 is not supported under TRITON_INTERPRET"):
        gated_mlp.tied_gated_mlp_step(x, torch.randn(3, 8, dtype=torch.bfloat16),
                                      torch.randn(4, 3, dtype=torch.bfloat16))
