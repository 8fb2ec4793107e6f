"""Activation memory: the bytes autograd keeps for the backward pass.

Training memory beyond the weights and optimiser state is dominated by the activations that
autograd saves in the forward pass for use in the backward pass. :func:`saved_activation_bytes`
measures them exactly, through ``torch.autograd.graph.saved_tensors_hooks``: every tensor autograd
saves passes through the pack hook, and the bytes of its storage are summed, each storage once
(views and tensors saved twice share a storage), leaving out the storages of ``exclude`` (the
parameters, which are memory of the model, not of the activations). The count depends only on the
shapes, dtypes and the autograd graph, not on timing or load, so it is deterministic on a given
PyTorch version. :func:`lm_saved_activation_bytes` applies it to one training forward (logits and
cross-entropy) of a language model.
"""

from __future__ import annotations

from typing import Callable, Iterable

import torch
import torch.nn.functional as F
from torch import nn

__all__ = ["saved_activation_bytes", "lm_saved_activation_bytes"]


def saved_activation_bytes(fn: Callable[[], object], exclude: Iterable[torch.Tensor] = ()) -> int:
    """Bytes of the tensors autograd saves for backward while ``fn()`` runs, each storage counted
    once, storages of the tensors in ``exclude`` (e.g. ``model.parameters()``) left out.

    ``fn`` takes no arguments; its result is kept alive until the count is done (so no saved
    storage is freed and its address reused by another one before it is counted). Under
    ``torch.no_grad()`` nothing is saved and the result is 0.
    """
    if not callable(fn):
        raise TypeError(f"fn must be callable, got {type(fn).__name__}")
    seen: dict[int, int] = {}

    def pack(t: torch.Tensor) -> torch.Tensor:
        s = t.untyped_storage()
        ptr = s.data_ptr()
        seen[ptr] = max(seen.get(ptr, 0), s.nbytes())
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        out = fn()
    skip = {t.untyped_storage().data_ptr() for t in exclude}
    total = sum(n for ptr, n in seen.items() if ptr not in skip)
    del out
    return total


def lm_saved_activation_bytes(model: nn.Module, idx: torch.Tensor, targets: torch.Tensor) -> int:
    """:func:`saved_activation_bytes` of one training forward of a language model: logits of
    ``model(idx)`` (B, L, vocab) and their cross-entropy with ``targets`` (B, L); parameters
    excluded. Divide by ``idx.numel()`` for bytes per token."""
    if idx.shape != targets.shape:
        raise ValueError(f"idx and targets must have the same shape, got {tuple(idx.shape)} and "
                         f"{tuple(targets.shape)}")

    def loss():
        logits = model(idx)
        return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1))

    return saved_activation_bytes(loss, exclude=list(model.parameters()))
