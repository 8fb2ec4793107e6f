"""Set-up shared by the Triton kernel tests: compiled on CUDA, Triton's interpreter elsewhere.

How this runs without a GPU: Triton decides whether to interpret a ``@triton.jit`` function when
it is decorated, from ``TRITON_INTERPRET``, and this includes the jit helpers inside
``triton.language`` itself, so the variable must be set before *triton* is first imported.
``import torch`` and ``import cemlib`` do not import triton (checked on torch 2.13; cemlib imports
its kernel modules lazily, at the first Triton call), so importing this module sets
``TRITON_INTERPRET=1`` (during pytest's collection) whenever CUDA is absent. The variable stays
set for the rest of the session, as in Triton's own interpreter test suite. If triton was
already imported without it (some earlier module imported it), the in-process tests are skipped
(:func:`skip_if_stale`) and :func:`rerun_in_fresh_process` re-runs the test file in a fresh
Python process with the variable set. On a CUDA machine the same tests run compiled.
"""

import os
import subprocess
import sys

import pytest
import torch

CUDA = torch.cuda.is_available()
# triton imported earlier without the interpreter: it cannot be switched on in this process
STALE_TRITON = not CUDA and "triton" in sys.modules and os.environ.get("TRITON_INTERPRET") != "1"
if not CUDA and not STALE_TRITON:
    os.environ["TRITON_INTERPRET"] = "1"
DEVICE = "cuda" if CUDA else "cpu"
FRESH_PROCESS_TEST = "test_interpreted_suite_in_fresh_process"


def skip_if_stale(request) -> None:
    """Skip a kernel test that cannot run in this process (see the module docstring)."""
    if STALE_TRITON and request.node.name != FRESH_PROCESS_TEST:
        pytest.skip("triton was imported before TRITON_INTERPRET=1 was set; this file is re-run "
                    f"in a fresh process by {FRESH_PROCESS_TEST}")


@pytest.fixture(autouse=True)
def kernels_usable(request):
    """Autouse in the kernel test modules that import it: skip where the kernels cannot run in
    this process, and return the dispatcher to its default backend after each test."""
    skip_if_stale(request)
    yield
    from cemlib.kernels import dispatch
    dispatch.set_backend(None)


def rerun_in_fresh_process(path: str) -> None:
    """The body of each kernel test file's ``test_interpreted_suite_in_fresh_process``."""
    if not STALE_TRITON:
        pytest.skip("the kernels run in this process")
    env = dict(os.environ, TRITON_INTERPRET="1")
    run = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                          os.path.abspath(path)], env=env, capture_output=True, text=True)
    assert run.returncode == 0, run.stdout[-4000:] + run.stderr[-2000:]
