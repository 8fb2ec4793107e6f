"""Compile every cemlib Triton kernel for a CUDA GPU ahead of time, on a machine without one.

Triton compiles for a named target (``GPUTarget("cuda", 90, 32)`` is the H100) anywhere: its
bundled ``ptxas`` turns the generated PTX into a cubin. This script runs cemlib's own launchers
(:mod:`cemlib.kernels.attention`, :mod:`cemlib.kernels.gated_mlp`, :mod:`cemlib.kernels.dplr`)
on CPU tensors with the *GPU* configurations, turns each launch into a compilation (Triton's ``warmup``
path, with a stand-in driver that names the target), and reads each cubin with the bundled
``cuobjdump``: registers per thread, stack and local memory (where ptxas puts spilled
registers), shared memory, and the machine code (SASS) of every loop.

**Instructions per score element** (the attention kernels' loops; ``loops`` in each record): a
loop is a backward branch of the SASS (``cuobjdump -sass``), its body the instructions from the
branch target to the branch. Each is counted in full and split into matrix instructions
(``HGMMA``, the sm_90 warpgroup MMA, or ``HMMA``) and the rest; the rest is divided by the score
elements (entries of the ``q kv^T`` tile) that one thread owns in one iteration,
``BLOCK_M x BLOCK_N / (32 num_warps)`` with the loop's own tile sizes. The loops of the v2
kernels are told apart by what they contain: the number of MMA groups (``HGMMA ... gsb0``: one
per ``tl.dot``; 2 in the forward, 4 in the ``d kv`` loop, 3 in the ``dq`` loop) and whether
they mask (``FSEL ... -INF``: the diagonal band). These are static counts of the compiled
code, not timings; the budget they are compared with is explained in ``benchmarks/NOTES.md``.

It catches what the interpreter cannot: a kernel that does not compile for the GPU, one that
spills registers to local memory, or one whose loops carry more element-wise work than planned.
Nothing here is timed, and nothing here is a GPU measurement. Cases: tied attention (plain
causal, with ALiBi and self/cross biases, and the default CEM layer's wide shared diagonal),
each kernel in its default configuration (``attention.GPU_CONFIGS``, first entry); the tied
gated-MLP step's two element-wise kernels (``mlp_v2_elementwise`` in the report: the width of
every global access and the instructions per element); the DPLR preconditioner; in bf16, fp16
and fp32. Case names, record fields (``version``: 2 for the attention kernels) and the method
names ``v2`` keep the labels of the stored reports, which also hold the first generation of the
kernels (removed since; ``benchmarks/NOTES.md``).

``--sweep`` compiles the candidate autotune space of every v2 kernel (:func:`candidates`) for
sm_90 in bf16, in the variant that makes each kernel heaviest (:data:`SWEEP_VARIANT`; the
atomic-dq backward, space ``bwd_atomic``, in the same call with atomic dq), and writes
``results/compile_kernels_sweep.json``; ``GPU_CONFIGS`` is the spill-free part of it, the
configuration with the fewest non-MMA instructions per element first
(``tests/test_kernels_compile.py`` checks that it stays so). ``--merge`` combines sweeps run in
parts, possibly at different commits (a space swept again after its kernel changed): each part
keeps its environment and command under ``parts``, and a later part's records of a space replace
an earlier part's.

Usage: ``python benchmarks/compile_kernels.py [--arch 90 80] [--quick] [--case TEXT] [--out FILE | --replace]``
(``--quick``: bf16 only; ``--case``: only the cases whose name contains TEXT; a stored result is
kept unless ``--replace``: by default a new file is written beside it, see ``benchmarks/outputs.py``),
``python benchmarks/compile_kernels.py --sweep [--widths 64 128] [--kernels ...]``, and
``--merge FILE ...`` to combine sweeps run in parts, and ``python benchmarks/compile_kernels.py
--fit 75`` to compile the autotune space for a smaller GPU (sm_75: a T4) and see which entries
load there (``results/compile_kernels_fit_sm75.json``); ``--dots [--arch ...]`` compiles one
``tl.dot`` per target and counts its tensor-core and FMA instructions
(``results/compile_dots.json``: below sm_80 Triton's products run on the FMA units, which is why
``cemlib.kernels.dispatch`` leaves attention to cuBLAS there).
Relies on Triton internals (``JITFunction.run(warmup=True)``, ``triton.runtime.driver``),
checked on Triton 3.9.
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import itertools
import json
import os
import re
import subprocess
import sys
import tempfile
import time

os.environ.pop("TRITON_INTERPRET", None)  # compile, do not interpret (set before triton loads)

import torch  # noqa: E402
import triton  # noqa: E402
import triton.language as tl  # noqa: E402
from triton.backends.compiler import GPUTarget  # noqa: E402
from triton.runtime.driver import driver  # noqa: E402
from triton.runtime.jit import JITFunction  # noqa: E402

from cemlib.kernels import attention as v2  # noqa: E402
from cemlib.kernels import dplr  # noqa: E402
from cemlib.kernels import gated_mlp as gm  # noqa: E402
from cemlib.train.results import git_commit  # noqa: E402
from outputs import RESULTS, announce, write_json  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
BIN = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin")
SHARED_LIMIT = {75: 64 * 1024, 80: 163 * 1024, 86: 99 * 1024, 89: 99 * 1024,
                90: 227 * 1024}  # bytes per block (75: T4; 86/89: consumer GPUs)


class _TargetDriver:
    """Stands in for the CUDA driver: names the target, and device/stream 0."""

    def __init__(self, arch: int):
        self.target = GPUTarget("cuda", arch, 32)

    def get_current_target(self):
        return self.target

    def get_current_device(self):
        return 0

    def get_current_stream(self, device=None):
        return 0


@contextlib.contextmanager
def compile_only(arch: int, sink: list, v2_configs: dict | None = None):
    """Inside: ``kernel[grid](...)`` compiles for ``sm_<arch>`` instead of launching, appending
    ``(kernel name, launch keywords, CompiledKernel)`` to ``sink``; GPU tile sizes are used, and
    for the v2 kernels the default configuration or the one ``v2_configs`` names."""
    getitem, dplr_blocks = JITFunction.__getitem__, dplr._blocks
    cuda = torch.device("cuda")  # only read for its .type; no GPU needed

    def compiling(self, grid):
        def launch(*args, **kw):
            sink.append((self.fn.__name__, kw, self.run(*args, grid=grid, warmup=True, **kw)))
        return launch

    def v2_select(name, device, block_d, table):
        if v2_configs and name in v2_configs:
            return dict(v2_configs[name])
        return dict(v2.TUNING.configs(table, block_d)[0])

    kernels = [f for m in (v2, gm, dplr) for f in vars(m).values() if isinstance(f, JITFunction)]
    for f in kernels:  # binders cache the target per device: start clean for this arch
        f.device_caches.clear()
    previous = driver._active
    driver.set_active(_TargetDriver(arch))
    JITFunction.__getitem__ = compiling
    dplr._blocks = lambda R, device: dplr_blocks(R, cuda)
    v2.TUNING.select = v2_select
    try:
        yield
    finally:
        JITFunction.__getitem__ = getitem
        dplr._blocks = dplr_blocks
        del v2.TUNING.select  # the method again
        driver._active = previous  # (reset_active() would look for a real GPU driver)
        for f in kernels:
            f.device_caches.clear()


def dplr_case(dtype):
    """The DPLR preconditioner at D_h = 768, rank 16."""
    g = torch.randn(64, 768, dtype=dtype)
    dplr.dplr_apply(g, torch.randn(768, dtype=dtype), *torch.randn(2, 768, 16, dtype=dtype))


# ---------------------------------------------------------------- tied gated MLP v2

def mlp_v2_case(dtype):
    """The v2 gated-MLP step's two element-wise kernels (its GEMMs are cuBLAS calls)."""
    h, gamma, da = torch.randn(3, 64, 3072, dtype=dtype)
    gm.silu_gate(h, gamma)
    gm.silu_gate_backward(h, gamma, da)


def mlp_v2_elementwise(archs, dtypes) -> list[dict]:
    """What makes the v2 element-wise kernels bandwidth-bound, read from their SASS: the width of
    every global load and store (``LDG.E.128``: 16 bytes per thread per access) and the
    instructions per element (a thread owns BLOCK / (32 num_warps) entries)."""
    rows = []
    for arch in archs:
        for dtype in dtypes:
            sink = []
            with compile_only(arch, sink):
                mlp_v2_case(dtype)
            for name, kw, kernel in sink:
                with tempfile.NamedTemporaryFile(suffix=".cubin", delete=False) as f:
                    f.write(kernel.asm["cubin"])
                try:
                    sass = subprocess.run([os.path.join(BIN, "cuobjdump"), "-sass", f.name],
                                          capture_output=True, text=True, check=True).stdout
                finally:
                    os.unlink(f.name)
                ops = [m.group(1) for m in re.finditer(r"/\*[0-9a-f]{4}\*/\s+(?:@!?U?P\w+\s+)?"
                                                        r"([A-Z][A-Z0-9_.]*)", sass)
                       if m.group(1) != "NOP"]
                per_thread = kw["BLOCK"] // (32 * kernel.metadata.num_warps)
                rows.append(dict(arch=f"sm_{arch}", dtype=str(dtype).replace("torch.", ""),
                                 kernel=name, block=kw["BLOCK"],
                                 num_warps=kernel.metadata.num_warps,
                                 elements_per_thread=per_thread,
                                 global_accesses=sorted(o for o in ops
                                                        if o.startswith(("LDG", "STG"))),
                                 instructions=len(ops),  # NOPs (alignment padding) left out
                                 instructions_per_element=round(len(ops) / per_thread, 1),
                                 **resource_usage(kernel.asm["cubin"])))
    return rows


V2_VARIANTS = {  # name: (biases, extra pair width, atomic dq)
    "causal": (False, 0, False),
    "alibi+self+cross": (True, 0, False),
    "shared-logits De=768": (True, 768, False),
    "alibi+self+cross atomic-dq": (True, 0, True),
}
# compiled by the autotune sweep only (the atomic-dq backward's heaviest call)
SWEEP_ONLY_VARIANTS = {"shared-logits De=768 atomic-dq": (True, 768, True)}


def v2_case(dtype, D, variant, L=128):
    """Forward and backward launches of v2 tied attention, every gradient: ``variant`` one of
    :data:`V2_VARIANTS` (with the extra pair: the default CEM layer's call, head-summed extra
    values; with atomic dq: the backward without the dq walk, ``v2.use_atomic_dq``). ``q`` and
    ``kv`` are the layers' head-split views of a (B, L, K D) projection."""
    B, K = 1, 12
    biases, De, atomic = {**V2_VARIANTS, **SWEEP_ONLY_VARIANTS}[variant]
    q = torch.randn(B, L, K, D, dtype=dtype).transpose(1, 2)
    vec = [torch.rand(K) for _ in range(3)] if biases else [None] * 3
    qe = ke = None
    if De:
        qe, ke = torch.randn(B, L, De, dtype=dtype), torch.randn(B, L, De, dtype=dtype)
    o, lse, oe, e2, a = v2.forward(q, q, 0.125, *vec, qe, ke, bool(De))
    needs = (True, True, False, biases, biases, bool(De), bool(De))
    with v2.use_atomic_dq(atomic):
        v2.backward(o, lse, oe, q, q, o, lse, 0.125, *vec, qe, ke, e2, a, needs)


def cases(dtypes):
    for dtype in dtypes:
        name = str(dtype).replace("torch.", "")
        for variant in V2_VARIANTS:
            yield f"v2 attention d=64 {variant} {name}", \
                lambda d=dtype, v=variant: v2_case(d, 64, v)
        yield f"v2 attention d=128 alibi+self+cross {name}", \
            lambda d=dtype: v2_case(d, 128, "alibi+self+cross")
        yield f"DPLR 768 R=16 {name}", lambda d=dtype: dplr_case(d)
        yield f"gated MLP v2 element-wise 64x3072 {name}", lambda d=dtype: mlp_v2_case(d)


def _cuobjdump(cubin: bytes, flag: str) -> str:
    with tempfile.NamedTemporaryFile(suffix=".cubin", delete=False) as f:
        f.write(cubin)
    try:
        return subprocess.run([os.path.join(BIN, "cuobjdump"), flag, f.name],
                              capture_output=True, text=True, check=True).stdout
    finally:
        os.unlink(f.name)


def resource_usage(cubin: bytes) -> dict:
    """Registers, stack, local (spill) and static shared memory of a cubin, via cuobjdump."""
    out = _cuobjdump(cubin, "-res-usage")
    m = re.search(r"REG:(\d+) STACK:(\d+) SHARED:(\d+) LOCAL:(\d+)", out)
    if m is None:
        raise RuntimeError(f"unexpected cuobjdump output:\n{out}")
    return dict(zip(("registers", "stack_bytes", "static_shared_bytes", "local_bytes"),
                    map(int, m.groups())))


_INSTRUCTION = re.compile(r"^\s*/\*([0-9a-f]{4,})\*/\s+(.*?)\s*;")
_BRANCH = re.compile(r"\bBRA\s+(?:`\(\S+\)\s*)?(0x[0-9a-f]+)")


def _opcodes(instructions) -> collections.Counter:
    """Histogram of the opcodes of SASS instruction texts (predicate and modifiers dropped:
    ``@!P0 HMMA.16816.F32`` counts as ``HMMA``)."""
    return collections.Counter(re.sub(r"^@!?U?P\w+\s+", "", t).split()[0].split(".")[0]
                               for t in instructions)


def sass_loops(sass: str) -> list[dict]:
    """The loops of a SASS listing (``cuobjdump -sass``): one per backward branch, its body the
    instructions from the branch target to the branch. Per loop: instructions, matrix
    instructions (HGMMA, HMMA), MMA groups (HGMMA ending a ``gsb0`` group: one per ``tl.dot``),
    whether it masks the diagonal band (``FSEL ... -INF``), and the opcode histogram."""
    body = []
    for line in sass.splitlines():
        m = _INSTRUCTION.match(line)
        if m:
            body.append((int(m.group(1), 16), m.group(2)))
    loops = []
    for addr, text in body:
        m = _BRANCH.search(text)
        if m is None or int(m.group(1), 16) >= addr:
            continue
        start = int(m.group(1), 16)
        ins = [t for a, t in body if start <= a <= addr]
        ops = _opcodes(ins)
        mma = ops["HGMMA"] + ops["HMMA"]
        loops.append(dict(start=hex(start), end=hex(addr), instructions=len(ins), mma=mma,
                          non_mma=len(ins) - mma,
                          mma_groups=sum(1 for t in ins if "HGMMA" in t and "gsb0" in t),
                          band=any(t.startswith("FSEL") and "-INF" in t for t in ins),
                          opcodes=dict(ops.most_common())))
    return loops


_V2_KINDS = {  # the MMA loops of each v2 kernel in source order: (kind, MMA groups, tile sizes)
    "_fwd_kernel": [("forward", 2, ("BLOCK_M", "BLOCK_N"))],
    "_bwd_kernel": [("backward dkv", 4, ("BLOCK_N1", "BLOCK_M1")),
                    ("backward dq", 3, ("BLOCK_N1", "BLOCK_N2")),
                    ("backward dkv + atomic dq", 5, ("BLOCK_N1", "BLOCK_M1"))],
    "_pre_kernel": [("preprocess row pass", 1, ("BLOCK_M", "BLOCK_N"))],
    "_extra_grads_kernel": [("extra-pair gradients (GEMM, output elements)", None,
                             ("BLOCK_M", "BLOCK_N"))],
}


def _v2_kinds(kernel: str, kw: dict):
    if kernel == "_headsum_kernel":
        return [("head sum of dS" if kw.get("GRAD") else "head sum of P", None,
                 ("BLOCK_M", "BLOCK_N"))]
    return _V2_KINDS.get(kernel, [])


def loop_report(kernel: str, kw: dict, num_warps: int, sass: str, version: int) -> list[dict]:
    """The MMA loops of one kernel with their non-MMA instructions per score element. A v2
    kernel's loops are matched to its source loops (:data:`_V2_KINDS`) by their number of MMA
    groups where the loop uses ``wgmma`` (``HGMMA ... gsb0``: one per ``tl.dot``), otherwise by
    order (each source loop may appear as a diagonal-band copy and a copy below the band, in
    that order for the ``d kv`` loop and the other way round for ``dq``)."""
    threads = 32 * num_warps
    loops = [lp for lp in sass_loops(sass) if lp["mma"]]
    kinds = _v2_kinds(kernel, kw) if version == 2 else [(kernel, None, ("BLOCK_M", "BLOCK_N"))]
    out = []
    for i, loop in enumerate(loops):
        match = [k for k in kinds if k[1] is not None and k[1] == loop["mma_groups"]]
        if not match:  # mma.sync, or one kind only: by position among the main loops
            main = [lp for lp in loops if not lp["band"]]
            before = sum(1 for lp in main if int(lp["start"], 16) < int(loop["start"], 16))
            j = before if not loop["band"] else (0 if before == 0 else before - 1)
            match = [kinds[min(j, len(kinds) - 1)]] if kinds else []
        if not match:
            continue
        kind, _, (a, b) = match[0]
        elements = kw[a] * kw[b] / threads
        out.append(dict(kind=kind + (" (diagonal band)" if loop["band"] else ""),
                        band=loop["band"], elements_per_thread=elements,
                        non_mma_per_element=round(loop["non_mma"] / elements, 2),
                        **{k: loop[k] for k in ("start", "end", "instructions", "mma", "non_mma",
                                                "mma_groups", "opcodes")}))
    return out


def _record(arch, case, name, kw, kernel, wall, version):
    meta = kernel.metadata
    flags = {k: v for k, v in kw.items() if isinstance(v, (bool, int, str))}
    usage = resource_usage(kernel.asm["cubin"])
    shared = meta.shared + usage["static_shared_bytes"]
    rec = dict(arch=f"sm_{arch}", case=case, kernel=name, version=version, flags=flags,
               num_warps=meta.num_warps, num_stages=meta.num_stages,
               dynamic_shared_bytes=meta.shared, **usage,
               # ptxas puts spilled registers in the stack frame (local memory)
               spills=usage["local_bytes"] + usage["stack_bytes"] > 0,
               fits_shared=shared <= SHARED_LIMIT.get(arch, 48 * 1024),
               case_compile_s=round(wall, 2))
    if name != "_dplr_kernel":
        sass = _cuobjdump(kernel.asm["cubin"], "-sass")
        rec["loops"] = loop_report(name, kw, meta.num_warps, sass, version)
    return rec


def compile_all(archs, dtypes, only=None) -> list[dict]:
    """Every case (or those whose name contains ``only``) for every target."""
    records, seen = [], set()
    for arch in archs:
        for case, fn in cases(dtypes):
            if only and only not in case:
                continue
            sink = []
            t0 = time.perf_counter()
            with compile_only(arch, sink):
                fn()
            wall = time.perf_counter() - t0
            for name, kw, kernel in sink:
                key = (arch, kernel.hash)
                if key in seen:  # same specialization launched twice (e.g. fwd and bwd)
                    continue
                seen.add(key)
                records.append(_record(arch, case, name, kw, kernel, wall,
                                       2 if case.startswith("v2 ") else 1))
    return records


# Instruction budgets of the main (below-diagonal) loops, non-MMA instructions per score element
# (benchmarks/NOTES.md derives them from the H100's issue rate and MMA throughput).
TARGETS = {"forward": 12, "backward dkv": 20, "backward dq": 20}


def per_element_summary(records) -> list[dict]:
    """The main loops of the attention kernels in their default configurations (sm_90), against
    :data:`TARGETS`."""
    rows = []
    for r in records:
        if r["arch"] != "sm_90":
            continue
        for loop in r.get("loops", []):
            target = TARGETS.get(loop["kind"]) if r["version"] == 2 else None
            rows.append(dict(case=r["case"], kernel=r["kernel"], version=r["version"],
                             kind=loop["kind"], non_mma_per_element=loop["non_mma_per_element"],
                             elements_per_thread=loop["elements_per_thread"],
                             target=target,
                             met=None if target is None else
                             loop["non_mma_per_element"] <= target))
    return rows


# ------------------------------------------------------------------------------ autotune sweep

# autotune spaces (attention.GPU_CONFIGS) and the kernel each one launches; the atomic-dq
# backward is the same kernel as "bwd", specialised (ATOMIC_DQ), with a space of its own
V2_KERNELS = {"fwd": "_fwd_kernel", "pre": "_pre_kernel", "bwd": "_bwd_kernel",
              "headsum": "_headsum_kernel", "extra_grads": "_extra_grads_kernel",
              "bwd_atomic": "_bwd_kernel"}


def candidates(name: str) -> list[dict]:
    """The candidate autotune space of one v2 kernel (before pruning by spills)."""
    warps = (4, 8)
    if name == "fwd":
        return [dict(BLOCK_M=m, BLOCK_N=n, num_warps=w, num_stages=st)
                for m in (64, 128) for n in (32, 64, 128) for w in warps for st in (2, 3)]
    if name == "bwd_atomic":  # no dq walk: BLOCK_N2 unused (fixed); query tiles up to ROW_PAD
        return [dict(BLOCK_M1=m1, BLOCK_N1=n1, BLOCK_N2=16, num_warps=w, num_stages=st)
                for n1 in (64, 128) for m1 in (16, 32, 64, 128) for w in warps for st in (2, 3)]
    if name == "bwd":
        return [dict(BLOCK_M1=m1, BLOCK_N1=n1, BLOCK_N2=n2, num_warps=w, num_stages=2)
                for n1 in (64, 128) for m1 in (16, 32, 64) for n2 in (16, 32, 64) for w in warps]
    if name in ("pre", "headsum"):
        return [dict(BLOCK_M=m, BLOCK_N=n, num_warps=w, num_stages=st)
                for m in (32, 64, 128) for n in (32, 64, 128) for w in warps for st in (2, 3)]
    return [dict(BLOCK_M=m, BLOCK_N=n, BLOCK_K=k, num_warps=w, num_stages=st)
            for m in (64, 128) for n in (64, 128) for k in (32, 64) for w in warps for st in (3, 4)]


# The sweep compiles every candidate in the variant that makes each kernel heaviest (the default
# CEM layer's call: ALiBi, both biases, the shared diagonal, every gradient): it holds the most
# values live, so what does not spill there does not spill in the lighter variants (the default
# configurations are compiled in all variants by the main report, which checks that).
SWEEP_VARIANT = "shared-logits De=768"
SWEEP_VARIANTS = {"bwd_atomic": "shared-logits De=768 atomic-dq"}  # the others: SWEEP_VARIANT
LAUNCH_NAMES = {"bwd_atomic": "bwd"}  # the kernel's name for attention.use_configs


def _compile_config(arch: int, dtype, width: int, name: str, cfg: dict) -> list[dict]:
    """Compile v2 kernel ``name`` with configuration ``cfg`` for ``sm_<arch>`` in ``dtype`` in
    its heaviest call (:data:`SWEEP_VARIANT`, :data:`SWEEP_VARIANTS` for the atomic-dq backward):
    its records (two for the head sum: the sums of P and of dS), tagged with the kernel's name,
    width, variant and configuration."""
    variant = SWEEP_VARIANTS.get(name, SWEEP_VARIANT)
    label = str(dtype).replace("torch.", "")
    sink = []
    t0 = time.perf_counter()
    with compile_only(arch, sink, {LAUNCH_NAMES.get(name, name): cfg}):
        v2_case(dtype, width, variant)
    wall = time.perf_counter() - t0
    out = []
    for n, kw, k in [h for h in sink if h[0] == V2_KERNELS[name]]:
        rec = _record(arch, f"v2 attention d={width} {variant} {label}", n, kw, k, wall, 2)
        rec.update(name=name, width=width, variant=variant, config=cfg)
        out.append(rec)
    return out


def sweep(widths, arch=90, names=tuple(V2_KERNELS), log=print) -> list[dict]:
    """Compile every candidate of every v2 kernel (bf16, ``sm_<arch>``) in
    :data:`SWEEP_VARIANT` (:data:`SWEEP_VARIANTS` for the atomic-dq backward); one record per
    (kernel, width, configuration) (two for the head sum: the sums of P and of dS)."""
    out = []
    for width in widths:
        for name in names:
            if name == "extra_grads" and width != widths[0]:
                continue  # independent of the head width
            for cfg in candidates(name):
                for rec in _compile_config(arch, torch.bfloat16, width, name, cfg):
                    out.append(rec)
                    main = [lp["non_mma_per_element"] for lp in rec["loops"] if not lp["band"]]
                    log(f"{name:12s} D={width:<4d} {cfg} regs {rec['registers']:3d} spill "
                        f"{rec['spills']!s:5s} per-element {main}", flush=True)
    return out


def prune(records) -> dict:
    """``{kernel: {width: [configs]}}``: the candidates that spill in none of their records, the
    default first: the one with the fewest non-MMA instructions per element in its main loops
    (summed over its records), then candidate order."""
    by = collections.defaultdict(list)
    for r in records:
        by[(r["name"], r["width"], json.dumps(r["config"], sort_keys=True))].append(r)
    table = collections.defaultdict(dict)
    for name in V2_KERNELS:
        widths = sorted({w for (n, w, _) in by if n == name})
        for width in widths:
            ok = []
            for (n, w, key), recs in by.items():
                if n != name or w != width or any(r["spills"] or not r["fits_shared"]
                                                  for r in recs):
                    continue
                main = [lp["non_mma_per_element"] for r in recs for lp in r["loops"]
                        if not lp["band"]]
                # no main loop recognised (mma.sync, or none): listed after the others
                cost = sum(main) if main else float("inf")
                ok.append((cost, candidates(name).index(json.loads(key)), json.loads(key)))
            ok.sort(key=lambda t: (t[0], t[1]))
            table[name][0 if name == "extra_grads" else width] = [c for _, _, c in ok]
    return dict(table)


def fit(arch: int, dtype=torch.float16, width: int = 64, names=tuple(V2_KERNELS),
        log=print) -> list[dict]:
    """Compile every entry of each v2 kernel's autotune space (:data:`GPU_CONFIGS`, chosen on
    sm_90) for ``sm_<arch>`` in ``dtype``, in the heaviest call of :func:`sweep`: which entries a
    smaller GPU can load (shared memory per block within :data:`SHARED_LIMIT`), and which
    compile there without spilling. One record per (kernel, entry), with its index in the space:
    what the autotuner there chooses among; ``CEMLIB_AUTOTUNE=0`` launches there the first that
    loads without spilling, else the first that loads (``runtime.Tuning.first_fitting``)."""
    out = []
    for name in names:
        for index, cfg in enumerate(v2.TUNING.configs(name, width)):
            for rec in _compile_config(arch, dtype, width, name, cfg):
                rec["index"] = index
                out.append(rec)
                log(f"{name:12s} #{index:<2d} {cfg} regs {rec['registers']:3d} spill "
                    f"{rec['spills']!s:5s} shared {rec['dynamic_shared_bytes']:6d} "
                    f"loads {rec['fits_shared']}", flush=True)
    return out


def _fit_summary(records) -> dict:
    """Per kernel: entries in the space, how many load (every record within the shared-memory
    limit), how many load without spills, the first that loads and the first that loads without
    spills (what ``CEMLIB_AUTOTUNE=0`` runs there; ``None`` where every entry that loads
    spills, and then it runs the first that loads)."""
    out = {}
    for name in dict.fromkeys(r["name"] for r in records):
        by = collections.defaultdict(list)
        for r in records:
            if r["name"] == name:
                by[r["index"]].append(r)
        loads = [i for i, recs in sorted(by.items()) if all(r["fits_shared"] for r in recs)]
        clean = [i for i in loads if not any(r["spills"] for r in by[i])]
        out[name] = dict(entries=len(by), load=len(loads), load_without_spills=len(clean),
                         first_loading=loads[0] if loads else None,
                         first_loading_config=by[loads[0]][0]["config"] if loads else None,
                         first_without_spills=clean[0] if clean else None)
    return out


def _sweep_parts(d: dict) -> list[dict]:
    """A sweep file as a list of parts (env, command, widths, total_compile_s, records): a merged
    file's recorded parts, each with its records, or the file itself."""
    if "parts" not in d:
        return [d]
    out = []
    for part in d["parts"]:
        kernels = set(part["kernels"])
        out.append(dict(part, records=[r for r in d["records"] if r["name"] in kernels]))
    return out


@triton.jit
def _dot_probe_kernel(a, b, c, M: "tl.constexpr"):
    """One ``M x M`` matrix product: what the installed Triton emits for ``tl.dot``."""
    r = tl.arange(0, M)
    tile = r[:, None] * M + r[None, :]
    tl.store(c + tile, tl.dot(tl.load(a + tile), tl.load(b + tile)))


#: SASS opcodes of a matrix product on the tensor cores, and on the FMA units
TENSOR_CORE_OPS, FMA_OPS = ("HGMMA", "HMMA"), ("FFMA", "HFMA2")


def dot_instructions(archs, dtypes=(torch.float16, torch.bfloat16), M: int = 64) -> list[dict]:
    """Compile one ``M x M x M`` ``tl.dot`` (fp32 accumulator) for each ``sm_<arch>`` and count the
    SASS instructions that do its multiply-adds: tensor-core ``HGMMA``/``HMMA`` or FMA-unit
    ``FFMA``/``HFMA2``. Where ``tensor_cores`` is false, every attention product of the kernels
    would run on the FMA units (Triton 3.2+ keeps ``mma.sync`` for compute capability 8.0 and
    above: triton-lang/triton pull request 5066); ``cemlib.kernels.dispatch`` reads the answer
    from :data:`~cemlib.kernels.dispatch.TENSOR_CORE_DOTS_FROM`."""
    from triton.compiler import ASTSource
    names = {torch.float16: "fp16", torch.bfloat16: "bf16"}
    out = []
    for arch in archs:
        for dtype in dtypes:
            src = ASTSource(_dot_probe_kernel, constexprs={"M": M},
                            signature={"a": f"*{names[dtype]}", "b": f"*{names[dtype]}",
                                       "c": "*fp32", "M": "constexpr"})
            try:  # (the bundled CUDA tools may not know an older target)
                kernel = triton.compile(src, target=GPUTarget("cuda", arch, 32),
                                        options=dict(num_warps=4))
                sass = _cuobjdump(kernel.asm["cubin"], "-sass")
            except Exception as e:
                out.append(dict(arch=f"sm_{arch}", dtype=str(dtype), M=M, error=(
                    f"{type(e).__name__}: {(str(e).strip().splitlines() or [''])[0][:200]}")))
                print(f"sm_{arch} {names[dtype]}: {out[-1]['error']}", flush=True)
                continue
            ops = _opcodes(m.group(2) for m in map(_INSTRUCTION.match, sass.splitlines()) if m)
            mma, fma = sum(ops[o] for o in TENSOR_CORE_OPS), sum(ops[o] for o in FMA_OPS)
            out.append(dict(arch=f"sm_{arch}", dtype=str(dtype), M=M, num_warps=4,
                            tensor_core_instructions=mma, fma_instructions=fma,
                            opcodes={o: ops[o] for o in TENSOR_CORE_OPS + FMA_OPS if ops[o]},
                            tensor_cores=mma > 0))
            print(f"sm_{arch} {names[dtype]}: {mma} tensor-core and {fma} FMA instructions "
                  f"for one {M}x{M}x{M} tl.dot", flush=True)
    return out


def _env():
    return dict(triton=triton.__version__, torch=torch.__version__, python=sys.version.split()[0],
                git_commit=git_commit(HERE),
                date=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()))


def _sweep_payload(records, env, command, widths, t0):
    table = prune(records)
    for name, by_width in table.items():
        for width, cfgs in by_width.items():
            n = len({json.dumps(r["config"], sort_keys=True) for r in records
                     if r["name"] == name and (name == "extra_grads" or r["width"] == width)})
            print(f"{name} width {width}: {len(cfgs)} of {n} candidates spill-free; "
                  f"default {cfgs[0] if cfgs else None}")
    return dict(benchmark="compile_kernels --sweep",
                note="v2 autotune candidates compiled for sm_90 in bf16 without a GPU; no timings",
                env=env, command=command, widths=widths, spill_free=table,
                total_compile_s=round(time.perf_counter() - t0, 1), records=records)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--arch", type=int, nargs="+",
                   help="compute capabilities, e.g. 90 (H100/H200) 80 (A100); default 90 80 "
                        "(with --dots: 75 80 86 89 90)")
    p.add_argument("--quick", action="store_true", help="bf16 only")
    p.add_argument("--sweep", action="store_true",
                   help="compile the v2 autotune candidates (sm_90, bf16) instead")
    p.add_argument("--widths", type=int, nargs="+", default=[64, 128],
                   help="padded head widths for --sweep")
    p.add_argument("--kernels", nargs="+", default=list(V2_KERNELS), choices=list(V2_KERNELS),
                   help="v2 kernels for --sweep")
    p.add_argument("--fit", type=int, metavar="ARCH",
                   help="compile the v2 autotune space (head width 64, the heaviest call) for "
                        "another GPU, e.g. 75 (T4), in float16: which entries load there")
    p.add_argument("--dots", action="store_true",
                   help="compile one tl.dot for each --arch in fp16 and bf16: tensor cores or "
                        "FMA units")
    p.add_argument("--case", help="only the cases whose name contains this string")
    p.add_argument("--merge", nargs="+", metavar="FILE",
                   help="combine --sweep files of parts of the kernels into one")
    p.add_argument("--out", help="JSON path (default: benchmarks/results/compile_kernels.json, "
                                 "or compile_kernels_sweep.json with --sweep/--merge; an existing stored "
                                 "file is kept and a new file is written beside it unless --replace)")
    p.add_argument("--replace", action="store_true", help="overwrite the stored default file")
    args = p.parse_args(argv)
    if args.arch is None:
        args.arch = [75, 80, 86, 89, 90] if args.dots else [90, 80]
    default = RESULTS / ("compile_dots.json" if args.dots else
                         f"compile_kernels_fit_sm{args.fit}.json" if args.fit else
                         "compile_kernels_sweep.json" if args.sweep or args.merge else
                         "compile_kernels.json")
    announce(default, args.out, args.replace)
    t0 = time.perf_counter()
    env = _env()  # the code compiled is the code at the start
    command = "python benchmarks/compile_kernels.py " + " ".join(
        argv if argv is not None else sys.argv[1:])
    if args.merge:
        # parts may come from different commits (a kernel's space swept again after a change):
        # each part keeps its own environment; a later part replaces the records of the same
        # space (kernel name) in earlier ones
        parts = [p for f in args.merge for p in _sweep_parts(json.load(open(f)))]
        names = [{r["name"] for r in part["records"]} for part in parts]
        kept = [dict(part, records=[r for r in part["records"]
                                    if not any(r["name"] in later for later in names[i + 1:])])
                for i, part in enumerate(parts)]
        kept = [part for part in kept if part["records"]]
        records = [r for part in kept for r in part["records"]]
        payload = _sweep_payload(records, kept[-1]["env"], [part["command"] for part in kept],
                                 sorted({w for part in kept for w in part["widths"]}), t0)
        payload["total_compile_s"] = round(sum(part["total_compile_s"] for part in kept), 1)
        payload["parts"] = [dict(env=part["env"], command=part["command"],
                                 widths=part["widths"], total_compile_s=part["total_compile_s"],
                                 kernels=sorted({r["name"] for r in part["records"]}))
                            for part in kept]
    elif args.dots:
        records = dot_instructions(args.arch)
        payload = dict(benchmark="compile_kernels --dots",
                       note=("one 64x64x64 tl.dot (fp32 accumulator, 4 warps) compiled per "
                             "target without a GPU: the SASS instructions of its multiply-adds "
                             "(tensor cores: HGMMA/HMMA; FMA units: FFMA/HFMA2); no timings"),
                       env=env, command=command, records=records,
                       tensor_cores_from=min((int(r["arch"][3:]) for r in records
                                              if r.get("tensor_cores")), default=None))
    elif args.fit:
        records = fit(args.fit, names=tuple(args.kernels))
        summary = _fit_summary(records)
        for name, row in summary.items():
            print(f"{name}: {row['load']} of {row['entries']} load on sm_{args.fit} "
                  f"({row['load_without_spills']} without spills); first that loads: "
                  f"#{row['first_loading']} {row['first_loading_config']}; first without "
                  f"spills: #{row['first_without_spills']}")
        payload = dict(benchmark="compile_kernels --fit",
                       note=(f"the v2 autotune space (chosen on sm_90) compiled for sm_{args.fit} "
                             f"in float16 without a GPU, head width 64, the default CEM layer's "
                             f"call; loads: shared memory per block within "
                             f"{SHARED_LIMIT.get(args.fit, 48 * 1024)} bytes; no timings"),
                       env=env, command=command, arch=f"sm_{args.fit}", summary=summary,
                       total_compile_s=round(time.perf_counter() - t0, 1), records=records)
    elif args.sweep:
        records = sweep(args.widths, names=tuple(args.kernels))
        payload = _sweep_payload(records, env, command, args.widths, t0)
    else:
        dtypes = [torch.bfloat16] if args.quick else [torch.bfloat16, torch.float16,
                                                      torch.float32]
        records = compile_all(args.arch, dtypes, args.case)
        for r in records:
            print(f"{r['arch']} {r['case']:<48} {r['kernel']:<20} regs {r['registers']:>3} "
                  f"stack+local {r['stack_bytes'] + r['local_bytes']:>5} B "
                  f"shared {r['dynamic_shared_bytes']:>6} B "
                  f"warps {r['num_warps']} stages {r['num_stages']}")
        per_element = per_element_summary(records)
        for row in per_element:
            if "bfloat16" in row["case"] and row["version"] == 2:
                print(f"{row['case']:<48} {row['kind']:<40} {row['non_mma_per_element']:6.2f} "
                      f"non-MMA / element" + (f" (target {row['target']})" if row["target"]
                                              else ""))
        payload = dict(
            benchmark="compile_kernels",
            note="ahead-of-time compilation without a GPU; no timings",
            env=env, command=command, archs=[f"sm_{a}" for a in args.arch],
            dtypes=[str(d) for d in dtypes],
            method=("loops: backward branches of cuobjdump -sass; non-MMA instructions of the "
                    "loop body (all but HGMMA/HMMA) divided by the score elements one thread "
                    "owns per iteration, BLOCK_M x BLOCK_N / (32 num_warps)"),
            summary=dict(kernels=len(records),
                         spilling=[f"{r['arch']} {r['case']} {r['kernel']}"
                                   for r in records if r["spills"]],
                         over_shared_limit=[f"{r['arch']} {r['case']} {r['kernel']}"
                                            for r in records if not r["fits_shared"]],
                         per_element=per_element,
                         total_compile_s=round(time.perf_counter() - t0, 1)),
            records=records)
        payload["mlp_v2_elementwise"] = mlp_v2_elementwise(args.arch, dtypes)
    print(f"{len(records)} kernels compiled in {round(time.perf_counter() - t0, 1)} s")
    write_json(payload, default, args.out, args.replace)
    return payload


if __name__ == "__main__":
    main()
