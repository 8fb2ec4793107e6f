"""Triton kernels by operation, their ``autograd.Function``s, and dispatch with PyTorch fallbacks.

One module per operation, each holding its kernels, launcher, autograd and compiled-path
operators: :mod:`~cemlib.kernels.attention` (tied causal attention),
:mod:`~cemlib.kernels.gated_mlp` (the tied gated-MLP step), :mod:`~cemlib.kernels.dplr` (the DPLR
preconditioner); what they share in :mod:`~cemlib.kernels.runtime`. :mod:`~cemlib.kernels.reference` is the contract every kernel
is tested against, :mod:`~cemlib.kernels.attention_torch` the closed-form CPU attention,
:mod:`~cemlib.kernels.costs` the FLOP/byte models and FLOP counter,
:mod:`~cemlib.kernels.launches` the launch and operator counters.

Layers call the functions re-exported here; :func:`set_backend` (or ``$CEMLIB_KERNELS``) forces
``"triton"``, ``"torch"`` or ``"reference"``; ``"auto"`` uses Triton on CUDA where it is available
(:mod:`cemlib.kernels.dispatch`). Importing this package does not import Triton.
"""

from cemlib.kernels.dispatch import (dots_on_tensor_cores, dplr_precondition, get_backend,
                                     set_backend, tied_attention, tied_gated_mlp_step,
                                     triton_available, use_backend)
from cemlib.kernels.reference import alibi_slopes, attention_bias

__all__ = ["tied_attention", "tied_gated_mlp_step", "dplr_precondition", "set_backend", "get_backend",
           "use_backend", "triton_available", "dots_on_tensor_cores", "alibi_slopes",
           "attention_bias"]
