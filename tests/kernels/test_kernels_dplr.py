"""The DPLR preconditioner's kernel (:mod:`cemlib.kernels.dplr`, CEM eq. 13) against the PyTorch
reference: output and every gradient in fp32 and fp16, first and second derivatives in float64,
and ``torch.compile``. On a machine without CUDA the kernel runs under Triton's interpreter.
"""

import pytest
import torch

from triton_interpreter import CUDA, DEVICE, kernels_usable, rerun_in_fresh_process  # noqa: F401

triton = pytest.importorskip("triton")

from cemlib.kernels import dplr, reference  # noqa: E402


@pytest.mark.slow
def test_interpreted_suite_in_fresh_process():
    rerun_in_fresh_process(__file__)


def rel_err(a, b):
    """max |a - b| / max |b| (b the trusted value), computed in float64 on the CPU (the two may
    lie on different devices)."""
    a, b = a.detach().double().cpu(), b.detach().double().cpu()
    return ((a - b).abs().max() / b.abs().max().clamp_min(1e-30)).item()


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
    for key, fn, dt in (("got", dplr.dplr_precondition, dtype),
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
    assert torch.autograd.gradcheck(dplr.dplr_precondition, xs, fast_mode=True)
    # the backward's P dout goes through the preconditioner's autograd again: second order exact
    assert torch.autograd.gradgradcheck(dplr.dplr_precondition, xs, fast_mode=True)


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
        return dplr.dplr_precondition(x, d, U, V).square().sum()

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


@pytest.mark.skipif(CUDA, reason="interpreter-only guard")
def test_interpreter_refuses_bfloat16():
    x = torch.randn(4, 8, dtype=torch.bfloat16)
    with pytest.raises(TypeError, match="bfloat16 is not supported under TRITON_INTERPRET"):
        dplr.dplr_precondition(x, torch.randn(8, dtype=torch.bfloat16),
                               torch.randn(8, 2, dtype=torch.bfloat16),
                               torch.randn(8, 2, dtype=torch.bfloat16))
