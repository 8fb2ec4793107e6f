"""Decoder-only language model whose blocks pick attention and MLP type independently.

``attn`` and ``mlp`` are each ``"llama"`` (untied attention with RoPE/ALiBi; SwiGLU) or ``"cem"``
(:class:`~cemlib.layers.cem_attention.CEMAttention`, :class:`~cemlib.layers.cem_mlp.CEMMLP`), so
the four families of the CEM paper (Llama, CEM-attention only, CEM-MLP only, full CEM; §4) are one
config field apart. Embeddings are untied by default: that is what reproduces Table 1's sizes
(``cemlib.models.params``). Pre-norm residual stream, final RMSNorm, linear head without bias.
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
from dataclasses import dataclass

import torch
from torch import nn

from cemlib.layers.base import check_norm_eps, check_step_size
from cemlib.layers.blocks import Block
from cemlib.layers.cache import DecodeCache
from cemlib.layers.cem_attention import CEMAttention, resolve_tau
from cemlib.layers.cem_mlp import CEMMLP
from cemlib.layers.llama import LlamaAttention, SwiGLU
from cemlib.layers.norm import RMSNorm
from cemlib.layers.reuse import IncrementDropout, LayerReuse, ResidualSublayer
from cemlib.models.generation import GenerationMixin, check_decoding
from cemlib.utils import check_positive_int, check_token_ids

__all__ = ["LMConfig", "LanguageModel", "default_d_ff"]


def default_d_ff(d_model: int) -> int:
    """Llama's ``8/3 d_model`` rounded up to a multiple of 8 (1792, 2048, 2304 for Table 1)."""
    return 8 * math.ceil(8 * d_model / 3 / 8)


@dataclass
class LMConfig:
    """Configuration of :class:`LanguageModel` (field names shared with the trainer).

    ``d_ff``: Llama MLP width (default :func:`default_d_ff`); ``d_v``: CEM MLP width (default
    ``d_ff``: dimension-matched; ``1.5 d_ff`` is parameter-matched). ``T_attn`` / ``T_mlp``: CEM
    recursion steps (eqs. 16-17; CEM layers only); ``reuse_attn`` / ``reuse_mlp``: plain layer reuse
    of the whole residual sublayer (any layer type). Remaining fields are passed to the CEM layers
    (see their docstrings) or select the Llama positional encoding (``pos``). ``dropout`` acts on
    the embeddings and on every sublayer's update (Llama: the residual branch; CEM: ``x^(T) - x``),
    so the CEM layers themselves stay exact; ``check_finite`` makes layers reject NaN/Inf input
    where the check is free (CPU tensors, eager mode: ``cemlib.utils.finite_check_is_free``;
    on a GPU or under ``torch.compile`` the trainer's per-step loss and gradient-norm check
    catches NaN/Inf); the cheap token-id range check stays on either way (eager mode only).
    Step sizes ``eta_*`` must be finite and >= 0, ``norm_eps`` >= 0.

    :param vocab_size: token ids ``0 .. vocab_size - 1``.
    :param context_length: the longest sequence the model takes.
    :param d_model: the width ``D_h`` of the residual stream.
    :param n_layers: blocks.
    :param n_heads: attention heads.
    :param d_ff: the SwiGLU hidden width.
    :param attn: ``"llama"`` (:class:`~cemlib.layers.llama.LlamaAttention` in a pre-norm residual
        sublayer) or ``"cem"`` (:class:`~cemlib.layers.cem_attention.CEMAttention`).
    :param mlp: ``"llama"`` (:class:`~cemlib.layers.llama.SwiGLU` in a pre-norm residual sublayer)
        or ``"cem"`` (:class:`~cemlib.layers.cem_mlp.CEMMLP`).
    :param tie_embeddings: use the token embedding as the output head.
    :param T_attn: CEM attention recursion steps.
    :param T_mlp: CEM MLP recursion steps.
    :param head_dim: per-head width (default ``d_model / n_heads``).
    :param pos: the Llama attention's positions, ``"rope"``, ``"alibi"`` or ``"none"``.
    :param d_v: the CEM MLP width.
    :param tau: CEM attention temperature (``CEMAttention``'s ``tau``).
    :param diag: CEM attention diagonal, ``"shared"``, ``"per_head"`` or ``"none"``.
    :param diag_grad: ``"exact"`` or ``"paper"`` (``CEMAttention``'s ``diag_grad``).
    :param alibi: ALiBi in CEM attention.
    :param self_cross_bias: CEM attention's learned self/cross biases.
    :param query_norm: RMS-normalise the query inside the CEM recursions.
    :param phi: the CEM MLP potential, ``"silu"``, ``"gelu"`` or ``"relu2"``.
    :param mlp_variant: ``"standard"`` or ``"sign"`` (``CEMMLP``'s ``variant``).
    :param precond_attn: CEM attention preconditioner, ``"none"``, ``"diag"`` or ``"dplr"``.
    :param precond_mlp: CEM MLP preconditioner, ``"none"``, ``"diag"`` or ``"dplr"``.
    :param precond_rank_attn: rank of the attention's ``"dplr"`` preconditioner.
    :param precond_rank_mlp: rank of the MLP's ``"dplr"`` preconditioner.
    :param precond_safeguard: keep the preconditioners positive definite.
    :param eta_attn: CEM attention step size.
    :param eta_mlp: CEM MLP step size.
    :param learn_eta: learn the CEM step sizes.
    :param reuse_attn: applications of each attention sublayer (plain layer reuse).
    :param reuse_mlp: applications of each MLP sublayer.
    :param norm_eps: every RMSNorm's epsilon.
    :param init_std: standard deviation of the initial weights.
    :param dropout: dropout on the embeddings and on every sublayer's update.
    :param check_finite: layers reject NaN/Inf input.
    """
    vocab_size: int
    context_length: int
    d_model: int
    n_layers: int
    n_heads: int
    d_ff: int | None = None
    attn: str = "llama"
    mlp: str = "llama"
    tie_embeddings: bool = False
    T_attn: int = 1
    T_mlp: int = 1
    head_dim: int | None = None
    pos: str = "rope"
    d_v: int | None = None
    tau: str | float = "head"
    diag: str = "shared"
    diag_grad: str = "exact"
    alibi: bool = True
    self_cross_bias: bool = True
    query_norm: bool = True
    phi: str = "silu"
    mlp_variant: str = "standard"
    precond_attn: str = "none"
    precond_mlp: str = "none"
    precond_rank_attn: int = 4
    precond_rank_mlp: int = 16
    precond_safeguard: bool = False
    eta_attn: float = 1.0
    eta_mlp: float = 1.0
    learn_eta: bool = False
    reuse_attn: int = 1
    reuse_mlp: int = 1
    norm_eps: float = 1e-6
    init_std: float = 0.02
    dropout: float = 0.0
    check_finite: bool = True

    def __post_init__(self):
        for name in ("vocab_size", "context_length", "d_model", "n_layers", "n_heads", "T_attn",
                     "T_mlp", "reuse_attn", "reuse_mlp"):
            check_positive_int(getattr(self, name), name)
        if self.attn not in ("llama", "cem"):
            raise ValueError(f"attn must be 'llama' or 'cem', got {self.attn!r}")
        if self.mlp not in ("llama", "cem"):
            raise ValueError(f"mlp must be 'llama' or 'cem', got {self.mlp!r}")
        if self.attn == "llama" and self.T_attn != 1:
            raise ValueError(f"T_attn={self.T_attn} needs attn='cem' (for Llama use reuse_attn)")
        if self.mlp == "llama" and self.T_mlp != 1:
            raise ValueError(f"T_mlp={self.T_mlp} needs mlp='cem' (for Llama use reuse_mlp)")
        if not 0.0 <= self.dropout < 1.0:
            raise ValueError(f"dropout must be in [0, 1), got {self.dropout}")
        for name in ("eta_attn", "eta_mlp"):  # step sizes: finite and >= 0
            check_step_size(getattr(self, name), name)
        check_norm_eps(self.norm_eps, "norm_eps")
        if self.head_dim is None and self.d_model % self.n_heads:
            raise ValueError(f"d_model={self.d_model} is not divisible by n_heads={self.n_heads}; "
                             "set head_dim")
        if self.d_ff is None:
            self.d_ff = default_d_ff(self.d_model)
        if self.d_v is None:
            self.d_v = self.d_ff
        check_positive_int(self.d_ff, "d_ff")
        check_positive_int(self.d_v, "d_v")
        resolve_tau(self.tau, self.d_model, self.resolved_head_dim)

    @property
    def resolved_head_dim(self) -> int:
        """``D_r`` (``d_model // n_heads`` unless ``head_dim`` is set)."""
        return self.head_dim if self.head_dim is not None else self.d_model // self.n_heads

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> "LMConfig":
        return cls(**d)


def _attn_step(cfg: LMConfig) -> nn.Module:
    if cfg.attn == "cem":
        step = CEMAttention(cfg.d_model, cfg.n_heads, cfg.head_dim, T=cfg.T_attn, eta=cfg.eta_attn,
                            learn_eta=cfg.learn_eta, tau=cfg.tau, diag=cfg.diag,
                            diag_grad=cfg.diag_grad, alibi=cfg.alibi,
                            self_cross_bias=cfg.self_cross_bias, query_norm=cfg.query_norm,
                            preconditioner=cfg.precond_attn, precond_rank=cfg.precond_rank_attn,
                            precond_safeguard=cfg.precond_safeguard, norm_eps=cfg.norm_eps,
                            init_std=cfg.init_std, check_finite=cfg.check_finite)
        if cfg.dropout > 0:
            step = IncrementDropout(step, cfg.dropout)
    else:
        step = ResidualSublayer(LlamaAttention(cfg.d_model, cfg.n_heads, cfg.head_dim, pos=cfg.pos,
                                               init_std=cfg.init_std), cfg.d_model, cfg.norm_eps,
                                cfg.dropout)
    return LayerReuse(step, cfg.reuse_attn) if cfg.reuse_attn > 1 else step


def _mlp_step(cfg: LMConfig) -> nn.Module:
    if cfg.mlp == "cem":
        step = CEMMLP(cfg.d_model, cfg.d_v, T=cfg.T_mlp, eta=cfg.eta_mlp, learn_eta=cfg.learn_eta,
                      phi=cfg.phi, variant=cfg.mlp_variant, query_norm=cfg.query_norm,
                      preconditioner=cfg.precond_mlp, precond_rank=cfg.precond_rank_mlp,
                      precond_safeguard=cfg.precond_safeguard, norm_eps=cfg.norm_eps,
                      init_std=cfg.init_std, check_finite=cfg.check_finite)
        if cfg.dropout > 0:
            step = IncrementDropout(step, cfg.dropout)
    else:
        step = ResidualSublayer(SwiGLU(cfg.d_model, cfg.d_ff, init_std=cfg.init_std), cfg.d_model,
                                cfg.norm_eps, cfg.dropout)
    return LayerReuse(step, cfg.reuse_mlp) if cfg.reuse_mlp > 1 else step


class LanguageModel(GenerationMixin, nn.Module):
    """``LanguageModel(cfg)(idx: LongTensor[B, L]) -> logits [B, L, vocab]``.

    ``forward(idx)`` returns the next-token logits at every position (``L <= context_length``).
    Each block is ``x = mlp_step(attn_step(x))`` on the un-normalised residual stream: a Llama step
    is the pre-norm sublayer ``x + f(RMSNorm(x))``, a CEM step is the CEM layer itself (it returns
    ``x`` plus its update and normalises inside), so Llama and CEM layers mix freely. Then a final
    RMSNorm and the linear head. ``model.generate(idx, max_new_tokens, temperature=..., top_k=...,
    seed=...)`` samples text (:func:`cemlib.models.generation.generate`), decoding with a
    :class:`~cemlib.layers.cache.DecodeCache` (:meth:`new_cache`); ``with model.recursion(T_attn=4):``
    runs the CEM layers with other recursion steps or step sizes (test-time recursion).

    :param cfg: the :class:`LMConfig` (every option is a field of it).
    """

    def __init__(self, cfg: LMConfig):
        super().__init__()
        if not isinstance(cfg, LMConfig):
            raise TypeError(f"cfg must be an LMConfig, got {type(cfg).__name__}")
        self.config = cfg
        self.tok_emb = nn.Embedding(cfg.vocab_size, cfg.d_model,  # N(0, init_std^2) weights
                                    _weight=torch.randn(cfg.vocab_size, cfg.d_model) * cfg.init_std)
        self.drop = nn.Dropout(cfg.dropout)
        self.blocks = nn.ModuleList(Block(_attn_step(cfg), _mlp_step(cfg))
                                    for _ in range(cfg.n_layers))
        self.norm_f = RMSNorm(cfg.d_model, eps=cfg.norm_eps)
        if cfg.tie_embeddings:
            self.lm_head = None
        else:
            self.lm_head = nn.Parameter(torch.randn(cfg.vocab_size, cfg.d_model) * cfg.init_std)

    @property
    def context_length(self) -> int:
        """The longest sequence :meth:`forward` accepts (``cfg.context_length``)."""
        return self.config.context_length

    @property
    def vocab_size(self) -> int:
        """The number of token ids (``cfg.vocab_size``)."""
        return self.config.vocab_size

    @property
    def head_weight(self) -> torch.Tensor:
        return self.tok_emb.weight if self.lm_head is None else self.lm_head

    def forward(self, idx: torch.Tensor, cache: DecodeCache | None = None) -> torch.Tensor:
        """Next-token logits (B, L, vocab_size) for token ids ``idx`` (B, L), ``L <= context_length``.

        ``cache`` (decoding, eval mode; :meth:`new_cache`): ``idx`` holds the tokens that follow
        the ``cache.length`` kept ones (at most ``context_length`` in all); every attention layer
        keeps their entries, and their logits are returned. The first call on an empty cache (the
        prefill) computes what the uncached forward computes."""
        cfg = self.config
        if not isinstance(idx, torch.Tensor) or idx.dtype not in (torch.long, torch.int32):
            raise TypeError(f"idx must be an integer tensor (B, L), got "
                            f"{getattr(idx, 'dtype', type(idx).__name__)}")
        if idx.dim() != 2:
            raise ValueError(f"idx must have shape (B, L), got {tuple(idx.shape)}")
        if idx.shape[1] > cfg.context_length:
            raise ValueError(f"sequence length {idx.shape[1]} exceeds context_length "
                             f"{cfg.context_length}")
        # the token-id range check stays on with check_finite=False (it is cheap; only skipped
        # while torch.compile traces the model, where it would break the graph)
        check_token_ids(idx, cfg.vocab_size)
        if cache is not None:
            check_decoding(self, idx)
            cache.position(idx.shape[1], n_layers=len(self.blocks))
        x = self.drop(self.tok_emb(idx))
        for i, block in enumerate(self.blocks):
            x = block(x) if cache is None else block(x, cache=cache.layers[i])
        return self.norm_f(x) @ self.head_weight.T

    def new_cache(self) -> DecodeCache:
        """An empty :class:`~cemlib.layers.cache.DecodeCache` for :meth:`forward`: per block, its
        attention's ``KVCache`` (a list of ``reuse_attn`` of them under plain reuse), each for up
        to ``context_length`` tokens. One entry per token serves every CEM recursion step."""
        return DecodeCache([block.new_cache(self.config.context_length) for block in self.blocks],
                           self.config.context_length)

    @contextlib.contextmanager
    def recursion(self, *, T_attn: int | None = None, T_mlp: int | None = None,
                  eta_attn: float | None = None, eta_mlp: float | None = None):
        """Run the CEM layers with other recursion steps ``T`` or step sizes ``eta`` (CEM eqs.
        16-17) inside a ``with`` block; the trained values are restored when it ends.

        ``with model.recursion(T_attn=4, T_mlp=4): logits = model(idx)`` evaluates a model trained
        with ``T = 2`` at ``T = 4`` (test-time recursion). ``None`` keeps a value; ``config`` keeps
        the trained ones. The keys and values of a CEM layer come from its input, so a decode cache
        is the same at every ``T``. A value for a sublayer that is not CEM (Llama), a ``T`` that is
        not a positive integer, a step size that is not finite and >= 0, or a step size of a layer
        that learns it (``learn_eta``) is a ``ValueError``."""
        changes = []
        for value, kind, attr in ((T_attn, CEMAttention, "T"), (T_mlp, CEMMLP, "T"),
                                  (eta_attn, CEMAttention, "eta"), (eta_mlp, CEMMLP, "eta")):
            if value is None:
                continue
            name = f"{attr}_{'attn' if kind is CEMAttention else 'mlp'}"
            layers = [m for m in self.modules() if isinstance(m, kind)]
            if not layers:
                raise ValueError(f"{name}={value!r} needs CEM layers; this model's "
                                 f"{'attention' if kind is CEMAttention else 'MLP'} is Llama's")
            if attr == "T":
                check_positive_int(value, name)
            else:
                check_step_size(value, name)
                if isinstance(layers[0].eta, torch.Tensor):
                    raise ValueError(f"{name}: this model learns its step sizes (learn_eta=True); "
                                     f"a learned eta is a parameter, not a knob")
                value = float(value)
            changes += [(m, attr, getattr(m, attr), value) for m in layers]
        for m, attr, _, value in changes:
            setattr(m, attr, value)
        try:
            yield self
        finally:
            for m, attr, old, _ in changes:
                setattr(m, attr, old)

    def num_parameters(self, exclude_embeddings: bool = False) -> int:
        """Number of parameters; ``exclude_embeddings`` drops the token embedding and the output
        head (the head counts once if tied)."""
        n = sum(p.numel() for p in self.parameters())
        if exclude_embeddings:
            n -= self.tok_emb.weight.numel()
            if self.lm_head is not None:
                n -= self.lm_head.numel()
        return n
