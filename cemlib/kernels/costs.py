"""FLOP, byte and memory models of the operations that cemlib's kernels fuse, and the roofline.

Everything here is arithmetic on shapes: nothing runs a kernel or needs a GPU. The models are the
"two numbers" of a kernel (how many floating-point operations it must do, how many bytes it must
move between DRAM and the chip) and, for two kernels, the peak memory of cemlib's own
implementation.

Conventions (the ones the scripts ``benchmarks/bench_attention.py`` and ``bench_mlp.py`` use, so that the
models and the stored benchmark files count alike):

- a multiply-add is 2 FLOPs; only matrix products are counted (softmax, SiLU, masking and the
  bias arithmetic are not);
- causal attention does half of the ``L x L`` products (the FlashAttention convention
  ``0.5 L^2``, not ``L (L + 1) / 2``); a backward pass is counted in matrix products of the same
  size as the forward's two (``q k^T`` and ``p v``): FlashAttention's backward recomputes
  ``q k^T`` and does four more (5 in all, "fwd+bwd = 3.5 x fwd"), cemlib's two-kernel backward
  recomputes ``q k^T`` and ``dO kv^T`` in both kernels (7), autograd through the eager reference
  stores the probabilities and recomputes nothing (4);
- "compulsory" bytes read every input and write every output once; "streamed" bytes are what a
  FlashAttention-style forward moves when nothing is reused from a cache between query tiles:
  every query tile of ``block_m`` rows reads all the key (and value) rows up to the diagonal.

Peak-memory models (:func:`tied_attention_peak_bytes`, :func:`gated_step_peak_bytes`) follow the
allocation order of the implementations the stored H100 benchmarks measured (the first generation
of the kernels, since removed, whose attention backward held fp32 temporaries of ``Delta``; the
``(N, D_v)`` tensors of the tied MLP step, fused and as :mod:`cemlib.kernels.gated_mlp` does it)
and of eager autograd; they describe that code, not attention or MLPs in general.

:func:`count_flops` is the measured counterpart of the closed forms: PyTorch's FLOP counter on any
callable.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

__all__ = ["count_flops", "Cost", "Machine", "H100_SXM_DATASHEET", "Multiprocessor", "H100_SM",
           "instruction_budget", "loop_time_bound", "attention_flops", "attention_bytes",
           "attention_cost", "mlp_flops", "mlp_cost", "kv_cache_bytes_per_token",
           "key_rows_streamed", "tied_attention_peak_bytes", "gated_step_peak_bytes",
           "tie_comparison", "BACKWARD_MATMULS"]

# matrix products of one backward pass, in units of one forward product (q k^T or p v); "cemlib"
# is the kernels' backward (a d kv and a dq walk, each recomputing q kv^T and dO kv^T)
BACKWARD_MATMULS = {"flash": 5, "cemlib": 7, "autograd": 4}
LSE_BYTES = 4  # the log-sum-exp is kept in float32


@dataclass(frozen=True)
class Cost:
    """FLOPs and DRAM bytes of one call."""
    flops: float
    bytes: float

    @property
    def intensity(self) -> float:
        """Arithmetic intensity, FLOPs per byte."""
        return self.flops / self.bytes

    def time_bound(self, machine: "Machine") -> float:
        """Roofline lower bound on the run time in seconds: ``max(FLOPs / peak, bytes / bandwidth)``."""
        return max(self.flops / (machine.peak_tflops * 1e12), self.bytes / (machine.bandwidth_tbs * 1e12))

    def __add__(self, other: "Cost") -> "Cost":
        return Cost(self.flops + other.flops, self.bytes + other.bytes)


@dataclass(frozen=True)
class Machine:
    """A roofline: dense peak throughput (TFLOP/s) and DRAM bandwidth (TB/s), with their source."""
    name: str
    peak_tflops: float
    bandwidth_tbs: float
    source: str

    def __post_init__(self):
        if not (self.peak_tflops > 0 and self.bandwidth_tbs > 0):
            raise ValueError(f"peak and bandwidth must be positive, got {self.peak_tflops}, "
                             f"{self.bandwidth_tbs}")

    @property
    def ridge(self) -> float:
        """The intensity (FLOP/byte) above which a kernel can be compute-bound."""
        return self.peak_tflops / self.bandwidth_tbs

    def attainable(self, intensity: float) -> float:
        """Attainable TFLOP/s at ``intensity``: ``min(peak, intensity * bandwidth)``."""
        return min(self.peak_tflops, intensity * self.bandwidth_tbs)


# NVIDIA H100 Tensor Core GPU datasheet, SXM5 80 GB (HBM3): BF16/FP16 tensor cores 1,979 TFLOP/s
# *with 2:4 sparsity* (dense: half), memory bandwidth 3.35 TB/s. Datasheet values, not measurements.
H100_SXM_DATASHEET = Machine("NVIDIA H100 SXM5 80GB", 1979 / 2, 3.35, "datasheet")


@dataclass(frozen=True)
class Multiprocessor:
    """The per-clock rates of one streaming multiprocessor that bound a fused attention loop:
    dense 16-bit tensor-core FLOPs, issued thread instructions (warp schedulers x 32 lanes) and
    special-function results (``MUFU``, e.g. ``ex2``)."""
    name: str
    mma_flops_per_clock: int
    issue_per_clock: int
    mufu_per_clock: int
    source: str


# H100 SXM5 (sm_90): 989.4 dense bf16 TFLOP/s = 132 SMs x 4096 FLOP x 1.83 GHz (the datasheet's
# clock for that figure); 4 warp schedulers per SM, one warp instruction per clock each; 16
# exp2/log2/rcp results per clock per SM (CUDA C++ Programming Guide, throughput of native
# arithmetic instructions, compute capability 9.0). Datasheet values, not measurements.
H100_SM = Multiprocessor("NVIDIA H100 SXM5 SM (sm_90)", 4096, 128, 16, "datasheet")


def instruction_budget(head_dim: int, products: int, sm: Multiprocessor = H100_SM) -> float:
    """Instructions per score element that one SM can issue while its tensor cores do the
    loop's ``products`` matrix products of width ``head_dim`` for that element
    (``2 head_dim`` FLOPs each): ``issue_per_clock * 2 head_dim products / mma_flops_per_clock``.
    A loop with more non-MMA instructions per element than this is bound by instruction issue,
    not by the tensor cores, however the two overlap. Attention at head width 64 on an H100: 8
    for the forward loop (2 products), 16 for the backward's ``d kv`` loop (4) and 12 for its
    ``dq`` loop (3)."""
    _positive(head_dim=head_dim, products=products)
    return sm.issue_per_clock * 2 * head_dim * products / sm.mma_flops_per_clock


def loop_time_bound(non_mma_per_element: float, head_dim: int, products: int,
                    exps_per_element: float = 1.0, sm: Multiprocessor = H100_SM) -> dict:
    """Clocks per score element of one SM, per resource, for a loop with the given work per
    element: tensor cores (``mma``), instruction issue (``issue``, the non-MMA instructions) and
    the special-function unit (``mufu``, one ``ex2`` per element). The largest is a lower bound on
    the loop's time; ``mma / max`` the best fraction of tensor-core peak it can reach."""
    _positive(head_dim=head_dim, products=products)
    mma = 2 * head_dim * products / sm.mma_flops_per_clock
    issue = non_mma_per_element / sm.issue_per_clock
    mufu = exps_per_element / sm.mufu_per_clock
    bound = max(mma, issue, mufu)
    return dict(mma=mma, issue=issue, mufu=mufu, bound=bound, peak_fraction=mma / bound)


def _positive(**kw):
    for k, v in kw.items():
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise ValueError(f"{k} must be a positive integer, got {v!r}")


def _causal_factor(causal: bool) -> float:
    return 0.5 if causal else 1.0


def attention_flops(B: int, H: int, L: int, d: int, *, causal: bool = True, mode: str = "fwd",
                    backward: str = "flash", extra_width: int = 0) -> float:
    """FLOPs of multi-head attention over ``L`` tokens (``q k^T`` and ``p v``: ``4 B H L^2 d``,
    halved when causal). ``mode="fwd_bwd"`` adds a backward of ``BACKWARD_MATMULS[backward]``
    products. ``extra_width`` adds a head-shared extra query/key pair of that width (CEM eq. 12's
    shared diagonal) with head-summed values: two more products of width ``extra_width``."""
    _positive(B=B, H=H, L=L, d=d)
    if mode not in ("fwd", "fwd_bwd"):
        raise ValueError(f"mode must be 'fwd' or 'fwd_bwd', got {mode!r}")
    if backward not in BACKWARD_MATMULS:
        raise ValueError(f"backward must be one of {tuple(BACKWARD_MATMULS)}, got {backward!r}")
    c = _causal_factor(causal)
    fwd = 4 * B * H * L * L * d * c + 4 * B * L * L * extra_width * c
    if mode == "fwd":
        return float(fwd)
    return float(fwd * (2 + BACKWARD_MATMULS[backward]) / 2)


def key_rows_streamed(L: int, block_m: int, causal: bool = True) -> int:
    """Key rows that query tiles of ``block_m`` rows read in total (per batch and head) when
    each tile streams every key up to its last row (all ``L`` keys if not causal)."""
    _positive(L=L, block_m=block_m)
    tiles = math.ceil(L / block_m)
    if not causal:
        return tiles * L
    return sum(min((m + 1) * block_m, L) for m in range(tiles))


def attention_bytes(B: int, H: int, L: int, d: int, *, tied: bool, elem_bytes: int = 2,
                    causal: bool = True, block_m: int | None = None, phase: str = "forward",
                    extra_width: int = 0) -> float:
    """DRAM bytes of one attention call.

    ``phase="forward"`` (training or prefill): read ``q`` and the keys/values, write ``o`` and the
    float32 log-sum-exp; the keys and values are read once (``block_m=None``, compulsory traffic)
    or once per query tile (``block_m``, streamed). ``tied`` reads one tensor ``kv`` where untied
    attention reads ``k`` and ``v``. ``phase="decode"``: one new query per sequence attends to a
    cache of ``L`` keys (and values). ``extra_width``: the shared extra pair's queries and keys
    (and the head-summed values it writes), width ``extra_width``, read like the keys."""
    _positive(B=B, H=H, L=L, d=d, elem_bytes=elem_bytes)
    n_kv = 1 if tied else 2
    if phase == "forward":
        rows = L if block_m is None else key_rows_streamed(L, block_m, causal)
        io = 2 * B * H * L * d * elem_bytes + B * H * L * LSE_BYTES        # q in, o out, lse out
        keys = n_kv * B * H * rows * d * elem_bytes
        extra = B * (2 * L + rows) * extra_width * elem_bytes                 # q_e, o_e; k_e rows
        return float(io + keys + extra)
    if phase == "decode":
        io = 2 * B * H * d * elem_bytes                                       # one query, one output
        return float(io + n_kv * B * H * L * d * elem_bytes + B * (L + 2) * extra_width * elem_bytes)
    raise ValueError(f"phase must be 'forward' or 'decode', got {phase!r}")


def attention_cost(B: int, H: int, L: int, d: int, *, tied: bool, elem_bytes: int = 2,
                   causal: bool = True, block_m: int | None = None, phase: str = "forward",
                   extra_width: int = 0) -> Cost:
    """:class:`Cost` of one attention forward (``phase="forward"``) or decode step
    (``phase="decode"``: ``4 B H L d`` FLOPs against a cache of length ``L``)."""
    if phase == "forward":
        flops = attention_flops(B, H, L, d, causal=causal, extra_width=extra_width)
    elif phase == "decode":
        _positive(B=B, H=H, L=L, d=d)
        flops = float(4 * B * H * L * d + 4 * B * L * extra_width)
    else:
        raise ValueError(f"phase must be 'forward' or 'decode', got {phase!r}")
    return Cost(flops, attention_bytes(B, H, L, d, tied=tied, elem_bytes=elem_bytes, causal=causal,
                                       block_m=block_m, phase=phase, extra_width=extra_width))


MLP_KINDS = ("swiglu", "cem", "cem_step")


def mlp_flops(N: int, D_h: int, width: int, *, kind: str, mode: str = "fwd") -> float:
    """Matmul FLOPs of an MLP on ``N`` tokens: ``"swiglu"`` (gate, up, down: ``6 N D_h D_m``),
    ``"cem"`` (``gamma = W h`` and the tied step ``V^T (gamma * SiLU(V u))``: ``6 N D_h D_v``), or
    ``"cem_step"`` (the fused step alone, as benchmarked: ``4 N D_h D_v``). ``mode="fwd_bwd"``:
    times 3 (each product has two gradient products)."""
    _positive(N=N, D_h=D_h, width=width)
    if kind not in MLP_KINDS:
        raise ValueError(f"kind must be one of {MLP_KINDS}, got {kind!r}")
    if mode not in ("fwd", "fwd_bwd"):
        raise ValueError(f"mode must be 'fwd' or 'fwd_bwd', got {mode!r}")
    products = {"swiglu": 3, "cem": 3, "cem_step": 2}[kind]
    fwd = 2 * products * N * D_h * width
    return float(fwd * (3 if mode == "fwd_bwd" else 1))


def mlp_cost(N: int, D_h: int, width: int, *, kind: str, elem_bytes: int = 2,
             v_passes: int = 2) -> Cost:
    """:class:`Cost` of an MLP forward with its activations kept on chip (only the weights, the
    input and the output move): SwiGLU reads three ``D_h x D_m`` matrices; the CEM MLP reads ``W``
    once and ``V`` ``v_passes`` times (2 for cemlib's kernel, which writes the gate product and
    multiplies by ``V`` in a second GEMM; 1 for a kernel that uses each row of ``V`` as the up and
    the down projection while it holds it)."""
    if kind not in ("swiglu", "cem"):
        raise ValueError(f"kind must be 'swiglu' or 'cem', got {kind!r}")
    if v_passes not in (1, 2):
        raise ValueError(f"v_passes must be 1 or 2, got {v_passes!r}")
    flops = mlp_flops(N, D_h, width, kind=kind)
    weight_reads = 3 if kind == "swiglu" else 1 + v_passes
    return Cost(flops, float((weight_reads * D_h * width + 2 * N * D_h) * elem_bytes))


def kv_cache_bytes_per_token(n_heads: int, head_dim: int, *, tied: bool, extra_width: int = 0,
                             elem_bytes: int = 2) -> int:
    """Bytes one token adds to one attention layer's decode cache (one application of the layer,
    one sequence): keys and values (``2 H d``) untied, one ``kv`` (``H d``) tied, plus the keys of
    an extra pair (CEM's diagonal, shared or per head, caches ``RMSNorm(h_j)``, width ``D_h``).

    Tied layers: CEM attention (``W_V = W_K``), Newton's ``MHA2nd1st`` (its values are its keys)
    and NRGPT's block as ``H = 1``, ``d = D`` (every head's key and value is the normalised
    state ``g_j`` itself). A layer applied several times with new keys (plain reuse, a recurrent
    block) pays it per application; CEM's recursion does not (its keys come from the layer's
    input). :func:`cemlib.models.params.kv_cache_bytes_per_token` sums it over a model's layers;
    :meth:`cemlib.layers.cache.KVCache.bytes_per_token` measures it on the kept tensors."""
    _positive(n_heads=n_heads, head_dim=head_dim, elem_bytes=elem_bytes)
    return ((1 if tied else 2) * n_heads * head_dim + extra_width) * elem_bytes


def tied_attention_peak_bytes(B: int, H: int, L: int, d: int, *, elem_bytes: int = 2,
                              mode: str = "fwd_bwd") -> int:
    """Peak memory (bytes above the inputs) of the first generation of the attention kernels
    (removed; measured in ``benchmarks/results/attention_NVIDIA_H100_80GB_HBM3.json``) without
    an extra pair, forward then backward of the output ``o`` only.

    Forward: ``o`` and the float32 ``lse``. Backward: autograd hands a zero ``dlse`` (float32),
    and ``Delta = (o.float() * do.float()).sum(-1)`` holds three float32 copies of an ``o``-sized
    tensor at once, the peak; ``dq`` and ``dkv`` come later, when those are freed."""
    _positive(B=B, H=H, L=L, d=d, elem_bytes=elem_bytes)
    rows, full = B * H * L, B * H * L * d
    fwd = full * elem_bytes + rows * LSE_BYTES
    if mode == "fwd":
        return fwd
    if mode != "fwd_bwd":
        raise ValueError(f"mode must be 'fwd' or 'fwd_bwd', got {mode!r}")
    return fwd + rows * LSE_BYTES + 3 * full * 4


def gated_step_peak_bytes(N: int, D_h: int, D_v: int, *, impl: str, elem_bytes: int = 2) -> int:
    """Peak memory (bytes above the inputs ``u, V, gamma`` and ``dy``) of one forward+backward of
    the tied gated-MLP step ``y = V^T (gamma * SiLU(V u))``.

    ``impl="fused"`` (the first generation of the step's kernels, removed; measured in
    ``benchmarks/results/mlp_NVIDIA_H100_80GB_HBM3.json``): the forward keeps only ``y``; the
    backward kernel writes
    ``a = gamma * SiLU(h)``, ``dgamma`` and ``dh`` (three ``N x D_v``), then ``du = dh V`` and
    ``dV = a^T dy + dh^T u`` (two ``D_v x D_h`` products and their sum).
    ``impl="v2"`` (:func:`cemlib.kernels.gated_mlp.tied_gated_mlp_step`): the forward keeps
    ``h = u V^T`` and ``y``; the backward adds ``da`` (which becomes ``dh``, then ``a``) and
    ``dgamma``, then ``du`` and ``dV`` (accumulated in place).
    ``impl="eager"`` (autograd): the forward keeps ``h = u V^T``, ``SiLU(h)`` and their product
    ``a`` for the backward, plus ``y``; the backward adds ``da`` and ``dV``, then ``dgamma`` and
    ``d SiLU`` before the forward's tensors are released."""
    _positive(N=N, D_h=D_h, D_v=D_v, elem_bytes=elem_bytes)
    if impl == "fused":
        elems = 2 * N * D_h + 3 * N * D_v + 3 * D_v * D_h
    elif impl == "v2":
        elems = 2 * N * D_h + 3 * N * D_v + D_v * D_h
    elif impl == "eager":
        elems = N * D_h + 5 * N * D_v + D_v * D_h
    else:
        raise ValueError(f"impl must be 'fused', 'v2' or 'eager', got {impl!r}")
    return elems * elem_bytes


def tie_comparison(*, phase: str, L: int, batch: int, n_heads: int, head_dim: int, d_ff: int,
                   block_m: int = 64, elem_bytes: int = 2) -> dict[str, Cost]:
    """Costs of one layer's attention and MLP, tied against untied, for the roofline explorer.

    ``phase="forward"``: a training/prefill forward on ``batch`` sequences of ``L`` tokens,
    attention streamed with query tiles of ``block_m`` rows. ``phase="decode"``: one new token per
    sequence against a cache of ``L`` tokens; the MLPs then see ``N = batch`` tokens. The MLP
    width is ``d_ff`` for both (dimension-matched CEM MLP, equal FLOPs)."""
    D_h = n_heads * head_dim
    N = batch * L if phase == "forward" else batch
    bm = block_m if phase == "forward" else None
    out = {}
    for tied, name in ((False, "attention, untied"), (True, "attention, tied")):
        out[name] = attention_cost(batch, n_heads, L, head_dim, tied=tied, elem_bytes=elem_bytes,
                                   block_m=bm, phase=phase)
    out["MLP, SwiGLU"] = mlp_cost(N, D_h, d_ff, kind="swiglu", elem_bytes=elem_bytes)
    out["MLP, tied, V read twice"] = mlp_cost(N, D_h, d_ff, kind="cem", elem_bytes=elem_bytes,
                                              v_passes=2)
    out["MLP, tied, V read once"] = mlp_cost(N, D_h, d_ff, kind="cem", elem_bytes=elem_bytes,
                                             v_passes=1)
    return out


def _cpu_sdpa_formulas() -> dict:
    """PyTorch's FLOP counter knows the CUDA attention kernels of
    ``scaled_dot_product_attention`` but not the CPU one; count it with PyTorch's own SDPA
    formulas (the full ``L x L`` score matrix, causal or not, as every other attention product)."""
    import torch
    from torch.utils.flop_counter import sdpa_backward_flop_count, sdpa_flop_count

    aten = torch.ops.aten
    out = {}
    if hasattr(aten, "_scaled_dot_product_flash_attention_for_cpu"):
        def forward(query_shape, key_shape, value_shape, *args, out_shape=None, **kwargs):
            return sdpa_flop_count(query_shape, key_shape, value_shape)

        out[aten._scaled_dot_product_flash_attention_for_cpu] = forward
    if hasattr(aten, "_scaled_dot_product_flash_attention_for_cpu_backward"):
        def backward(grad_out_shape, query_shape, key_shape, value_shape, *args, out_shape=None,
                     **kwargs):
            return sdpa_backward_flop_count(grad_out_shape, query_shape, key_shape, value_shape)

        out[aten._scaled_dot_product_flash_attention_for_cpu_backward] = backward
    return out


def count_flops(fn, *, grad: bool = False) -> int:
    """The matrix-product FLOPs of ``fn()`` as PyTorch counts them
    (:class:`torch.utils.flop_counter.FlopCounterMode`, 2 per multiply-add; element-wise work is
    not counted): every matmul, batched matmul, einsum and attention product, the CPU kernel of
    ``scaled_dot_product_attention`` included, however a model shares its weights (a block
    iterated ``T`` times is counted ``T`` times). ``fn`` runs under ``torch.no_grad()``, unless
    ``grad=True`` (a ``fn`` that calls ``backward``: its backward products are counted too)."""
    import torch
    from torch.utils.flop_counter import FlopCounterMode

    if not callable(fn):
        raise TypeError(f"fn must be callable, got {type(fn).__name__}")
    with torch.set_grad_enabled(grad), FlopCounterMode(
            display=False, custom_mapping=_cpu_sdpa_formulas()) as counter:
        fn()
    return int(counter.get_total_flops())
