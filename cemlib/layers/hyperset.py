"""The Hyper-SET layer (Hu et al. 2025, arXiv:2502.11646, §3-4, eqs. 7-12): alternating steps on E_ATTN and E_FF.

- :class:`SubspaceAttention` / :class:`BiSoftmaxAttention`: the tied symmetric attention of
  eq. (9), ``X <- X - alpha * sum_h W_h Z_h (softmax_row(G_h) + softmax_col(G_h))`` in the paper's
  column layout, with ``Z_h = RMSNorm(W_h^T X)`` (norm ``sqrt(p)``), ``G_h = Z_h^T Z_h / sqrt(p)``,
  Q = K = V = ``W_h^T`` and O = ``W_h``. Without the norm (``normalize=False``) the update is
  exactly ``-alpha grad E_ATTN`` (eq. 7). With it, it is **not** the gradient of
  ``E_ATTN(RMSNorm(W_h^T X))``: eq. (9) drops the RMSNorm Jacobian
  ``J = (sqrt(p)/||z||)(I - z z^T/||z||^2)``; :meth:`energy_grad` keeps it.
- :class:`TiedFeedForward` / :class:`TiedReLUFeedForward`: eq. (11),
  ``X <- X + gamma * D ReLU(RMSNorm(D^T X))`` (up = ``D^T``, down = ``D``), again with the Jacobian
  dropped; without the norm ``D ReLU(D^T x) = -grad E_FF`` exactly (eq. 10).
- :class:`StepSizeNet`: eq. (12) / Table 6, channel-wise per-token ``alpha_t, gamma_t`` from a
  sinusoidal embedding of ``t`` plus ``RMSNorm(x(0))`` (or ``x(t)``), last layer zero-initialised
  (every iteration is the identity at initialisation).
- :class:`HyperSETLayer`: one attention step then one feed-forward step on the post-attention state
  (the alternating minimisation of eq. 6), optionally with depth-wise LoRA weights for iteration t.

RMSNorm here has unit gain by default, so the normalised projections lie exactly on the constraint
spheres of eqs. (4)-(5) (up to ``eps``). The authors' released code uses learnable gains: one
RMSNorm shared by Q, K and V in its Sudoku model, three separate ones (Q, K, V) in its image
models, and one on the feed-forward hidden layer. ``qkv_gain="shared"`` / ``"separate"`` and
``TiedFeedForward(gain=True)`` reproduce them (options, off by default): a shared gain keeps
Q = K = V (the update is still eq. 9 for the gained projections). Separate gains keep the score
symmetric (diagonal gains commute: ``Q K^T = U diag(g_q g_k) U^T``), but the update is the gradient
of eq. (3) in that metric only if ``g_v = g_q g_k``, which nothing enforces. :meth:`energy` always
evaluates the unit-gain energy, as the authors' logging helpers do.
Tokens are rows: ``X (..., N, d)``; the Table 19/20 alternatives are in
:mod:`cemlib.layers.hyperset_variants`.
"""

from __future__ import annotations

import math

import torch
from torch import nn

from cemlib.energies import hyperset as hs
from cemlib.layers.base import EnergyLayer, check_norm_eps, check_step_size
from cemlib.layers.norm import rms_norm
from cemlib.utils import check_positive_int, check_tensor, resolve_head_dim

__all__ = ["SubspaceAttention", "BiSoftmaxAttention", "TiedFeedForward", "TiedReLUFeedForward",
           "StepSizeNet", "HyperSETLayer", "timestep_embedding", "qkv_update", "QKV_GAINS",
           "TIME_EMBEDDINGS"]


def _apply_step(x, direction, step):
    if not isinstance(step, torch.Tensor):
        if not math.isfinite(step):
            raise ValueError(f"step size must be finite, got {step!r}")
        return x + step * direction
    check_tensor(step, "step size", finite="where_free")
    try:
        torch.broadcast_shapes(step.shape, x.shape)
    except RuntimeError:
        raise ValueError(f"step size of shape {tuple(step.shape)} does not broadcast to the tokens "
                         f"{tuple(x.shape)}") from None
    return x + step * direction


QKV_GAINS = ("none", "shared", "separate")


def qkv_update(kind: str, Q, K, V, beta=None):
    """The attention direction with separate query, key and value projections ``(..., N, p)``:
    bi-softmax ``(softmax_row(G) + softmax_col(G)) V``, sigmoid ``sigma'(G) V`` with
    ``G = beta Q K^T``, linear ``Phi'(Q) * beta Phi(V) (Phi(Q)^T Phi(K))`` (the released code's
    forms). With ``Q = K = V = U`` each equals ``grad_U`` of its energy (:mod:`cemlib.energies.hyperset`)."""
    b = 1.0 / math.sqrt(Q.shape[-1]) if beta is None else float(beta)
    if kind == "bisoftmax":
        G = b * Q @ K.transpose(-1, -2)
        return (torch.softmax(G, -1) + torch.softmax(G, -2)) @ V
    if kind == "sigmoid":
        s = torch.sigmoid(b * Q @ K.transpose(-1, -2))
        return (s * (1 - s)) @ V
    if kind == "linear":
        PQ, PK, PV = torch.sigmoid(Q), torch.sigmoid(K), torch.sigmoid(V)
        return PQ * (1 - PQ) * (b * PV @ (PQ.transpose(-1, -2) @ PK))
    raise ValueError(f"unknown attention kind {kind!r}")


class SubspaceAttention(EnergyLayer):
    """Symmetric tied attention over ``H`` subspaces ``W_h (d, p)``: a step on the attention energy
(Hyper-SET eq. 3, the update of eq. 7 with the RMSNorm constraint of eqs. 8-9); ``kind`` picks the
energy (Table 4's variants).

    ``forward(x, alpha=1.0, W=None)`` returns the **stepped tokens** ``x + alpha * direction``
    (..., N, d), not an update; the projections are RMS-normalised inside (``normalize``). It
    replaces a whole pre-norm attention sublayer: ``x = attn(x, alpha)``, never
    ``x + attn(norm(x))``. The attention is bidirectional (no causal mask).

    :param d: the token width ``d``.
    :param n_heads: subspaces ``H``.
    :param head_dim: the subspace width ``p`` (default ``d / H``).
    :param normalize: RMS-normalise the projections ``W_h^T x`` (the paper's layer; ``False``
        makes the step exactly ``-alpha grad E_ATTN``).
    :param beta: the inverse temperature of the scores (default ``1/sqrt(p)``).
    :param eps: the RMSNorm's epsilon.
    :param qkv_gain: learnable RMSNorm gains: ``"none"``, ``"shared"`` (one for Q, K and V) or
        ``"separate"`` (the authors' image models; the score stays symmetric, but the update is
        a gradient only if the value gain equals the product of the query and key gains, which
        nothing enforces).
    """

    kind = "bisoftmax"

    def __init__(self, d: int, n_heads: int, head_dim: int | None = None, normalize: bool = True,
                 beta: float | None = None, eps: float = 1e-6, qkv_gain: str = "none"):
        super().__init__()
        head_dim = resolve_head_dim(d, n_heads, head_dim, name="d")
        check_norm_eps(eps, "eps")
        if qkv_gain not in QKV_GAINS:
            raise ValueError(f"qkv_gain must be one of {QKV_GAINS}, got {qkv_gain!r}")
        self.d, self.n_heads, self.head_dim = d, n_heads, head_dim
        self.normalize, self.beta, self.eps, self.qkv_gain = normalize, beta, eps, qkv_gain
        self.W = nn.Parameter(torch.randn(d, n_heads * head_dim) / math.sqrt(d))
        # learnable RMSNorm gains over the head dimension, shared by the heads (as nn.RMSNorm(p)
        # applied to (B, H, N, p) in the released code); one-dimensional, so never weight-decayed
        names = {"none": (), "shared": ("qkv_gain_",), "separate": ("q_gain", "k_gain", "v_gain")}
        for name in names[qkv_gain]:
            setattr(self, name, nn.Parameter(torch.ones(head_dim)))

    def _W(self, W):
        if W is None:
            return self.W
        if W.shape != self.W.shape:
            raise ValueError(f"W must have shape {tuple(self.W.shape)}, got {tuple(W.shape)}")
        return W

    def energy(self, x, h=None, W=None):
        """``sum_h E^h_i`` per token (eq. 3 or Table 19), at the normalised projections if
        ``normalize`` (the energy the paper plots in Fig. 5)."""
        return hs.attention_energy(x, self._W(W), self.n_heads, self.normalize, self.kind,
                                   self.beta, self.eps)

    def energy_grad(self, x, h=None, W=None):
        """Exact gradient of :meth:`energy` (RMSNorm Jacobian included)."""
        return hs.attention_energy_grad(x, self._W(W), self.n_heads, self.normalize, self.kind,
                                        self.beta, self.eps)

    def descent_direction(self, x, W=None):
        """The paper's update direction (eq. 9 / Table 19 with the sign corrected):
        ``-sum_h W_h [grad_U E](U_h)`` at ``U_h = RMSNorm(W_h^T x)``, Jacobian dropped."""
        W = self._W(W)
        hs.check_tokens(x, self.d, "x")
        _, grad = hs.ATTENTION_KERNELS[self.kind]
        Z = hs.split_heads(x @ W, self.n_heads)
        U = rms_norm(Z, eps=self.eps) if self.normalize else Z
        if self.qkv_gain == "shared":
            U = U * self.qkv_gain_
        if self.qkv_gain == "separate":
            g = qkv_update(self.kind, U * self.q_gain, U * self.k_gain, U * self.v_gain, self.beta)
        else:
            g = grad(U, self.beta)
        return -hs.merge_heads(g) @ W.T

    def forward(self, x, alpha=1.0, W=None):
        """``x + alpha * descent_direction(x)`` (eq. 9 for bi-softmax); ``alpha`` broadcasts."""
        return _apply_step(x, self.descent_direction(x, W), alpha)

    def extra_repr(self) -> str:
        return (f"d={self.d}, n_heads={self.n_heads}, head_dim={self.head_dim}, "
                f"kind={self.kind!r}, normalize={self.normalize}, qkv_gain={self.qkv_gain!r}")


class BiSoftmaxAttention(SubspaceAttention):
    """Eq. (9): row softmax + column softmax of the symmetric score (the default attention).

    ``forward(x, alpha)`` returns the stepped tokens (use as ``x = attn(x, alpha)``); the options
    are :class:`SubspaceAttention`'s.
    """

    kind = "bisoftmax"


class TiedFeedForward(EnergyLayer):
    """Tied feed-forward ``x - gamma * D [grad_U E](RMSNorm(D^T x))``: a step on the feed-forward
energy (Hyper-SET eq. 5, the update of eqs. 10-11); ``kind`` picks the energy (Table 4's variants).

    ``forward(x, gamma=1.0, D=None)`` returns the **stepped tokens** ``x + gamma * direction``
    (..., N, d), not an update, with the hidden layer RMS-normalised inside. It replaces a whole
    pre-norm MLP sublayer: ``x = ff(x, gamma)``, never ``x + ff(norm(x))``.

    :param d: the token width ``d``.
    :param ff_dim: the hidden width ``M`` (default ``d``).
    :param normalize: RMS-normalise the hidden layer ``D^T x`` (the paper's layer; ``False`` makes
        the step exactly ``-gamma grad E_FF``).
    :param eps: the RMSNorm's epsilon.
    :param gain: a learnable gain on the hidden RMSNorm (the authors' code).
    """

    kind = "relu"

    def __init__(self, d: int, ff_dim: int | None = None, normalize: bool = True,
                 eps: float = 1e-6, gain: bool = False):
        super().__init__()
        check_positive_int(d, "d")
        ff_dim = d if ff_dim is None else ff_dim
        check_positive_int(ff_dim, "ff_dim")
        check_norm_eps(eps, "eps")
        self.d, self.ff_dim, self.normalize, self.eps = d, ff_dim, normalize, eps
        self.D = nn.Parameter(torch.randn(d, ff_dim) / math.sqrt(d))
        # the released code's learnable RMSNorm gain on the hidden layer (option, off by default)
        self.gain = nn.Parameter(torch.ones(ff_dim)) if gain else None

    def _D(self, D):
        if D is None:
            return self.D
        if D.shape != self.D.shape:
            raise ValueError(f"D must have shape {tuple(self.D.shape)}, got {tuple(D.shape)}")
        return D

    def energy(self, x, h=None, D=None):
        """E_FF per token (eq. 5 or Table 20), at ``RMSNorm(D^T x)`` if ``normalize``."""
        return hs.ff_energy(x, self._D(D), self.normalize, self.kind, self.eps)

    def energy_grad(self, x, h=None, D=None):
        """Exact gradient of :meth:`energy` (RMSNorm Jacobian included)."""
        return hs.ff_energy_grad(x, self._D(D), self.normalize, self.kind, self.eps)

    def descent_direction(self, x, D=None):
        """Eq. (11)'s direction ``D ReLU(RMSNorm(D^T x))`` (Jacobian dropped); eq. (10) if not
        normalised."""
        D = self._D(D)
        hs.check_tokens(x, self.d, "x")
        _, grad = hs.FEEDFORWARD_KERNELS[self.kind]
        U = x @ D
        U = rms_norm(U, eps=self.eps) if self.normalize else U
        return -grad(U if self.gain is None else U * self.gain) @ D.T

    def forward(self, x, gamma=1.0, D=None):
        return _apply_step(x, self.descent_direction(x, D), gamma)

    def extra_repr(self) -> str:
        return (f"d={self.d}, ff_dim={self.ff_dim}, kind={self.kind!r}, normalize={self.normalize}, "
                f"gain={self.gain is not None}")


class TiedReLUFeedForward(TiedFeedForward):
    """Eqs. (10)-(11): ``D ReLU(RMSNorm(D^T x))`` with up = ``D^T`` and down = ``D``.

    ``forward(x, gamma)`` returns the stepped tokens (use as ``x = ff(x, gamma)``); the options are
    :class:`TiedFeedForward`'s.
    """

    kind = "relu"


TIME_EMBEDDINGS = ("cemlib", "authors")


def timestep_embedding(t: int, dim: int, dtype=torch.float32, max_period: float = 10000.0,
                       style: str = "cemlib"):
    """Sinusoidal embedding of the iteration index ``t`` (defined for any ``t``, so the model can be
    run for more iterations than it was trained with).

    ``style="cemlib"``: frequencies ``max_period^(-k/half)``, ``[cos, sin]`` (GLIDE / DiT order).
    ``style="authors"``: the released code's ``SinusoidalPosEmb``, frequencies
    ``max_period^(-k/(half-1))`` (the last one exactly ``1/max_period``), ``[sin, cos]``. The
    iteration count from 1 is the caller's business (:class:`StepSizeNet` passes ``t + 1``)."""
    if style not in TIME_EMBEDDINGS:
        raise ValueError(f"time embedding style must be one of {TIME_EMBEDDINGS}, got {style!r}")
    half = dim // 2
    if style == "authors" and half < 2:
        raise ValueError(f"the authors' time embedding needs dim >= 4, got {dim}")
    denom = half - 1 if style == "authors" else half
    freqs = torch.exp(-math.log(max_period) * torch.arange(half, dtype=torch.float64) / denom)
    arg = float(t) * freqs
    parts = [torch.sin(arg), torch.cos(arg)] if style == "authors" else [torch.cos(arg), torch.sin(arg)]
    emb = torch.cat(parts)
    if dim % 2:
        emb = torch.cat([emb, torch.zeros(1, dtype=torch.float64)])
    return emb.to(dtype)


class StepSizeNet(nn.Module):
    """Eq. (12) / Table 6:
    ``(alpha_t, gamma_t) = Linear_{d->2d}(GELU(TimeMLP(emb(t)) + RMSNorm(c)))``,
    ``c`` = ``x(0)`` (or ``x(t)``); the last Linear is zero-initialised (ReZero).

    ``forward(t, cond)`` returns the per-token, per-channel step sizes ``(alpha, gamma)``, each of
    ``cond``'s shape; it is not a sublayer (:class:`HyperSETLayer` calls it).

    :param d: the token width ``d``.
    :param freq_dim: the width of the sinusoidal embedding of ``t``.
    :param time_embedding: ``"cemlib"`` or ``"authors"`` (the released Sudoku model's frequency
        spacing and ``[sin, cos]`` order, and ``t`` counted from 1).
    :param cond_norm: RMS-normalise the condition (``False``: it enters raw, as in the released
        Sudoku model).
    :param zero_time_mlp: zero-initialise the TimeMLP's Linears too (the released Sudoku model).
    """

    def __init__(self, d: int, freq_dim: int = 512, time_embedding: str = "cemlib",
                 cond_norm: bool = True, zero_time_mlp: bool = False):
        super().__init__()
        check_positive_int(d, "d")
        check_positive_int(freq_dim, "freq_dim")
        if time_embedding not in TIME_EMBEDDINGS:
            raise ValueError(f"time_embedding must be one of {TIME_EMBEDDINGS}, got {time_embedding!r}")
        self.d, self.freq_dim = d, freq_dim
        self.time_embedding, self.cond_norm = time_embedding, bool(cond_norm)
        self.time_mlp = nn.Sequential(nn.Linear(freq_dim, d), nn.GELU(), nn.Linear(d, d))
        self.out = nn.Linear(d, 2 * d)
        layers = [self.out] + ([self.time_mlp[0], self.time_mlp[2]] if zero_time_mlp else [])
        for lin in layers:
            nn.init.zeros_(lin.weight)
            nn.init.zeros_(lin.bias)

    def forward(self, t: int, cond: torch.Tensor):
        """Per-token, per-channel step sizes ``alpha, gamma`` of shape ``cond.shape``."""
        if isinstance(t, bool) or not isinstance(t, int) or t < 0:
            raise ValueError(f"iteration index t must be a non-negative int, got {t!r}")
        hs.check_tokens(cond, self.d, "step-size condition")
        authors = self.time_embedding == "authors"
        emb = timestep_embedding(t + 1 if authors else t, self.freq_dim, cond.dtype,
                                 style=self.time_embedding).to(cond.device)
        c = self.time_mlp(emb) + (rms_norm(cond) if self.cond_norm else cond)
        alpha, gamma = self.out(nn.functional.gelu(c)).chunk(2, dim=-1)
        return alpha, gamma


class HyperSETLayer(nn.Module):
    """One Hyper-SET iteration: attention step (eq. 9), then feed-forward step (eq. 11).

    ``forward(x, t=0, x0=None)`` returns ``x(t+1)`` (..., N, d), the next state, not an update: the
    layer is a whole (pre-norm-free) block, iterated as ``x = layer(x, t, x0)`` for
    ``t = 0, 1, ...`` (:class:`~cemlib.models.hyperset.HyperSETModel` does this).

    :param attention: the attention step (:class:`SubspaceAttention` or a variant).
    :param feedforward: the feed-forward step (:class:`TiedFeedForward` or a variant), same width.
    :param step_size: ``None`` learns ``alpha_t, gamma_t`` with :class:`StepSizeNet`; a number
        fixes ``alpha = gamma = step_size`` (Table 4's ablation).
    :param condition: what conditions the step sizes, ``"x0"`` (Sudoku, MIM) or ``"xt"``
        (classification).
    :param freq_dim: the :class:`StepSizeNet`'s time-embedding width.
    :param lora: a :class:`~cemlib.layers.hyperset_variants.DepthwiseLoRA`: per-iteration low-rank
        updates to ``W`` and ``D``.
    :param step_net_options: further options of :class:`StepSizeNet` (``time_embedding``,
        ``cond_norm``, ``zero_time_mlp``).
    """

    def __init__(self, attention: SubspaceAttention, feedforward: TiedFeedForward,
                 step_size: float | None = None, condition: str = "x0", freq_dim: int = 512,
                 lora: nn.Module | None = None, step_net_options: dict | None = None):
        super().__init__()
        if attention.d != feedforward.d:
            raise ValueError(f"attention width {attention.d} != feed-forward width {feedforward.d}")
        if condition not in ("x0", "xt"):
            raise ValueError(f"condition must be 'x0' or 'xt', got {condition!r}")
        self.attention, self.feedforward, self.condition = attention, feedforward, condition
        self.d = attention.d
        if step_size is None:
            self.step_net = StepSizeNet(self.d, freq_dim, **(step_net_options or {}))
        else:
            check_step_size(step_size, "step_size")  # finite and >= 0 (alpha = gamma = step_size)
            self.step_net = None
        self.step_size = step_size
        self.lora = lora

    def weights(self, t: int):
        """``(W, D)`` used at iteration ``t`` (the shared ones, plus LoRA if any)."""
        if self.lora is None:
            return self.attention.W, self.feedforward.D
        return self.lora(self.attention.W, self.feedforward.D, t)

    def step_sizes(self, t: int, x, x0):
        if self.step_net is None:
            return self.step_size, self.step_size
        return self.step_net(t, x0 if self.condition == "x0" else x)

    def forward(self, x, t: int = 0, x0=None):
        """``x(t) -> x(t+1)``; ``x0`` (defaults to ``x``) conditions the step sizes."""
        hs.check_tokens(x, self.d, "x")
        x0 = x if x0 is None else x0
        W, D = self.weights(t)
        alpha, gamma = self.step_sizes(t, x, x0)
        x_half = self.attention(x, alpha, W=W)
        return self.feedforward(x_half, gamma, D=D)

    def energies(self, x, t: int = 0):
        """Per-token ``(E_ATTN, E_FF)`` at ``x`` with the weights of iteration ``t``."""
        W, D = self.weights(t)
        return self.attention.energy(x, W=W), self.feedforward.energy(x, D=D)
