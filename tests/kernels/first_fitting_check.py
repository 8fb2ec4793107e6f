"""Run by tests/kernels/test_kernels_compile.py in a fresh process (compiled kernels, not the
interpreter).

``CEMLIB_AUTOTUNE=0`` on a GPU other than the H100:
:meth:`cemlib.kernels.runtime.Tuning.first_fitting` compiles and loads the forward's autotune entries with the installed Triton, without launching
them, until one loads without spilling. No GPU: the kernels are compiled for ``sm_<ARCH>``
(argument 1, default 80: the A100) and a stand-in driver loads them, refusing what needs more
shared memory per block than argument 2 (bytes, default the A100's 163 KiB) and reading each
cubin's spills with ``cuobjdump`` (``benchmarks/compile_kernels.py``). Prints, as JSON, every
entry probed (index, spilled or not, loaded or not) and the entry chosen.
"""

import json
import os
import sys

os.environ["TRITON_INTERPRET"] = "0"
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "benchmarks"))
sys.path.insert(0, os.path.join(ROOT, "tools", "gpu"))

import torch  # noqa: E402
import triton  # noqa: E402
from triton.runtime import driver  # noqa: E402

import compile_kernels  # noqa: E402
import host_overhead  # noqa: E402
from cemlib.kernels import attention, runtime  # noqa: E402

ARCH = int(sys.argv[1]) if len(sys.argv) > 1 else 80
SHARED = int(sys.argv[2]) if len(sys.argv) > 2 else 163 * 1024


class Utils:
    def load_binary(self, name, cubin, shared, device):
        if shared > SHARED:
            raise triton.runtime.errors.OutOfResources(shared, SHARED, "shared memory")
        usage = compile_kernels.resource_usage(cubin)
        spills = usage["local_bytes"] + usage["stack_bytes"]
        return (1, 1, usage["registers"], spills, 1024)

    def get_device_properties(self, device):
        return {"max_shared_mem": SHARED, "multiprocessor_count": 108}


def main():
    host_overhead.gpu_paths()  # the GPU path on CPU tensors (as on CUDA)
    stand_in = host_overhead.NullDriver(ARCH)
    stand_in.utils = Utils()
    driver.set_active(stand_in)
    tuning = attention.TUNING
    tuning.autotune = False
    probed, real = [], runtime.spills

    def spills(kernel, grid, args, kw):
        index = len(probed)
        probed.append(dict(index=index, loads=False))
        n = real(kernel, grid, args, kw)
        probed[index].update(loads=True, spills=n)
        return n
    runtime.spills = spills
    g = torch.Generator().manual_seed(0)
    q, kv = (torch.randn(1, 4, 64, 64, generator=g, dtype=torch.bfloat16) for _ in range(2))
    attention.tied_attention(q, kv, scale=0.125, alibi=torch.linspace(0.1, 0.5, 4),
                             self_bias=torch.zeros(4), cross_bias=torch.zeros(4))
    chosen = {table: index for (table, _, _), index in tuning.fitting.items()}
    json.dump(dict(arch=f"sm_{ARCH}", triton=triton.__version__, probed=probed,
                   chosen=chosen.get("fwd")), sys.stdout)


if __name__ == "__main__":
    main()
