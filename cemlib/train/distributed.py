"""Distributed training with PyTorch's own engine: DDP, or FSDP (``fully_shard``) when asked.

Under ``torchrun`` the environment holds ``RANK``, ``WORLD_SIZE`` and ``LOCAL_RANK``; the same
entry point then joins the process group (NCCL on CUDA, gloo on CPU), places each process on its
own GPU, and wraps the model. Without those variables everything runs in one process, unchanged.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch import nn

from cemlib.train.config import ConfigError

__all__ = ["DistInfo", "init_distributed", "wrap_model", "unwrap_model", "all_reduce_mean",
           "shutdown_distributed", "resolve_device"]


def resolve_device(name: str | torch.device | None = None) -> torch.device:
    """The device a run uses: ``name`` (``train.device``), else ``$CEMLIB_DEVICE``, else CUDA when
    available, else the CPU. A device this machine does not have raises
    :class:`~cemlib.train.config.ConfigError` in one line (not torch's traceback)."""
    source = "train.device"
    if name is None and os.environ.get("CEMLIB_DEVICE"):
        name, source = os.environ["CEMLIB_DEVICE"], "CEMLIB_DEVICE"
    if name is None:
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        dev = torch.device(name)
    except (RuntimeError, TypeError, ValueError):
        raise ConfigError(f"{source}={str(name)!r} is not a device; use cpu, cuda, cuda:N or mps") from None
    if dev.type == "cuda":
        if not torch.cuda.is_available():
            why = "this torch is built without CUDA" if torch.version.cuda is None else "no GPU is visible"
            raise ConfigError(f"{source}={str(name)!r} but CUDA is not available here ({why}); use "
                              f"--device cpu")
        if dev.index is not None and dev.index >= torch.cuda.device_count():
            raise ConfigError(f"{source}={str(name)!r} but only {torch.cuda.device_count()} GPU(s) are "
                              f"visible")
    elif dev.type == "mps":
        if not torch.backends.mps.is_available():
            raise ConfigError(f"{source}={str(name)!r} but MPS is not available here; use --device cpu")
    elif dev.type != "cpu":
        raise ConfigError(f"{source}={str(name)!r}: cemlib trains on cpu, cuda or mps")
    return dev


@dataclass(frozen=True)
class DistInfo:
    """Rank, world size, local rank and device of this process."""

    rank: int = 0
    world_size: int = 1
    local_rank: int = 0
    device: torch.device = torch.device("cpu")

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def enabled(self) -> bool:
        return self.world_size > 1


def init_distributed(device: torch.device) -> DistInfo:
    """Join the process group if launched by ``torchrun`` (world size > 1), else a no-op.

    On CUDA each process uses ``cuda:LOCAL_RANK``; on CPU the gloo backend is used.
    """
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world <= 1:
        return DistInfo(device=device)
    rank, local = int(os.environ["RANK"]), int(os.environ.get("LOCAL_RANK", "0"))
    if device.type == "cuda":
        if local >= torch.cuda.device_count():
            raise RuntimeError(f"LOCAL_RANK={local} but only {torch.cuda.device_count()} GPU(s) are visible")
        device = torch.device("cuda", local)
        torch.cuda.set_device(device)
    if not dist.is_initialized():
        dist.init_process_group(backend="nccl" if device.type == "cuda" else "gloo")
    return DistInfo(rank=rank, world_size=world, local_rank=local, device=device)


def wrap_model(model: nn.Module, info: DistInfo, strategy: str = "ddp") -> nn.Module:
    """Wrap for data parallelism: ``"ddp"`` (replicated) or ``"fsdp"`` (sharded, FSDP2).

    FSDP shards each child module that holds parameters, then the root; use it when the model or
    its optimiser state do not fit on one device.
    """
    if not info.enabled:
        return model
    if strategy == "ddp":
        ids = [info.device.index] if info.device.type == "cuda" else None
        return nn.parallel.DistributedDataParallel(model, device_ids=ids)
    if strategy == "fsdp":
        from torch.distributed.fsdp import fully_shard
        for child in model.children():
            if any(True for _ in child.parameters()):
                fully_shard(child)
        fully_shard(model)
        return model
    raise ValueError(f"unknown distributed strategy {strategy!r} (expected 'ddp' or 'fsdp')")


def unwrap_model(model: nn.Module) -> nn.Module:
    """The user's module inside a DDP (or ``torch.compile``) wrapper."""
    while True:
        if isinstance(model, nn.parallel.DistributedDataParallel):
            model = model.module
        elif hasattr(model, "_orig_mod"):
            model = model._orig_mod
        else:
            return model


def all_reduce_mean(value: torch.Tensor, info: DistInfo) -> torch.Tensor:
    """Mean of ``value`` over processes (identity in a single process)."""
    if info.enabled:
        value = value.clone()
        dist.all_reduce(value, op=dist.ReduceOp.SUM)
        value /= info.world_size
    return value


def shutdown_distributed(info: DistInfo) -> None:
    if info.enabled and dist.is_initialized():
        dist.destroy_process_group()
