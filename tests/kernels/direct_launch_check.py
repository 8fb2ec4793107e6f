"""Run by tests/kernels/test_kernels_runtime.py in a fresh process (compiled kernels, not the
interpreter).

Records, at the launcher (the boundary between Triton and the CUDA driver), what every launch of
the attention kernels receives, once through Triton's own path (``JITFunction.run``) and once
through :func:`cemlib.kernels.runtime.launch`, for several calls; prints the comparison as JSON.
No GPU: the kernels are compiled for sm_90 (Triton's bundled ptxas) and a stand-in driver's
launcher records its arguments instead of launching.
"""

import json
import os
import sys

os.environ["TRITON_INTERPRET"] = "0"

import torch  # noqa: E402
from triton import knobs  # noqa: E402
from triton.runtime import driver  # noqa: E402
from triton.runtime.autotuner import Autotuner  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "tools", "gpu"))
from host_overhead import NullDriver  # noqa: E402

from cemlib.kernels import attention as attn  # noqa: E402
from cemlib.kernels import reference, runtime  # noqa: E402

RECORDS = []


class RecordingDriver(NullDriver):
    """The stand-in driver of ``tools/gpu/host_overhead.py`` (the H100 as target, no module
    loaded), on stream 7, whose launchers record what they are given."""

    def get_current_stream(self, device=None):
        return 7

    def launcher_cls(self, src, metadata):
        class Launcher:
            def __call__(self, *args):  # (the hooks as they are now: a chain can change)
                chain = getattr(knobs, "HookChain", None)
                idle = all(runtime._idle(h, chain) for h in args[7:9])
                RECORDS.append((self, args[:6] + ("no hook",) * 3 + args[9:] if idle else args))
        return Launcher()


def normalized(record, inputs):
    """A launch as comparable values: the launcher (which compiled kernel), and every argument,
    tensors as (dtype, shape, strides, address mod 16, and which input they are, if one). The
    launch metadata and the two hooks (arguments 6-8) were recorded as "no hook" where neither
    hook would have done anything at the launch (``None`` or an empty ``HookChain``: the
    launcher then calls nothing, and the metadata goes only to the hooks)."""
    launcher, args = record
    out = []
    for a in args:
        if isinstance(a, torch.Tensor):
            which = next((i for i, t in enumerate(inputs) if t.data_ptr() == a.data_ptr()), None)
            out.append(["tensor", str(a.dtype), list(a.shape), list(a.stride()), a.data_ptr() % 16,
                        which])
        elif isinstance(a, (int, float, bool, str)) or a is None:
            out.append(a)
        else:
            out.append(repr(type(a).__name__))  # hooks, launch metadata, packed metadata
    return [id(launcher)] + out


def scenarios():
    B, K, L, D, De = 1, 3, 40, 64, 48
    g = torch.Generator().manual_seed(0)
    rnd = lambda *s: torch.randn(*s, generator=g, dtype=torch.bfloat16)  # noqa: E731
    q, kv, do = rnd(B, L, K, D).transpose(1, 2), rnd(B, L, K, D).transpose(1, 2), rnd(B, K, L, D)
    # q at an address 2 bytes past a 16-byte boundary: Triton compiles another specialization
    base = torch.empty(B * L * K * D + 1, dtype=torch.bfloat16)[1:]
    q_off = base.view(B, L, K, D).copy_(q.transpose(1, 2)).transpose(1, 2)
    slopes = reference.alibi_slopes(K).float()
    sb, cb = torch.zeros(K, requires_grad=True), torch.zeros(K, requires_grad=True)
    qe, ke, doe = rnd(B, L, De), rnd(B, L, De), rnd(B, L, De)

    def plain(qq, atomic=False):
        def run():
            a, b = qq.detach().requires_grad_(), kv.detach().requires_grad_()
            o = attn.tied_attention(a, b, scale=0.125, alibi=slopes, self_bias=sb, cross_bias=cb,
                                  atomic_dq=atomic)[0]
            o.backward(do)
            return [qq, kv, slopes, sb, cb, do]
        return run

    def diag():
        a, b = q.detach().requires_grad_(), kv.detach().requires_grad_()
        e, f = qe.detach().requires_grad_(), ke.detach().requires_grad_()
        o, _, oe = attn.tied_attention(a, b, scale=0.125, alibi=slopes, q_extra=e, k_extra=f,
                                     extra_values=True, extra_head_sum=True)
        torch.autograd.backward((o, oe), (do, doe))
        return [q, kv, slopes, qe, ke, do, doe]
    def hooked():  # a profiler's launch hook (Triton's own path builds the metadata for it)
        hook = lambda metadata: None  # noqa: E731
        knobs.runtime.launch_enter_hook.add(hook)
        try:
            return plain(q)()
        finally:
            knobs.runtime.launch_enter_hook.remove(hook)
    return {"plain": plain(q), "plain, q misaligned": plain(q_off), "atomic dq": plain(q, True),
            "default layer's call": diag, "plain, with a launch hook": hooked}


def recorded(run, direct, repeats):
    """The launches of the last of ``repeats`` calls."""
    runtime._enabled[0] = direct
    for _ in range(repeats):
        RECORDS.clear()
        inputs = run()
    return [normalized(r, inputs) for r in RECORDS]


def main():
    tuning = attn.TUNING
    launch, cuda = tuning.launch, torch.device("cuda")
    tuning.launch = lambda name, kernel, grid, args, meta, block_d, device, length, table=None: \
        launch(name, kernel, grid, args, meta, block_d, cuda, length, table)
    attn.INTERPRET = tuning.interpret = False
    Autotuner._bench = lambda self, *args, config, **kw: [1.0, 1.0, 1.0]
    driver.set_active(RecordingDriver())
    out = {"supported": runtime.supported(), "scenarios": {}}
    runs = scenarios()
    launchers = {}
    # autotuned launches (the default), then each kernel's first configuration (CEMLIB_AUTOTUNE=0,
    # or use_configs): two caches, the tuning's and runtime.launch's own
    for autotune, suffix in ((True, ""), (False, " (fixed configurations)")):
        tuning.autotune = autotune
        through_triton = {name: recorded(run, False, 2) for name, run in runs.items()}
        tuning.tuned.clear()  # the direct path from empty caches, the scenarios in order: a call
        tuning.choices.clear()  # then finds what the calls before it left (aligned kernels, say)
        runtime.clear()
        for name, run in runs.items():
            direct = recorded(run, True, 3)  # a miss fills the caches, later calls hit them
            out["scenarios"][name + suffix] = dict(
                launches=len(direct), same=direct == through_triton[name],
                first_difference=next(([a, b] for a, b in zip(direct, through_triton[name])
                                       if a != b), None))
            launchers[name + suffix] = [r[0] for r in direct]
            if "hook" in name:  # the direct path hands a set hook its metadata, as Triton does
                out["hooked_launches_get_metadata" + suffix] = all(
                    r[7] == repr("LazyDict") and r[8] == repr("HookChain") for r in direct)
    out["misaligned_q_uses_other_forward_kernel"] = (
        launchers["plain"][0] != launchers["plain, q misaligned"][0])
    json.dump(out, sys.stdout)


if __name__ == "__main__":
    main()
