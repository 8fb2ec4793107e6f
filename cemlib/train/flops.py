"""Model FLOPs utilisation: FLOPs per token, a table of stated peaks, and a measured peak.

MFU = (training FLOPs per token) x (tokens per second) / (peak FLOP/s x number of devices).
Training FLOPs per token are 3 x forward (backward = 2 x forward). For cemlib language models the
forward count comes from ``cemlib.models.params.flops_per_token(model.config)``, which counts every
recursion step; for any other module the 2N approximation (N = parameters) is used and labelled
as such in the results.

The peak table holds vendor dense bf16 tensor-core figures (no sparsity); :func:`measure_peak_flops`
measures a large bf16 matmul instead, which the book prefers when a GPU is at hand.
"""

from __future__ import annotations

import time

import torch
from torch import nn

__all__ = ["PEAK_BF16_TFLOPS", "stated_peak_tflops", "forward_flops_per_token", "mfu",
           "measure_peak_flops"]

# Dense bf16 peak, TFLOP/s, from the vendors' datasheets (sparsity excluded).
PEAK_BF16_TFLOPS = {
    "H200": 989.0,
    "H100 SXM": 989.0,
    "H100 NVL": 835.0,
    "H100 PCIe": 756.0,
    "H100": 989.0,       # a bare "H100" name is the SXM part on most cloud machines
    "A100": 312.0,
    "L40S": 362.0,
    "A10G": 70.0,
    "L4": 121.0,
}


def stated_peak_tflops(device_name: str) -> float | None:
    """Peak bf16 TFLOP/s for a CUDA device name (first table key it contains), or ``None``."""
    for key, value in PEAK_BF16_TFLOPS.items():
        if all(part in device_name for part in key.split()):
            return value
    return None


def forward_flops_per_token(model: nn.Module) -> tuple[float, str]:
    """``(forward FLOPs per token, how it was computed)``.

    Uses ``cemlib.models.params.flops_per_token(model.config)`` for cemlib language models, else
    ``2 * num_parameters`` (the usual dense approximation, attention scores excluded).
    """
    cfg = getattr(model, "config", None)
    if cfg is not None and type(cfg).__name__ == "LMConfig":
        try:
            from cemlib.models.params import flops_per_token
        except ImportError:
            flops_per_token = None
        if flops_per_token is not None:
            return float(flops_per_token(cfg)), "cemlib.models.params.flops_per_token"
    n = sum(p.numel() for p in model.parameters())
    return 2.0 * n, "2 x parameters (approximation)"


def mfu(forward_flops: float, tokens_per_s: float, peak_flops: float | None, n_devices: int = 1) -> float | None:
    """Model FLOPs utilisation in [0, 1], or ``None`` when no peak is known."""
    if peak_flops is None or peak_flops <= 0:
        return None
    return 3.0 * forward_flops * tokens_per_s / (peak_flops * n_devices)


def measure_peak_flops(device: torch.device, dtype: torch.dtype = torch.bfloat16, n: int = 8192,
                       repeats: int = 20) -> float:
    """Measured FLOP/s of an ``n x n`` matmul on ``device`` (best of ``repeats``)."""
    a = torch.randn(n, n, device=device, dtype=dtype)
    b = torch.randn(n, n, device=device, dtype=dtype)
    best = float("inf")
    for _ in range(repeats + 2):
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        t0 = time.perf_counter()
        a @ b
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        best = min(best, time.perf_counter() - t0)
    return 2.0 * n**3 / best
