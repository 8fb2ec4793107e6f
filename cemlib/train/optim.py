"""AdamW with decay / no-decay parameter groups, and a learning-rate schedule with warm-up and a floor.

Weight decay applies to parameters with two or more dimensions (projection matrices and
embeddings); vectors (normalisation gains, biases, CEM's diagonal and preconditioner parameters)
are not decayed. This is the usual Llama / nanoGPT convention; the CEM paper ([ICLR] Table 2)
states only "weight decay 0.1", so which tensors it decays is not known.

Schedules (``optim.schedule``; nanoGPT's form, with ``W`` warm-up steps, ``S`` total steps and
``p = (s - W) / (S - W)``), for optimiser step ``s = 0, 1, ...``::

    s <  W:  lr * (s + 1) / (W + 1)                                   (every schedule)
    s >= W:  cosine:   lr_min + (lr - lr_min) * (1 + cos(pi * p)) / 2,  lr_min = ratio * lr
             linear:   lr_min + (lr - lr_min) * (1 - p)
             constant: lr
"""

from __future__ import annotations

import math

import torch
from torch import nn

from cemlib.train.config import OptimConfig

__all__ = ["param_groups", "make_optimizer", "WarmupCosine", "WarmupLinear", "WarmupConstant", "make_scheduler"]


def param_groups(model: nn.Module, weight_decay: float) -> list[dict]:
    """Two AdamW groups: tensors with ``dim >= 2`` decayed, the rest not. Shared tensors once."""
    decay, no_decay, seen = [], [], set()
    for p in model.parameters():
        if not p.requires_grad or id(p) in seen:
            continue
        seen.add(id(p))
        (decay if p.dim() >= 2 else no_decay).append(p)
    if not decay and not no_decay:
        raise ValueError("the model has no trainable parameters")
    return [{"params": decay, "weight_decay": weight_decay},
            {"params": no_decay, "weight_decay": 0.0}]


def make_optimizer(model: nn.Module, cfg: OptimConfig) -> torch.optim.AdamW:
    """AdamW with the betas, eps and decay of ``cfg`` (fused kernel on CUDA when available)."""
    on_cuda = next(model.parameters()).is_cuda
    return torch.optim.AdamW(param_groups(model, cfg.weight_decay), lr=cfg.lr,
                             betas=(cfg.beta1, cfg.beta2), eps=cfg.eps,
                             **({"fused": True} if on_cuda else {}))


class WarmupCosine:
    """LR multiplier for ``LambdaLR``: linear warm-up, half-cosine decay to ``min_ratio``.

    A plain object (not a closure) so that ``LambdaLR.state_dict()`` stores its fields and the
    checkpoint loads with ``weights_only=True``.
    """

    def __init__(self, warmup_steps: int, max_steps: int, min_ratio: float):
        if not 0 <= warmup_steps < max_steps:
            raise ValueError(f"need 0 <= warmup_steps < max_steps, got {warmup_steps}, {max_steps}")
        self.warmup_steps, self.max_steps, self.min_ratio = warmup_steps, max_steps, min_ratio

    def __call__(self, step: int) -> float:
        w, s_max = self.warmup_steps, self.max_steps
        if step < w:
            return (step + 1) / (w + 1)
        progress = min(1.0, (step - w) / max(1, s_max - w))
        return self.min_ratio + (1.0 - self.min_ratio) * 0.5 * (1.0 + math.cos(math.pi * progress))


class WarmupLinear(WarmupCosine):
    """LR multiplier: linear warm-up, then a straight line down to ``min_ratio`` at the last step."""

    def __call__(self, step: int) -> float:
        w = self.warmup_steps
        if step < w:
            return (step + 1) / (w + 1)
        progress = min(1.0, (step - w) / max(1, self.max_steps - w))
        return self.min_ratio + (1.0 - self.min_ratio) * (1.0 - progress)


class WarmupConstant(WarmupCosine):
    """LR multiplier: linear warm-up, then 1 (``min_ratio`` is not used)."""

    def __call__(self, step: int) -> float:
        w = self.warmup_steps
        return (step + 1) / (w + 1) if step < w else 1.0


_SCHEDULES = {"cosine": WarmupCosine, "linear": WarmupLinear, "constant": WarmupConstant}


def make_scheduler(optimizer: torch.optim.Optimizer, cfg: OptimConfig,
                   max_steps: int) -> torch.optim.lr_scheduler.LambdaLR:
    """``LambdaLR`` driven by the multiplier of ``cfg.schedule`` (:class:`WarmupCosine`,
    :class:`WarmupLinear`, :class:`WarmupConstant`); call ``.step()`` once per optimiser step."""
    return torch.optim.lr_scheduler.LambdaLR(
        optimizer, _SCHEDULES[cfg.schedule](cfg.warmup(max_steps), max_steps, cfg.min_lr_ratio))
