"""The operators registered without ``torch.library.custom_op`` (:mod:`cemlib.kernels.operators`):
the attention v2 forward and backward, the MLP step's forward, backward and inference, the
DPLR preconditioner.

``custom_op`` checks at every call that no output aliases an input; these operators go without
that check, so it is made here, once per operator: every output is a new tensor. Also: each
operator returns what its kernel function returns, its fake (meta) implementation gives the
outputs' shapes and dtypes, and it carries the ``pt2_compliant_tag`` that ``custom_op`` gives
(``torch.compile`` of a model that calls them is tested in ``test_kernels_v2.py`` and
``test_kernels_triton.py``). On the CPU the kernels run under Triton's interpreter.
"""

import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode

from triton_interpreter import CUDA, DEVICE, kernels_usable, rerun_in_fresh_process  # noqa: F401

triton = pytest.importorskip("triton")

from cemlib.kernels import gated_mlp_triton as gm  # noqa: E402
from cemlib.kernels import ops  # noqa: E402
from cemlib.kernels import reference  # noqa: E402
from cemlib.kernels import tied_attention_v2 as v2  # noqa: E402

DTYPE = torch.float16 if CUDA else torch.float32


def test_interpreted_suite_in_fresh_process():
    rerun_in_fresh_process(__file__)


def _attention_backward_args():
    g = torch.Generator().manual_seed(0)
    B, K, L, D = 2, 2, 13, 16
    q, kv, do = (torch.randn(B, K, L, D, generator=g).to(DEVICE, DTYPE) for _ in range(3))
    alibi = reference.alibi_slopes(K).to(DEVICE)
    sb, cb = (torch.randn(K, generator=g).to(DEVICE) for _ in range(2))
    o, lse, _, e2, a = v2.forward(q, kv, D ** -0.5, alibi, sb, cb)
    needs = [True, True, False, True, True, False, False]
    return (do, None, None, q, kv, o, lse, D ** -0.5, alibi, sb, cb, None, None, e2, a, needs, -1)


def _attention_forward_args():
    """The default layer's call: ALiBi, self/cross biases, the head-shared extra pair with
    head-summed values (every output of the forward operator is a tensor of its own)."""
    g = torch.Generator().manual_seed(2)
    B, K, L, D, De = 2, 2, 13, 16, 12
    q, kv = (torch.randn(B, K, L, D, generator=g).to(DEVICE, DTYPE) for _ in range(2))
    qe, ke = (torch.randn(B, L, De, generator=g).to(DEVICE, DTYPE) for _ in range(2))
    alibi = reference.alibi_slopes(K).to(DEVICE)
    sb, cb = (torch.randn(K, generator=g).to(DEVICE) for _ in range(2))
    return (q, kv, D ** -0.5, alibi, sb, cb, qe, ke, True)


def _mlp_args():
    g = torch.Generator().manual_seed(1)
    u, dy = (torch.randn(7, 16, generator=g).to(DEVICE, DTYPE) for _ in range(2))
    V = torch.randn(40, 16, generator=g).to(DEVICE, DTYPE)
    gamma = torch.randn(7, 40, generator=g).to(DEVICE, DTYPE)
    _, h = gm._forward(u, V, gamma)
    return (dy, u, V, gamma, h), (u, V, gamma)


def _dplr_args():
    g = torch.Generator().manual_seed(3)
    return (torch.randn(7, 16, generator=g).to(DEVICE, DTYPE),
            torch.randn(16, generator=g).to(DEVICE, DTYPE),
            *(0.25 * torch.randn(16, 4, generator=g).to(DEVICE, DTYPE) for _ in range(2)))


def _cases():
    """``(name, operator, its kernel function, arguments)``"""
    bwd = _attention_backward_args()
    mlp_bwd, mlp_infer = _mlp_args()
    return [("tied_attention_v2_bwd", v2._bwd_op, v2._bwd_kernel_op, bwd),
            ("tied_attention_v2_fwd", v2._fwd_op, v2._fwd_kernel_op, _attention_forward_args()),
            ("tied_mlp_step_bwd", gm._step_bwd, gm._backward, mlp_bwd),
            ("tied_mlp_step_fwd", gm._step_fwd, gm._forward, mlp_infer),
            ("tied_mlp_step_infer", gm._step_infer, gm._inference, mlp_infer),
            ("dplr_precondition", ops._dplr, ops._dplr_kernel, _dplr_args())]


def _tensors(x):
    return [t for t in (x if isinstance(x, (list, tuple)) else [x]) if isinstance(t, torch.Tensor)]


def _shares_memory(a, b) -> bool:
    """Whether two tensors share their memory (empty tensors own none)."""
    return bool(a.numel() and b.numel()) and \
        a.untyped_storage().data_ptr() == b.untyped_storage().data_ptr()


@pytest.mark.parametrize("case", range(6))
def test_operators_return_new_tensors_equal_to_their_kernels(case):
    name, op, kernel, args = _cases()[case]
    assert op.name() == f"cemlib::{name}" and torch.Tag.pt2_compliant_tag in op.tags
    got = _tensors(op(*args))
    inputs = _tensors(args)
    for i, out in enumerate(got):  # custom_op's alias check, made here
        assert not any(_shares_memory(out, x) for x in inputs), (name, i)
    for i, (a, b) in enumerate(zip(got, _tensors(kernel(*args)))):
        assert torch.equal(a, b), (name, i)
    # the fake implementation: the outputs' shapes and dtypes, without running a kernel
    with FakeTensorMode(allow_non_fake_inputs=False) as mode:
        fake_args = [mode.from_tensor(t) if isinstance(t, torch.Tensor) else t for t in args]
        fake = _tensors(op(*fake_args))
    assert [(t.shape, t.dtype) for t in fake] == [(t.shape, t.dtype) for t in got]


def test_an_output_that_aliases_an_input_is_caught():
    """The check above fails where an operator hands back an input or a view of one (what
    ``custom_op`` would have refused at the call)."""
    x = torch.randn(4, 4)
    assert _shares_memory(x[1:], x) and _shares_memory(x, x)
    assert not _shares_memory(x.clone(), x) and not _shares_memory(x.new_empty(0), x)


def _has_kernel(name: str, key: str) -> bool:
    return torch._C._dispatch_has_kernel_for_dispatch_key(f"cemlib::{name}", key)


def test_no_autograd_layer_stands_before_the_operators_of_a_compiled_graph():
    """Each operator registered here has a kernel for CPU and CUDA tensors and none for autograd:
    a compiled graph reaches the kernel function through the dispatcher alone (the derivative is
    the ``autograd.Function`` that dynamo traced into the graph; ``benchmarks/NOTES.md``, step
    27). Failing input: an operator made with ``torch.library.custom_op``, such as the first
    version's attention forward, has an autograd kernel (custom_op's Python layer, which runs at
    every call, with grad mode off too)."""
    for name, *_ in _cases():
        assert _has_kernel(name, "CPU") and _has_kernel(name, "CUDA"), name
        assert not _has_kernel(name, "Autograd"), name
    assert _has_kernel("tied_attention_fwd", "Autograd")  # (registered by importing ops)


def test_an_operator_defined_again_keeps_its_first_definition():
    """A module that defines operators, imported a second time (a reload, or a fresh import
    after its ``sys.modules`` entry was dropped, as ``test_imports.py`` does), defines them
    again while the first definitions live on: ``define`` keeps the first. Failing input,
    shown once by that test: without the check the dispatcher refused the DPLR operator's
    second definition ("registered ... multiple times")."""
    from cemlib.kernels import operators
    fake = lambda x: x.new_empty(x.shape)  # noqa: E731
    first = operators.define("test_defined_twice", "(Tensor x) -> Tensor", torch.clone, fake)
    again = operators.define("test_defined_twice", "(Tensor x) -> Tensor", torch.neg, fake)
    x = torch.ones(3)
    assert again.name() == first.name() == "cemlib::test_defined_twice"
    assert torch.equal(again(x), x)  # the first kernel
