"""CEM attention: T preconditioned gradient steps on the interaction energy (CEM Algorithm 1, MHA).

Energy ([arXiv] eq. 2 = [ICLR] eq. 1, with eq. 12 and Appendix B), see
:func:`cemlib.energies.cem.interaction_energy`; the layer's update (eqs. 14, 16):

    hn = RMSNorm(h);  k_j^k = W_K^k hn_j  (= values, K = V tying);  x^(0) = h
    u  = RMSNorm(x^(t))                         (query_norm=True; u = x^(t) otherwise)
    x^(t+1) = x^(t) - eta sum_k P_k g_k(u),     g_k = -(W_Q^kT o_k + d_k * o^hn_k)   (Q = O tying)

with ``o_k = sum_j alpha_kij k_j^k`` and the diagonal value path ``o^hn_k = sum_j alpha_kij hn_j``.

Exactness. With ``query_norm=False``, ``P = I`` per head and ``diag_grad="exact"`` the update is
exactly ``x - eta grad_x eps(x | hn)``; with per-head ``P_k`` it is ``x - eta sum_k P_k grad eps_k``
(eq. 14; not a preconditioned gradient of eps, each head's gradient gets its own P_k). With ``query_norm=True`` (Algorithm
1, the default) the update uses ``grad_u eps`` at ``u = RMSNorm(x)`` and drops the norm's Jacobian:
the true gradient of ``eps(RMSNorm(x))`` is ``J^T grad_u eps``, ``J^T v = g*v/r - x (x.(g*v))/(D r^3)``;
the difference is measured in ``tests/layers/test_cem_attention.py``. ``diag_grad="paper"`` reproduces
Algorithm 1, which omits ``d_k * o^hn_k`` (not a gradient when a diagonal is present).

Choices (the papers are silent or disagree; see ``cemlib/README_cem.md``):

- ``tau="head"`` (default) is ``sqrt(D_r)`` ([arXiv] eq. 5, the standard attention scale, and the
  Llama baseline's); ``"model"`` is ``sqrt(D_h)`` ([ICLR] eq. 5 and Algorithm 1); or a number.
- one RMSNorm module (learnable gain) serves the context ``hn`` and the query ``u``: at t = 0,
  ``u = hn_i``, so T = 1 is exactly pre-norm tied attention ``x + MHA(RMSNorm(x))``; the residual
  stream itself is never renormalised (our reading of Algorithm 1 of the ICLR 2026 submission version).
- ``diag="shared"`` (the paper's proposal) initialised to zero; ``diag_grad="exact"`` by default.
- ALiBi ``-m_k|i-j|`` with ``m_k = 2^{-8k/K}`` for every K (the ALiBi paper's geometric rule, see
  :func:`cemlib.kernels.reference.alibi_slopes`; [arXiv] sign, the [ICLR] ``+`` sign favours distant
  tokens), held in the layer's dtype; learnable self/cross biases per head, zero-initialised (only
  their difference matters).
- ``eta`` fixed at 1 by default (``learn_eta=True`` makes it a parameter).
"""

from __future__ import annotations

import math

import torch
from torch import nn

from cemlib.energies.cem import interaction_energy
from cemlib.kernels import dispatch
from cemlib.kernels.reference import alibi_slopes, refresh_alibi_buffer
from cemlib.layers.base import EnergyLayer, check_norm_eps, check_step_size
from cemlib.layers.cache import KVCache, tied_attention_cached
from cemlib.layers.norm import RMSNorm
from cemlib.layers.precondition import Preconditioner
from cemlib.utils import (check_positive_int, check_tensor, finite_check_is_free, merge_heads,
                          resolve_head_dim, split_heads)

__all__ = ["CEMAttention", "resolve_tau"]

DIAG_MODES = ("none", "shared", "per_head")
DIAG_GRADS = ("exact", "paper")


def _step(x: torch.Tensor, eta, delta: torch.Tensor) -> torch.Tensor:
    """``x - eta * delta``: one pass when ``eta`` is a number (a learned ``eta`` is a tensor)."""
    return x - eta * delta if isinstance(eta, torch.Tensor) else torch.add(x, delta, alpha=-eta)


def resolve_tau(tau, d_model: int, head_dim: int) -> float:
    """``"head"`` -> sqrt(D_r) ([arXiv] eq. 5), ``"model"`` -> sqrt(D_h) ([ICLR] eq. 5), or a
    positive number."""
    if tau == "head":
        return math.sqrt(head_dim)
    if tau == "model":
        return math.sqrt(d_model)
    if isinstance(tau, (int, float)) and not isinstance(tau, bool) and tau > 0:
        return float(tau)
    raise ValueError(f"tau must be 'head', 'model' or a positive number, got {tau!r}")


class CEMAttention(EnergyLayer):
    """Tied (K = V, Q = O), causal, multi-head CEM attention with T recursive steps (Algorithm 1).

    ``forward(x)`` maps the residual stream (B, L, D_h) to ``x^(T)`` (the residual is part of the
    update). ``energy(x, h)`` / ``energy_grad(x, h)``: per-token ``eps(N(x) | RMSNorm(h))`` and its
    exact gradient in x (``N`` = RMSNorm if ``query_norm`` else identity); ``h`` defaults to ``x``.

    .. important::
       ``forward`` returns the **updated stream** ``x^(T) = x + update``, not an update, and it
       normalises its context and its query itself (its own RMSNorm). It replaces a whole pre-norm
       attention sublayer ``x + Attn(RMSNorm(x))``:

       - right: ``x = attn(x)`` (then ``x = mlp(x)`` with :class:`~cemlib.layers.cem_mlp.CEMMLP`);
       - wrong: ``x = x + attn(norm(x))``, which adds the stream twice and normalises twice.

       At T = 1 it is one pre-norm sublayer of tied attention, ``x + MHA(RMSNorm(x))`` with
       ``K = V`` and ``Q = O`` (plus the diagonal value path and the learned biases).
       For dropout on its update use
       :class:`~cemlib.layers.reuse.IncrementDropout`.

    :param d_model: the width ``D_h`` of the stream.
    :param n_heads: heads ``K``.
    :param head_dim: per-head width ``D_r`` (default ``D_h / K``).
    :param T: recursion steps (eq. 16); the context stays fixed, only the query moves.
    :param eta: the step size (finite, >= 0).
    :param learn_eta: make ``eta`` a learned parameter.
    :param tau: the softmax temperature, ``"head"`` (``sqrt(D_r)``), ``"model"`` (``sqrt(D_h)``)
        or a positive number.
    :param diag: the diagonal of the key-query interaction, ``"shared"`` (one per layer, the
        paper's proposal, zero-initialised), ``"per_head"`` or ``"none"``.
    :param diag_grad: ``"exact"`` (the gradient of the energy) or ``"paper"`` (Algorithm 1, which
        omits the diagonal's value path).
    :param alibi: ALiBi distance penalties ``-m_k |i - j|``.
    :param self_cross_bias: learned per-head biases for a token attending to itself and to others.
    :param query_norm: RMS-normalise the query inside the recursion (Algorithm 1); ``False`` makes
        the update an exact gradient step.
    :param preconditioner: per-head ``P_k``: ``"none"``, ``"diag"`` or ``"dplr"`` (eqs. 13-14).
    :param precond_rank: rank of the ``"dplr"`` preconditioner.
    :param precond_safeguard: keep ``P_k`` positive definite (cemlib's safeguard,
        :class:`~cemlib.layers.precondition.Preconditioner`).
    :param norm_eps: the RMSNorm's epsilon.
    :param init_std: standard deviation of the initial ``W_Q``, ``W_K``.
    :param check_finite: reject NaN/Inf input with a clear error (one device sync per call).
    """

    def __init__(self, d_model: int, n_heads: int, head_dim: int | None = None, *, T: int = 1,
                 eta: float = 1.0, learn_eta: bool = False, tau="head", diag: str = "shared",
                 diag_grad: str = "exact", alibi: bool = True, self_cross_bias: bool = True,
                 query_norm: bool = True, preconditioner: str = "none", precond_rank: int = 4,
                 precond_safeguard: bool = False, norm_eps: float = 1e-6, init_std: float = 0.02,
                 check_finite: bool = True):
        super().__init__()
        head_dim = resolve_head_dim(d_model, n_heads, head_dim)
        self.T = check_positive_int(T, "T")
        check_step_size(eta, "eta")
        check_norm_eps(norm_eps, "norm_eps")
        if diag not in DIAG_MODES:
            raise ValueError(f"diag must be one of {DIAG_MODES}, got {diag!r}")
        if diag_grad not in DIAG_GRADS:
            raise ValueError(f"diag_grad must be one of {DIAG_GRADS}, got {diag_grad!r}")
        self.d_model, self.n_heads, self.head_dim = d_model, n_heads, head_dim
        self.tau = resolve_tau(tau, d_model, head_dim)
        self.diag, self.diag_grad, self.query_norm = diag, diag_grad, query_norm
        self.check_finite = check_finite
        self.norm = RMSNorm(d_model, eps=norm_eps)
        self.W_Q = nn.Parameter(torch.randn(n_heads * head_dim, d_model) * init_std)
        self.W_K = nn.Parameter(torch.randn(n_heads * head_dim, d_model) * init_std)
        if diag == "shared":
            self.d = nn.Parameter(torch.zeros(d_model))
        elif diag == "per_head":
            self.d = nn.Parameter(torch.zeros(n_heads, d_model))
        else:
            self.d = None
        if alibi:
            # slopes in the default dtype (float32 unless set otherwise); _apply keeps them exact
            # in whatever dtype the layer is converted to (.double(), .to(torch.float64), ...)
            self.register_buffer("alibi", alibi_slopes(n_heads).to(torch.get_default_dtype()),
                                 persistent=False)
        else:
            self.alibi = None
        if self_cross_bias:
            self.self_bias = nn.Parameter(torch.zeros(n_heads))
            self.cross_bias = nn.Parameter(torch.zeros(n_heads))
        else:
            self.self_bias = self.cross_bias = None
        if learn_eta:
            self.eta = nn.Parameter(torch.tensor(float(eta)))
        else:
            self.eta = float(eta)
        self.P = Preconditioner(d_model, preconditioner, precond_rank, n_heads=n_heads,
                                safeguard=precond_safeguard)

    def _apply(self, fn, recurse=True):
        super()._apply(fn, recurse)
        refresh_alibi_buffer(self)  # exact slopes in the new dtype, not float32 ones widened
        return self

    # -- pieces ------------------------------------------------------------------------------
    def _check(self, x: torch.Tensor, name: str) -> None:
        check_tensor(x, name, ndim=3, last_dim=self.d_model,
                     finite=self.check_finite and finite_check_is_free(x))

    def _heads(self, W: torch.Tensor) -> torch.Tensor:
        return W.view(self.n_heads, self.head_dim, self.d_model)

    def context(self, h: torch.Tensor):
        """``(hn, kv)``: the normalised context (B, L, D_h) and tied keys/values (B, K, L, D_r)."""
        hn = self.norm(h)
        kv = split_heads(hn @ self.W_K.T, self.n_heads)
        return hn, kv

    def query(self, x: torch.Tensor) -> torch.Tensor:
        """``u = RMSNorm(x)`` inside the recursion (Algorithm 1), or ``x`` if not ``query_norm``."""
        return self.norm(x) if self.query_norm else x

    def _attend(self, u, hn, kv, values: bool, head_sum: bool = False):
        """Attention of the queries ``u`` (B, n, D_h) to the context ``hn``, ``kv`` of ``L``
        tokens; ``n < L`` when decoding with a cache (the queries are the last ``n`` tokens)."""
        q = split_heads(u @ self.W_Q.T, self.n_heads)
        extra = {}
        if self.d is not None:
            qe = self.d * u if self.d.dim() == 1 else self.d[None, :, None, :] * u[:, None]
            extra = dict(q_extra=qe.to(q.dtype), k_extra=hn.to(q.dtype), extra_values=values,
                         extra_head_sum=values and head_sum)
        attend = dispatch.tied_attention if q.shape[2] == kv.shape[2] else tied_attention_cached
        return attend(q, kv, scale=1.0 / self.tau, alibi=self.alibi, self_bias=self.self_bias,
                      cross_bias=self.cross_bias, **extra)

    def head_grads(self, u, hn, kv, exact: bool = True, per_head: bool = True) -> torch.Tensor:
        """``grad_u eps_k`` per head (B, K, L, D_h), or summed over heads (B, L, D_h);
        ``exact=False`` drops the diagonal value term (Algorithm 1)."""
        values = exact and self.d is not None
        # shared diagonal, heads summed: sum_k d * o^hn_k = d * (sum_k alpha_k) hn, K times
        # cheaper than the per-head diagonal value paths (and fused on GPU at any width)
        head_sum = not per_head and self.d is not None and self.d.dim() == 1
        out = self._attend(u, hn, kv, values, head_sum)
        o = out[0]
        if not per_head:
            o_x = merge_heads(o) @ self.W_Q                            # sum_k W_Q^kT o_k
            if values and head_sum:
                return -torch.addcmul(o_x, self.d, out[2])            # ... + d * sum_k o^hn_k
            g = -o_x
        else:
            g = -torch.einsum("bklr,krh->bklh", o, self._heads(self.W_Q))
        if values:
            dk = self.d if self.d.dim() == 1 else self.d[None, :, None, :]
            ge = dk * out[2]
            g = g - (ge if per_head else ge.sum(1))
        return g

    def direction(self, x: torch.Tensor, hn: torch.Tensor, kv: torch.Tensor,
                  u: torch.Tensor | None = None) -> torch.Tensor:
        """``Delta x = sum_k P_k g_k(u)`` (eq. 14 at ``x^(t)``); the update is
        ``x - eta Delta x``. ``u`` defaults to :meth:`query` of ``x``."""
        u = self.query(x) if u is None else u
        exact = self.diag_grad == "exact"
        if self.P.kind == "none":
            return self.head_grads(u, hn, kv, exact, per_head=False)
        return self.P(self.head_grads(u, hn, kv, exact, per_head=True)).sum(1)

    # -- EnergyLayer protocol ------------------------------------------------------------------
    def forward(self, x: torch.Tensor, return_trajectory: bool = False, cache: KVCache | None = None):
        """``x^(T)`` (B, L, D_h); with ``return_trajectory`` also the list
        ``[x^(0), ..., x^(T)]``.

        ``cache`` (decoding): ``x`` holds the tokens that follow the ``cache.length`` kept ones;
        their ``kv`` (and ``hn`` with a diagonal) are kept, and their queries attend to every kept
        token. The context comes from the input only, so one entry per token serves all ``T``
        steps."""
        self._check(x, "x")
        hn, kv = self.context(x)
        ctx = hn
        if cache is not None:
            decoding = cache.length > 0
            kept = cache.append(kv=kv, **({} if self.d is None else {"hn": hn}))
            if decoding:
                kv, ctx = kept["kv"], kept.get("hn")
        traj = [x]
        for t in range(self.T):
            # at t = 0, x = h: the query RMSNorm(x) is the context's hn (same
            # module), reused; the step is x - eta * Delta x
            u = hn if t == 0 and self.query_norm else None
            x = _step(x, self.eta, self.direction(x, ctx, kv, u))
            traj.append(x)
        return (x, traj) if return_trajectory else x

    def new_cache(self, capacity: int) -> KVCache:
        """An empty :class:`~cemlib.layers.cache.KVCache` for :meth:`forward`: ``kv`` (K D_r per
        token), and ``hn`` (D_h) with a diagonal."""
        return KVCache(capacity)

    def energy(self, x: torch.Tensor, h: torch.Tensor | None = None, per_head: bool = False):
        """``eps(N(x_i) | RMSNorm(h)_{1:i})`` per token (B, L), or (B, K, L) with ``per_head``."""
        h = x if h is None else h
        self._check(x, "x")
        self._check(h, "h")
        return interaction_energy(self.query(x), self.norm(h), self._heads(self.W_Q),
                                  self._heads(self.W_K), tau=self.tau, d=self.d, alibi=self.alibi,
                                  self_bias=self.self_bias, cross_bias=self.cross_bias,
                                  per_head=per_head)

    def energy_grad(self, x: torch.Tensor, h: torch.Tensor | None = None) -> torch.Tensor:
        """Exact ``grad_x`` of :meth:`energy` in closed form (diagonal value term and, with
        ``query_norm``, the RMSNorm Jacobian ``J^T`` included)."""
        h = x if h is None else h
        self._check(x, "x")
        self._check(h, "h")
        hn, kv = self.context(h)
        g = self.head_grads(self.query(x), hn, kv, exact=True, per_head=False)
        return self.norm.vjp(x, g) if self.query_norm else g

    def extra_repr(self) -> str:
        return (f"d_model={self.d_model}, n_heads={self.n_heads}, head_dim={self.head_dim}, "
                f"T={self.T}, tau={self.tau:.4g}, diag={self.diag!r}, diag_grad={self.diag_grad!r}, "
                f"alibi={self.alibi is not None}, query_norm={self.query_norm}")
