"""Benchmark: CEM tied attention (Triton) against SDPA, FlexAttention+ALiBi and the eager reference.

GPU mode (the issue's setting): B=8, H=12, d=64, causal, bf16, T in {512, 1024, 2048, 4096};
forward and forward+backward. Compared:

- ``cem_triton``: :func:`cemlib.kernels.ops.tied_attention` with ALiBi and self/cross biases,
  tied ``kv`` (gradients for q, kv and the biases);
- ``sdpa_untied``: ``F.scaled_dot_product_attention(q, k, v, is_causal=True)``, untied k, v;
- ``flex_alibi``: compiled FlexAttention with an ALiBi ``score_mod`` and a causal block mask
  (untied k, v);
- ``cem_reference``: the eager :func:`cemlib.kernels.reference.tied_attention`;
- ``cem_diag_triton`` / ``cem_diag_reference``: the call the default CEM layer makes (shared
  diagonal of eq. 12: an extra query/key pair of width D_e = H d shared by the heads, with the
  head-summed diagonal value path), i.e. the "logits" path of
  :func:`cemlib.kernels.dispatch.extra_path`, against the eager reference.

FLOPs counted as 4 B H T^2 d x 0.5 (causal) for the forward and x 3.5 for forward+backward
(FlashAttention convention), plus 4 B T^2 D_e x 0.5 (x 3.5) for the shared extra pair;
throughput is reported against the measured bf16 GEMM peak.

Usage: ``python benchmarks/bench_attention.py`` (GPU) or ``... --cpu-smoke`` (checks it runs).
"""

from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common  # noqa: E402

CUDA = common.setup_cpu_interpreter()

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

from cemlib.kernels import ops, reference  # noqa: E402


def flex_alibi_fn(slopes, T, device):
    from torch.nn.attention.flex_attention import create_block_mask, flex_attention

    def score_mod(score, b, h, q_idx, kv_idx):
        return score - slopes[h] * (q_idx - kv_idx)

    def causal(b, h, q_idx, kv_idx):
        return q_idx >= kv_idx

    mask = create_block_mask(causal, None, None, T, T, device=device)
    compiled = torch.compile(flex_attention)
    return lambda q, k, v: compiled(q, k, v, score_mod=score_mod, block_mask=mask)


def main():
    args = common.parser(__doc__.splitlines()[0]).parse_args()
    device = torch.device("cuda" if CUDA and not args.cpu_smoke else "cpu")
    if args.cpu_smoke:  # D_e = 144 > MAX_TILE_EXTRA exercises the shared-logits path
        B, H, d, Ts, dtype, De = 1, 2, 16, [32], torch.float32, 144
    else:
        if not CUDA:
            sys.exit("GPU mode needs CUDA; use --cpu-smoke on a CPU machine")
        B, H, d, Ts, dtype = 8, 12, 64, [512, 1024, 2048, 4096], torch.bfloat16
        De = H * d
    env = common.environment(device)
    peak = common.measured_peak_tflops(device)
    slopes = reference.alibi_slopes(H).to(device=device, dtype=torch.float32)
    results = []
    for T in Ts:
        g = torch.Generator(device=device).manual_seed(0)
        q, kv, k, v = (torch.randn(B, H, T, d, generator=g, device=device, dtype=dtype)
                       for _ in range(4))
        qe, ke = (0.1 * torch.randn(B, T, De, generator=g, device=device, dtype=dtype)
                  for _ in range(2))
        sb = torch.zeros(H, device=device, dtype=torch.float32)
        cb = torch.zeros(H, device=device, dtype=torch.float32)
        scale = d ** -0.5
        methods = {
            "cem_triton": (lambda q, kv, sb, cb: ops.tied_attention(
                q, kv, scale=scale, alibi=slopes, self_bias=sb, cross_bias=cb)[0], [q, kv, sb, cb]),
            "cem_reference": (lambda q, kv, sb, cb: reference.tied_attention(
                q, kv, scale=scale, alibi=slopes, self_bias=sb, cross_bias=cb)[0], [q, kv, sb, cb]),
            "sdpa_untied": (lambda q, k, v: F.scaled_dot_product_attention(
                q, k, v, is_causal=True, scale=scale), [q, k, v]),
        }
        for impl, mod in (("triton", ops), ("reference", reference)):
            methods[f"cem_diag_{impl}"] = (
                lambda q, kv, qe, ke, mod=mod: mod.tied_attention(
                    q, kv, scale=scale, alibi=slopes, q_extra=qe, k_extra=ke, extra_values=True,
                    extra_head_sum=True)[::2], [q, kv, qe, ke])  # (o, head-summed o_extra)
        if device.type == "cuda":
            flex = flex_alibi_fn(slopes, T, device)
            methods["flex_alibi"] = (flex, [q, k, v])
        fwd_flops = 4 * B * H * T * T * d * 0.5
        for name, (fn, inputs) in methods.items():
            fwd = fwd_flops + (4 * B * T * T * De * 0.5 if name.startswith("cem_diag") else 0)
            leaves = [x.detach().clone().requires_grad_() for x in inputs]
            do = torch.randn(B, H, T, d, device=device, dtype=dtype)
            doe = torch.randn(B, T, De, device=device, dtype=dtype)
            for mode, flops in (("fwd", fwd), ("fwd_bwd", 3.5 * fwd)):
                if mode == "fwd":
                    def call(fn=fn, inputs=inputs):
                        with torch.no_grad():
                            fn(*inputs)
                else:
                    def call(fn=fn, leaves=leaves, do=do, doe=doe):
                        out = fn(*leaves)
                        if isinstance(out, tuple):  # (o, o_extra)
                            torch.autograd.backward(out, (do, doe))
                        else:
                            out.backward(do)
                r = common.run_case(call, device, args.rep, grad_to_none=leaves)
                if "median_ms" in r:
                    r["tflops"] = flops / (r["median_ms"] * 1e-3) / 1e12
                    r["fraction_of_peak"] = r["tflops"] / peak["tflops"]
                r.update(method=name, mode=mode, B=B, H=H, T=T, d=d, dtype=str(dtype),
                         causal=True, flops=flops,
                         extra_width=De if name.startswith("cem_diag") else 0)
                results.append(r)
                print({k: r[k] for k in ("method", "mode", "T") }, r.get("median_ms"),
                      r.get("peak_mem_mb"), r.get("error", ""))
    ratios = {}
    for T in Ts:
        for mode in ("fwd", "fwd_bwd"):
            t = {r["method"]: r.get("median_ms") for r in results if r["T"] == T and r["mode"] == mode}
            if t.get("cem_triton") and t.get("sdpa_untied"):
                ratios[f"T{T}_{mode}_cem_over_sdpa"] = t["cem_triton"] / t["sdpa_untied"]
            if t.get("cem_diag_triton") and t.get("cem_diag_reference"):
                ratios[f"T{T}_{mode}_cem_diag_triton_over_reference"] = (
                    t["cem_diag_triton"] / t["cem_diag_reference"])
    common.write_json({"benchmark": "attention", "env": env, "peak_gemm": peak,
                       "results": results, "time_ratios": ratios}, "attention", args, device)


if __name__ == "__main__":
    main()
