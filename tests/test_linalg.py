"""cemlib.linalg: batched solves on a multi-threaded CPU (PyTorch's batched LU runs oneMKL's
factorizations concurrently, which fails from n = 150 with torch 2.13.0; see the module).

The failing input, shown once (torch 2.13.0 CPU, two threads): ``torch.linalg.solve`` of a batch of
two ``I + N(0, 1/n)`` matrices at ``n = 256`` returned ``max |A x - b| = 17.5`` without an error,
and a batch of 128 raised "Pivots given to lu_solve must all be greater or equal to 1" after
oneMKL's "Parameter 6 was incorrect on entry to SLASWP"; a batch of 4 in float64 the same. The
multi-threaded checks run in a subprocess with a time limit: the unpatched call has also been seen
never to return."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest
import torch

from cemlib import linalg

CHECK = textwrap.dedent("""
    import torch
    torch.set_num_threads(2)
    from cemlib import linalg
    from cemlib.layers.newton import Att2nd

    def one_thread(fn, *args):               # the reference: PyTorch's own call on one thread
        torch.set_num_threads(1)
        try:
            return fn(*args)
        finally:
            torch.set_num_threads(2)

    def batch(n, b, dtype, seed):
        g = torch.Generator().manual_seed(seed)
        A = torch.eye(n, dtype=dtype) + torch.randn(b, n, n, generator=g, dtype=dtype) / n ** 0.5
        return A, torch.randn(b, n, 1, generator=g, dtype=dtype)

    for n, b, dtype in ((160, 4, torch.float32), (256, 2, torch.float32), (256, 8, torch.float64)):
        A, B = batch(n, b, dtype, n + b)
        assert linalg.needs_one_thread(A, B)
        ref = one_thread(torch.linalg.solve, A.double(), B.double())
        X = linalg.solve(A, B)
        res = (A.double() @ X.double() - B.double()).abs().max().item()
        tol = 1e-3 if dtype == torch.float32 else 1e-10
        assert res < tol, (n, b, dtype, res)
        assert torch.allclose(X.double(), ref, rtol=1e-3, atol=tol), (n, b, dtype)
        Ainv = linalg.inv(A)
        eye = torch.eye(n, dtype=torch.float64)
        assert (A.double() @ Ainv.double() - eye).abs().max().item() < tol * 10, (n, b, dtype)
        assert torch.get_num_threads() == 2           # restored after each call

    # the gradient through the solve (PyTorch's backward, lu_solve on the saved factorization)
    A, B = batch(200, 3, torch.float64, 7)
    A.requires_grad_(True)
    linalg.solve(A, B).sum().backward()
    X = one_thread(torch.linalg.solve, A.detach(), B)
    lam = one_thread(torch.linalg.solve, A.detach().mT, torch.ones_like(B))  # dL/dA = -(A^-T 1) X^T
    assert torch.allclose(A.grad, -lam @ X.mT, rtol=1e-8, atol=1e-10)

    # the layers: Att2nd's d x d Newton solves at d = 192 on two threads equal one thread's
    torch.manual_seed(0)
    layer = Att2nd(192, T=192.0)
    z, h = torch.randn(48, 192), torch.randn(24, 192)            # 48 tokens, 24 particles: 48 solves
    with torch.no_grad():
        two, one = layer(z, h), one_thread(layer, z, h)
    assert torch.isfinite(two).all() and torch.allclose(two, one, rtol=1e-4, atol=1e-5)
    print("ok")
""")


def test_batched_solves_are_right_on_two_threads():
    proc = subprocess.run([sys.executable, "-c", CHECK], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0 and proc.stdout.strip().endswith("ok"), proc.stdout + proc.stderr[-3000:]


def test_which_calls_run_on_one_thread(monkeypatch):
    monkeypatch.setattr(torch, "get_num_threads", lambda: 4)
    big, small = torch.zeros(3, 64, 64), torch.zeros(3, 63, 63)
    assert linalg.needs_one_thread(big)
    assert not linalg.needs_one_thread(small)                            # below ONE_THREAD_FROM
    assert not linalg.needs_one_thread(big[0])                           # one matrix
    assert linalg.needs_one_thread(big[0], torch.zeros(5, 64, 1))        # broadcast against B's batch
    assert linalg.needs_one_thread(big[:1], torch.zeros(2, 1, 64, 1))
    assert not linalg.needs_one_thread(big[:1], torch.zeros(1, 64, 3))
    assert not linalg.needs_one_thread(torch.zeros(3, 64, 64, device="meta"))  # not the CPU
    monkeypatch.setattr(torch, "get_num_threads", lambda: 1)
    assert not linalg.needs_one_thread(big)


def test_one_thread_is_restored_when_the_solve_fails(monkeypatch):
    monkeypatch.setattr(linalg, "needs_one_thread", lambda A, B=None: True)
    before = torch.get_num_threads()
    with pytest.raises(RuntimeError):
        linalg.solve(torch.zeros(2, 3, 3), torch.ones(2, 3, 1))       # singular: torch raises
    assert torch.get_num_threads() == before


@pytest.mark.parametrize("fn", ["solve", "inv"])
def test_same_as_torch_where_no_thread_change_is_needed(fn):
    g = torch.Generator().manual_seed(0)
    A = torch.eye(8, dtype=torch.float64) + 0.1 * torch.randn(5, 8, 8, generator=g, dtype=torch.float64)
    B = torch.randn(5, 8, 2, generator=g, dtype=torch.float64)
    ours = linalg.solve(A, B) if fn == "solve" else linalg.inv(A)
    theirs = torch.linalg.solve(A, B) if fn == "solve" else torch.linalg.inv(A)
    assert torch.equal(ours, theirs)
