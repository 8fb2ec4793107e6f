"""Benchmark: CEM tied attention (the Triton kernels) against SDPA, FlexAttention+ALiBi and the
eager reference.

GPU mode (the issue's setting): B=8, H=12, d=64, causal, bf16, T in {512, 1024, 2048, 4096};
forward and forward+backward. Methods (:data:`METHODS`; the CEM entry points are looked up in
:data:`IMPLEMENTATIONS`, and one that cannot be imported is reported "not available"):

- ``sdpa_untied``: ``F.scaled_dot_product_attention(q, k, v, is_causal=True)``, untied k, v;
- ``sdpa_tied``: the same with ``k = v`` (one tensor: the tying CEM has, in SDPA);
- ``cem_v2``: the CEM tied attention kernels, :mod:`cemlib.kernels.attention` (ALiBi and
  self/cross biases, tied ``kv``; gradients for q, kv and the biases); ``cem_reference``: the
  eager reference; ``cem_v2_atomic``: the kernels with the backward that adds ``dq`` atomically
  inside the ``d kv`` walk (``atomic_dq=True``: 5 matrix products instead of 7, no second
  exponential pass);
- ``cem_diag_v2`` / ``cem_diag_v2_atomic`` / ``cem_diag_reference``: the call the default CEM
  layer makes (shared diagonal of eq. 12: an extra query/key pair of width D_e = H d shared by
  the heads, with the head-summed diagonal value path);
- ``flex_alibi`` (CUDA only): compiled FlexAttention with an ALiBi ``score_mod`` and a causal block
  mask (untied k, v).

The method names keep the stored files' labels: ``v2`` is the kernels' second generation, the
only one now; the stored files also hold the first (``cem_v1``, ``cem_diag_v1``; the first H100
file, ``results/attention_NVIDIA_H100_80GB_HBM3.json``, calls it ``cem_triton`` and
``cem_diag_triton``).

FLOPs counted as 4 B H T^2 d x 0.5 (causal) for the forward and x 3.5 for forward+backward
(FlashAttention convention), plus 4 B T^2 D_e x 0.5 (x 3.5) for the shared extra pair;
throughput is reported against the measured bf16 GEMM peak.

Usage: ``python benchmarks/bench_attention.py`` (GPU) or ``... --cpu-smoke`` (checks it runs).
"""

from __future__ import annotations

import functools
import importlib
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common  # noqa: E402

CUDA = common.setup_cpu_interpreter()

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

from cemlib.kernels import reference  # noqa: E402

#: The CEM tied-attention entry points (module, function[, fixed keyword arguments]), each with
#: the contract of :func:`cemlib.kernels.reference.tied_attention`: ``fn(q, kv, *, scale, alibi,
#: self_bias, cross_bias, q_extra, k_extra, extra_values, extra_head_sum) -> (o, lse[, o_extra])``.
IMPLEMENTATIONS = {
    "v2": ("cemlib.kernels.attention", "tied_attention"),
    "v2_atomic": ("cemlib.kernels.attention", "tied_attention", {"atomic_dq": True}),
    "reference": ("cemlib.kernels.reference", "tied_attention"),
}
METHODS = ("sdpa_untied", "sdpa_tied", "cem_v2", "cem_v2_atomic", "cem_reference",
           "cem_diag_v2", "cem_diag_v2_atomic", "cem_diag_reference", "flex_alibi")


def implementation(name: str):
    """``(function or None, record)``: the CEM entry point ``name`` of :data:`IMPLEMENTATIONS`,
    and where it came from, or why it is not available."""
    module, attr, *fixed = IMPLEMENTATIONS[name]
    kwargs = fixed[0] if fixed else {}
    where = {"implementation": name, "function": f"{module}.{attr}", **({"kwargs": kwargs} if kwargs else {})}
    try:
        fn = getattr(importlib.import_module(module), attr)
        return (functools.partial(fn, **kwargs) if kwargs else fn), {**where, "available": True}
    except (ImportError, AttributeError) as err:
        return None, {**where, "available": False, "error": f"{type(err).__name__}: {err}"}


def flex_alibi_fn(slopes, T, device):
    from torch.nn.attention.flex_attention import create_block_mask, flex_attention

    def score_mod(score, b, h, q_idx, kv_idx):
        return score - slopes[h] * (q_idx - kv_idx)

    def causal(b, h, q_idx, kv_idx):
        return q_idx >= kv_idx

    mask = create_block_mask(causal, None, None, T, T, device=device)
    compiled = torch.compile(flex_attention)
    return lambda q, k, v: compiled(q, k, v, score_mod=score_mod, block_mask=mask)


def attention_inputs(B, H, T, d, De, dtype, device, seed=0):
    g = torch.Generator(device=device).manual_seed(seed)
    q, kv, k, v = (torch.randn(B, H, T, d, generator=g, device=device, dtype=dtype)
                   for _ in range(4))
    qe, ke = (0.1 * torch.randn(B, T, De, generator=g, device=device, dtype=dtype)
              for _ in range(2))
    sb = torch.zeros(H, device=device, dtype=torch.float32)
    cb = torch.zeros(H, device=device, dtype=torch.float32)
    do = torch.randn(B, H, T, d, generator=g, device=device, dtype=dtype)
    doe = torch.randn(B, T, De, generator=g, device=device, dtype=dtype)
    return dict(q=q, kv=kv, k=k, v=v, qe=qe, ke=ke, sb=sb, cb=cb, do=do, doe=doe)


def method(name, x, scale, slopes, T, device):
    """``(fn, inputs, record)`` of one method on the inputs ``x``; ``fn`` is None (and the record
    says why) where the method is not available."""
    if name == "sdpa_untied":
        return (lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=True,
                                                                scale=scale),
                [x["q"], x["k"], x["v"]], {"available": True})
    if name == "sdpa_tied":
        return (lambda q, kv: F.scaled_dot_product_attention(q, kv, kv, is_causal=True,
                                                             scale=scale),
                [x["q"], x["kv"]], {"available": True})
    if name == "flex_alibi":
        if device.type != "cuda":
            return None, [], {"available": False, "error": "FlexAttention is timed on CUDA only"}
        return flex_alibi_fn(slopes, T, device), [x["q"], x["k"], x["v"]], {"available": True}
    diag = name.startswith("cem_diag_")
    fn, record = implementation(name[len("cem_diag_" if diag else "cem_"):])
    if fn is None:
        return None, [], record
    if diag:  # (o, head-summed o_extra)
        return (lambda q, kv, qe, ke: fn(q, kv, scale=scale, alibi=slopes, q_extra=qe, k_extra=ke,
                                         extra_values=True, extra_head_sum=True)[::2],
                [x["q"], x["kv"], x["qe"], x["ke"]], record)
    return (lambda q, kv, sb, cb: fn(q, kv, scale=scale, alibi=slopes, self_bias=sb,
                                     cross_bias=cb)[0],
            [x["q"], x["kv"], x["sb"], x["cb"]], record)


def fwd_and_fwd_bwd(fn, inputs, do, doe):
    """``{"fwd": no-grad call, "fwd_bwd": call + backward}`` and the leaves of the second."""
    leaves = [t.detach().clone().requires_grad_() for t in inputs]

    def fwd():
        with torch.no_grad():
            fn(*inputs)

    def fwd_bwd():
        out = fn(*leaves)
        if isinstance(out, tuple):  # (o, o_extra)
            torch.autograd.backward(out, (do, doe))
        else:
            out.backward(do)

    return {"fwd": fwd, "fwd_bwd": fwd_bwd}, leaves


def measure(Ts, B, H, d, De, dtype, device, rep, peak_tflops, names=METHODS, deadline=None):
    """Time (and peak memory) of every available method at every T; returns ``(results,
    availability)``. Cases not reached before ``deadline`` (``time.monotonic()``) are recorded as
    skipped."""
    slopes = reference.alibi_slopes(H).to(device=device, dtype=torch.float32)
    scale = d ** -0.5
    results, availability = [], {}
    for T in Ts:
        x = attention_inputs(B, H, T, d, De, dtype, device)
        fwd_flops = 4 * B * H * T * T * d * 0.5
        for name in names:
            fn, inputs, record = method(name, x, scale, slopes, T, device)
            availability[name] = record
            if fn is None:
                continue
            fwd = fwd_flops + (4 * B * T * T * De * 0.5 if name.startswith("cem_diag") else 0)
            calls, leaves = fwd_and_fwd_bwd(fn, inputs, x["do"], x["doe"])
            for mode, flops in (("fwd", fwd), ("fwd_bwd", 3.5 * fwd)):
                r = common.timed_case(calls[mode], device, rep, leaves, flops, peak_tflops,
                                      deadline)
                r.update(method=name, mode=mode, B=B, H=H, T=T, d=d, dtype=str(dtype),
                         causal=True, extra_width=De if name.startswith("cem_diag") else 0)
                results.append(r)
                print(name, mode, T, r.get("median_ms"), r.get("peak_mem_mb"),
                      r.get("error", r.get("skipped", "")), flush=True)
    return results, availability


def time_ratios(results, pairs=(("cem_v2", "sdpa_untied"), ("cem_v2_atomic", "sdpa_untied"),
                                ("cem_v2", "sdpa_tied"), ("cem_v2_atomic", "cem_v2"),
                                ("cem_diag_v2_atomic", "cem_diag_v2"),
                                ("cem_diag_v2", "cem_diag_reference"))) -> dict:
    """``{"T<T>_<mode>_<a>_over_<b>": time a / time b}`` for the pairs both measured."""
    ratios = {}
    for T in sorted({r["T"] for r in results}):
        for mode in ("fwd", "fwd_bwd"):
            t = {r["method"]: r.get("median_ms") for r in results
                 if r["T"] == T and r["mode"] == mode}
            for a, b in pairs:
                if t.get(a) and t.get(b):
                    ratios[f"T{T}_{mode}_{a}_over_{b}"] = t[a] / t[b]
    return ratios


def main():
    args = common.parser(__doc__.splitlines()[0]).parse_args()
    device = torch.device("cuda" if CUDA and not args.cpu_smoke else "cpu")
    if args.cpu_smoke:  # D_e = 144: a wide shared pair, as the default layer's D_e = H d
        B, H, d, Ts, dtype, De = 1, 2, 16, [32], torch.float32, 144
    else:
        if not CUDA:
            sys.exit("GPU mode needs CUDA; use --cpu-smoke on a CPU machine")
        B, H, d, Ts, dtype = 8, 12, 64, [512, 1024, 2048, 4096], torch.bfloat16
        De = H * d
    env = common.environment(device)
    peak = common.measured_peak_tflops(device)
    results, availability = measure(Ts, B, H, d, De, dtype, device, args.rep, peak["tflops"])
    common.write_json({"benchmark": "attention", "env": env, "peak_gemm": peak,
                       "implementations": availability, "results": results,
                       "time_ratios": time_ratios(results)}, "attention", args, device)


if __name__ == "__main__":
    main()
