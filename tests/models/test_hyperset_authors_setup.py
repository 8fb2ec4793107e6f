"""The options that reproduce the Hyper-SET authors' released code (github.com/huyunzhe/hyper-set):
learnable RMSNorm gains, their step-size network and time embedding, their Sudoku head and
initialisation, their image patch embedding, and Fig. 6's rank and angle on the normalised per-head
projections. Each test compares against a line-by-line re-statement of the released code (written
out here in plain torch), so it fails if the option is missing or computes something else."""

import math

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from cemlib.energies import hyperset as hs
from cemlib.layers.hyperset import (BiSoftmaxAttention, StepSizeNet, TiedReLUFeedForward, qkv_update,
                                    timestep_embedding)
from cemlib.layers.hyperset_variants import LinearAttention, SigmoidAttention
from cemlib.metrics import average_angle, effective_rank, separation_per_iteration, subspace_tokens
from cemlib.models.hyperset import HyperSETModel
from cemlib.models.recurrent_transformer import RecurrentTransformer
from cemlib.normalization import rms_norm
from cemlib.train.registry import build, get_config

EPS = 1e-6


@pytest.fixture(autouse=True)
def _float64():
    old = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    yield
    torch.set_default_dtype(old)


def _rms(x, g=None):
    y = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + EPS)
    return y if g is None else y * g


def _randomise(module, gen):
    with torch.no_grad():
        for p in module.parameters():
            p.copy_(0.3 * torch.randn(p.shape, generator=gen) + (1.0 if p.dim() == 1 else 0.0))


# ------------------------------------------------------------------------------ attention gains
def _authors_attention(x, Wqkv, H, gq, gk, gv, score="bisoftmax"):
    """released code, HyperSETAttention / HyperSETAlterAttention.forward (qkv = x @ Wqkv^T)."""
    B, T, C = x.shape
    p = C // H
    w = (x @ Wqkv.T).view(B, T, H, p).transpose(1, 2)
    q, k, v = _rms(w, gq), _rms(w, gk), _rms(w, gv)
    if score == "linear":
        att = torch.sigmoid(q).transpose(-1, -2) @ torch.sigmoid(k) / math.sqrt(p)
        y = (torch.sigmoid(v) @ att) * (torch.sigmoid(q) * (1 - torch.sigmoid(q)))
        return y.transpose(1, 2).reshape(B, T, C) @ Wqkv
    att = torch.einsum("bhif,bhjf->bhij", q, k) / math.sqrt(p)
    if score == "bisoftmax":
        s = F.softmax(att, dim=-1) + F.softmax(att, dim=-2)
    else:
        s = torch.sigmoid(att) * (1 - torch.sigmoid(att))
    y = torch.einsum("bhij,bhjf->bihf", s, v)
    return y.flatten(2) @ Wqkv


@pytest.mark.parametrize("cls,score", [(BiSoftmaxAttention, "bisoftmax"), (SigmoidAttention, "sigmoid"),
                                       (LinearAttention, "linear")])
def test_separate_qkv_gains_match_the_released_attention(cls, score):
    gen = torch.Generator().manual_seed(0)
    d, H, N = 12, 3, 7
    attn = cls(d, H, qkv_gain="separate")
    _randomise(attn, gen)
    x = torch.randn(2, N, d, generator=gen)
    ref = _authors_attention(x, attn.W.T, H, attn.q_gain, attn.k_gain, attn.v_gain, score)
    torch.testing.assert_close(attn.descent_direction(x), -ref, rtol=1e-10, atol=1e-10)
    # the gains matter: the unit-gain layer with the same W gives another direction
    plain = cls(d, H)
    with torch.no_grad():
        plain.W.copy_(attn.W)
    assert (plain.descent_direction(x) + ref).abs().max() > 1e-3
    # 1-D parameters (not weight-decayed by cemlib.train.optim)
    assert {n for n, p in attn.named_parameters() if p.dim() == 1} == {"q_gain", "k_gain", "v_gain"}


def test_shared_gain_is_eq9_on_the_gained_projections_and_keeps_symmetry():
    gen = torch.Generator().manual_seed(1)
    d, H, N = 12, 3, 6
    attn = BiSoftmaxAttention(d, H, qkv_gain="shared")
    _randomise(attn, gen)
    x = torch.randn(N, d, generator=gen)
    g = attn.qkv_gain_
    # released Sudoku code: one RMSNorm (gain g) for Q, K and V
    ref = _authors_attention(x[None], attn.W.T, H, g, g, g)[0]
    torch.testing.assert_close(attn.descent_direction(x), -ref, rtol=1e-10, atol=1e-10)
    # = minus the eq. (7) gradient, evaluated at U = g * RMSNorm(Z): symmetric score, one energy
    U = _rms(hs.split_heads(x @ attn.W, H), g)
    torch.testing.assert_close(attn.descent_direction(x), -hs.merge_heads(hs.bisoftmax_grad(U)) @ attn.W.T)
    # with Q = K = V the general q/k/v update reduces to each kernel's gradient
    for kind, (_, grad) in hs.ATTENTION_KERNELS.items():
        torch.testing.assert_close(qkv_update(kind, U, U, U), grad(U))
    # separate gains with equal values = the shared gain
    sep = BiSoftmaxAttention(d, H, qkv_gain="separate")
    with torch.no_grad():
        sep.W.copy_(attn.W)
        for name in ("q_gain", "k_gain", "v_gain"):
            getattr(sep, name).copy_(g)
    torch.testing.assert_close(sep.descent_direction(x), attn.descent_direction(x))


def test_separate_gains_keep_the_score_symmetric_but_not_the_gradient():
    """Diagonal gains commute: Q K^T = U diag(g_q g_k) U^T stays symmetric. The update is the
    U-gradient of eq. (3) with that metric only when g_v = g_q g_k."""
    gen = torch.Generator().manual_seed(2)
    attn = BiSoftmaxAttention(8, 2, qkv_gain="separate")
    _randomise(attn, gen)
    U = rms_norm(hs.split_heads(torch.randn(5, 8, generator=gen) @ attn.W, 2)).detach().requires_grad_()
    gq, gk, gv = attn.q_gain.detach(), attn.k_gain.detach(), attn.v_gain.detach()
    G = (U * gq) @ (U * gk).transpose(-1, -2)
    torch.testing.assert_close(G, G.transpose(-1, -2))
    beta = 0.5
    E = torch.logsumexp(beta * G, -1).sum() / beta
    (grad,) = torch.autograd.grad(E, U)
    torch.testing.assert_close(qkv_update("bisoftmax", U * gq, U * gk, U * gq * gk, beta), grad)
    assert (qkv_update("bisoftmax", U * gq, U * gk, U * gv, beta) - grad).abs().max() > 1e-2


def test_default_attention_and_ff_have_no_gains():
    assert [n for n, _ in BiSoftmaxAttention(8, 2).named_parameters()] == ["W"]
    assert [n for n, _ in TiedReLUFeedForward(8, 16).named_parameters()] == ["D"]
    with pytest.raises(ValueError, match="qkv_gain"):
        BiSoftmaxAttention(8, 2, qkv_gain="per-head")


# ------------------------------------------------------------------------------ feed-forward gain
def test_ff_gain_matches_the_released_feedforward():
    gen = torch.Generator().manual_seed(3)
    d, M = 6, 24
    ff = TiedReLUFeedForward(d, M, gain=True)
    _randomise(ff, gen)
    x = torch.randn(4, d, generator=gen)
    # released code: F.linear(relu(ln2(mlp(x))), mlp.weight.t()), mlp.weight = D^T, ln2 gain g
    ref = F.relu(_rms(x @ ff.D, ff.gain)) @ ff.D.T
    torch.testing.assert_close(ff.descent_direction(x), ref)
    assert (TiedReLUFeedForward(d, M).descent_direction(x) - ref).abs().max() > 0  # uses its own D
    plain = TiedReLUFeedForward(d, M)
    with torch.no_grad():
        plain.D.copy_(ff.D)
    assert (plain.descent_direction(x) - ref).abs().max() > 1e-3


# ------------------------------------------------------------------------------ step sizes
def _authors_time_embedding(t, dim):
    """released layers/pos_embed.py SinusoidalPosEmb.forward."""
    half = dim // 2
    scale = math.log(10000) / (half - 1)
    freqs = torch.exp(torch.arange(half) * -scale)
    emb = t[:, None] * freqs[None, :]
    return torch.cat((emb.sin(), emb.cos()), dim=-1)


def test_authors_time_embedding_spacing_order():
    ts = torch.arange(1, 6, dtype=torch.float64)
    ref = _authors_time_embedding(ts, 512)
    ours = torch.stack([timestep_embedding(int(t), 512, torch.float64, style="authors") for t in ts])
    torch.testing.assert_close(ours, ref)
    # cemlib's own embedding is a different function (cos first, spacing 1/half)
    cem = torch.stack([timestep_embedding(int(t), 512, torch.float64) for t in ts])
    assert (cem - ref).abs().max() > 0.5
    with pytest.raises(ValueError, match="style"):
        timestep_embedding(1, 8, style="glide")


def test_step_net_authors_counts_from_one_and_conditions_on_the_raw_input():
    gen = torch.Generator().manual_seed(4)
    d, fd = 8, 16
    net = StepSizeNet(d, fd, time_embedding="authors", cond_norm=False)
    _randomise(net, gen)
    x0 = 3.0 * torch.randn(5, d, generator=gen)                         # RMS far from 1
    for t in range(3):
        emb = _authors_time_embedding(torch.tensor([t + 1.0]), fd)[0]   # released code: t = 1..L
        c = net.time_mlp(emb) + x0                                      # c + x_inp, no norm
        ref = net.out(F.gelu(c)).chunk(2, dim=-1)
        for a, b in zip(net(t, x0), ref):
            torch.testing.assert_close(a, b)
    normed = StepSizeNet(d, fd, time_embedding="authors")
    normed.load_state_dict(net.state_dict())
    assert (normed(0, x0)[0] - net(0, x0)[0]).abs().max() > 1e-3


def test_step_net_zero_time_mlp():
    net = StepSizeNet(8, 16, zero_time_mlp=True)
    for lin in (net.time_mlp[0], net.time_mlp[2], net.out):
        assert lin.weight.abs().max() == 0 and lin.bias.abs().max() == 0
    default = StepSizeNet(8, 16)
    assert default.time_mlp[0].weight.abs().max() > 0 and default.out.weight.abs().max() == 0


# ------------------------------------------------------------------------------ the whole Sudoku model
AUTHORS_SUDOKU = dict(qkv_gain="shared", ff_gain=True, time_embedding="authors", step_cond_norm=False,
                      step_zero_time_mlp=True, head="rmsnorm", init_std=0.02)


def _authors_sudoku_forward(m, idx):
    """released sudoku/models.py, model_type "hyper-set", gd_with_learnable_step_size, eval mode."""
    L, layer = m.n_iter, m.layer
    Wqkv, Wmlp, H = layer.attention.W.T, layer.feedforward.D.T, layer.attention.n_heads
    sn = layer.step_net
    x = m.embed.weight[idx] + m.pos
    time_emb = sn.time_mlp(_authors_time_embedding(torch.arange(1, L + 1, dtype=torch.float64), sn.freq_dim))
    x_inp = x
    for r in range(L):
        alpha, beta = sn.out(F.gelu(time_emb[r].expand_as(x) + x_inp)).chunk(2, dim=-1)
        g = layer.attention.qkv_gain_
        x = x - alpha * _authors_attention(x, Wqkv, H, g, g, g)
        x = x + beta * (F.relu(_rms(x @ Wmlp.T, layer.feedforward.gain)) @ Wmlp)
    return m.head[1](m.head[0](x))


def test_authors_sudoku_model_matches_the_released_forward():
    gen = torch.Generator().manual_seed(5)
    torch.manual_seed(0)
    m = HyperSETModel(d=16, n_heads=4, n_iter=3, n_classes=9, n_positions=81, vocab_size=10,
                      ff_dim=64, freq_dim=32, **AUTHORS_SUDOKU)
    assert m.head[1].bias is None and isinstance(m.head[0], nn.RMSNorm)
    _randomise(m, gen)                                     # the zero-initialised parts too
    idx = torch.randint(0, 10, (2, 81), generator=gen)
    torch.testing.assert_close(m(idx), _authors_sudoku_forward(m, idx))


def test_init_std_draws_the_weights_and_leaves_the_step_net_at_zero():
    torch.manual_seed(0)
    m = HyperSETModel(d=64, n_heads=4, n_iter=2, n_classes=9, n_positions=81, vocab_size=10,
                      ff_dim=256, **AUTHORS_SUDOKU)
    for w in (m.embed.weight, m.layer.attention.W, m.layer.feedforward.D, m.head[1].weight):
        assert abs(w.std().item() - 0.02) < 0.004
    sn = m.layer.step_net
    assert all(p.abs().max() == 0 for p in sn.parameters())
    d = HyperSETModel(d=64, n_heads=4, n_iter=2, n_classes=9, n_positions=81, vocab_size=10)
    assert d.embed.weight.std() > 0.5                     # nn.Embedding's N(0, 1) by default
    with pytest.raises(ValueError, match="init_std"):
        HyperSETModel(d=8, n_heads=2, n_iter=1, n_classes=2, n_positions=4, vocab_size=3, init_std=-1.0)


def test_default_model_is_unchanged():
    torch.manual_seed(0)
    m = HyperSETModel(d=16, n_heads=4, n_iter=2, n_classes=9, n_positions=81, vocab_size=10)
    names = {n for n, _ in m.named_parameters()}
    assert not any("gain" in n for n in names)
    assert isinstance(m.head[0], nn.LayerNorm) and m.head[1].bias is not None
    assert isinstance(m.embed, nn.Embedding)


# ------------------------------------------------------------------------------ image patch embedding
def test_patch_embed_layernorm_linear_layernorm():
    gen = torch.Generator().manual_seed(6)
    m = HyperSETModel(d=16, n_heads=2, n_iter=1, n_classes=10, n_positions=16, patch_dim=4, pool="cls",
                      positional="sinusoidal", patch_embed="ln_linear_ln")
    _randomise(m.embed, gen)
    x = torch.randn(3, 16, 4, generator=gen) * 5 + 2
    ln0, lin, ln1 = m.embed
    ref = F.layer_norm(F.layer_norm(x, (4,), ln0.weight, ln0.bias) @ lin.weight.T + lin.bias, (16,),
                       ln1.weight, ln1.bias)
    X0 = m.embed_inputs(x)
    torch.testing.assert_close(X0[:, 1:] - m.pos[1:], ref)
    assert isinstance(HyperSETModel(d=16, n_heads=2, n_iter=1, n_classes=10, n_positions=16, patch_dim=4)
                      .embed, nn.Linear)
    with pytest.raises(ValueError, match="patch"):
        HyperSETModel(d=8, n_heads=2, n_iter=1, n_classes=2, n_positions=4, vocab_size=3,
                      patch_embed="ln_linear_ln")


# ------------------------------------------------------------------------------ Fig. 6 measurements
def test_rank_on_normalised_per_head_projections_as_the_released_code():
    gen = torch.Generator().manual_seed(7)
    d, H, N = 12, 3, 10
    W = torch.randn(d, H * 4, generator=gen)
    X = torch.randn(2, N, d, generator=gen) * torch.linspace(0.1, 5.0, N)[:, None]  # very unequal norms
    sep_n = separation_per_iteration([X], W, H, normalize=True)
    sep_r = separation_per_iteration([X], W, H)
    # released code: w = F.rms_norm(qkv(x) per head); exp(entropy of s / sum s)
    w = F.rms_norm(hs.split_heads(X @ W, H), (4,), eps=EPS)
    s = torch.linalg.svdvals(w)
    p = s / s.sum(-1, keepdim=True)
    torch.testing.assert_close(sep_n["erank"][0], (-(p * p.log()).sum(-1)).exp())
    assert (sep_n["erank"] - sep_r["erank"]).abs().max() > 0.05
    torch.testing.assert_close(sep_n["angle"], sep_r["angle"])          # cosines ignore lengths
    torch.testing.assert_close(sep_n["full_erank"], sep_r["full_erank"])
    torch.testing.assert_close(sep_r["full_erank"][0], effective_rank(X))
    torch.testing.assert_close(subspace_tokens(X, W, H, normalize=True), w)


def test_mean_pairwise_angle_as_the_released_code():
    gen = torch.Generator().manual_seed(8)
    X = torch.randn(2, 3, 9, 5, generator=gen)
    U = F.normalize(X, dim=-1)
    ang = torch.acos((U @ U.transpose(-1, -2)).clamp(-1, 1))
    mask = ~torch.eye(9, dtype=torch.bool)
    ref = torch.rad2deg(ang[..., mask].mean(-1))
    torch.testing.assert_close(average_angle(X, of="angle"), ref)
    assert (average_angle(X) - ref).abs().max() > 1.0                   # eq. (18) is another number
    # equiangular (orthonormal) tokens: both read 90 degrees
    torch.testing.assert_close(average_angle(torch.eye(4), of="angle"), torch.tensor(90.0))
    with pytest.raises(ValueError, match="of"):
        average_angle(X, of="median")


# ------------------------------------------------------------------------------ baseline and trainer
def test_authors_transformer_baseline_rmsnorm_no_bias():
    d, M = 16, 64
    m = RecurrentTransformer(d=d, n_heads=4, n_iter=2, n_classes=9, n_positions=81, vocab_size=10,
                             norm="rmsnorm", bias=False, head="rmsnorm")
    layer = sum(p.numel() for p in m.layer.parameters())
    assert layer == 4 * d * d + 2 * d * M + 2 * d                       # W_QKV, W_O, MLP, two gains
    assert isinstance(m.layer.ln1, nn.RMSNorm) and m.head[1].bias is None
    default = RecurrentTransformer(d=d, n_heads=4, n_iter=2, n_classes=9, n_positions=81, vocab_size=10)
    assert sum(p.numel() for p in default.layer.parameters()) == layer + 4 * d + M + d + 2 * d


def test_trainer_reaches_the_options():
    cfg = get_config("sudoku-hyperset", "cpu", ["model.qkv_gain=separate", "model.ff_gain=true",
                                                 "model.time_embedding=authors", "model.head=rmsnorm"])
    model, _ = build(cfg)
    att = model.layer.attention
    assert att.qkv_gain == "separate" and model.layer.feedforward.gain is not None
    assert model.layer.step_net.time_embedding == "authors" and isinstance(model.head[0], nn.RMSNorm)
    for name in ("sudoku-hyperset-authors", "digits-hyperset-authors", "sudoku-transformer-authors",
                 "digits-transformer-authors"):
        model, _ = build(get_config(name, "cpu"))
        assert model.head is not None
    m, _ = build(get_config("sudoku-hyperset-authors", "cpu"))
    assert m.layer.attention.qkv_gain == "shared" and m.layer.step_net.cond_norm is False
    m, _ = build(get_config("digits-hyperset-authors", "cpu"))
    assert isinstance(m.embed, nn.Sequential) and m.layer.attention.qkv_gain == "separate"


@pytest.mark.parametrize("name,tiny", [
    ("sudoku-hyperset-authors", ["task.n_train=64", "task.val_fraction=0.005", "task.n_test=40", "model.d=16",
                                 "model.ff_dim=64", "model.n_iter=2", "model.n_heads=2"]),
    ("digits-hyperset-authors", ["model.d=16", "model.ff_dim=16", "model.n_iter=2", "model.n_heads=2"])])
def test_authors_experiments_train_and_resume_exactly(name, tiny, tmp_path):
    from cemlib.train import run_experiment
    torch.set_default_dtype(torch.float32)
    ovr = tiny + ["train.max_steps=4", "train.eval_interval=2", "train.eval_batches=1", "train.batch_size=8",
                  "train.log_interval=1", "optim.warmup_steps=1"]
    full = run_experiment(name, "cpu", ovr, out_dir=tmp_path / "full", verbose=False)
    assert all(math.isfinite(v) for v in full["metrics"]["final"].values())
    run_experiment(name, "cpu", ovr, out_dir=tmp_path / "part", until=2, verbose=False)
    resumed = run_experiment(name, "cpu", ovr, out_dir=tmp_path / "part", verbose=False,
                             resume=tmp_path / "part" / "ckpt_000002.pt")
    assert resumed["metrics"]["final"] == full["metrics"]["final"]
