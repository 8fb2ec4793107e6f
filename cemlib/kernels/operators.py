"""cemlib operators that no autograd layer wraps, registered with a lean dispatch.

Under ``torch.compile`` the fused layers run as opaque ``torch.library`` operators: a forward and
a backward operator per layer, called by the layer's ``autograd.Function`` while dynamo traces it
(``tied_attention_v2._TiedAttention``, ``gated_mlp_triton._TiedMLPStep``,
``ops._DPLRPrecondition``; in eager mode the same functions call the launchers). AOTAutograd puts
the forward operator into the compiled forward graph and the backward operator into the backward
graph, and at run time nothing but the dispatcher stands between a graph and an operator's
kernel. A compiled training step calls every layer's operators at every step, and where the step
is host-bound, each call's host time is time the GPU waits for (the H100 run of 2026-11-27: a
compiled CEM step took 22 ms for 15 ms of GPU kernels).
``torch.library.custom_op`` would call an operator's kernel through several Python layers: an
autograd layer (even for an operator without a derivative, and in a compiled graph, where grad
mode is off), a redispatch below it, a wrapper that checks the outputs for aliases of the inputs,
a ``torch._dynamo`` guard: about 10 us per call on this project's CPU for the attention backward's
17 arguments (22 us against 12 us registered with ``Library.impl``; ``benchmarks/NOTES.md``, step
25), about 10 us more for a forward with its derivative (step 27).

:func:`define` registers an operator the direct way: its schema, tagged ``pt2_compliant_tag`` as
``custom_op`` tags it; its kernel for CPU and CUDA tensors; its fake (meta) kernel for tracing. It
serves the forward and backward operators of the compiled path, and operators used only without
autograd (the MLP step's inference). What ``custom_op`` adds and these go without: its runtime
check that no output aliases an input (the kernels return new tensors: ``tests/test_operators.py``
checks each operator), and a derivative of its own (an operator called outside the
``autograd.Function`` has none: a backward through it fails).
"""

from __future__ import annotations

from typing import Callable

import torch

__all__ = ["define", "LIBRARY"]

#: the ``cemlib`` namespace's fragment that holds the operators defined here
LIBRARY = torch.library.Library("cemlib", "FRAGMENT")


def define(name: str, schema: str, kernel: Callable, fake: Callable):
    """Define ``cemlib::<name>``: ``schema`` its arguments and returns as ``torch.library`` writes
    them (``"(Tensor x, float s) -> Tensor[]"``), ``kernel`` its implementation for CPU and CUDA
    tensors, ``fake`` its fake (meta) implementation for tracing. Returns the operator
    (``torch.ops.cemlib.<name>.default``), called with the schema's arguments in order.

    An operator that exists already is returned as it is: a module that defines one, imported a
    second time (``importlib.reload``, or a fresh import after its entry left ``sys.modules``),
    keeps the first definition, whose fragment lives as long as anything refers to the first
    module (the dispatcher refuses a second definition of one name)."""
    existing = getattr(torch.ops.cemlib, name, None)
    if existing is not None:
        return existing.default
    LIBRARY.define(name + schema, tags=(torch.Tag.pt2_compliant_tag,))
    for key in ("CPU", "CUDA"):
        LIBRARY.impl(name, kernel, key)
    torch.library.register_fake(f"cemlib::{name}", fake, lib=LIBRARY)
    return getattr(torch.ops.cemlib, name).default
