"""Language models / classifiers for the NRGPT chapter: NRGPT, the recurrent parallel GPT baseline
and a standard deep GPT (Dehmamy et al. 2025, NRGPT, §3 and App. F.1).

All three share the GPT-2 wrapper: learned token + position embeddings (``x^(0)``), a body, a final
LayerNorm and an output head, with ``forward(idx: LongTensor[B, L]) -> logits [B, L, n_outputs]``
(``n_outputs`` defaults to the vocabulary size; a classifier reads the logits it needs) and
``num_parameters()``. The output head is untied by default, which is what reproduces the paper's
85M / 90M counts of Tables 1-2 (tied: ``tie_embeddings=True``, as in Table 5). The baselines'
blocks (:class:`RecurrentGPTModel`, :class:`GPTModel`) keep biases on the attention's q/k/v and
output projections and on the MLP (:mod:`cemlib.layers.gpt`), as nanoGPT does; eq. (9) has none.
"""

from __future__ import annotations

import torch
from torch import nn

from cemlib.layers.cache import DecodeCache
from cemlib.layers.gpt import GPTBlock, RecurrentGPT
from cemlib.layers.nrgpt import NRGPTBlock
from cemlib.models.generation import GenerationMixin, check_decoding
from cemlib.utils import check_positive_int

__all__ = ["NRGPTModel", "RecurrentGPTModel", "GPTModel", "AUTHORS_NRGPT", "AUTHORS_BASELINE"]

#: The options that make :class:`NRGPTModel` the authors' released ``NRGPT_H_FF2W`` (github
#: bhoov/nrgpt, ``models/energy_models.py``); ``ff="ff2"`` gives their ``NRGPT_H_FF2``. Add
#: ``mask="strict"`` for ListOps (their ``tril_plus_one=True``) or ``"inclusive"`` for Shakespeare,
#: and ``attn_dropout`` = their ``dropout`` (0.1 in their Shakespeare sweep). See
#: ``cemlib/README_nrgpt.md``, "The authors' setup".
AUTHORS_NRGPT = dict(ff="ff2w", act="gelu", ff_bias=True, norm="layernorm", learn_gain=False,
                     learn_alpha=False, beta=1.0, rate="matrix", rate_init="normal",
                     learn_ff_scale=True, head_bias=True)
#: The same for their baselines (``GPT``, ``GPT_Rec_parallel``; ``block="sequential"`` on
#: :class:`RecurrentGPTModel` for ``GPT_Rec``): ReLU MLPs with biases and a head bias.
AUTHORS_BASELINE = dict(act="relu", head_bias=True)


class _CausalTokenModel(GenerationMixin, nn.Module):
    """Embeddings, final LayerNorm and output head around a body ``self._body(x)``; with
    ``n_outputs == vocab_size`` (the default) ``generate`` samples text
    (:func:`cemlib.models.generation.generate`)."""

    def __init__(self, vocab_size: int, block_size: int, d_model: int, n_outputs: int | None = None,
                 dropout: float = 0.0, tie_embeddings: bool = False, head_bias: bool = False):
        super().__init__()
        self.vocab_size = check_positive_int(vocab_size, "vocab_size")
        self.block_size = check_positive_int(block_size, "block_size")
        self.d_model = check_positive_int(d_model, "d_model")
        self.n_outputs = check_positive_int(vocab_size if n_outputs is None else n_outputs, "n_outputs")
        self.tok_emb = nn.Embedding(vocab_size, d_model)
        self.pos_emb = nn.Embedding(block_size, d_model)
        self.drop = nn.Dropout(dropout)
        self.ln_f = nn.LayerNorm(d_model)
        self.head = nn.Linear(d_model, self.n_outputs, bias=False)
        for m in (self.tok_emb, self.pos_emb, self.head):
            nn.init.normal_(m.weight, mean=0.0, std=0.02)
        if head_bias:  # the authors' lm_head has a bias, zero-initialised (added without an RNG draw)
            self.head.bias = nn.Parameter(torch.zeros(self.n_outputs))
        if tie_embeddings:
            if self.n_outputs != vocab_size:
                raise ValueError("tie_embeddings needs n_outputs == vocab_size")
            self.head.weight = self.tok_emb.weight

    @property
    def context_length(self) -> int:
        """The longest sequence :meth:`forward` accepts (``block_size``)."""
        return self.block_size

    def embed(self, idx: torch.Tensor, start: int = 0) -> torch.Tensor:
        """``x^(0)_A = token embedding + position embedding`` (App. F.1) of tokens at positions
        ``start, start + 1, ...``, after input checks."""
        if not isinstance(idx, torch.Tensor) or idx.dtype != torch.long:
            raise TypeError(f"idx must be a LongTensor, got {getattr(idx, 'dtype', type(idx))}")
        if idx.dim() != 2:
            raise ValueError(f"idx must have shape (B, L), got {tuple(idx.shape)}")
        L = idx.shape[1]
        if not 1 <= start + L <= self.block_size or L < 1:
            raise ValueError(f"sequence length {L} after {start} tokens must end in 1..block_size="
                             f"{self.block_size}")
        # the range check reads values: skipped while torch.compile traces the model, where it
        # would break the graph at every call (and synchronise the GPU)
        if idx.numel() and not torch.compiler.is_compiling() \
                and (idx.min() < 0 or idx.max() >= self.vocab_size):
            raise ValueError(f"token ids must lie in [0, {self.vocab_size}), got range "
                             f"[{int(idx.min())}, {int(idx.max())}]")
        pos = torch.arange(start, start + L, device=idx.device)
        return self.drop(self.tok_emb(idx) + self.pos_emb(pos))

    def forward(self, idx: torch.Tensor, cache: DecodeCache | None = None) -> torch.Tensor:
        """Logits (B, L, n_outputs). ``cache`` (decoding, eval mode; :meth:`new_cache`): ``idx``
        holds the tokens that follow the ``cache.length`` kept ones (learned positions from
        there); they are kept and their logits returned."""
        if cache is None:
            return self.head(self.ln_f(self._body(self.embed(idx))))
        check_decoding(self, idx)
        start = cache.position(idx.shape[1], n_layers=len(self._body_cache(1)))
        return self.head(self.ln_f(self._body(self.embed(idx, start), cache.layers)))

    def new_cache(self) -> DecodeCache:
        """An empty :class:`~cemlib.layers.cache.DecodeCache`, one entry per layer of depth (per
        step of a recurrent model: each step computes its keys from a new state)."""
        return DecodeCache(self._body_cache(self.block_size), self.block_size)

    def num_parameters(self, non_embedding: bool = False) -> int:
        """Number of trainable parameters (shared tensors counted once); ``non_embedding`` excludes
        the token and position embeddings (and the head, if tied)."""
        n = sum(p.numel() for p in self.parameters() if p.requires_grad)
        if non_embedding:
            n -= self.tok_emb.weight.numel() + self.pos_emb.weight.numel()
        return n


class NRGPTModel(_CausalTokenModel):
    """NRGPT: one :class:`~cemlib.layers.nrgpt.NRGPTBlock` applied ``n_steps`` times (eq. 6 with
    shared weights, §2). ``block_kwargs`` go to the block (``ff``, ``norm``, ``rate``, ``mask``, ...).

    ``forward(idx)`` (B, L) returns logits (B, L, n_outputs): embeddings, ``n_steps`` applications
    of the block (each returns the updated stream), the final LayerNorm and the head.

    :param vocab_size: token ids ``0 .. vocab_size - 1``.
    :param block_size: the longest sequence (learned positions).
    :param d_model: the width ``D``.
    :param n_heads: attention heads.
    :param n_steps: applications of the block (the recurrent depth).
    :param n_outputs: logits per position (default ``vocab_size``; a classifier reads the ones it
        needs; ``generate`` needs the default).
    :param dropout: dropout on the embeddings (and, for the GPT baselines, in the blocks).
    :param tie_embeddings: use the token embedding as the output head.
    :param head_bias: a zero-initialised bias on the output head (the authors' ``lm_head``).
    :param block_kwargs: the options of :class:`~cemlib.layers.nrgpt.NRGPTBlock`.
    """

    def __init__(self, vocab_size: int, block_size: int, d_model: int, n_heads: int = 1,
                 n_steps: int = 5, *, n_outputs: int | None = None, dropout: float = 0.0,
                 tie_embeddings: bool = False, head_bias: bool = False, **block_kwargs):
        super().__init__(vocab_size, block_size, d_model, n_outputs, dropout, tie_embeddings, head_bias)
        self.n_steps = check_positive_int(n_steps, "n_steps")
        self.block = NRGPTBlock(d_model, n_heads, **block_kwargs)

    def _body(self, x: torch.Tensor, cache: list | None = None) -> torch.Tensor:
        return self.block.run(x, self.n_steps, cache=cache)

    def _body_cache(self, capacity: int) -> list:
        return [self.block.new_cache(capacity) for _ in range(self.n_steps)]

    @torch.no_grad()
    def energy_trajectory(self, idx: torch.Tensor, n_steps: int | None = None) -> torch.Tensor:
        """Per-token energies ``E_A(x^(t))`` for ``t = 0..n_steps`` (default: the trained number of
        steps; more steps show the asymptotic behaviour, Fig. 2 / Fig. 6): shape
        ``(n_steps + 1, B, L)``. Uses the current mode: call ``eval()`` first to switch off
        embedding dropout."""
        n = self.n_steps if n_steps is None else n_steps
        return self.block.run(self.embed(idx), n, return_energies=True)[1]


class RecurrentGPTModel(_CausalTokenModel):
    """One GPT block applied ``n_steps`` times: ``block="parallel"`` (GPT-J style, the authors'
    GPT_Rec_parallel, default) or ``"sequential"`` (pre-LN GPT-2 block, their GPT_Rec).

    ``forward(idx)`` (B, L) returns logits (B, L, n_outputs).

    ``vocab_size``, ``block_size``, ``d_model``, ``n_heads``, ``n_outputs``, ``dropout``,
    ``tie_embeddings`` and ``head_bias`` are :class:`NRGPTModel`'s options.

    :param n_steps: applications of the block.
    :param ff_hidden: the MLP hidden width (default ``4 D``).
    :param act: the MLP activation, ``"relu"`` or ``"gelu"``.
    :param block: ``"parallel"`` or ``"sequential"``.
    """

    def __init__(self, vocab_size: int, block_size: int, d_model: int, n_heads: int = 1,
                 n_steps: int = 5, *, n_outputs: int | None = None, dropout: float = 0.0,
                 tie_embeddings: bool = False, ff_hidden: int | None = None, act: str = "relu",
                 block: str = "parallel", head_bias: bool = False):
        super().__init__(vocab_size, block_size, d_model, n_outputs, dropout, tie_embeddings, head_bias)
        self.body = RecurrentGPT(d_model, n_heads, n_steps, block, ff_hidden=ff_hidden, act=act,
                                 dropout=dropout)
        _init_linear(self.body)

    def _body(self, x: torch.Tensor, cache: list | None = None) -> torch.Tensor:
        return self.body(x, cache=cache)

    def _body_cache(self, capacity: int) -> list:
        return self.body.new_cache(capacity)


class GPTModel(_CausalTokenModel):
    """A standard deep GPT-2: ``n_layers`` sequential pre-LN blocks, no weight sharing.

    ``forward(idx)`` (B, L) returns logits (B, L, n_outputs).

    ``vocab_size``, ``block_size``, ``d_model``, ``n_heads``, ``n_outputs``, ``dropout``,
    ``tie_embeddings`` and ``head_bias`` are :class:`NRGPTModel`'s options.

    :param n_layers: blocks (:class:`~cemlib.layers.gpt.GPTBlock`).
    :param ff_hidden: the MLP hidden width (default ``4 D``).
    :param act: the MLP activation, ``"relu"`` or ``"gelu"``.
    """

    def __init__(self, vocab_size: int, block_size: int, d_model: int, n_heads: int = 1,
                 n_layers: int = 4, *, n_outputs: int | None = None, dropout: float = 0.0,
                 tie_embeddings: bool = False, ff_hidden: int | None = None, act: str = "relu",
                 head_bias: bool = False):
        super().__init__(vocab_size, block_size, d_model, n_outputs, dropout, tie_embeddings, head_bias)
        check_positive_int(n_layers, "n_layers")
        self.blocks = nn.ModuleList(GPTBlock(d_model, n_heads, ff_hidden, act, dropout)
                                    for _ in range(n_layers))
        _init_linear(self.blocks)

    def _body(self, x: torch.Tensor, cache: list | None = None) -> torch.Tensor:
        for i, block in enumerate(self.blocks):
            x = block(x) if cache is None else block(x, cache=cache[i])
        return x

    def _body_cache(self, capacity: int) -> list:
        return [block.new_cache(capacity) for block in self.blocks]


def _init_linear(module: nn.Module) -> None:
    """nanoGPT initialisation: Linear weights ~ N(0, 0.02^2), biases zero."""
    for m in module.modules():
        if isinstance(m, nn.Linear):
            nn.init.normal_(m.weight, mean=0.0, std=0.02)
            if m.bias is not None:
                nn.init.zeros_(m.bias)
