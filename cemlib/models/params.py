"""Parameter and FLOP counting; reproduction of the CEM paper's Table 1 model sizes.

Table 1 (arXiv:2605.07588v1, App. D.1; numbers as printed in the ICLR 2026 submission version) lists
four Llama configurations with a 32,000 vocabulary and context 2048. Counting -- untied input/output
embeddings, no biases, two RMSNorm gains per block plus a final one -- gives 86.37M, 108.05M,
134.11M, 162.81M: the labels 86M/108M/134M/162M are these counts *truncated* to whole millions
(162.81M is labelled 162M), so the check is ``nominal <= count < nominal + 1M``. Models are built on
the meta device (no memory is allocated). The CEM paper's "about half of the attention, two-thirds
of the MLP parameters" (§4.1, Fig. 3a) is :func:`sublayer_ratios`.
"""

from __future__ import annotations

from collections import defaultdict

import torch
from torch import nn

from cemlib.kernels import costs
from cemlib.layers.cem_attention import CEMAttention
from cemlib.layers.cem_mlp import CEMMLP
from cemlib.layers.llama import LlamaAttention, SwiGLU
from cemlib.layers.norm import RMSNorm
from cemlib.layers.precondition import Preconditioner
from cemlib.models.lm import LanguageModel, LMConfig

__all__ = ["TABLE1", "table1_config", "meta_model", "count_parameters", "parameter_breakdown",
           "sublayer_ratios", "table1_report", "flops_per_token", "kv_cache_bytes_per_token"]

#: Table 1 of the CEM paper: name -> (d_model, n_layers, n_heads, d_ff, nominal parameter count).
TABLE1: dict[str, tuple[int, int, int, int, int]] = {
    "86M": (672, 8, 8, 1792, 86_000_000),
    "108M": (672, 12, 12, 1792, 108_000_000),
    "134M": (768, 12, 12, 2048, 134_000_000),
    "162M": (864, 12, 12, 2304, 162_000_000),
}


def table1_config(name: str, **overrides) -> LMConfig:
    """The Llama configuration ``name`` of Table 1 (vocab 32,000, context 2048, untied
    embeddings), with any :class:`LMConfig` field overridden (e.g. ``attn="cem"``)."""
    if name not in TABLE1:
        raise ValueError(f"unknown Table-1 model {name!r}; choose one of {list(TABLE1)}")
    d, n_layers, n_heads, d_ff, _ = TABLE1[name]
    kw = dict(vocab_size=32_000, context_length=2048, d_model=d, n_layers=n_layers,
              n_heads=n_heads, d_ff=d_ff)
    kw.update(overrides)
    return LMConfig(**kw)


def meta_model(cfg: LMConfig) -> LanguageModel:
    """Build ``LanguageModel(cfg)`` on the meta device (shapes only, no storage)."""
    with torch.device("meta"):
        return LanguageModel(cfg)


def count_parameters(cfg: LMConfig, exclude_embeddings: bool = False) -> int:
    """Parameter count of ``LanguageModel(cfg)``, built on the meta device."""
    return meta_model(cfg).num_parameters(exclude_embeddings)


_KINDS = ((Preconditioner, "preconditioners"), (RMSNorm, "norms"), (CEMAttention, "attention"),
          (LlamaAttention, "attention"), (CEMMLP, "mlp"), (SwiGLU, "mlp"))


def parameter_breakdown(model: nn.Module) -> dict[str, int]:
    """Parameters by role: ``embeddings`` (token embedding and head), ``attention``, ``mlp``
    (projections, diagonal, biases, step sizes), ``preconditioners``, ``norms``."""
    out: dict[str, int] = defaultdict(int)
    for mod in model.modules():
        kind = next((k for cls, k in _KINDS if isinstance(mod, cls)), None)
        for name, p in mod.named_parameters(recurse=False):
            if isinstance(mod, LanguageModel):
                out["embeddings" if name == "lm_head" else "other"] += p.numel()
            elif isinstance(mod, nn.Embedding):
                out["embeddings"] += p.numel()
            else:
                out[kind or "other"] += p.numel()
    return dict(out)


def sublayer_ratios(name: str) -> dict[str, float]:
    """CEM / Llama parameter ratios of the attention and MLP sublayers of Table-1 model ``name``
    (projections, diagonal and biases; no preconditioner): the paper's "about 1/2" and "about 2/3"."""
    llama = parameter_breakdown(meta_model(table1_config(name)))
    cem = parameter_breakdown(meta_model(table1_config(name, attn="cem", mlp="cem")))
    return {"attention": cem["attention"] / llama["attention"], "mlp": cem["mlp"] / llama["mlp"]}


def table1_report() -> list[dict]:
    """One row per Table-1 model: nominal size, and counts of Llama, CEM attention only, CEM MLP
    only, full CEM, and full CEM with DPLR preconditioners (R = 4 / 16), counted as in the module
    docstring."""
    rows = []
    for name, (*_, nominal) in TABLE1.items():
        rows.append({
            "model": name, "nominal": nominal,
            "llama": count_parameters(table1_config(name)),
            "cem_attn": count_parameters(table1_config(name, attn="cem", self_cross_bias=False)),
            "cem_mlp": count_parameters(table1_config(name, mlp="cem")),
            "cem_full": count_parameters(table1_config(name, attn="cem", mlp="cem",
                                                       self_cross_bias=False)),
            "cem_full_dplr": count_parameters(table1_config(
                name, attn="cem", mlp="cem", self_cross_bias=False, precond_attn="dplr",
                precond_mlp="dplr")),
        })
    return rows


def flops_per_token(cfg: LMConfig) -> int:
    """Forward matmul FLOPs per token (2 x multiply-adds) of ``LanguageModel(cfg)``.

    Counts every projection, the attention scores and value aggregation at the full
    ``context_length`` (no causal halving, the Kaplan/PaLM convention), the recursion steps
    (CEM keys/values and gamma once per layer call, queries/outputs per step), the diagonal
    term and its value path, low-rank preconditioner products, plain reuse, and the output head.
    Element-wise work (norms, softmax, SiLU, diagonal scalings) is not counted. The trainer
    multiplies by 3 for a training step.
    """
    D, L, V = cfg.d_model, cfg.context_length, cfg.vocab_size
    K, R = cfg.n_heads, cfg.resolved_head_dim
    KR = K * R
    if cfg.attn == "llama":
        attn = 2 * 4 * D * KR + 2 * 2 * L * KR
    else:
        step = 2 * 2 * D * KR + 2 * 2 * L * KR          # W_Q u, W_Q^T o; scores, values
        if cfg.diag != "none":
            step += 2 * L * D * (K if cfg.diag == "per_head" else 1)   # h_j . (d * u_i)
            if cfg.diag_grad == "exact":
                # sum_j alpha_kij hn_j: per head, or, with a shared diagonal and no preconditioner,
                # once for the head sum (sum_k alpha_kij) hn_j, as CEMAttention.head_grads computes it
                head_sum = cfg.diag == "shared" and cfg.precond_attn == "none"
                step += 2 * L * D * (1 if head_sum else K)
        if cfg.precond_attn == "dplr":
            step += 2 * 4 * D * cfg.precond_rank_attn * K
        attn = 2 * D * KR + cfg.T_attn * step           # keys/values once
    if cfg.mlp == "llama":
        mlp = 2 * 3 * D * cfg.d_ff
    else:
        step = 2 * 2 * D * cfg.d_v                       # V u and V^T (...)
        if cfg.precond_mlp == "dplr":
            step += 2 * 4 * D * cfg.precond_rank_mlp
        mlp = 2 * D * cfg.d_v + cfg.T_mlp * step         # gamma = W h once
    return cfg.n_layers * (cfg.reuse_attn * attn + cfg.reuse_mlp * mlp) + 2 * D * V


def kv_cache_bytes_per_token(cfg: LMConfig, bytes_per_element: int = 2) -> int:
    """Bytes that decoding with ``LanguageModel(cfg)`` keeps per token of context: the per-layer
    formula :func:`cemlib.kernels.costs.kv_cache_bytes_per_token` summed over its attention
    layers (``n_layers``, each ``reuse_attn`` times). ``model.new_cache()`` keeps exactly this
    (:meth:`cemlib.layers.cache.DecodeCache.bytes_per_token` measures it).

    Llama attention caches a key and a value per head: ``2 K D_r``. CEM attention ties them
    (``W_V = W_K``), so one tensor serves as both: ``K D_r`` -- half (implied by CEM eq. 5; the paper
    does not state it).
    With a KQ diagonal (``diag`` shared or per head, CEM eq. 12) the layer also needs the
    normalised inputs ``RMSNorm(h_j)`` for the term ``h_j^T D_k u_i`` and the diagonal value path,
    ``D_h`` more per token, which at ``K D_r = D_h`` gives back the saving. Recursion (``T``) reuses
    the cache; plain layer reuse recomputes keys from a new state, so each pass has its own.
    """
    if isinstance(bytes_per_element, bool) or not isinstance(bytes_per_element, int) or bytes_per_element < 1:
        raise ValueError(f"bytes_per_element must be a positive integer, got {bytes_per_element!r}")
    cem = cfg.attn == "cem"
    per_layer = costs.kv_cache_bytes_per_token(
        cfg.n_heads, cfg.resolved_head_dim, tied=cem,
        extra_width=cfg.d_model if cem and cfg.diag != "none" else 0, elem_bytes=bytes_per_element)
    return cfg.n_layers * cfg.reuse_attn * per_layer
