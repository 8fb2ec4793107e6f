"""The second version of the tied attention kernels (:mod:`cemlib.kernels.tied_attention_v2`)
against the float64 reference: forward and every gradient (q, kv, the shared extra pair, lse,
the self/cross biases, learned ALiBi slopes) on awkward shapes; its tile configurations; its
place in the dispatcher; ``torch.compile``; and the number of kernel launches per call.

On a machine without CUDA the kernels run under Triton's interpreter (``triton_interpreter.py``).
Shapes are tiny: the interpreter runs every program instance in numpy, one after another.
Criteria: float32 within 1e-5 (relative to the largest entry) of the float64 reference; float16
within the FlashAttention criterion, an error against float64 at most twice that of the float16
PyTorch reference (plus a small floor for what the reference gets exactly).
"""

import functools
import itertools

import pytest
import torch

from triton_interpreter import CUDA, DEVICE, kernels_usable, rerun_in_fresh_process  # noqa: F401

triton = pytest.importorskip("triton")

from cemlib.kernels import dispatch, ops, reference  # noqa: E402
from cemlib.kernels import tied_attention_triton as v1  # noqa: E402
from cemlib.kernels import tied_attention_v2 as v2  # noqa: E402
from cemlib.kernels.launches import count_launches  # noqa: E402


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
] + [(1, 2, 19, 8, b, 0, False, (0, 1)) for b in itertools.product((False, True), repeat=3)
     if b not in ((True, True, True), (False, False, False))]  # every bias combination


@pytest.mark.parametrize("case", CASES)
def test_v2_float32_matches_the_float64_reference(case):
    B, K, L, D, biases, De, values, used = case
    inp = make_inputs(B, K, L, D, biases, De)
    got, got_g = run(v2.tied_attention, inp, torch.float32, values=values, outputs=used)
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


def test_v2_learned_alibi_slopes():
    """Slopes that require grad (no cemlib layer learns them) get theirs from the dq loop."""
    for De, values in ((0, False), (12, True)):
        inp = make_inputs(2, 2, 27, 8, De=De)
        got, got_g = run(v2.tied_attention, inp, torch.float32, values=values, learn_alibi=True)
        ref, ref_g = run(reference.tied_attention, inp, torch.float64, values=values,
                         learn_alibi=True)
        assert rel_err(got_g["alibi"], ref_g["alibi"]) <= 1e-5
        assert rel_err(got_g["q"], ref_g["q"]) <= 1e-5


@pytest.mark.parametrize("De", [0, 12])
def test_bias_gradients_take_delta_from_the_probabilities_not_the_stored_output(De):
    """``dS_ii = P_ii (dP_ii - Delta_i)``: the self/cross bias gradients sum it over every row and
    batch, so an error in ``Delta_i = o_i.do_i - dlse_i`` from the output *as stored* (bf16 on a
    GPU) adds up in them (``benchmarks/bias_grad_rounding.py``: 2 of 32 bf16 bias gradients of
    the GPU test's shared-diagonal call fail the FlashAttention criterion that way, none with an
    exact ``Delta``). The ``dq`` walk therefore takes ``Delta_i = sum_j P_ij dP_ij - dlse_i``
    from the probabilities it computes, and the bias gradients do not depend on ``o`` at all,
    while ``dq`` and ``d kv`` keep FlashAttention-2's ``Delta`` from ``o`` (one row each).
    Failing input: the preprocess kernel's ``Delta``, which the atomic-dq backward (no walk)
    still uses: a perturbed ``o`` moves its bias gradients."""
    inp = {n: t.float() for n, t in make_inputs(2, 3, 45, 16, De=De, seed=7).items()}
    q, kv, qe, ke = inp["q"], inp["kv"], inp.get("q_extra"), inp.get("k_extra")
    args = (q, kv, 0.3, inp["alibi"], inp["self_bias"], inp["cross_bias"], qe, ke)
    o, lse, _, e2, a = v2.forward(*args, extra_values=De > 0)
    g = torch.Generator().manual_seed(8)
    do, dlse = torch.randn(o.shape, generator=g), torch.randn(lse.shape, generator=g)
    doe = torch.randn(2, 45, De, generator=g) if De else None
    bad = o + 1e-2 * torch.randn(o.shape, generator=g)
    needs = (True, True, False, True, True, De > 0, De > 0)

    def grads(o, atomic):
        return v2.backward(do, dlse, doe, *args[:2], o, lse, *args[2:], e2, a, needs,
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
def test_v2_atomic_dq_matches_the_float64_reference(case):
    """The backward that adds each tile's share of dq atomically inside the d kv walk (no dq
    walk) gives the same gradients: float32, and float16 through its float32 buffer."""
    B, K, L, D, biases, De, values, used = case
    inp = make_inputs(B, K, L, D, biases, De, seed=5)
    ref, ref_g = run(reference.tied_attention, inp, torch.float64, values=values, outputs=used)
    with v2.use_atomic_dq():
        assert v2.atomic_dq_enabled()
        got, got_g = run(v2.tied_attention, inp, torch.float32, values=values, outputs=used)
    assert not v2.atomic_dq_enabled()
    for name in ref_g:
        assert got_g[name].dtype == torch.float32
        assert rel_err(got_g[name], ref_g[name]) <= 1e-5, (name, rel_err(got_g[name], ref_g[name]))


def test_v2_atomic_dq_float16_tiles_and_slopes():
    inp = make_inputs(1, 2, 33, 16, De=24, seed=6)
    inp16 = {n: t.half() for n, t in inp.items()}
    exact, exact_g = run(reference.tied_attention, {n: t.double() for n, t in inp16.items()},
                         torch.float64, scale=0.25, values=True)
    ref, ref_g = run(reference.tied_attention, inp16, torch.float16, scale=0.25, values=True)
    with v2.use_atomic_dq():
        got, got_g = run(v2.tied_attention, inp16, torch.float16, scale=0.25, values=True)
    for name in exact_g:
        assert got_g[name].dtype == torch.float16
        assert rel_err(got_g[name], exact_g[name]) <= 2 * rel_err(ref_g[name], exact_g[name]) \
            + 2e-3, name
    # unequal tiles both ways: the atomic adds land on query tiles that straddle key blocks
    inp = make_inputs(1, 2, 70, 16, seed=7)
    ref, ref_g = run(reference.tied_attention, inp, torch.float64)
    for bwd in (dict(BLOCK_M1=32, BLOCK_N1=16, BLOCK_N2=32), dict(BLOCK_M1=16, BLOCK_N1=64, BLOCK_N2=16)):
        with v2.use_atomic_dq(), v2.use_configs(bwd=bwd):
            got, got_g = run(v2.tied_attention, inp, torch.float32)
        assert rel_err(got_g["q"], ref_g["q"]) <= 1e-5, bwd
    # per call: atomic_dq=True without the module setting, saved for that call's backward
    got, got_g = run(functools.partial(v2.tied_attention, atomic_dq=True), inp, torch.float32)
    assert not v2.atomic_dq_enabled() and rel_err(got_g["q"], ref_g["q"]) <= 1e-5
    # learned ALiBi slopes need the dq walk's row sums: the call walks, and is right
    inp = make_inputs(2, 2, 27, 8, seed=8)
    ref, ref_g = run(reference.tied_attention, inp, torch.float64, learn_alibi=True)
    with v2.use_atomic_dq():
        got, got_g = run(v2.tied_attention, inp, torch.float32, learn_alibi=True)
    assert rel_err(got_g["alibi"], ref_g["alibi"]) <= 1e-5
    assert rel_err(got_g["q"], ref_g["q"]) <= 1e-5


@pytest.mark.parametrize("configs", [
    dict(fwd=dict(BLOCK_M=16, BLOCK_N=32), bwd=dict(BLOCK_M1=32, BLOCK_N1=16, BLOCK_N2=32),
         pre=dict(BLOCK_M=16, BLOCK_N=32), headsum=dict(BLOCK_M=32, BLOCK_N=16),
         extra_grads=dict(BLOCK_M=32, BLOCK_N=16, BLOCK_K=32)),
    dict(fwd=dict(BLOCK_M=64, BLOCK_N=16), bwd=dict(BLOCK_M1=16, BLOCK_N1=64, BLOCK_N2=16),
         pre=dict(BLOCK_M=32, BLOCK_N=16), headsum=dict(BLOCK_M=16, BLOCK_N=64)),
])
def test_v2_tile_configurations(configs):
    """Query and key tiles of unequal sizes both ways (the band split and the padded rows of
    the backward depend on them); the GPU runs other sizes than the interpreter's default."""
    inp = make_inputs(1, 2, 70, 16, De=24, seed=3)
    ref, ref_g = run(reference.tied_attention, inp, torch.float64, values=True)
    with v2.use_configs(**configs):
        got, got_g = run(v2.tied_attention, inp, torch.float32, values=True)
    for a, b in zip(got, ref):
        assert rel_err(a, b) <= 1e-5
    for name in ref_g:
        assert rel_err(got_g[name], ref_g[name]) <= 1e-5, name
    with pytest.raises(ValueError, match="ROW_PAD"):
        with v2.use_configs(bwd=dict(BLOCK_M1=16, BLOCK_N1=256, BLOCK_N2=16)):
            pass


def _gpu_tiles(table: str, width: int) -> list[dict]:
    """The distinct tile sizes (``BLOCK_*``) of a GPU autotune space, in the space's order (warps
    and stages do not change what a kernel computes, and the interpreter ignores them)."""
    seen = []
    for cfg in v2.GPU_CONFIGS[table][width if width in v2.GPU_CONFIGS[table] else 0]:
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
    with v2.use_configs(**configs):
        got, got_g = run(functools.partial(v2.tied_attention, atomic_dq=backward == "bwd_atomic"),
                         inp, torch.float32, values=True)
    for a, b in zip(got, ref):
        assert rel_err(a, b) <= 1e-5, configs
    for name in ref_g:
        assert rel_err(got_g[name], ref_g[name]) <= 1e-5, (name, configs)


@pytest.mark.parametrize("case", [(1, 2, 33, 16, 0), (1, 16, 12, 16, 0), (2, 2, 29, 24, 40)])
def test_v2_float16_flash_criterion(case):
    B, K, L, D, De = case
    inp = make_inputs(B, K, L, D, De=De, seed=4)
    inp16 = {n: t.half() for n, t in inp.items()}
    exact, exact_g = run(reference.tied_attention, {n: t.double() for n, t in inp16.items()},
                         torch.float64, scale=0.25, values=bool(De))
    ref, ref_g = run(reference.tied_attention, inp16, torch.float16, scale=0.25, values=bool(De))
    got, got_g = run(v2.tied_attention, inp16, torch.float16, scale=0.25, values=bool(De))
    for a, r, e in zip(got, ref, exact):
        assert rel_err(a, e) <= 2 * rel_err(r, e) + 1e-3
    for name in exact_g:
        assert rel_err(got_g[name], exact_g[name]) <= 2 * rel_err(ref_g[name], exact_g[name]) \
            + 2e-3, name


def test_v2_gradcheck_float64():
    inp = make_inputs(1, 2, 6, 3, De=4)
    inp["alibi"] = inp["alibi"].clone()
    names = list(inp)

    def f(*xs):
        kw = dict(zip(names, xs))
        return v2.tied_attention(kw.pop("q"), kw.pop("kv"), scale=0.7, extra_values=True,
                                 extra_head_sum=True, **kw)

    xs = [inp[n].to(DEVICE).clone().requires_grad_() for n in names]
    assert torch.autograd.gradcheck(f, xs, fast_mode=True)


def test_v2_keeps_the_layers_head_layout():
    """Head-split views go in without a copy and ``o``, ``dq``, ``d kv`` come out laid out the
    same way, so that the layer's head merge is a view."""
    inp = make_inputs(2, 3, 10, 8)
    q, kv = (inp[n].float().to(DEVICE).requires_grad_() for n in ("q", "kv"))
    o, lse = v2.tied_attention(q, kv, scale=0.5)
    assert o.stride() == q.stride() and o.transpose(1, 2).is_contiguous()
    o.sum().backward()
    assert q.grad.stride() == q.stride() and kv.grad.stride() == kv.stride()
    contiguous = {n: t.contiguous() for n, t in make_inputs(2, 3, 10, 8).items()}
    o2, _ = v2.tied_attention(contiguous["q"].float().to(DEVICE),
                              contiguous["kv"].float().to(DEVICE), scale=0.5)
    assert o2.is_contiguous() and torch.equal(o2, o.detach())


def test_v2_covers_and_refuses():
    q = torch.empty(1, 2, 5, 8)
    assert v2.covers(q, None, False, False)
    assert dispatch.v2_covers(q, torch.empty(1, 5, 7), True, True)
    assert not v2.covers(q, torch.empty(1, 2, 5, 7), True, True)  # per-head pair: version 1
    assert not v2.covers(q, torch.empty(1, 5, 7), True, False)  # per-head extra values: v1
    assert not v2.covers(torch.empty(1, 2, 5, 129), None, False, False)  # wide heads: v1
    with pytest.raises(ValueError, match="per-head"):
        v2.tied_attention(q, q, scale=1.0, q_extra=torch.empty(1, 2, 5, 7),
                          k_extra=torch.empty(1, 5, 7))


@pytest.mark.skipif(CUDA, reason="interpreter-only guard")
def test_v2_interpreter_refuses_bfloat16():
    x = torch.randn(1, 1, 4, 8, dtype=torch.bfloat16)
    with pytest.raises(TypeError, match="bfloat16 is not supported under TRITON_INTERPRET"):
        v2.tied_attention(x, x, scale=1.0)


def test_dispatch_routes_triton_to_v2_and_v1(monkeypatch):
    """``"triton"`` (and ``"auto"`` on CUDA) runs version 2 where it covers the call and version
    1 elsewhere; ``"triton_v1"`` runs version 1 everywhere."""
    seen = []
    real_v2, real_v1 = v2.forward, v1.attention_forward
    monkeypatch.setattr(v2, "forward", lambda *a: seen.append(2) or real_v2(*a))
    monkeypatch.setattr(v1, "attention_forward", lambda *a: seen.append(1) or real_v1(*a))
    shared = make_inputs(1, 2, 9, 8, De=6)
    per_head = dict(shared, q_extra=torch.randn(1, 2, 9, 6, dtype=torch.float64))
    calls = [(make_inputs(1, 2, 9, 8), {}), (shared, dict(extra_values=True, extra_head_sum=True)),
             (per_head, dict(extra_values=True)), (shared, dict(extra_values=True))]
    for backend, expected in (("triton", [2, 2, 1, 1]), ("triton_v1", [1, 1, 1, 1])):
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


def test_v2_traces_under_torch_compile():
    """While compiling, v2 runs as two opaque operators joined by an autograd.Function that
    dynamo traces: no graph break (fullgraph), the same values and gradients as the eager
    autograd.Function (one call with the atomic-dq backward, whose flag the traced function
    carries to its backward)."""
    plain = make_inputs(1, 2, 11, 8)
    shared = make_inputs(1, 2, 11, 8, De=12, seed=5)
    torch._dynamo.reset()

    def energy(q, kv, sb, cb, qe, ke):
        o, lse = v2.tied_attention(q, kv, scale=0.5, alibi=plain["alibi"].float().to(DEVICE),
                                   self_bias=sb, cross_bias=cb)
        o2, lse2, oe = v2.tied_attention(q, kv, scale=0.5, q_extra=qe, k_extra=ke,
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
    its layers dispatch to the kernels (v2 attention, the v2 MLP step): the dispatcher's
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

def test_the_autotuner_times_each_configuration_for_autotune_rep_ms(monkeypatch):
    """The autotuner's timing of a configuration is ``do_bench`` with ``AUTOTUNE_REP_MS`` of
    repetitions (25 by default; Triton's own benchmarker takes 100 plus 25 of warm-up, about 3 s
    per kernel and kind of call on a space of 26). Failing input: a tuner built without the
    option times with the driver's benchmarker (its ``do_bench`` is not ``v2._timed``)."""
    tuner = v2._tuner("fwd", v2._fwd_kernel, "fwd", 64)
    assert tuner.do_bench is v2._timed
    assert len(tuner.configs) == len(v2.GPU_CONFIGS["fwd"][64])
    seen = []
    monkeypatch.setattr(triton.testing, "do_bench",
                        lambda fn, warmup, rep, quantiles: seen.append((warmup, rep, quantiles)))
    monkeypatch.setattr(v2, "AUTOTUNE_REP_MS", 40.0)
    v2._timed(lambda: None, quantiles=(0.5, 0.2, 0.8))
    assert seen == [(8.0, 40.0, (0.5, 0.2, 0.8))]
    plain = triton.autotune([triton.Config({"BLOCK_M": 16})], key=["L"])(v2._fwd_kernel)
    assert plain._do_bench is None  # (the failing input: Triton's own benchmarker, chosen later)


def test_autotuned_launches_consult_the_tuner_once_per_signature(monkeypatch):
    """On a GPU, every autotuned launch used to go through ``triton.autotune``'s ``run``, which
    rebuilds its key from every argument (about 20 us of host time per launch,
    ``benchmarks/host_overhead.py``); now the tuner is consulted once per call signature and
    later launches go to the kernel with its choice. With a stand-in kernel and tuner: the tuner
    runs once, every launch gets exactly its configuration and grid, and another length, dtype
    or flag consults it again."""
    launches, consulted = [], []

    class Kernel:
        def __getitem__(self, grid):
            return lambda *args, **kw: launches.append((grid, args, kw))

    class Config:
        def all_kwargs(self):
            return {"BLOCK_M": 64, "num_warps": 8, "num_stages": 2}

    class Tuner:
        best_config = None

        def __getitem__(self, grid):
            def run(*args, **meta):
                consulted.append(args)
                self.best_config = Config()
                kw = {**meta, **self.best_config.all_kwargs()}
                launches.append((grid(kw), args, kw))
            return run

    monkeypatch.setattr(v2, "_select", lambda name, device, block_d, table: None)
    monkeypatch.setattr(v2, "_tuner", lambda name, kernel, table, block_d, t=Tuner(): t)
    monkeypatch.setattr(v2, "_tuned", {})
    monkeypatch.setattr(v2, "_choices", {})
    x = torch.zeros(4)

    def launch(L=100, dtype=torch.float32, flag=True):
        v2._launch("fwd", Kernel(), lambda cfg: (-(-L // cfg["BLOCK_M"]), 3), (x.to(dtype), L),
                   dict(D=64, HAS_ALIBI=flag), 64, torch.device("cpu"), L)

    for _ in range(3):
        launch()
    assert len(consulted) == 1 and len(launches) == 3
    expected = {"D": 64, "HAS_ALIBI": True, "BLOCK_M": 64, "num_warps": 8, "num_stages": 2}
    assert all(grid == (2, 3) and kw == expected for grid, _, kw in launches)
    launch(L=200), launch(dtype=torch.float16), launch(flag=False)
    assert len(consulted) == 4
    launch(L=200)
    assert len(consulted) == 4 and launches[-1][0] == (4, 3)
    # another length in a tuned power-of-two bucket (100 and 128: 128; 200 and 256: 256) takes
    # that bucket's choice without timing the configurations again (generation, one length
    # after another); its launch gets its own grid
    launch(L=128), launch(L=97), launch(L=256)
    assert len(consulted) == 4 and [g for g, _, _ in launches[-3:]] == [(2, 3), (2, 3), (4, 3)]
    launch(L=300)
    assert len(consulted) == 5


def test_length_buckets():
    assert [v2._length_bucket(L) for L in (1, 16, 17, 100, 128, 129, 4096)] == \
        [16, 16, 32, 128, 128, 256, 4096]


def test_autotuning_off_launches_the_first_configuration_the_gpu_runs_well(monkeypatch):
    """``CEMLIB_AUTOTUNE=0`` on a GPU: the space is ordered and pruned for the H100. Elsewhere an
    entry may not load (a T4's 64 KiB of shared memory per block: the forward's default
    128 x 128 tiles need 96 KiB there, compiled for sm_75) or may spill registers (the default
    forward and backward compiled for sm_80, ``results/compile_kernels.json``). The launch
    compiles and loads entries without launching them until one loads without spilling, runs
    it, and remembers it; where every entry that loads spills, the first of them runs; where
    none loads, the error shows. With a stand-in compiler: 128-row query tiles do not load,
    128-column key tiles spill. Failing input: the previous rule (the first entry that
    loads) launches a spilling configuration."""
    probed, launched = [], []

    def spills(kernel, grid, args, kw):
        probed.append((kw["BLOCK_M"], kw["BLOCK_N"], kw["num_warps"]))
        if kw["BLOCK_M"] == 128:
            raise triton.runtime.errors.OutOfResources(96 * 1024, 64 * 1024, "shared memory")
        return 88 if kw["BLOCK_N"] == 128 else 0

    def launch(kernel, grid, args, kw, cuda=True):
        launched.append((kw["BLOCK_M"], kw["BLOCK_N"], kw["num_warps"]))

    monkeypatch.setattr(v2, "_spills", spills)
    monkeypatch.setattr(v2.direct_launch, "launch", launch)
    monkeypatch.setattr(v2, "AUTOTUNE", False)
    monkeypatch.setattr(v2, "INTERPRET", False)
    monkeypatch.setattr(v2, "_fitting", {})
    configs = v2._gpu_configs("fwd", 64)
    tiles = [(c["BLOCK_M"], c["BLOCK_N"], c["num_warps"]) for c in configs]
    assert tiles[0][0] == 128  # the H100's default
    loads = [i for i, t in enumerate(tiles) if t[0] != 128]
    good = next(i for i in loads if tiles[i][1] != 128)
    assert loads[0] != good  # the space has an entry that loads but spills before a good one
    cuda = torch.device("cuda")

    def call():
        v2._launch("fwd", None, lambda cfg: (1,), (), dict(D=64), 64, cuda, 100)
    for _ in range(2):
        call()
    # the first call probes in order up to the good entry; both calls launch only that one
    assert probed == tiles[:good + 1] and launched == [tiles[good]] * 2
    assert v2._fitting == {("fwd", 64, cuda): good}
    # every entry that loads spills: the first that loads runs
    probed.clear(), launched.clear()
    monkeypatch.setattr(v2, "_fitting", {})
    monkeypatch.setattr(v2, "_gpu_configs",
                        lambda table, block_d: [c for c in configs if c["BLOCK_N"] == 128])
    call()
    assert launched == [next(t for t in tiles if t[0] != 128 and t[1] == 128)]
    # nothing loads: the error shows
    monkeypatch.setattr(v2, "_fitting", {})
    monkeypatch.setattr(v2, "_gpu_configs", lambda table, block_d: [configs[0]])
    with pytest.raises(triton.runtime.errors.OutOfResources):
        call()


def test_probing_a_configuration_compiles_and_loads_without_launching(monkeypatch):
    """:func:`v2._spills` asks Triton for the compiled kernel (``warmup``: no launch) and loads
    it (``_init_handles``: where a GPU refuses it), and reads its spills."""
    events = []

    class Compiled:
        n_spills = 5

        def _init_handles(self):
            events.append("load")

    class Kernel:
        def warmup(self, *args, grid, **kw):
            events.append(("compile", args, grid, kw))
            return Compiled()

        def __getitem__(self, grid):
            raise AssertionError("launched")

    assert v2._spills(Kernel(), (3, 1), (1, 2), {"BLOCK_M": 64}) == 5
    assert events == [("compile", (1, 2), (3, 1), {"BLOCK_M": 64}), "load"]

    class Future:  # what Triton's cache holds for a kernel compiled in parallel
        def result(self):
            events.append("waited")
            return Compiled()

    Kernel.warmup = lambda self, *args, grid, **kw: Future()
    events.clear()
    assert v2._spills(Kernel(), (3, 1), (1, 2), {"BLOCK_M": 64}) == 5
    assert events == ["waited", "load"]


def test_count_launches_counts_kernels_not_views():
    a = torch.randn(4, 6)
    with count_launches() as n:
        b = (a @ a.T).relu()          # two kernels
        c = b.view(16).transpose(0, 0)  # views: none
        torch.empty(5)                # an allocation: none
        c.sum()                       # one
    assert dict(n.torch) == {"mm": 1, "relu": 1, "sum": 1} and not n.triton and n.total == 3


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
    with count_launches() as n_atomic, v2.use_atomic_dq():
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


def test_default_cem_layer_runs_v2(monkeypatch):
    """The default CEM layer (shared diagonal, exact diagonal values) reaches the second version
    through the dispatcher, and its forward+backward launches fewer kernels than with the
    first (the rest of the layer, norms and projections, is the same in both)."""
    from cemlib.layers.cem_attention import CEMAttention
    torch.manual_seed(0)
    layer = CEMAttention(24, 2, init_std=0.3).to(DEVICE)
    x = torch.randn(1, 13, 24, device=DEVICE)
    seen, real = [], v2.forward
    monkeypatch.setattr(v2, "forward", lambda *a: seen.append(a[6] is not None) or real(*a))
    totals = {}
    for backend in ("triton", "triton_v1"):
        layer.zero_grad()
        with dispatch.use_backend(backend), count_launches() as n:
            layer(x).square().sum().backward()
        totals[backend] = n.total
    assert seen == [True]  # one call, with the shared pair, on the second version only
    assert totals["triton"] < totals["triton_v1"], totals
