"""Compile every cemlib Triton kernel for a CUDA GPU ahead of time, on a machine without one.

Triton compiles for a named target (``GPUTarget("cuda", 90, 32)`` is the H100) anywhere: its
bundled ``ptxas`` turns the generated PTX into a cubin. This script runs cemlib's own launchers
(:mod:`cemlib.kernels.tied_attention_triton`, :mod:`cemlib.kernels.gated_mlp_triton`) on CPU
tensors with the *GPU* tile sizes, turns each launch into a compilation (Triton's ``warmup``
path, with a stand-in driver that names the target), and reads each cubin's resource usage with
the bundled ``cuobjdump``: registers per thread, stack and local memory (where ptxas puts
spilled registers), shared memory.

It catches what the interpreter cannot: a kernel that does not compile for the GPU, or one that
spills registers to local memory. Nothing here is timed, and nothing here is a GPU measurement:
these are facts about the compiled code. Cases: tied attention without an extra pair, with a
narrow one in the register tiles, and with the default CEM layer's wide shared diagonal (the
shared-logits path), forward and backward; the tied gated-MLP step forward and backward (v1) and
the v2 step's two element-wise kernels; the DPLR preconditioner; in bf16, fp16 and fp32.

Usage: ``python benchmarks/compile_kernels.py [--arch 90 80] [--quick] [--out FILE | --replace]``
(``--quick``: bf16 only; the stored ``results/compile_kernels.json`` is kept unless ``--replace``:
by default a new file is written beside it, see ``benchmarks/outputs.py``). Relies on Triton internals (``JITFunction.run(warmup=True)``,
``triton.runtime.driver``), checked on Triton 3.9.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import re
import subprocess
import sys
import tempfile
import time

os.environ.pop("TRITON_INTERPRET", None)  # compile, do not interpret (set before triton loads)

import torch  # noqa: E402
import triton  # noqa: E402
from triton.backends.compiler import GPUTarget  # noqa: E402
from triton.runtime.driver import driver  # noqa: E402
from triton.runtime.jit import JITFunction  # noqa: E402

from cemlib.kernels import gated_mlp_triton as gm  # noqa: E402
from cemlib.kernels import tied_attention_triton as ta  # noqa: E402
from outputs import RESULTS, add_output_arguments, announce, write_json  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
BIN = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin")
SHARED_LIMIT = {80: 163 * 1024, 86: 99 * 1024, 89: 99 * 1024, 90: 227 * 1024}  # bytes per block


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
def compile_only(arch: int, sink: list):
    """Inside: ``kernel[grid](...)`` compiles for ``sm_<arch>`` instead of launching, appending
    ``(kernel name, launch keywords, CompiledKernel)`` to ``sink``; GPU tile sizes are used."""
    getitem, blocks, gate_blocks, dplr_blocks = (JITFunction.__getitem__, ta._blocks,
                                                 gm._gate_blocks, gm._dplr_blocks)
    cuda = torch.device("cuda")  # only read for its .type; no GPU needed

    def compiling(self, grid):
        def launch(*args, **kw):
            sink.append((self.fn.__name__, kw, self.run(*args, grid=grid, warmup=True, **kw)))
        return launch

    kernels = [f for m in (ta, gm) for f in vars(m).values() if isinstance(f, JITFunction)]
    for f in kernels:  # binders cache the target per device: start clean for this arch
        f.device_caches.clear()
    previous = driver._active
    driver.set_active(_TargetDriver(arch))
    JITFunction.__getitem__ = compiling
    ta._blocks = lambda L, D, DE, device, kind="fwd": blocks(L, D, DE, cuda, kind)
    gm._gate_blocks = lambda device: gate_blocks(cuda)
    gm._dplr_blocks = lambda R, device: dplr_blocks(R, cuda)
    try:
        yield
    finally:
        JITFunction.__getitem__ = getitem
        ta._blocks, gm._gate_blocks, gm._dplr_blocks = blocks, gate_blocks, dplr_blocks
        driver._active = previous  # (reset_active() would look for a real GPU driver)
        for f in kernels:
            f.device_caches.clear()


def attention_case(dtype, D, De, head_sum):
    """Forward and backward launches of one attention configuration (De = 0: no extra pair)."""
    B, K, L = 1, 12, 128
    q = torch.randn(B, K, L, D, dtype=dtype)
    vec = [torch.rand(K) for _ in range(3)]
    qe = ke = None
    if De:
        qe, ke = torch.randn(B, L, De, dtype=dtype), torch.randn(B, L, De, dtype=dtype)
    ev = bool(De)
    o, lse, oe, oe_heads = ta.attention_forward(q, q, 0.125, *vec, qe, ke, ev, head_sum)
    ta.attention_backward(q, torch.zeros(B, K, L), oe if ev else None, q, q, q, lse,
                          oe_heads if head_sum else oe, 0.125, *vec, qe, ke, ev, head_sum)


def mlp_case(dtype):
    u, V, gamma = (torch.randn(64, 768, dtype=dtype), torch.randn(3072, 768, dtype=dtype),
                   torch.randn(64, 3072, dtype=dtype))
    gm.gate_forward(u, V, gamma)
    gm.gate_backward(u, u, V, gamma)
    gm.dplr_apply(u, torch.randn(768, dtype=dtype), *torch.randn(2, 768, 16, dtype=dtype))


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


def cases(dtypes):
    for dtype in dtypes:
        name = str(dtype).replace("torch.", "")
        for D in (64, 128):
            yield f"attention d={D} {name}", lambda d=dtype, D=D: attention_case(d, D, 0, False)
        yield f"attention d=64 extra-in-tile De=64 {name}", \
            lambda d=dtype: attention_case(d, 64, 64, True)
        yield f"attention d=64 shared-logits De=768 {name}", \
            lambda d=dtype: attention_case(d, 64, 768, True)
        yield f"gated MLP 768x3072 + DPLR R=16 {name}", lambda d=dtype: mlp_case(d)
        yield f"gated MLP v2 element-wise 64x3072 {name}", lambda d=dtype: mlp_v2_case(d)


def resource_usage(cubin: bytes) -> dict:
    """Registers, stack, local (spill) and static shared memory of a cubin, via cuobjdump."""
    with tempfile.NamedTemporaryFile(suffix=".cubin", delete=False) as f:
        f.write(cubin)
    try:
        out = subprocess.run([os.path.join(BIN, "cuobjdump"), "-res-usage", f.name],
                             capture_output=True, text=True, check=True).stdout
    finally:
        os.unlink(f.name)
    m = re.search(r"REG:(\d+) STACK:(\d+) SHARED:(\d+) LOCAL:(\d+)", out)
    if m is None:
        raise RuntimeError(f"unexpected cuobjdump output:\n{out}")
    return dict(zip(("registers", "stack_bytes", "static_shared_bytes", "local_bytes"),
                    map(int, m.groups())))


def compile_all(archs, dtypes) -> list[dict]:
    records, seen = [], set()
    for arch in archs:
        for case, fn in cases(dtypes):
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
                meta = kernel.metadata
                flags = {k: v for k, v in kw.items() if isinstance(v, (bool, int, str))}
                usage = resource_usage(kernel.asm["cubin"])
                shared = meta.shared + usage["static_shared_bytes"]
                records.append(dict(
                    arch=f"sm_{arch}", case=case, kernel=name, flags=flags,
                    num_warps=meta.num_warps, num_stages=meta.num_stages,
                    dynamic_shared_bytes=meta.shared, **usage,
                    # ptxas puts spilled registers in the stack frame (local memory)
                    spills=usage["local_bytes"] + usage["stack_bytes"] > 0,
                    fits_shared=shared <= SHARED_LIMIT.get(arch, 48 * 1024),
                    case_compile_s=round(wall, 2)))
    return records


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--arch", type=int, nargs="+", default=[90, 80],
                   help="compute capabilities, e.g. 90 (H100/H200) 80 (A100)")
    p.add_argument("--quick", action="store_true", help="bf16 only")
    add_output_arguments(p, "benchmarks/results/compile_kernels.json")
    args = p.parse_args(argv)
    default = RESULTS / "compile_kernels.json"
    announce(default, args.out, args.replace)
    dtypes = [torch.bfloat16] if args.quick else [torch.bfloat16, torch.float16, torch.float32]
    t0 = time.perf_counter()
    records = compile_all(args.arch, dtypes)
    for r in records:
        print(f"{r['arch']} {r['case']:<44} {r['kernel']:<16} regs {r['registers']:>3} "
              f"stack+local {r['stack_bytes'] + r['local_bytes']:>5} B "
              f"shared {r['dynamic_shared_bytes']:>6} B "
              f"warps {r['num_warps']} stages {r['num_stages']}")
    try:
        git = subprocess.run(["git", "rev-parse", "HEAD"], cwd=HERE, capture_output=True,
                             text=True).stdout.strip() or None
    except OSError:  # no git on this machine
        git = None
    payload = dict(
        benchmark="compile_kernels", note="ahead-of-time compilation without a GPU; no timings",
        env=dict(triton=triton.__version__, torch=torch.__version__, python=sys.version.split()[0],
                 git_commit=git,
                 date=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())),
        archs=[f"sm_{a}" for a in args.arch], dtypes=[str(d) for d in dtypes],
        summary=dict(kernels=len(records), spilling=[f"{r['arch']} {r['case']} {r['kernel']}"
                                                     for r in records if r["spills"]],
                     over_shared_limit=[f"{r['arch']} {r['case']} {r['kernel']}"
                                        for r in records if not r["fits_shared"]],
                     total_compile_s=round(time.perf_counter() - t0, 1)),
        records=records)
    payload["mlp_v2_elementwise"] = mlp_v2_elementwise(args.arch, dtypes)
    print(f"{len(records)} kernels compiled in {payload['summary']['total_compile_s']} s; "
          f"spilling: {payload['summary']['spilling'] or 'none'}")
    write_json(payload, default, args.out, args.replace)
    return payload


if __name__ == "__main__":
    main()
