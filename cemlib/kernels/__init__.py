"""Fused Triton kernels, their ``autograd.Function``s, and dispatch with PyTorch fallbacks.

Layers call the functions re-exported here; :func:`set_backend` (or ``$CEMLIB_KERNELS``) forces
``"triton"``, ``"triton_v1"`` (the first version of the attention kernels), ``"torch"`` or
``"reference"``; ``"auto"`` uses Triton on CUDA when it is available (attention and the
preconditioner from compute capability 8.0, :func:`dots_on_tensor_cores`), and on the CPU the
closed-form attention of :mod:`cemlib.kernels.tied_attention_torch`. Importing this package does
not import Triton.
"""

from cemlib.kernels.dispatch import (dots_on_tensor_cores, dplr_precondition, get_backend,
                                     set_backend, tied_attention, tied_gated_mlp_step,
                                     triton_available, use_backend)
from cemlib.kernels.reference import alibi_slopes, attention_bias

__all__ = ["tied_attention", "tied_gated_mlp_step", "dplr_precondition", "set_backend", "get_backend",
           "use_backend", "triton_available", "dots_on_tensor_cores", "alibi_slopes",
           "attention_bias"]
