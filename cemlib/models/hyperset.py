"""Recurrent-depth Hyper-SET model (Hu et al. 2025, §4, App. D): embed, iterate one layer, head.

Inputs are either integer tokens ``(B, N)`` (``vocab_size``; e.g. Sudoku: 81 cells, digits 0-9
with 0 = blank) or patch vectors ``(B, N, patch_dim)`` (images). The same
:class:`~cemlib.layers.hyperset.HyperSETLayer` is applied ``n_iter`` times (more at test time for
extrapolation, unless depth-wise LoRA fixes the depth). The head is ``LayerNorm -> Linear``
(``head="rmsnorm"``: the released Sudoku code's ``RMSNorm -> Linear`` without bias):

- ``pool="none"``: per-token logits ``(B, N, n_classes)`` (Sudoku);
- ``pool="mean"``: mean over tokens, logits ``(B, n_classes)``;
- ``pool="cls"``: a learnable CLS token is prepended; its final state gives ``(B, n_classes)``.

:meth:`HyperSETModel.trajectory` records every state and the per-sample energies ``E_ATTN`` and
``E_FF`` (normalised, as in the paper's Fig. 5) at every iteration.

Options that reproduce the authors' released code (all off by default; see
``cemlib/README_helmholtz_hyperset.md``): ``qkv_gain`` and ``ff_gain`` (learnable RMSNorm gains),
``time_embedding="authors"``, ``step_cond_norm=False`` and ``step_zero_time_mlp=True`` (their
step-size network), ``head="rmsnorm"`` (their Sudoku head), ``patch_embed="ln_linear_ln"`` (their
image patch embedding ``LayerNorm -> Linear -> LayerNorm``) and ``init_std`` (their Sudoku
initialisation: every embedding, projection and head weight ``N(0, init_std^2)``, biases zero,
the step-size network untouched).
"""

from __future__ import annotations

import math

import torch
from torch import nn

from cemlib.layers import hyperset as hl
from cemlib.layers import hyperset_variants as hv
from cemlib.utils import check_positive_int, check_tensor, check_token_ids

__all__ = ["HyperSETModel", "ATTENTIONS", "FEEDFORWARDS", "sinusoidal_positions", "HEADS",
           "PATCH_EMBEDS"]

HEADS = ("layernorm", "rmsnorm")
PATCH_EMBEDS = ("linear", "ln_linear_ln")

ATTENTIONS = {"bisoftmax": hl.BiSoftmaxAttention, "sigmoid": hv.SigmoidAttention,
              "linear": hv.LinearAttention}
FEEDFORWARDS = {"relu": hl.TiedReLUFeedForward, "softmax": hv.SoftmaxFeedForward,
                "gated": hv.GatedFeedForward}


def sinusoidal_positions(n: int, d: int) -> torch.Tensor:
    """Absolute sinusoidal positional encoding (Vaswani et al.), shape ``(n, d)``."""
    pos = torch.arange(n, dtype=torch.float64)[:, None]
    i = torch.arange(0, d, 2, dtype=torch.float64)
    ang = pos * torch.exp(-math.log(10000.0) * i / d)
    pe = torch.zeros(n, d, dtype=torch.float64)
    pe[:, 0::2] = torch.sin(ang)
    pe[:, 1::2] = torch.cos(ang[:, : d // 2])
    return pe.float()


class HyperSETModel(nn.Module):
    """Embedding, ``n_iter`` iterations of one Hyper-SET layer, and a classification head.

    ``forward(x)`` takes tokens (B, N) or patches (B, N, patch_dim) and returns logits
    (B, N, n_classes) with ``pool="none"``, else (B, n_classes). The iterated layer returns the next
    state itself (no residual or norm around it; see
    :class:`~cemlib.layers.hyperset.HyperSETLayer`). Attention is bidirectional: the model
    classifies, it does not generate text.

    :param d: the token width.
    :param n_heads: attention subspaces.
    :param n_iter: iterations of the layer (the recurrent depth).
    :param n_classes: classes per position (``pool="none"``) or per example.
    :param n_positions: tokens per example.
    :param vocab_size: for token inputs: ids ``0 .. vocab_size - 1`` (give this or ``patch_dim``).
    :param patch_dim: for patch inputs: the width of a patch vector.
    :param ff_dim: the feed-forward width (default ``d``).
    :param pool: ``"none"`` (per-token logits), ``"mean"`` or ``"cls"``.
    :param positional: ``"learned"`` or ``"sinusoidal"`` positions.
    :param attention: ``"bisoftmax"``, ``"sigmoid"`` or ``"linear"`` (Table 19).
    :param feedforward: ``"relu"``, ``"softmax"`` or ``"gated"`` (Table 20).
    :param step_size: ``None`` learns the step sizes; a number fixes them.
    :param condition: ``"x0"`` or ``"xt"``: what conditions the step sizes.
    :param freq_dim: the step-size network's time-embedding width.
    :param lora_rank: rank of depth-wise LoRA (0: none; it fixes the depth at ``n_iter``).
    :param lora_scale: the LoRA factor ``s``.
    :param qkv_gain: ``"none"``, ``"shared"`` or ``"separate"`` learnable RMSNorm gains.
    :param ff_gain: a learnable gain on the feed-forward RMSNorm.
    :param time_embedding: ``"cemlib"`` or ``"authors"``.
    :param step_cond_norm: RMS-normalise the step-size condition.
    :param step_zero_time_mlp: zero-initialise the step-size network's TimeMLP.
    :param head: ``"layernorm"`` (``LayerNorm -> Linear``) or ``"rmsnorm"`` (the released Sudoku
        head).
    :param patch_embed: ``"linear"`` or ``"ln_linear_ln"`` (the released image models).
    :param init_std: ``None`` (PyTorch's defaults) or the released Sudoku initialisation's
        standard deviation.
    """

    def __init__(self, *, d: int, n_heads: int, n_iter: int, n_classes: int, n_positions: int,
                 vocab_size: int | None = None, patch_dim: int | None = None,
                 ff_dim: int | None = None, pool: str = "none", positional: str = "learned",
                 attention: str = "bisoftmax", feedforward: str = "relu",
                 step_size: float | None = None, condition: str = "x0", freq_dim: int = 512,
                 lora_rank: int = 0, lora_scale: float = 4.0, qkv_gain: str = "none",
                 ff_gain: bool = False, time_embedding: str = "cemlib", step_cond_norm: bool = True,
                 step_zero_time_mlp: bool = False, head: str = "layernorm",
                 patch_embed: str = "linear", init_std: float | None = None):
        super().__init__()
        for v, n in ((d, "d"), (n_heads, "n_heads"), (n_iter, "n_iter"), (n_classes, "n_classes"),
                     (n_positions, "n_positions")):
            check_positive_int(v, n)
        if (vocab_size is None) == (patch_dim is None):
            raise ValueError("give exactly one of vocab_size (tokens) or patch_dim (patches)")
        if pool not in ("none", "mean", "cls"):
            raise ValueError(f"pool must be 'none', 'mean' or 'cls', got {pool!r}")
        if positional not in ("learned", "sinusoidal"):
            raise ValueError(f"positional must be 'learned' or 'sinusoidal', got {positional!r}")
        for kind, table, what in ((attention, ATTENTIONS, "attention"),
                                  (feedforward, FEEDFORWARDS, "feedforward")):
            if kind not in table:
                raise ValueError(f"unknown {what} {kind!r}; choose from {sorted(table)}")
        if head not in HEADS:
            raise ValueError(f"head must be one of {HEADS}, got {head!r}")
        if patch_embed not in PATCH_EMBEDS:
            raise ValueError(f"patch_embed must be one of {PATCH_EMBEDS}, got {patch_embed!r}")
        if patch_embed != "linear" and patch_dim is None:
            raise ValueError(f"patch_embed={patch_embed!r} needs patch inputs (patch_dim)")
        if init_std is not None and (isinstance(init_std, bool) or not isinstance(init_std, (int, float))
                                         or not math.isfinite(init_std) or init_std <= 0):
            raise ValueError(f"init_std must be a positive number or None, got {init_std!r}")
        self.d, self.n_iter, self.pool, self.n_positions = d, n_iter, pool, n_positions
        self.vocab_size, self.patch_dim = vocab_size, patch_dim
        if vocab_size is not None:
            self.embed = nn.Embedding(check_positive_int(vocab_size, "vocab_size"), d)
        elif patch_embed == "linear":
            self.embed = nn.Linear(check_positive_int(patch_dim, "patch_dim"), d)
        else:
            self.embed = nn.Sequential(nn.LayerNorm(check_positive_int(patch_dim, "patch_dim")),
                                       nn.Linear(patch_dim, d), nn.LayerNorm(d))
        n_tok = n_positions + (pool == "cls")
        if positional == "learned":
            self.pos = nn.Parameter(0.02 * torch.randn(n_tok, d))
        else:
            self.register_buffer("pos", sinusoidal_positions(n_tok, d))
        self.cls = nn.Parameter(0.02 * torch.randn(d)) if pool == "cls" else None
        attn = ATTENTIONS[attention](d, n_heads, qkv_gain=qkv_gain)
        ff = FEEDFORWARDS[feedforward](d, ff_dim, gain=ff_gain)
        lora = None
        if lora_rank:
            lora = hv.DepthwiseLoRA(d, attn.W.shape[1], ff.ff_dim, n_iter, lora_rank, lora_scale)
        step_opts = {"time_embedding": time_embedding, "cond_norm": step_cond_norm,
                     "zero_time_mlp": step_zero_time_mlp}
        self.layer = hl.HyperSETLayer(attn, ff, step_size, condition, freq_dim, lora, step_opts)
        if head == "layernorm":
            self.head = nn.Sequential(nn.LayerNorm(d), nn.Linear(d, n_classes))
        else:
            self.head = nn.Sequential(nn.RMSNorm(d), nn.Linear(d, n_classes, bias=False))
        self.init_std = init_std
        if init_std is not None:
            self.normal_init(init_std)

    def normal_init(self, std: float) -> None:
        """The released Sudoku code's initialisation: every ``Linear`` / ``Embedding`` weight outside
        the step-size network, and the tied ``W`` and ``D``, drawn from ``N(0, std^2)``; biases zero."""
        step_net = getattr(self.layer, "step_net", None)
        skip = set(step_net.modules()) if step_net is not None else set()
        with torch.no_grad():
            for m in self.modules():
                if m in skip or not isinstance(m, (nn.Linear, nn.Embedding)):
                    continue
                m.weight.normal_(0.0, std)
                if getattr(m, "bias", None) is not None:
                    m.bias.zero_()
            for sub, name in (("attention", "W"), ("feedforward", "D")):
                mod = getattr(self.layer, sub, None)
                if mod is not None and isinstance(getattr(mod, name, None), nn.Parameter):
                    getattr(mod, name).normal_(0.0, std)

    def embed_inputs(self, x: torch.Tensor) -> torch.Tensor:
        """``x(0)``: token or patch embedding plus positions (CLS prepended if ``pool="cls"``)."""
        if self.vocab_size is not None:
            if x.dim() != 2 or x.dtype not in (torch.int64, torch.int32):
                raise ValueError(f"token input must be an integer tensor (B, N), got "
                                 f"{tuple(x.shape)} {x.dtype}")
            check_token_ids(x, self.vocab_size)  # (skipped while torch.compile traces)
        else:
            check_tensor(x, "patches", ndim=3, last_dim=self.patch_dim, finite="where_free")
        if x.shape[1] != self.n_positions:
            raise ValueError(f"expected {self.n_positions} tokens per sample, got {x.shape[1]}")
        X = self.embed(x)
        if self.cls is not None:
            X = torch.cat([self.cls.expand(X.shape[0], 1, -1).to(X.dtype), X], dim=1)
        return X + self.pos.to(X.dtype)

    def _n_iter(self, n_iter):
        return self.n_iter if n_iter is None else check_positive_int(n_iter, "n_iter")

    def head_logits(self, X: torch.Tensor) -> torch.Tensor:
        if self.pool == "mean":
            X = X.mean(1)
        elif self.pool == "cls":
            X = X[:, 0]
        return self.head(X)

    def forward(self, x: torch.Tensor, n_iter: int | None = None) -> torch.Tensor:
        X0 = self.embed_inputs(x)
        X = X0
        for t in range(self._n_iter(n_iter)):
            X = self.layer(X, t, X0)
        return self.head_logits(X)

    @torch.no_grad()
    def trajectory(self, x: torch.Tensor, n_iter: int | None = None) -> dict:
        """States ``(T+1, B, N, d)`` and per-sample energies ``(T+1, B)`` at each iteration.

        The energy at state ``t`` uses the weights of iteration ``t`` (those of the last
        iteration for the final state when depth-wise LoRA is on).
        """
        X0 = self.embed_inputs(x)
        states, X = [X0], X0
        T = self._n_iter(n_iter)
        for t in range(T):
            X = self.layer(X, t, X0)
            states.append(X)
        ea, ef = zip(*(self.layer.energies(s, min(t, T - 1)) for t, s in enumerate(states)))
        return {"states": torch.stack(states), "attention_energy": torch.stack(ea).sum(-1),
                "ff_energy": torch.stack(ef).sum(-1), "logits": self.head_logits(X)}

    def num_parameters(self, trainable_only: bool = True) -> int:
        return sum(p.numel() for p in self.parameters() if p.requires_grad or not trainable_only)
