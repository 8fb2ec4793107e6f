"""The v2 kernels' self/cross-bias gradients in bf16 against the FlashAttention criterion: an
emulation, on the CPU, of the rounding the kernels do.

The H100 run of 2026-11-27 (``RESULTS_H100.md``, third run) found ``dself`` and ``dcross`` with the
same error, 6.7e-3, in every one of 143 autotune configurations, against a bound of twice the bf16
PyTorch reference's error plus 1e-3; every other output and gradient passed. An error that no
tiling changes comes from what all configurations share. The kernels (``tied_attention_v2``,
FlashAttention-2's backward) form the row term ``Delta_i = o_i . do_i - dlse_i`` from the output
``o`` *as stored*, in bf16, and

    dself_k  = sum_{b,i} dS_kii,   dS_kii = P_kii (dP_kii - Delta_ki),
    dcross_k = sum_{b,i} dlse_ki - dself_k     (the rows of dS sum to dlse)

(``_pre_kernel`` and ``_bwd_kernel``). Rounding ``o`` to bf16 moves each ``Delta_i`` by about
``2^-9 |o_i| |do_i|``, and the bias gradients sum those errors over all rows and batches, while
``dq`` and ``dkv`` see each ``Delta_i`` only through their own row. The PyTorch reference never
forms ``Delta`` from ``o``: autograd's softmax backward sums ``P_ij dP_ij`` in float32.

This script draws the inputs several times for each case of the GPU checks (the four shapes of
the correctness stage, ALiBi and both biases, and the every-configuration call with the extra
pair), with the cotangents of ``gpu_kernels._outputs_and_grads``, and computes in float64 from the
same bf16 values: the exact gradients rounded once to bf16 (the best a bf16 result can do), the
bf16 PyTorch reference (on this CPU), and the kernels' formulas with ``Delta`` from ``o`` rounded
to bf16 (as the kernels do) and from ``o`` unrounded, each result rounded to bf16 (the gradient of
a bf16 parameter). It reports the errors in units of bf16 roundoff and how often each emulation
fails the criterion. Two questions: does the rounded ``o`` add error, and how often does the
criterion, applied to a result of K numbers (one per head), fail by chance?

Since ``NOTES.md`` step 26 the kernels' default backward takes the bias gradients' ``Delta_i`` from
the ``dq`` walk's own sums ``sum_j P_ij dP_ij - dlse_i`` in float32, which equal ``o_i.do_i -
dlse_i`` with the unrounded ``o`` up to float32 rounding: ``kernel_formulas_o_exact`` is now the
kernels' formula, ``kernel_formulas_o_bf16`` that of the atomic-dq backward (and of the default
one before that step).

Usage::

    python benchmarks/bias_grad_rounding.py [--seeds N] [--out FILE | --replace]
"""

from __future__ import annotations

import argparse
import os
import sys

import torch

from cemlib.kernels import reference

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common  # noqa: E402
from outputs import RESULTS, add_output_arguments, announce, command_line, write_json  # noqa: E402

#: The GPU correctness stage's attention shapes (B, K, L, D), ALiBi and both biases, and the calls
#: with the head-shared extra pair: (shape, its width D_e (None: K D), the scale of its draws),
#: the every-configuration check's and the CUDA test's of the default layer at GPT-2 width
#: (``tests/test_kernels_cuda.py::test_attention_cuda_shared_logits_bf16``).
SHAPES = [(2, 3, 37, 64), (1, 12, 256, 64), (1, 2, 1000, 48), (2, 1, 129, 128)]
EXTRA_CASES = [((2, 4, 200, 64), None, 0.3), ((2, 12, 300, 64), 768, 0.05)]


def _rel_err(a, b) -> float:
    a, b = a.double(), b.double()
    return ((a - b).abs().max() / b.abs().max().clamp_min(1e-30)).item()


def _cotangents(shapes, seed=1):
    """The random projection of ``gpu_kernels._outputs_and_grads``: one float64 cotangent per
    output, in order, from one generator."""
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(shape, generator=g, dtype=torch.float64) for shape in shapes]


def _call(q, kv, qe, ke, sb, cb, alibi, scale):
    extra = {} if qe is None else dict(q_extra=qe, k_extra=ke, extra_values=True,
                                       extra_head_sum=True)
    return reference.tied_attention(q, kv, scale=scale, alibi=alibi, self_bias=sb, cross_bias=cb,
                                    **extra)


def _reference_grads(inputs, alibi, scale, dtype):
    """``(dself, dcross)`` of the PyTorch reference computed in ``dtype``."""
    leaves = [None if x is None else x.to(dtype).clone().requires_grad_() for x in inputs]
    outs = _call(*leaves, alibi.to(torch.promote_types(dtype, torch.float32)), scale)
    cots = _cotangents([o.shape for o in outs])
    sum((o.double() * c).sum() for o, c in zip(outs, cots)).backward()
    return leaves[4].grad, leaves[5].grad


def kernel_formulas(inputs, alibi, scale, round_o: bool, dtype=torch.bfloat16):
    """``(dself, dcross)`` by the kernels' formulas in float64 from the bf16 inputs: ``do`` and
    ``do_extra`` in bf16 (cotangents of bf16 outputs), ``dlse`` in float32; with the extra pair,
    ``dA = do_extra k_extra^T`` rounded to bf16 (``torch.bmm`` in bf16, ``backward``), added to
    every head's ``dP`` and, through ``sum_j P_ij dA_ij``, to ``Delta``; ``Delta`` from ``o``
    rounded to bf16 (``round_o``, the kernels) or not; each result rounded to bf16. ``dtype``:
    the 16-bit type of all this (``torch.float64``: no rounding at all, the formulas alone)."""
    low = torch.promote_types(dtype, torch.float32)  # the log-sum-exp's type
    q, kv, qe, ke, sb, cb = [None if x is None else x.double() for x in inputs]
    B, K, L, _ = q.shape
    s = torch.einsum("bkid,bkjd->bkij", q, kv) * scale + reference.attention_bias(
        L, K, alibi=alibi.double(), self_bias=sb, cross_bias=cb, dtype=torch.float64,
        device=q.device)
    if qe is not None:
        s = s + (qe @ ke.transpose(1, 2))[:, None] * scale
    lse = torch.logsumexp(s, -1)
    p = torch.exp(s - lse[..., None])
    o = p @ kv
    shapes = [o.shape, lse.shape] + ([] if qe is None else [(B, L, ke.shape[-1])])
    do, dlse, *doe = _cotangents(shapes)
    do = do.to(dtype).double()
    dlse = dlse.to(low).double()
    if round_o:
        o = o.to(dtype).double()
    delta = (o * do).sum(-1) - dlse
    dp_diag = (do * kv).sum(-1)
    if qe is not None:
        da = (doe[0].to(dtype).double() @ ke.transpose(1, 2)).to(dtype).double()
        delta = delta + (p * da[:, None]).sum(-1)
        dp_diag = dp_diag + torch.diagonal(da, dim1=-2, dim2=-1)[:, None]
    p_diag = torch.diagonal(p, dim1=-2, dim2=-1)
    dself = (p_diag * (dp_diag - delta)).sum((0, 2))
    dcross = dlse.sum((0, 2)) - dself
    return dself.to(dtype), dcross.to(dtype)


UNIT_ROUNDOFF = 2.0 ** -8  #: bf16: 8 significant bits, round to nearest


def _inputs(shape, extra, seed, extra_width=None, extra_scale=0.3):
    B, K, L, D = shape
    g = torch.Generator().manual_seed(seed)
    q, kv = torch.randn(2, B, K, L, D, generator=g, dtype=torch.float64)
    qe = ke = None
    if extra:
        qe, ke = extra_scale * torch.randn(2, B, L, extra_width or K * D, generator=g,
                                           dtype=torch.float64)
    sb, cb = torch.randn(2, K, generator=g, dtype=torch.float64)
    return [None if x is None else x.to(torch.bfloat16) for x in (q, kv, qe, ke, sb, cb)]


def errors(shape, extra=False, seed=0, extra_width=None, extra_scale=0.3) -> dict:
    """Errors, in bf16 units of roundoff, of ``dself`` and ``dcross`` for one draw of the inputs:
    the exact values rounded once to bf16 (the best a bf16 result can do), the bf16 PyTorch
    reference, and the kernels' formulas with ``Delta`` from the rounded and the exact ``o``.
    ``extra``: with the head-shared extra pair (width ``extra_width``, default ``K D``, drawn
    ``extra_scale`` N(0, 1)) and head-summed values, as in ``gpu_kernels.every_config_check``."""
    inputs = _inputs(shape, extra, seed, extra_width, extra_scale)
    K, D = shape[1], shape[3]
    alibi, scale = reference.alibi_slopes(K), D ** -0.5
    exact = _reference_grads(inputs, alibi, scale, torch.float64)
    rows = {"exact_rounded": tuple(e.to(torch.bfloat16) for e in exact),
            "reference_bf16": _reference_grads(inputs, alibi, scale, torch.bfloat16),
            "kernel_formulas_o_bf16": kernel_formulas(inputs, alibi, scale, round_o=True),
            "kernel_formulas_o_exact": kernel_formulas(inputs, alibi, scale, round_o=False)}
    return {name: [_rel_err(got[i], exact[i]) / UNIT_ROUNDOFF for i in range(2)]
            for name, got in rows.items()}


def measure(shape, extra=False, seeds=16, floor=1e-3, extra_width=None, extra_scale=0.3) -> dict:
    """Over ``seeds`` draws: the median and largest error of each way (bf16 roundoff units, both
    gradients pooled), how often each kernel emulation fails the FlashAttention criterion
    (error > 2 x the bf16 reference's + ``floor``), and in how many draws one of the two
    gradients fails (``draws_failing``: a test that checks both fails then)."""
    draws = [errors(shape, extra, seed, extra_width, extra_scale) for seed in range(seeds)]
    out = {"shape": list(shape), "extra_pair": extra, "draws": seeds, "gradients": 2 * seeds}
    if extra:
        out.update(extra_width=extra_width or shape[1] * shape[3], extra_scale=extra_scale)
    for name in draws[0]:
        pooled = sorted(e for d in draws for e in d[name])
        out[name] = {"median_ulp": pooled[len(pooled) // 2], "max_ulp": pooled[-1]}
    for name in ("kernel_formulas_o_bf16", "kernel_formulas_o_exact"):
        fails = [[k * UNIT_ROUNDOFF > 2 * r * UNIT_ROUNDOFF + floor
                  for k, r in zip(d[name], d["reference_bf16"])] for d in draws]
        out[name]["criterion_failures"] = sum(sum(f) for f in fails)
        out[name]["draws_failing"] = sum(any(f) for f in fails)
    return out


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_output_arguments(p, "results/bias_grad_rounding_cpu.json")
    p.add_argument("--seeds", type=int, default=16, help="draws of the inputs per case")
    p.add_argument("--shapes", type=int, nargs=4, action="append", metavar=("B", "K", "L", "D"),
                   help="plain calls of these shapes instead of the GPU checks' cases")
    args = p.parse_args(argv)
    default = RESULTS / "bias_grad_rounding_cpu.json"
    announce(default, args.out, args.replace)
    cases = ([(tuple(s), False, None, 0.3) for s in args.shapes] if args.shapes else
             [(s, False, None, 0.3) for s in SHAPES] + [(s, True, w, a) for s, w, a in EXTRA_CASES])
    results = []
    for shape, extra, width, scale in cases:
        results.append(measure(shape, extra, args.seeds, extra_width=width, extra_scale=scale))
        r = results[-1]
        print(r["shape"], "extra pair" if extra else "", "; ".join(
            f"{k}: median {v['median_ulp']:.2f}, max {v['max_ulp']:.2f} ulp"
            + (f", fails {v['criterion_failures']}/{r['gradients']}"
               if "criterion_failures" in v else "")
            for k, v in r.items() if isinstance(v, dict)), flush=True)
    out = {"benchmark": "bias_grad_rounding", "env": common.environment(torch.device("cpu")),
           "command": command_line(__file__, argv),
           "what": "errors of the self/cross-bias gradients against float64 in units of bf16 "
                   "roundoff (2^-8, relative to the largest exact value), bf16 inputs; the "
                   "kernels' formulas emulated in float64; criterion_failures: error > 2 x the "
                   "bf16 reference's + 1e-3",
           "results": results}
    write_json(out, default, args.out, args.replace)
    return out


if __name__ == "__main__":
    main()
