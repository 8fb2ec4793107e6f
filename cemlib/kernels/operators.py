"""cemlib operators that no autograd graph records, registered with a lean dispatch.

Under ``torch.compile`` the fused layers run as opaque ``torch.library`` operators: a forward
operator with its derivative (``torch.library.custom_op`` and ``register_autograd``), whose
formula calls a backward operator. A compiled training step calls every layer's operators at
every step, and where the step is host-bound, each call's host time is time the GPU waits for
(the H100 run of 2026-11-27: a compiled CEM step took 22 ms for 15 ms of GPU kernels).
``custom_op`` calls an operator's kernel through several Python layers: an autograd layer (even
for an operator without a derivative), a redispatch below it, a wrapper that checks the outputs
for aliases of the inputs, a ``torch._dynamo`` guard. For an operator with the attention
backward's 17 arguments that is about 10 us per call on this project's CPU (22 us against 12 us
registered with ``Library.impl``; ``benchmarks/NOTES.md``, step 25).

:func:`define` registers an operator that needs no derivative the direct way: its schema, tagged
``pt2_compliant_tag`` as ``custom_op`` tags it; its kernel for CPU and CUDA tensors; its fake
(meta) kernel for tracing. It serves the operators no autograd graph records: the backward
operators, which only the derivative formulas of compiled forward operators call (AOTAutograd
traces a formula once, and a compiled graph has no double backward), and operators used only
without autograd (the MLP step's inference). What ``custom_op`` adds and these go without: its
runtime check that no output aliases an input (the kernels return new tensors:
``tests/test_operators.py`` checks each operator), and an error at a backward through the
operator (no graph records one).
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
    (``torch.ops.cemlib.<name>.default``), called with the schema's arguments in order."""
    LIBRARY.define(name + schema, tags=(torch.Tag.pt2_compliant_tag,))
    for key in ("CPU", "CUDA"):
        LIBRARY.impl(name, kernel, key)
    torch.library.register_fake(f"cemlib::{name}", fake, lib=LIBRARY)
    return getattr(torch.ops.cemlib, name).default
