"""Decoding with a cache: the same logits and text as the whole window, for every causal family.

Every model that generates text (``LanguageModel`` with Llama or CEM attention in each variant,
GPT, the recurrent GPT, NRGPT, the Newton Transformer) is run twice on the same tokens: whole
(``model(idx)``) and incrementally (a prefill, then chunks and single tokens into a
``DecodeCache``). The logits agree to rounding (float64 1e-10, float32 1e-5), greedy and sampled
text agree token for token, also for prompts longer than the window, and the bytes every cache
keeps per token equal the one formula, :func:`cemlib.kernels.costs.kv_cache_bytes_per_token`.
"""

import math

import pytest
import torch

from cemlib.kernels import costs
from cemlib.kernels.reference import alibi_slopes, attention_bias, tied_attention
from cemlib.layers.cache import DecodeCache, KVCache, tied_attention_cached
from cemlib.layers.cem_attention import CEMAttention
from cemlib.layers.cem_mlp import CEMMLP
from cemlib.models.generation import generate
from cemlib.models.lm import LanguageModel, LMConfig
from cemlib.models.newton_transformer import NewtonTransformer
from cemlib.models.nrgpt import AUTHORS_NRGPT, GPTModel, NRGPTModel, RecurrentGPTModel
from cemlib.models.params import kv_cache_bytes_per_token

V, C, D = 13, 12, 16  # vocabulary, context window, width of every model here

LM = {  # LMConfig options: every attention variant of LanguageModel
    "llama-rope": {},
    "llama-alibi": dict(pos="alibi"),
    "llama-nopos": dict(pos="none", mlp="cem"),
    "llama-reuse2": dict(reuse_attn=2, reuse_mlp=2),
    "cem": dict(attn="cem", mlp="cem"),
    "cem-T3": dict(attn="cem", mlp="cem", T_attn=3, T_mlp=2),
    "cem-diag-none": dict(attn="cem", diag="none"),
    "cem-diag-head": dict(attn="cem", diag="per_head", T_attn=2),
    "cem-diag-paper": dict(attn="cem", diag_grad="paper", T_attn=2),
    "cem-no-alibi-no-bias": dict(attn="cem", alibi=False, self_cross_bias=False),
    "cem-no-query-norm": dict(attn="cem", query_norm=False, T_attn=2),
    "cem-precond-diag": dict(attn="cem", mlp="cem", precond_attn="diag", T_attn=2),
    "cem-precond-dplr": dict(attn="cem", mlp="cem", precond_attn="dplr", precond_rank_attn=2, T_attn=2),
    "cem-reuse2": dict(attn="cem", mlp="cem", reuse_attn=2, reuse_mlp=2),
    "cem-learn-eta-dropout": dict(attn="cem", mlp="cem", learn_eta=True, eta_attn=0.7, dropout=0.1),
    "cem-head-dim": dict(attn="cem", head_dim=6, tau="model"),
}
OTHER = {  # the other families: constructor and options
    "gpt": lambda: GPTModel(V, C, D, 2, n_layers=2),
    "rgpt-parallel": lambda: RecurrentGPTModel(V, C, D, 2, n_steps=2),
    "rgpt-sequential": lambda: RecurrentGPTModel(V, C, D, 2, n_steps=2, block="sequential"),
    "nrgpt": lambda: NRGPTModel(V, C, D, 2, n_steps=2),
    "nrgpt-authors-inclusive": lambda: NRGPTModel(V, C, D, 2, n_steps=3, mask="inclusive",
                                                  **AUTHORS_NRGPT),
    "newton-mha": lambda: NewtonTransformer(V, C, D, n_layers=2, n_heads=2, attn="mha"),
    "newton-2nd1st": lambda: NewtonTransformer(V, C, D, n_layers=2, n_heads=2, attn="mha2nd1st"),
    "newton-2nd1st-paper": lambda: NewtonTransformer(V, C, D, n_layers=2, n_heads=2, attn="mha2nd1st",
                                                     form="paper", ffn=False),
}
FAMILIES = sorted(LM) + sorted(OTHER)
TOL = {torch.float64: 1e-10, torch.float32: 1e-5}


@pytest.fixture(autouse=True, scope="module")
def one_thread():
    """One intra-op thread: these models are tiny, and on a shared, busy CPU two threads per call
    made the module many times slower."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def build(name: str, dtype=torch.float64) -> torch.nn.Module:
    """The model ``name`` in eval mode, every parameter moved off its initial value (zero
    diagonals and biases would hide their cache paths)."""
    torch.manual_seed(0)
    if name in LM:
        model = LanguageModel(LMConfig(vocab_size=V, context_length=C, d_model=D, n_layers=2,
                                       n_heads=2, **LM[name]))
    else:
        model = OTHER[name]()
    model = model.to(dtype).eval()
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.1 * torch.randn_like(p))
    return model


def tokens(batch: int, length: int, seed: int = 1) -> torch.Tensor:
    return torch.randint(0, V, (batch, length), generator=torch.Generator().manual_seed(seed))


def incremental(model, idx, chunks) -> tuple[torch.Tensor, DecodeCache]:
    """Logits of ``idx`` fed into a new cache in ``chunks`` (their lengths), concatenated."""
    cache, out, i = model.new_cache(), [], 0
    with torch.no_grad():
        for n in chunks:
            out.append(model(idx[:, i:i + n], cache=cache))
            i += n
    return torch.cat(out, 1), cache


# ------------------------------------------------------------------------------ the logits
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32], ids=["f64", "f32"])
@pytest.mark.parametrize("name", FAMILIES)
def test_cached_logits_equal_the_whole_forward(name, dtype):
    model = build(name, dtype)
    idx = tokens(2, C)
    with torch.no_grad():
        whole = model(idx)
    assert torch.equal(incremental(model, idx, [C])[0], whole)      # the prefill: the same code
    cached, cache = incremental(model, idx, [4, 3] + [1] * (C - 7))  # a chunk, then one by one
    tol = TOL[dtype]
    torch.testing.assert_close(cached, whole, rtol=tol, atol=tol)
    assert cache.length == C


@pytest.mark.parametrize("name", FAMILIES)
def test_cached_text_equals_the_uncached_text(name):
    model = build(name)
    for prompt in (tokens(2, 3), tokens(2, C + 5)):      # fits the window; longer than it
        for kw in (dict(temperature=0), dict(temperature=1.0, top_k=5, seed=3)):
            cached = generate(model, prompt, C + 2, **kw)  # runs past the window
            assert torch.equal(cached, generate(model, prompt, C + 2, use_cache=False, **kw))


# ------------------------------------------------------------------------------ the bytes kept
def _formula(layer, elem: int) -> int:
    """The one formula for ``layer``'s cache (one application)."""
    from cemlib.layers.gpt import CausalSelfAttention
    from cemlib.layers.llama import LlamaAttention
    from cemlib.layers.nrgpt import NRGPTBlock
    from cemlib.layers.newton import MHA2nd1st
    if isinstance(layer, CEMAttention):
        return costs.kv_cache_bytes_per_token(layer.n_heads, layer.head_dim, tied=True,
                                              extra_width=0 if layer.d is None else layer.d_model,
                                              elem_bytes=elem)
    if isinstance(layer, LlamaAttention):
        return costs.kv_cache_bytes_per_token(layer.n_heads, layer.head_dim, tied=False, elem_bytes=elem)
    if isinstance(layer, CausalSelfAttention):
        return costs.kv_cache_bytes_per_token(layer.n_heads, layer.d_model // layer.n_heads, tied=False,
                                              elem_bytes=elem)
    if isinstance(layer, NRGPTBlock):
        return costs.kv_cache_bytes_per_token(1, layer.d_model, tied=True, elem_bytes=elem)
    assert isinstance(layer, MHA2nd1st)
    return costs.kv_cache_bytes_per_token(layer.n_heads, layer.d_h, tied=True, elem_bytes=elem)


def _attention_layers(model) -> list:
    """The attention layer behind each ``KVCache`` of ``model.new_cache()``, in its order."""
    from cemlib.layers.gpt import CausalSelfAttention
    from cemlib.layers.llama import LlamaAttention
    if isinstance(model, LanguageModel):
        one = [m for m in model.modules() if isinstance(m, (CEMAttention, LlamaAttention))]
        return [layer for layer in one for _ in range(model.config.reuse_attn)]
    if isinstance(model, NRGPTModel):
        return [model.block] * model.n_steps
    if isinstance(model, RecurrentGPTModel):
        return [model.body.block.attn] * model.body.n_steps
    if isinstance(model, GPTModel):
        return [b.attn for b in model.blocks]
    return [b.attn for b in model.blocks]


@pytest.mark.parametrize("name,dtype", [pytest.param(n, torch.float64, id=f"{n}-f64") for n in FAMILIES]
                         + [pytest.param(n, torch.bfloat16, id=f"{n}-bf16") for n in sorted(LM)])
def test_the_bytes_kept_equal_the_formula(name, dtype):
    model = build(name, dtype)
    _, cache = incremental(model, tokens(3, 5), [3, 1, 1])
    elem = torch.finfo(dtype).bits // 8
    entries = cache.entries()
    layers = _attention_layers(model)
    assert len(entries) == len(layers)
    assert [c.bytes_per_token() for c in entries] == [_formula(layer, elem) for layer in layers]
    if isinstance(model, LanguageModel):     # the whole model: the chapters' count
        assert sum(cache.bytes_per_token()) == kv_cache_bytes_per_token(model.config, elem)
        assert len(cache.bytes_per_token()) == model.config.n_layers


def test_the_tie_halves_the_cache_only_without_the_diagonal():
    per_token = {n: sum(incremental(build(n), tokens(1, 4), [4])[1].bytes_per_token())
                 for n in ("llama-rope", "cem-diag-none", "cem")}
    assert per_token["cem-diag-none"] * 2 == per_token["llama-rope"] == per_token["cem"]


# ------------------------------------------------------------------------------ test-time recursion
def test_recursion_changes_T_and_eta_inside_the_block_only():
    model = build("cem-T3")
    idx = tokens(2, 8)
    twin = LanguageModel(LMConfig(vocab_size=V, context_length=C, d_model=D, n_layers=2, n_heads=2,
                                  attn="cem", mlp="cem", T_attn=5, T_mlp=1, eta_attn=0.5)).double().eval()
    twin.load_state_dict(model.state_dict())
    with torch.no_grad():
        before = model(idx)
        with model.recursion(T_attn=5, T_mlp=1, eta_attn=0.5) as m:
            assert m is model and model.config.T_attn == 3        # the config keeps the trained T
            assert {x.T for x in model.modules() if isinstance(x, CEMAttention)} == {5}
            assert torch.equal(model(idx), twin(idx))
        assert torch.equal(model(idx), before)
        with pytest.raises(RuntimeError, match="inside"):
            with model.recursion(T_attn=8):
                raise RuntimeError("inside")
        assert torch.equal(model(idx), before)                   # restored after an error too


def test_one_cache_entry_per_token_serves_every_recursion_step():
    model = build("cem")
    idx = tokens(2, C)
    sizes = set()
    for T in (1, 2, 8):
        with model.recursion(T_attn=T, T_mlp=T), torch.no_grad():
            cached, cache = incremental(model, idx, [5] + [1] * (C - 5))
            torch.testing.assert_close(cached, model(idx), rtol=1e-10, atol=1e-10)
            sizes.add(tuple(cache.bytes_per_token()))
    assert len(sizes) == 1


def test_recursion_rejects_what_it_cannot_change():
    llama, cem, learned = build("llama-rope"), build("cem"), build("cem-learn-eta-dropout")
    for model, kw, match in ((llama, dict(T_attn=2), "needs CEM layers"),
                             (build("cem-diag-none"), dict(T_mlp=2), "needs CEM layers"),
                             (cem, dict(T_attn=0), "T_attn"), (cem, dict(T_mlp=1.5), "T_mlp"),
                             (cem, dict(eta_attn=-1.0), "eta_attn"), (cem, dict(eta_mlp=math.nan), "eta_mlp"),
                             (learned, dict(eta_attn=0.5), "learns its step sizes")):
        with pytest.raises(ValueError, match=match):
            with model.recursion(**kw):
                pass
    assert all(m.T == 1 for m in cem.modules() if isinstance(m, (CEMAttention, CEMMLP)))


# ------------------------------------------------------------------------------ wrong inputs
def test_decoding_rejects_wrong_use_with_one_clear_error():
    model = build("cem")
    cache = model.new_cache()
    with torch.no_grad():
        model(tokens(2, C - 1), cache=cache)
        with pytest.raises(ValueError, match="exceed the context_length 12"):
            model(tokens(2, 2), cache=cache)
        with pytest.raises(ValueError, match="one batch"):
            model(tokens(3, 1), cache=cache)
        with pytest.raises(ValueError, match="this cache has 2 layers, the model 3"):
            LanguageModel(LMConfig(vocab_size=V, context_length=C, d_model=D, n_layers=3, n_heads=2,
                                   attn="cem")).double().eval()(tokens(1, 1), cache=model.new_cache())
        with pytest.raises(ValueError, match="eval mode"):
            model.train()(tokens(1, 1), cache=model.new_cache())
    with pytest.raises(ValueError, match="use_cache must be True or False"):
        generate(model.eval(), tokens(1, 2), 2, use_cache=1)
    with pytest.raises(TypeError, match="no decode cache"):
        generate(_NoCache(), tokens(1, 2), 2)
    assert generate(_NoCache(), tokens(1, 2), 2, use_cache=False).shape == (1, 4)
    with pytest.raises(ValueError, match="do not fit"):
        KVCache(2).append(k=torch.zeros(1, 1, 3, 4))


class _NoCache(torch.nn.Module):
    """A causal model of the generation protocol without a decode cache."""
    context_length, vocab_size = C, V

    def forward(self, idx):
        return torch.zeros(*idx.shape, V)


# ------------------------------------------------------------------------------ the attention rows
@pytest.mark.parametrize("extra", ["none", "shared", "shared-values", "shared-head-sum", "per-head-values"])
def test_cached_tied_attention_is_the_last_rows_of_the_reference(extra):
    g = torch.Generator().manual_seed(0)
    B, K, L, R, n = 2, 3, 9, 4, 3
    q, kv = (torch.randn(B, K, L, R, generator=g, dtype=torch.float64) for _ in range(2))
    kw = dict(scale=0.5, alibi=alibi_slopes(K), self_bias=torch.randn(K, generator=g, dtype=torch.float64),
              cross_bias=torch.randn(K, generator=g, dtype=torch.float64))
    if extra != "none":
        shape = (B, K, L, 5) if extra.startswith("per-head") else (B, L, 5)
        kw.update(q_extra=torch.randn(*shape, generator=g, dtype=torch.float64),
                  k_extra=torch.randn(B, L, 5, generator=g, dtype=torch.float64),
                  extra_values=extra.endswith(("values", "sum")), extra_head_sum=extra.endswith("sum"))
    full = tied_attention(q, kv, **kw)
    rows = dict(kw, q_extra=kw["q_extra"][..., -n:, :]) if "q_extra" in kw else kw
    last = tied_attention_cached(q[:, :, -n:], kv, **rows)
    assert len(last) == len(full)
    for i, (a, b) in enumerate(zip(last, full)):   # lse (B, K, L): tokens last; the rest second to last
        torch.testing.assert_close(a, b[..., -n:] if i == 1 else b[..., -n:, :], rtol=1e-13, atol=1e-13)
    square = tied_attention_cached(q, kv, **kw)
    for a, b in zip(square, full):
        torch.testing.assert_close(a, b, rtol=1e-13, atol=1e-13)


def test_attention_bias_of_the_last_rows():
    K = 3
    kw = dict(alibi=alibi_slopes(K), self_bias=torch.randn(K, dtype=torch.float64),
              cross_bias=torch.randn(K, dtype=torch.float64), dtype=torch.float64)
    full = attention_bias(7, K, **kw)
    for n in (1, 3, 7):
        assert torch.equal(attention_bias(7, K, n_queries=n, **kw), full[:, -n:])
    for bad in (0, 8, 2.0, True):
        with pytest.raises(ValueError, match="n_queries"):
            attention_bias(7, K, n_queries=bad, **kw)


# ------------------------------------------------------------------------------ the command
def test_generate_command_decodes_with_the_cache(tmp_path, capsys):
    from cemlib.generate import main
    from cemlib.train import run_experiment
    tiny = ["model.d_model=16", "model.n_layers=2", "model.n_heads=2", "train.batch_size=4",
            "train.context_length=16", "train.eval_batches=1", "optim.warmup_steps=1",
            "train.max_steps=4", "train.final_whole_eval=false"]
    run_experiment("shakespeare-llama", "cpu", overrides=tiny, out_dir=tmp_path / "run", verbose=False)
    texts = {}
    for extra in ([], ["--no-cache"], ["--context-length", "40"], ["--context-length", "40", "--no-cache"]):
        assert main(["--checkpoint", str(tmp_path / "run"), "--prompt", "KING", "--max-new-tokens", "30",
                     "--temperature", "0", "--seed", "0", *extra]) == 0
        texts[tuple(extra)] = capsys.readouterr().out
    assert texts[()] == texts[("--no-cache",)] and len(texts[()]) == 4 + 30 + 1
    assert texts[("--context-length", "40")] == texts[("--context-length", "40", "--no-cache")]
    assert main(["--checkpoint", str(tmp_path / "run"), "--context-length", "0"]) == 2
    assert "--context-length must be a positive integer" in capsys.readouterr().err
