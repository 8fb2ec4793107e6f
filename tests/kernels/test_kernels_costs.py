"""The FLOP, byte and memory models of ``cemlib.kernels.costs``, the FLOP counter, the launch and
operator counters of ``cemlib.kernels.launches``, and the roofline plots/explorer.

FLOPs are checked against PyTorch's own FLOP counter on the reference implementations, bytes
against the sizes of the tensors a call reads and writes, and the two peak-memory models against
the stored H100 benchmark files (when present).
"""

import json
from pathlib import Path

import matplotlib

matplotlib.use("Agg")

import pytest  # noqa: E402
import torch  # noqa: E402

from cemlib.kernels import costs as C  # noqa: E402
from cemlib.kernels import dispatch, reference  # noqa: E402
from cemlib.layers.cem_mlp import CEMMLP  # noqa: E402
from cemlib.layers.llama import SwiGLU  # noqa: E402

RESULTS = Path(__file__).resolve().parents[2] / "benchmarks" / "results"
f64 = torch.float64


counted = C.count_flops


def test_attention_flops_match_the_flop_counter_on_the_reference():
    g = torch.Generator().manual_seed(0)
    B, K, L, D, De = 2, 3, 11, 4, 5
    q, kv = (torch.randn(B, K, L, D, dtype=f64, generator=g, requires_grad=True) for _ in range(2))
    qe, ke = (torch.randn(B, L, De, dtype=f64, generator=g) for _ in range(2))
    assert counted(lambda: reference.tied_attention(q, kv, scale=0.5)) == \
        C.attention_flops(B, K, L, D, causal=False)

    def fwd_bwd():
        o, lse = reference.tied_attention(q, kv, scale=0.5)
        (o.sum() + lse.sum()).backward()
    assert counted(fwd_bwd, grad=True) == C.attention_flops(B, K, L, D, causal=False, mode="fwd_bwd",
                                                 backward="autograd")
    # head-shared extra pair with head-summed values: logits and values, width De
    extra = counted(lambda: reference.tied_attention(q.detach(), kv.detach(), scale=0.5, q_extra=qe,
                                                     k_extra=ke, extra_values=True,
                                                     extra_head_sum=True))
    assert extra == C.attention_flops(B, K, L, D, causal=False, extra_width=De)


def test_attention_flop_conventions():
    fwd = C.attention_flops(8, 12, 512, 64)
    assert fwd == 4 * 8 * 12 * 512**2 * 64 / 2                     # causal: half the products
    assert C.attention_flops(8, 12, 512, 64, mode="fwd_bwd") == 3.5 * fwd   # FlashAttention
    assert C.attention_flops(8, 12, 512, 64, mode="fwd_bwd", backward="cemlib") == 4.5 * fwd
    # the shared diagonal at D_e = H d doubles the products
    assert C.attention_flops(8, 12, 512, 64, extra_width=768) == 2 * fwd
    with pytest.raises(ValueError, match="mode"):
        C.attention_flops(1, 1, 4, 4, mode="bwd")
    with pytest.raises(ValueError, match="backward"):
        C.attention_flops(1, 1, 4, 4, backward="magic")
    with pytest.raises(ValueError, match="L must be a positive integer"):
        C.attention_flops(1, 1, 0, 4)


def test_mlp_flops_match_the_flop_counter():
    g = torch.Generator().manual_seed(1)
    N, Dh, Dm = 6, 8, 20
    x = torch.randn(N, Dh, dtype=f64, generator=g)
    with dispatch.use_backend("reference"):
        assert counted(lambda: SwiGLU(Dh, Dm).double()(x)) == C.mlp_flops(N, Dh, Dm, kind="swiglu")
        assert counted(lambda: CEMMLP(Dh, Dm).double()(x)) == C.mlp_flops(N, Dh, Dm, kind="cem")
    u = torch.randn(N, Dh, dtype=f64, generator=g, requires_grad=True)
    V = torch.randn(Dm, Dh, dtype=f64, generator=g, requires_grad=True)
    gamma = torch.randn(N, Dm, dtype=f64, generator=g, requires_grad=True)
    assert counted(lambda: reference.tied_gated_mlp_step(u, V, gamma)) == \
        C.mlp_flops(N, Dh, Dm, kind="cem_step")
    assert counted(lambda: reference.tied_gated_mlp_step(u, V, gamma).sum().backward(),
                   grad=True) == \
        C.mlp_flops(N, Dh, Dm, kind="cem_step", mode="fwd_bwd")
    with pytest.raises(ValueError, match="kind"):
        C.mlp_flops(N, Dh, Dm, kind="gelu")


def test_compulsory_bytes_are_the_tensors_read_and_written():
    B, K, L, D = 2, 3, 9, 4
    q, kv, k, v = (torch.randn(B, K, L, D, dtype=torch.float16) for _ in range(4))
    o, lse = reference.tied_attention(q, kv, scale=0.5)
    assert lse.dtype == torch.float32
    tied = sum(t.nbytes for t in (q, kv, o, lse))
    untied = sum(t.nbytes for t in (q, k, v, o, lse))
    assert C.attention_bytes(B, K, L, D, tied=True) == tied
    assert C.attention_bytes(B, K, L, D, tied=False) == untied


def test_streamed_rows_and_intensity_limit():
    assert C.key_rows_streamed(100, 128) == 100                      # one tile reads every key once
    assert C.key_rows_streamed(100, 16, causal=False) == 7 * 100
    for L, bm in [(4096, 64), (512, 128)]:
        assert C.key_rows_streamed(L, bm) == L * (L + bm) // (2 * bm)
    assert C.key_rows_streamed(37, 16) == 16 + 32 + 37
    L = 2**16
    for tied, n_kv in ((False, 2), (True, 1)):
        c = C.attention_cost(1, 1, L, 64, tied=tied, block_m=64)
        assert c.intensity == pytest.approx(4 * 64 / (n_kv * 2), rel=0.02)
    # decode: one FLOP per byte untied in bf16, two tied; the shared diagonal gives it back
    dec = {t: C.attention_cost(4, 12, 4096, 64, tied=t, phase="decode") for t in (False, True)}
    assert dec[False].intensity == pytest.approx(1.0, rel=1e-3)
    assert dec[True].intensity == pytest.approx(2.0, rel=1e-3)
    diag = C.attention_cost(4, 12, 4096, 64, tied=True, phase="decode", extra_width=768)
    assert diag.bytes == pytest.approx(dec[False].bytes, rel=1e-3)
    with pytest.raises(ValueError, match="phase"):
        C.attention_bytes(1, 1, 4, 4, tied=True, phase="backward")


def test_mlp_cost_and_cache():
    sw = C.mlp_cost(1, 768, 3072, kind="swiglu")
    twice = C.mlp_cost(1, 768, 3072, kind="cem", v_passes=2)
    once = C.mlp_cost(1, 768, 3072, kind="cem", v_passes=1)
    assert sw.flops == twice.flops == once.flops and sw.bytes == twice.bytes
    assert once.bytes / sw.bytes == pytest.approx(2 / 3, rel=1e-3)   # weights dominate at N = 1
    with pytest.raises(ValueError, match="v_passes"):
        C.mlp_cost(1, 8, 8, kind="cem", v_passes=3)
    untied = C.kv_cache_bytes_per_token(12, 64, tied=False)
    assert C.kv_cache_bytes_per_token(12, 64, tied=True) * 2 == untied == 2 * 2 * 768
    assert C.kv_cache_bytes_per_token(12, 64, tied=True, extra_width=768) == untied


def test_machine_roofline():
    m = C.Machine("toy", 100.0, 2.0, "made up")
    assert m.ridge == 50.0
    assert m.attainable(10.0) == 20.0 and m.attainable(1000.0) == 100.0
    c = C.Cost(flops=1e12, bytes=1e10)                               # intensity 100: compute-bound
    assert c.intensity == 100.0 and c.time_bound(m) == pytest.approx(1e12 / 100e12)
    assert (c + c).flops == 2e12
    assert C.H100_SXM_DATASHEET.ridge == pytest.approx(295.4, abs=0.1)
    with pytest.raises(ValueError, match="positive"):
        C.Machine("bad", 0.0, 1.0, "x")


def test_tie_comparison():
    fwd = C.tie_comparison(phase="forward", L=1024, batch=2, n_heads=4, head_dim=32, d_ff=512)
    assert set(fwd) == {"attention, untied", "attention, tied", "MLP, SwiGLU",
                        "MLP, tied, V read twice", "MLP, tied, V read once"}
    assert fwd["attention, tied"].flops == fwd["attention, untied"].flops
    assert fwd["attention, tied"].bytes < fwd["attention, untied"].bytes
    dec = C.tie_comparison(phase="decode", L=1024, batch=1, n_heads=4, head_dim=32, d_ff=512)
    assert dec["MLP, SwiGLU"].flops == C.mlp_flops(1, 128, 512, kind="swiglu")


def _stored(name):
    path = RESULTS / name
    if not path.is_file():
        pytest.skip(f"stored benchmark {name} not present")
    return json.loads(path.read_text())


def test_attention_peak_memory_model_matches_the_stored_h100_run():
    data = _stored("attention_NVIDIA_H100_80GB_HBM3.json")
    rows = [r for r in data["results"] if r["method"] == "cem_triton"]
    assert len(rows) == 8
    for r in rows:
        model = C.tied_attention_peak_bytes(r["B"], r["H"], r["T"], r["d"], mode=r["mode"]) / 2**20
        assert model == pytest.approx(r["peak_mem_mb"], abs=0.01), r


def test_gated_step_peak_memory_model_matches_the_stored_h100_run():
    data = _stored("mlp_NVIDIA_H100_80GB_HBM3.json")
    rows = [r for r in data["results"] if r["op"] == "step" and r["mode"] == "fwd_bwd"
            and r["method"] in ("triton", "eager")]
    assert len(rows) == 8
    for r in rows:
        impl = "fused" if r["method"] == "triton" else "eager"
        model = C.gated_step_peak_bytes(r["N"], r["D_h"], r["D_v"], impl=impl) / 2**20
        assert model == pytest.approx(r["peak_mem_mb"], abs=1.0), r   # allocator rounding


def test_gated_step_v2_peak_memory_model_matches_the_cpu_prediction():
    """The v2 step's model against its peak measured on the CPU at the GPU benchmark's shapes
    (benchmarks/bench_mlp.py --memory-cpu, which reproduces the H100's eager peaks exactly)."""
    data = _stored("mlp_memory_cpu.json")
    rows = [r for r in data["rows"] if r["method"] in ("v2", "eager")]
    assert len(rows) == 8
    for r in rows:
        model = C.gated_step_peak_bytes(r["N"], r["D_h"], r["D_v"], impl=r["method"]) / 2**20
        assert model == pytest.approx(r["fwd_bwd_peak_bf16_mib"], abs=1e-9), r
        if r["method"] == "v2":
            eager = C.gated_step_peak_bytes(r["N"], r["D_h"], r["D_v"], impl="eager")
            assert model * 2**20 / eager <= 0.7  # the target


def test_peak_models_limits():
    assert C.tied_attention_peak_bytes(1, 1, 8, 4, mode="fwd") == 8 * 4 * 2 + 8 * 4
    with pytest.raises(ValueError, match="impl"):
        C.gated_step_peak_bytes(8, 4, 16, impl="magic")
    big = [C.gated_step_peak_bytes(2**30, 256, 1024, impl=i) for i in ("fused", "eager")]
    assert big[0] / big[1] == pytest.approx(2 / 3, rel=1e-3)      # (3r + 2) / (5r + 1) at r = 4


def test_roofline_small_multiples_and_panel_points():
    from cemlib.viz import roofline as R

    settings = [dict(phase="forward", L=2048, batch=2, block_m=64), dict(phase="decode", L=2048, batch=4),
                dict(phase="decode", L=512, batch=1)]
    fig = R.roofline_small_multiples(settings, ncols=2)
    visible = [ax for ax in fig.axes if ax.get_visible()]
    assert len(visible) == 3 and len(fig.axes) == 4
    for ax, setting in zip(visible, settings):
        costs = C.tie_comparison(n_heads=12, head_dim=64, d_ff=4 * 768, **setting)
        labelled = [line for line in ax.lines if not line.get_label().startswith("_")]
        assert labelled[0].get_label().startswith("roofline")
        points = labelled[1:]
        assert [p.get_label() for p in points] == list(costs)
        for p, cost in zip(points, costs.values()):
            x, y = p.get_xydata()[0]
            assert x == pytest.approx(cost.intensity)
            assert y == pytest.approx(C.H100_SXM_DATASHEET.attainable(cost.intensity))
        assert "FLOP/byte" in ax.get_xlabel() or not ax.get_xlabel()
    with pytest.raises(ValueError, match="phase"):
        R.roofline_panel(visible[0], phase="train")
    png, costs = R.render_roofline_png(phase="decode", L=256, batch=2, dpi=30)
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(costs) == 5


def test_roofline_explorer_reacts_to_controls():
    pytest.importorskip("ipywidgets")
    from cemlib.viz import roofline as R

    w = R.roofline_explorer(phase="forward", L=1024, batch=4, head_dim=64, block_m=64)
    assert repr(w) == "RooflineExplorer(phase='forward', L=1024, batch=4, head_dim=64, block_m=64)"
    before = w.image.value
    assert "tied/untied" in w.info.value and not w.block_m.disabled
    w.phase.value = "decode"
    assert w.block_m.disabled and w.image.value != before
    assert "tied/untied 0.50" in w.info.value                        # bandwidth-bound: half the bytes


def test_instruction_budget_per_score_element():
    """The H100 numbers: 4096 dense bf16 FLOP and 128 issued instructions per clock per SM, so
    at head width 64 the forward loop (2 products) may spend 8 non-MMA instructions per score
    element, the backward's d kv loop (4) 16 and its dq loop (3) 12; one exp2 per element takes
    exactly as long as the forward's products (16 MUFU results per clock)."""
    assert C.H100_SM.mma_flops_per_clock * 132 * 1.83e9 == pytest.approx(989.4e12, rel=1e-3)
    assert [C.instruction_budget(64, n) for n in (2, 4, 3)] == [8.0, 16.0, 12.0]
    assert C.instruction_budget(128, 2) == 16.0
    t = C.loop_time_bound(8.0, 64, 2)
    assert t["mma"] == t["issue"] == t["mufu"] == 1 / 16 and t["peak_fraction"] == 1.0
    slow = C.loop_time_bound(24.0, 64, 2)   # three times the budget: a third of the peak at most
    assert slow["bound"] == slow["issue"] and slow["peak_fraction"] == pytest.approx(1 / 3)
    with pytest.raises(ValueError):
        C.instruction_budget(0, 2)


def test_count_flops_runs_without_grad_and_counts_cpu_attention():
    """``count_flops`` runs ``fn`` under ``no_grad`` (a backward inside fails there; ``grad=True``
    counts it), refuses what is not callable, and counts the CPU kernel of
    ``scaled_dot_product_attention`` (which PyTorch's counter misses) like the explicit
    products: ``softmax(q k^T) v`` with the full ``L x L`` score matrix."""
    import torch.nn.functional as F
    g = torch.Generator().manual_seed(1)
    q, k, v = (torch.randn(2, 3, 7, 4, generator=g, requires_grad=True) for _ in range(3))
    seen = []
    C.count_flops(lambda: seen.append(torch.is_grad_enabled()))
    C.count_flops(lambda: seen.append(torch.is_grad_enabled()), grad=True)
    assert seen == [False, True]
    with pytest.raises(RuntimeError):
        C.count_flops(lambda: (q * 2).sum().backward())
    with pytest.raises(TypeError, match="callable"):
        C.count_flops(3)
    sdpa = C.count_flops(lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True))
    explicit = C.count_flops(lambda: torch.softmax(q @ k.transpose(-1, -2), -1) @ v)
    assert sdpa == explicit == 4 * 2 * 3 * 7 * 7 * 4


def test_count_launches_counts_kernels_not_views():
    from cemlib.kernels.launches import count_launches
    a = torch.randn(4, 6)
    with count_launches() as n:
        b = (a @ a.T).relu()          # two kernels
        c = b.view(16).transpose(0, 0)  # views: none
        torch.empty(5)                # an allocation: none
        c.sum()                       # one
    assert dict(n.torch) == {"mm": 1, "relu": 1, "sum": 1} and not n.triton and n.total == 3


def test_count_operators_counts_every_dispatch():
    """``count_operators``: every ATen operator the call dispatches, views, allocations and
    in-place updates included (each a dispatch on the host), where ``count_launches`` counts
    only those that launch a kernel."""
    from cemlib.kernels.launches import OperatorCounter, count_operators
    a = torch.randn(4, 6)

    def call():
        b = (a @ a.T).relu_()         # permute (a.T), mm, relu_
        b.view(16).transpose(0, 0)    # view, transpose
        torch.empty(5)                # empty
    assert count_operators(call) == 6
    with OperatorCounter() as counter:
        call()
    assert counter.total == 6 and counter.counter["mm.default"] == 1
