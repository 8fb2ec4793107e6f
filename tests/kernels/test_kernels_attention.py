"""The tied attention kernels (:mod:`cemlib.kernels.attention`) against the float64 reference:
forward and every gradient (q, kv, the shared extra pair, lse, the self/cross biases, learned
ALiBi slopes) on awkward shapes; its tile configurations; its place in the dispatcher (calls it
does not take go to the PyTorch path); ``torch.compile``; the number of kernel launches per
call; and the CEM attention layer through the kernels.

On a machine without CUDA the kernels run under Triton's interpreter (``triton_interpreter.py``).
Shapes are tiny: the interpreter runs every program instance in numpy, one after another.
Criteria: float32 within 1e-5 (relative to the largest entry) of the float64 reference; float16
within the FlashAttention criterion, an error against float64 at most twice that of the float16
PyTorch reference (plus a small floor for what the reference gets exactly).
"""

import copy
import functools
import itertools

import pytest
import torch

from triton_interpreter import CUDA, DEVICE, kernels_usable, rerun_in_fresh_process  # noqa: F401

triton = pytest.importorskip("triton")

from cemlib.kernels import attention as attn  # noqa: E402
from cemlib.kernels import attention_torch, dispatch, reference  # noqa: E402
from cemlib.kernels.launches import count_launches  # noqa: E402


@pytest.mark.slow
def test_interpreted_suite_in_fresh_process():
    rerun_in_fresh_process(__file__)


def rel_err(a, b):
    """max |a - b| / max |b| (b the trusted value), in float64."""
    a, b = a.detach().double(), b.detach().double()
    return ((a - b).abs().max() / b.abs().max().clamp_min(1e-30)).item()


def make_inputs(B, K, L, D, biases=(True, True, True), De=0, seed=0, split_heads=True):
    """float64 inputs; ``q``/``kv`` as the layers make them (head-split views of (B, L, K D)),
    ``q_extra``/``k_extra`` the shared pair (B, L, De)."""
    g = torch.Generator().manual_seed(seed)

    def rnd(*shape, scale=1.0):
        return scale * torch.randn(*shape, generator=g, dtype=torch.float64)

    if split_heads:
        q, kv = (rnd(B, L, K, D).transpose(1, 2) for _ in range(2))
    else:
        q, kv = rnd(B, K, L, D), rnd(B, K, L, D)
    inp = dict(q=q, kv=kv)
    alibi, self_b, cross_b = biases
    if alibi:
        inp["alibi"] = reference.alibi_slopes(K)
    if self_b:
        inp["self_bias"] = rnd(K)
    if cross_b:
        inp["cross_bias"] = rnd(K)
    if De:
        inp["q_extra"], inp["k_extra"] = rnd(B, L, De, scale=0.5), rnd(B, L, De, scale=0.5)
    return inp


def run(fn, inp, dtype, scale=0.37, values=False, outputs=(0, 1, 2), learn_alibi=False, seed=1):
    """Outputs and the gradients of every input (alibi only if ``learn_alibi``) of
    ``sum_k <cot_k, out_k>`` over the chosen outputs (``1`` is lse)."""
    leaves = {}
    for name, t in inp.items():
        t = t.to(dtype).to(DEVICE)
        if name != "alibi" or learn_alibi:
            t = t.detach().requires_grad_()
        leaves[name] = t
    args = dict(leaves)
    kw = dict(extra_values=True, extra_head_sum=True) if values else {}
    outs = fn(args.pop("q"), args.pop("kv"), scale=scale, **args, **kw)
    g = torch.Generator().manual_seed(seed)
    cot = [torch.randn(o.shape, generator=g, dtype=torch.float64).to(DEVICE) for o in outs]
    loss = sum((outs[i].double() * cot[i]).sum() for i in outputs if i < len(outs))
    loss.backward()
    grads = {n: t.grad for n, t in leaves.items() if t.requires_grad}
    return list(outs), grads


CASES = [  # B, K, L, D, (alibi, self, cross), De, extra values, outputs used
    (1, 1, 1, 8, (True, True, True), 0, False, (0, 1)),      # L = 1, one head
    (2, 3, 37, 20, (True, True, True), 0, False, (0, 1)),    # L, D not multiples of any tile
    (1, 16, 9, 16, (True, True, True), 0, False, (0, 1)),    # 16 heads
    (1, 2, 45, 33, (False, False, False), 0, False, (0,)),   # plain causal, odd D, no lse
    (1, 2, 33, 16, (True, True, True), 0, False, (1,)),      # lse only (the energy)
    (2, 2, 29, 24, (True, True, True), 40, True, (0, 1, 2)),  # the default layer's call
    (1, 3, 17, 8, (True, True, True), 136, True, (0, 2)),    # wider pair than a tile
    (1, 2, 21, 8, (False, True, False), 12, False, (0, 1)),  # pair in the logits only
    (1, 1, 1, 8, (True, True, True), 10, True, (0, 1, 2)),   # L = 1 with the pair
    (1, 1, 1, 8, (True, True, True), 136, True, (0, 1, 2)),  # L = 1 with a wide pair
    (2, 2, 16, 64, (True, True, True), 7, False, (0, 1)),    # L = one tile, D = 64, logits only
    (1, 2, 21, 8, (True, True, True), 129, False, (0, 1)),   # wide pair in the logits only
    (2, 2, 19, 12, (True, True, True), 10, True, (0, 1, 2)),  # narrow pair, head-summed
    (2, 3, 37, 20, (True, True, True), 140, True, (0, 1, 2)),  # wide pair, odd L and D
] + [(1, 2, 19, 8, b, 0, False, (0, 1)) for b in itertools.product((False, True), repeat=3)
     if b not in ((True, True, True), (False, False, False))]  # every bias combination


@pytest.mark.parametrize("case", CASES)
def test_attention_float32_matches_the_float64_reference(case):
    B, K, L, D, biases, De, values, used = case
    inp = make_inputs(B, K, L, D, biases, De)
    got, got_g = run(attn.tied_attention, inp, torch.float32, values=values, outputs=used)
    ref, ref_g = run(reference.tied_attention, inp, torch.float64, values=values, outputs=used)
    assert len(got) == len(ref) == (3 if values else 2)
    for name, a, b in zip(["o", "lse", "o_extra"], got, ref):
        assert a.shape == b.shape, name
        assert a.dtype == torch.float32, name
        assert rel_err(a, b) <= 1e-5, (name, rel_err(a, b))
    assert set(got_g) == set(ref_g) == {n for n in inp if n != "alibi"}
    for name in ref_g:
        assert got_g[name].dtype == torch.float32, name
        if L == 1 and name == "cross_bias":  # no pair j < i: the exact gradient is zero, the
            assert got_g[name].abs().max() < 1e-6  # rest is the rounding of dS_00 = 0
            continue
        assert rel_err(got_g[name], ref_g[name]) <= 1e-5, (name, rel_err(got_g[name],
                                                                          ref_g[name]))


def test_attention_learned_alibi_slopes():
    """Slopes that require grad (no cemlib layer learns them) get theirs from the dq loop."""
    for De, values in ((0, False), (12, True)):
        inp = make_inputs(2, 2, 27, 8, De=De)
        got, got_g = run(attn.tied_attention, inp, torch.float32, values=values, learn_alibi=True)
        ref, ref_g = run(reference.tied_attention, inp, torch.float64, values=values,
                         learn_alibi=True)
        assert rel_err(got_g["alibi"], ref_g["alibi"]) <= 1e-5
        assert rel_err(got_g["q"], ref_g["q"]) <= 1e-5


@pytest.mark.slow
@pytest.mark.parametrize("De", [0, 12])
def test_bias_gradients_take_delta_from_the_probabilities_not_the_stored_output(De):
    """``dS_ii = P_ii (dP_ii - Delta_i)``: the self/cross bias gradients sum it over every row and
    batch, so an error in ``Delta_i = o_i.do_i - dlse_i`` from the output *as stored* (bf16 on a
    GPU) adds up in them (``benchmarks/NOTES.md``, step 26: 2 of 32 bf16 bias gradients of
    the GPU test's shared-diagonal call fail the FlashAttention criterion that way, none with an
    exact ``Delta``). The ``dq`` walk therefore takes ``Delta_i = sum_j P_ij dP_ij - dlse_i``
    from the probabilities it computes, and the bias gradients do not depend on ``o`` at all,
    while ``dq`` and ``d kv`` keep FlashAttention-2's ``Delta`` from ``o`` (one row each).
    Failing input: the preprocess kernel's ``Delta``, which the atomic-dq backward (no walk)
    still uses: a perturbed ``o`` moves its bias gradients."""
    inp = {n: t.float() for n, t in make_inputs(2, 3, 45, 16, De=De, seed=7).items()}
    q, kv, qe, ke = inp["q"], inp["kv"], inp.get("q_extra"), inp.get("k_extra")
    args = (q, kv, 0.3, inp["alibi"], inp["self_bias"], inp["cross_bias"], qe, ke)
    o, lse, _, e2, a = attn.forward(*args, extra_values=De > 0)
    g = torch.Generator().manual_seed(8)
    do, dlse = torch.randn(o.shape, generator=g), torch.randn(lse.shape, generator=g)
    doe = torch.randn(2, 45, De, generator=g) if De else None
    bad = o + 1e-2 * torch.randn(o.shape, generator=g)
    needs = (True, True, False, True, True, De > 0, De > 0)

    def grads(o, atomic):
        return attn.backward(do, dlse, doe, *args[:2], o, lse, *args[2:], e2, a, needs,
                           atomic_dq=atomic)
    walk, walk_bad = grads(o, False), grads(bad, False)
    assert torch.equal(walk[3], walk_bad[3]) and torch.equal(walk[4], walk_bad[4])
    assert not torch.equal(walk[0], walk_bad[0])  # dq: Delta from o, as FlashAttention-2
    atomic, atomic_bad = grads(o, True), grads(bad, True)
    assert (atomic[3] - atomic_bad[3]).abs().max() > 1e-4
    exact = {n: t.double().requires_grad_(n != "alibi") for n, t in inp.items()}
    ex = dict(exact)
    outs = reference.tied_attention(ex.pop("q"), ex.pop("kv"), scale=0.3, extra_values=De > 0,
                                    extra_head_sum=De > 0, **ex)
    torch.autograd.backward(outs, [c.double() for c in (do, dlse, doe) if c is not None])
    for i, name in ((3, "self_bias"), (4, "cross_bias")):
        assert rel_err(walk[i], exact[name].grad) <= 1e-5, name


ATOMIC_CASES = [CASES[i] for i in (1, 2, 3, 4, 5, 7)]


@pytest.mark.parametrize("case", ATOMIC_CASES)
def test_attention_atomic_dq_matches_the_float64_reference(case):
    """The backward that adds each tile's share of dq atomically inside the d kv walk (no dq
    walk) gives the same gradients: float32, and float16 through its float32 buffer."""
    B, K, L, D, biases, De, values, used = case
    inp = make_inputs(B, K, L, D, biases, De, seed=5)
    ref, ref_g = run(reference.tied_attention, inp, torch.float64, values=values, outputs=used)
    with attn.use_atomic_dq():
        assert attn.atomic_dq_enabled()
        got, got_g = run(attn.tied_attention, inp, torch.float32, values=values, outputs=used)
    assert not attn.atomic_dq_enabled()
    for name in ref_g:
        assert got_g[name].dtype == torch.float32
        assert rel_err(got_g[name], ref_g[name]) <= 1e-5, (name, rel_err(got_g[name], ref_g[name]))


def test_attention_atomic_dq_float16_tiles_and_slopes():
    inp = make_inputs(1, 2, 33, 16, De=24, seed=6)
    inp16 = {n: t.half() for n, t in inp.items()}
    exact, exact_g = run(reference.tied_attention, {n: t.double() for n, t in inp16.items()},
                         torch.float64, scale=0.25, values=True)
    ref, ref_g = run(reference.tied_attention, inp16, torch.float16, scale=0.25, values=True)
    with attn.use_atomic_dq():
        got, got_g = run(attn.tied_attention, inp16, torch.float16, scale=0.25, values=True)
    for name in exact_g:
        assert got_g[name].dtype == torch.float16
        assert rel_err(got_g[name], exact_g[name]) <= 2 * rel_err(ref_g[name], exact_g[name]) \
            + 2e-3, name
    # unequal tiles both ways: the atomic adds land on query tiles that straddle key blocks
    inp = make_inputs(1, 2, 70, 16, seed=7)
    ref, ref_g = run(reference.tied_attention, inp, torch.float64)
    for bwd in (dict(BLOCK_M1=32, BLOCK_N1=16, BLOCK_N2=32), dict(BLOCK_M1=16, BLOCK_N1=64, BLOCK_N2=16)):
        with attn.use_atomic_dq(), attn.use_configs(bwd=bwd):
            got, got_g = run(attn.tied_attention, inp, torch.float32)
        assert rel_err(got_g["q"], ref_g["q"]) <= 1e-5, bwd
    # per call: atomic_dq=True without the module setting, saved for that call's backward
    got, got_g = run(functools.partial(attn.tied_attention, atomic_dq=True), inp, torch.float32)
    assert not attn.atomic_dq_enabled() and rel_err(got_g["q"], ref_g["q"]) <= 1e-5
    # learned ALiBi slopes need the dq walk's row sums: the call walks, and is right
    inp = make_inputs(2, 2, 27, 8, seed=8)
    ref, ref_g = run(reference.tied_attention, inp, torch.float64, learn_alibi=True)
    with attn.use_atomic_dq():
        got, got_g = run(attn.tied_attention, inp, torch.float32, learn_alibi=True)
    assert rel_err(got_g["alibi"], ref_g["alibi"]) <= 1e-5
    assert rel_err(got_g["q"], ref_g["q"]) <= 1e-5


@pytest.mark.parametrize("configs", [
    dict(fwd=dict(BLOCK_M=16, BLOCK_N=32), bwd=dict(BLOCK_M1=32, BLOCK_N1=16, BLOCK_N2=32),
         pre=dict(BLOCK_M=16, BLOCK_N=32), headsum=dict(BLOCK_M=32, BLOCK_N=16),
         extra_grads=dict(BLOCK_M=32, BLOCK_N=16, BLOCK_K=32)),
    dict(fwd=dict(BLOCK_M=64, BLOCK_N=16), bwd=dict(BLOCK_M1=16, BLOCK_N1=64, BLOCK_N2=16),
         pre=dict(BLOCK_M=32, BLOCK_N=16), headsum=dict(BLOCK_M=16, BLOCK_N=64)),
])
def test_attention_tile_configurations(configs):
    """Query and key tiles of unequal sizes both ways (the band split and the padded rows of
    the backward depend on them); the GPU runs other sizes than the interpreter's default."""
    inp = make_inputs(1, 2, 70, 16, De=24, seed=3)
    ref, ref_g = run(reference.tied_attention, inp, torch.float64, values=True)
    with attn.use_configs(**configs):
        got, got_g = run(attn.tied_attention, inp, torch.float32, values=True)
    for a, b in zip(got, ref):
        assert rel_err(a, b) <= 1e-5
    for name in ref_g:
        assert rel_err(got_g[name], ref_g[name]) <= 1e-5, name
    with pytest.raises(ValueError, match="ROW_PAD"):
        with attn.use_configs(bwd=dict(BLOCK_M1=16, BLOCK_N1=256, BLOCK_N2=16)):
            pass


def _gpu_tiles(table: str, width: int) -> list[dict]:
    """The distinct tile sizes (``BLOCK_*``) of a GPU autotune space, in the space's order (warps
    and stages do not change what a kernel computes, and the interpreter ignores them)."""
    seen = []
    for cfg in attn.GPU_CONFIGS[table][width if width in attn.GPU_CONFIGS[table] else 0]:
        tiles = {k: v for k, v in cfg.items() if k.startswith("BLOCK")}
        if tiles not in seen:
            seen.append(tiles)
    return seen


def _gpu_tile_cases():
    """One call per index ``i`` up to the longest space: kernel ``k`` runs the ``i``-th distinct
    tiles of its space (cycling through shorter ones), so that every tile size of every kernel's
    GPU space runs once; the walk and the atomic-dq backward each at head widths 64 and 128."""
    cases = []
    for width in (64, 128):
        for backward in ("bwd", "bwd_atomic"):
            spaces = {k: _gpu_tiles(k, width) for k in ("fwd", "pre", "headsum", "extra_grads")}
            spaces["bwd"] = _gpu_tiles(backward, width)
            n = max(len(v) for v in spaces.values()) if backward == "bwd" else len(spaces["bwd"])
            cases += [pytest.param(width, backward, {k: v[i % len(v)] for k, v in spaces.items()},
                                   id=f"{width}-{backward}-{i}") for i in range(n)]
    return cases


@pytest.mark.slow
@pytest.mark.parametrize("width,backward,configs", _gpu_tile_cases())
def test_every_tile_size_of_the_gpu_autotune_spaces(width, backward, configs):
    """On a GPU the autotuner may launch any entry of a kernel's space, and a GPU run checks only
    the entries it chose; here every distinct tile size of every space (:data:`GPU_CONFIGS`, 80
    in all) computes the default layer's call (ALiBi, self/cross biases, the shared pair with
    head-summed values: all six kernels) against the float64 reference, float32, 1e-5. Query and
    key tiles of unequal sizes both ways, a length with a partial last tile of every size, and
    the head width of each table (64; 72, padded to 128)."""
    D, L = (64, 200) if width == 64 else (72, 150)
    inp = make_inputs(1, 2, L, D, De=40, seed=11)
    ref, ref_g = run(reference.tied_attention, inp, torch.float64, values=True)
    with attn.use_configs(**configs):
        got, got_g = run(functools.partial(attn.tied_attention, atomic_dq=backward == "bwd_atomic"),
                         inp, torch.float32, values=True)
    for a, b in zip(got, ref):
        assert rel_err(a, b) <= 1e-5, configs
    for name in ref_g:
        assert rel_err(got_g[name], ref_g[name]) <= 1e-5, (name, configs)


@pytest.mark.parametrize("case", [(1, 2, 33, 16, 0), (1, 16, 12, 16, 0), (2, 2, 29, 24, 40),
                                  (1, 3, 29, 24, 136)])
def test_attention_float16_flash_criterion(case):
    B, K, L, D, De = case
    inp = make_inputs(B, K, L, D, De=De, seed=4)
    inp16 = {n: t.half() for n, t in inp.items()}
    exact, exact_g = run(reference.tied_attention, {n: t.double() for n, t in inp16.items()},
                         torch.float64, scale=0.25, values=bool(De))
    ref, ref_g = run(reference.tied_attention, inp16, torch.float16, scale=0.25, values=bool(De))
    got, got_g = run(attn.tied_attention, inp16, torch.float16, scale=0.25, values=bool(De))
    for a, r, e in zip(got, ref, exact):
        assert rel_err(a, e) <= 2 * rel_err(r, e) + 1e-3
    for name in exact_g:
        assert rel_err(got_g[name], exact_g[name]) <= 2 * rel_err(ref_g[name], exact_g[name]) \
            + 2e-3, name


@pytest.mark.parametrize("De", [4, pytest.param(130, marks=pytest.mark.slow)])
def test_attention_gradcheck_float64(De):
    inp = make_inputs(1, 2, 6, 3, De=De)
    inp["alibi"] = inp["alibi"].clone()
    names = list(inp)

    def f(*xs):
        kw = dict(zip(names, xs))
        return attn.tied_attention(kw.pop("q"), kw.pop("kv"), scale=0.7, extra_values=True,
                                 extra_head_sum=True, **kw)

    xs = [inp[n].to(DEVICE).clone().requires_grad_() for n in names]
    assert torch.autograd.gradcheck(f, xs, fast_mode=True)


def test_attention_keeps_the_layers_head_layout():
    """Head-split views go in without a copy and ``o``, ``dq``, ``d kv`` come out laid out the
    same way, so that the layer's head merge is a view."""
    inp = make_inputs(2, 3, 10, 8)
    q, kv = (inp[n].float().to(DEVICE).requires_grad_() for n in ("q", "kv"))
    o, lse = attn.tied_attention(q, kv, scale=0.5)
    assert o.stride() == q.stride() and o.transpose(1, 2).is_contiguous()
    o.sum().backward()
    assert q.grad.stride() == q.stride() and kv.grad.stride() == kv.stride()
    contiguous = {n: t.contiguous() for n, t in make_inputs(2, 3, 10, 8).items()}
    o2, _ = attn.tied_attention(contiguous["q"].float().to(DEVICE),
                              contiguous["kv"].float().to(DEVICE), scale=0.5)
    assert o2.is_contiguous() and torch.equal(o2, o.detach())


def test_attention_covers_and_refuses():
    q = torch.empty(1, 2, 5, 8)
    assert attn.covers(q, None, False, False)
    assert dispatch.attention_covers(q, torch.empty(1, 5, 7), True, True)
    assert not attn.covers(q, torch.empty(1, 2, 5, 7), True, True)  # per-head pair
    assert not attn.covers(q, torch.empty(1, 5, 7), True, False)  # per-head extra values
    assert not attn.covers(torch.empty(1, 2, 5, 129), None, False, False)  # wide heads
    with pytest.raises(ValueError, match="per-head"):
        attn.tied_attention(q, q, scale=1.0, q_extra=torch.empty(1, 2, 5, 7),
                            k_extra=torch.empty(1, 5, 7))


@pytest.mark.skipif(CUDA, reason="interpreter-only guard")
def test_attention_interpreter_refuses_bfloat16():
    x = torch.randn(1, 1, 4, 8, dtype=torch.bfloat16)
    with pytest.raises(TypeError, match="bfloat16 is not supported under TRITON_INTERPRET"):
        attn.tied_attention(x, x, scale=1.0)


UNCOVERED = [  # B, K, L, D, De, per-head pair, call: what the kernel does not take
    (2, 3, 37, 20, 12, False, dict(extra_values=True)),   # per-head extra values, odd L, D, D_e
    (1, 2, 37, 20, 12, True, dict(extra_values=True)),    # per-head extra queries
    (1, 2, 17, 8, 12, True, dict(extra_values=True, extra_head_sum=True)),  # per-head, summed
    (1, 2, 13, 136, 0, False, {}),                        # a head wider than 128
]


@pytest.mark.parametrize("case", UNCOVERED)
def test_calls_the_kernel_does_not_take_go_to_the_pytorch_path(case, monkeypatch):
    """``"triton"`` (and ``"auto"`` on CUDA) runs the kernel where it takes the call and the
    PyTorch path elsewhere (the closed form on the CPU in float32/float64, else the reference):
    forward and every gradient against the float64 reference, float32 to 1e-5, and the kernel
    never launched."""
    B, K, L, D, De, per_head, kw = case
    inp = make_inputs(B, K, L, D, De=De, seed=2)
    if per_head:
        inp["q_extra"] = 0.5 * torch.randn(B, K, L, De, dtype=torch.float64,
                                           generator=torch.Generator().manual_seed(3))
    seen = []
    monkeypatch.setattr(attn, "forward", lambda *a, **k: seen.append("kernel"))
    real = attention_torch.tied_attention
    monkeypatch.setattr(attention_torch, "tied_attention",
                        lambda *a, **k: seen.append("closed form") or real(*a, **k))
    values = kw.get("extra_values", False)

    def call(q, kv, **args):
        return dispatch.tied_attention(q, kv, **args, **kw)
    with dispatch.use_backend("triton"):
        got, got_g = run(call, inp, torch.float32)
    ref, ref_g = run(functools.partial(reference.tied_attention, **kw), inp, torch.float64)
    assert seen == ["closed form"] and len(got) == (3 if values else 2)
    for a, b in zip(got, ref):
        assert a.shape == b.shape and rel_err(a, b) <= 1e-5
    for name in ref_g:
        assert rel_err(got_g[name], ref_g[name]) <= 1e-5, name


def test_dispatch_routes_triton_to_the_kernel_where_it_takes_the_call(monkeypatch):
    """The calls the kernel takes reach it through the dispatcher with ``"triton"``; the others,
    and every call with ``"reference"``, do not; the outputs agree."""
    seen = []
    real = attn.forward
    monkeypatch.setattr(attn, "forward", lambda *a: seen.append(1) or real(*a))
    shared = make_inputs(1, 2, 9, 8, De=6)
    per_head = dict(shared, q_extra=torch.randn(1, 2, 9, 6, dtype=torch.float64))
    calls = [(make_inputs(1, 2, 9, 8), {}), (shared, dict(extra_values=True, extra_head_sum=True)),
             (per_head, dict(extra_values=True)), (shared, dict(extra_values=True))]
    for backend, expected in (("triton", [1, 1]), ("reference", [])):
        seen.clear()
        with dispatch.use_backend(backend):
            for inp, kw in calls:
                x = {n: t.float().to(DEVICE) for n, t in inp.items()}
                out = dispatch.tied_attention(x.pop("q"), x.pop("kv"), scale=0.5, **x, **kw)
                with dispatch.use_backend("reference"):
                    x = {n: t.float().to(DEVICE) for n, t in inp.items()}
                    want = dispatch.tied_attention(x.pop("q"), x.pop("kv"), scale=0.5, **x, **kw)
                for a, b in zip(out, want):
                    assert rel_err(a, b) < 1e-5
        assert seen == expected, backend


def test_attention_traces_under_torch_compile():
    """While compiling, the kernel runs as two opaque operators joined by an autograd.Function that
    dynamo traces: no graph break (fullgraph), the same values and gradients as the eager
    autograd.Function (one call with the atomic-dq backward, whose flag the traced function
    carries to its backward)."""
    plain = make_inputs(1, 2, 11, 8)
    shared = make_inputs(1, 2, 11, 8, De=12, seed=5)
    torch._dynamo.reset()

    def energy(q, kv, sb, cb, qe, ke):
        o, lse = attn.tied_attention(q, kv, scale=0.5, alibi=plain["alibi"].float().to(DEVICE),
                                   self_bias=sb, cross_bias=cb)
        o2, lse2, oe = attn.tied_attention(q, kv, scale=0.5, q_extra=qe, k_extra=ke,
                                         extra_values=True, extra_head_sum=True, atomic_dq=True)
        return (-lse.sum() * 2 + o.square().sum() + o2.square().sum() + lse2.sum()
                + oe.square().sum())

    xs = [plain["q"], plain["kv"], plain["self_bias"], plain["cross_bias"], shared["q_extra"],
          shared["k_extra"]]
    results = []
    for fn in (energy, torch.compile(energy, backend="aot_eager", fullgraph=True)):
        leaves = [x.float().to(DEVICE).requires_grad_() for x in xs]
        val = fn(*leaves)
        val.backward()
        results.append([val] + [x.grad for x in leaves])
    for a, b in zip(*results):
        assert rel_err(a, b) < 1e-6


def test_compiled_cem_model_on_the_kernel_path_has_no_graph_break():
    """A whole CEM language model (default layers: shared diagonal, ALiBi, self/cross biases;
    T = 1; float16 autocast, as the GPU trainer's bf16) compiled with ``fullgraph=True`` while
    its layers dispatch to the kernels (attention, the MLP step): the dispatcher's
    decision traces without a break (one graph, no break counted), and the compiled step
    launches the same kernels as the eager step and gives its loss and gradients. Failing input
    (with torch 2.11, the H100's version, not the one installed here): a dispatcher that asks
    ``importlib.util.find_spec`` at every call whether Triton is installed broke the graph there
    (the 10 breaks of the H100 train-step run); with torch 2.13 that call traces, and
    ``test_kernels_dispatch.py`` checks that it is no longer made at call time."""
    from torch._dynamo.utils import counters

    from cemlib.models.lm import LanguageModel, LMConfig
    torch.manual_seed(0)
    cfg = LMConfig(vocab_size=17, context_length=8, d_model=32, n_layers=1, n_heads=2,
                   attn="cem", mlp="cem")
    model = LanguageModel(cfg).to(DEVICE)
    idx = torch.randint(0, 17, (1, 8), device=DEVICE)
    results, launched = [], []
    with dispatch.use_backend("triton"):
        for compiled in (False, True):
            torch._dynamo.reset()
            counters.clear()
            fn = torch.compile(model, backend="aot_eager", fullgraph=True) if compiled else model
            model.zero_grad(set_to_none=True)
            with count_launches(operators=False) as n, torch.autocast(DEVICE, dtype=torch.float16):
                loss = fn(idx).float().square().mean()  # (the interpreter takes no bf16)
                loss.backward()
            results.append([loss] + [p.grad for p in model.parameters()])
            launched.append(dict(n.triton))
    assert sum(counters["graph_break"].values()) == 0
    assert counters["stats"]["unique_graphs"] == 1
    assert launched[0] == launched[1] and {"_fwd_kernel", "_bwd_kernel", "_silu_gate_kernel",
                                            "_silu_gate_bwd_kernel"} <= set(launched[0])
    for a, b in zip(*results):
        assert rel_err(a, b) < 1e-3


# ------------------------------------------------------------------------------ launch counts

def _default_layer_call(B=1, K=2, L=13, D=8, De=24, dtype=torch.float32):
    """The attention call of the default CEM layer (shared diagonal, exact diagonal values,
    ALiBi buffer, learned self/cross biases), inputs as the layer makes them."""
    inp = make_inputs(B, K, L, D, De=De, seed=6)
    leaves = {n: t.to(dtype).to(DEVICE).requires_grad_(n != "alibi") for n, t in inp.items()}
    grads = [torch.randn(B, K, L, D).transpose(1, 2).contiguous().transpose(1, 2).to(DEVICE),
             torch.randn(B, L, De).to(DEVICE)]
    return leaves, grads


def test_launches_per_forward_backward():
    """One CEM attention call, forward and backward: at most 5 launches without the extra pair
    (here 4: the forward, the preprocess, the backward, the fold of the bias gradients; 3 with
    atomic dq, whose backward folds them itself) and at most 10 for the default CEM layer's call
    (shared diagonal of width D_h with head-summed values); the Triton launches and the PyTorch
    operators that would launch kernels on a GPU are both counted."""
    leaves, (do, doe) = _default_layer_call()
    plain = {n: t for n, t in leaves.items() if n not in ("q_extra", "k_extra")}
    dispatch.set_backend("triton")  # what "auto" does on CUDA
    with count_launches() as n_plain:
        o, lse = dispatch.tied_attention(plain["q"], plain["kv"], scale=0.5, alibi=plain["alibi"],
                                         self_bias=plain["self_bias"],
                                         cross_bias=plain["cross_bias"])
        o.backward(do)
    assert n_plain.total <= 5, str(n_plain)
    assert dict(n_plain.triton) == {"_fwd_kernel": 1, "_pre_kernel": 1, "_bwd_kernel": 1,
                                    "_fold_kernel": 1}
    for t in leaves.values():
        t.grad = None
    with count_launches() as n_atomic, attn.use_atomic_dq():
        o, lse = dispatch.tied_attention(plain["q"], plain["kv"], scale=0.5, alibi=plain["alibi"],
                                         self_bias=plain["self_bias"],
                                         cross_bias=plain["cross_bias"])
        o.backward(do)
    assert dict(n_atomic.triton) == {"_fwd_kernel": 1, "_pre_kernel": 1, "_bwd_kernel": 1}
    for t in leaves.values():
        t.grad = None
    a = dict(leaves)
    with count_launches() as n_layer:
        o, lse, oe = dispatch.tied_attention(a.pop("q"), a.pop("kv"), scale=0.5,
                                             extra_values=True, extra_head_sum=True, **a)
        torch.autograd.backward([o, oe], [do, doe])
    assert n_layer.total <= 10, str(n_layer)
    assert all(leaves[n].grad is not None for n in leaves if n != "alibi")


def test_default_cem_layer_runs_the_kernel(monkeypatch):
    """The default CEM layer (shared diagonal, exact diagonal values) reaches the kernel through
    the dispatcher, once, with the shared pair, and its forward+backward launches fewer kernels
    than through the reference (the rest of the layer, norms and projections, is the same)."""
    from cemlib.layers.cem_attention import CEMAttention
    torch.manual_seed(0)
    layer = CEMAttention(24, 2, init_std=0.3).to(DEVICE)
    x = torch.randn(1, 13, 24, device=DEVICE)
    seen, real = [], attn.forward
    monkeypatch.setattr(attn, "forward", lambda *a: seen.append(a[6] is not None) or real(*a))
    totals = {}
    for backend in ("triton", "reference"):
        layer.zero_grad()
        with dispatch.use_backend(backend), count_launches() as n:
            layer(x).square().sum().backward()
        totals[backend] = n.total
    assert seen == [True]  # one call, with the shared pair, on the kernel only
    assert totals["triton"] < totals["reference"], totals


def test_attention_value_and_key_roles_of_kv():
    """d kv is the sum of the value-role and key-role gradients (untied reference, float64)."""
    inp = make_inputs(1, 2, 21, 5, biases=(True, False, False), split_heads=False)
    q = inp["q"].to(DEVICE)
    kv = inp["kv"].to(DEVICE).clone().requires_grad_()
    alibi = inp["alibi"].to(DEVICE)
    (attn.tied_attention(q, kv, scale=0.5, alibi=alibi)[0] ** 2).sum().backward()
    k_role, v_role = (inp["kv"].to(DEVICE).clone().requires_grad_() for _ in range(2))
    s = torch.einsum("bkid,bkjd->bkij", q, k_role) * 0.5 + reference.attention_bias(
        21, 2, alibi=alibi, dtype=torch.float64, device=DEVICE)
    (torch.einsum("bkij,bkjd->bkid", s.softmax(-1), v_role) ** 2).sum().backward()
    assert rel_err(kv.grad, k_role.grad + v_role.grad) < 1e-12
    assert rel_err(kv.grad, v_role.grad) > 1e-3  # the key role is not negligible


def test_head_sum_of_the_probabilities():
    """The head-sum kernel directly: ``A = sum_k P_k`` against the reference's probabilities
    (float64). On a GPU Triton passes Python floats as fp32: a scale exact in fp32 (0.5) keeps
    this a 1e-13 test of the sum itself."""
    B, K, L, D = 2, 3, 23, 5
    inp = {n: t.to(DEVICE) for n, t in make_inputs(B, K, L, D, split_heads=False).items()}
    E = torch.randn(B, L, L, dtype=torch.float64).to(DEVICE)
    bias = dict(alibi=inp["alibi"], self_bias=inp["self_bias"], cross_bias=inp["cross_bias"])
    call = attn._Call(inp["q"], inp["kv"], 0.5, *bias.values(), True)
    e2 = E * attn.LOG2E.value   # the logits in log2 units, as forward() makes them
    o, lse = call.forward(e2)
    s = (torch.einsum("bkid,bkjd->bkij", inp["q"], inp["kv"]) * 0.5 + E[:, None]
         + reference.attention_bias(L, K, **bias, dtype=torch.float64, device=DEVICE))
    assert rel_err(call.head_sum(lse, e2), torch.softmax(s, -1).sum(1)) < 1e-13


# ------------------------------------------------------------------------------ the CEM layer

@pytest.mark.parametrize("d_model, diag, precond", [
    (24, "none", "none"), (24, "shared", "none"), (24, "per_head", "none"),
    (136, "shared", "none"),   # D_h = 136: a wide shared pair, head-summed (the default layer)
    (136, "shared", "dplr"),   # per-head P_k needs per-head diagonal values: the PyTorch path
])
def test_cem_attention_layer_same_through_both_backends(d_model, diag, precond):
    """End to end: the CEM layer (T = 2 recursion steps) gives the same output and parameter
    gradients through the kernels as through the reference. Truth is the float64 reference; the
    fp32 kernels' error must be at most twice the fp32 reference's (+ a floor): with a strong
    diagonal the fp32 *reference* is the less accurate one (about 5e-4 against 2e-5 here, CPU)."""
    from cemlib.layers.cem_attention import CEMAttention
    torch.manual_seed(0)
    layer = CEMAttention(d_model, 2 if d_model > 100 else 3, T=2, diag=diag,
                         preconditioner=precond, init_std=0.3).to(DEVICE)
    if diag != "none":
        torch.nn.init.normal_(layer.d, std=0.5)  # zero at init: make the diagonal term count
    x = torch.randn(2, 13, d_model, device=DEVICE)
    results = []
    for backend, dtype in (("reference", torch.float64), ("reference", torch.float32),
                           ("triton", torch.float32)):
        net = copy.deepcopy(layer).to(dtype)
        with dispatch.use_backend(backend):
            y = net(x.to(dtype))
            y.square().sum().backward()
        results.append([y] + [p.grad for p in net.parameters() if p.grad is not None])
    assert len(results[0]) == len(results[1]) == len(results[2]) > 3
    # Measured against the fp32 reference's worst output: the per-head bias gradients are sums of
    # B*L^2 score gradients that cancel (the rows of dS sum to zero), and on CUDA the reference's
    # tree-ordered sums are luckier there than the kernels' tile-ordered ones (on an H100: 2.8e-5
    # and 4.9e-5 against 9e-7, while both are 2e-5 to 1.2e-4 on W_Q, W_K, d and the norm weight).
    ref_worst = max(rel_err(ref, exact) for exact, ref in zip(results[0], results[1]))
    for exact, got in zip(results[0], results[2]):
        assert rel_err(got, exact) <= 2 * ref_worst + 2e-5
