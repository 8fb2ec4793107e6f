"""The NRGPT block: one parallel, weight-shared step ``x <- x - eta dE/dg`` (NRGPT eq. 6), applied
recurrently (Dehmamy et al. 2025, NRGPT, §2).

``g = LayerNorm(x)``, ``RMSNorm(x)`` or ``x`` (eq. 17). The per-token energy is
``E_A = E^AT_A + E^FF_A`` (eqs. 3, 11, 14; :mod:`cemlib.energies.nrgpt`). Which quantity each
token's update descends, precisely: token ``A`` moves along ``-eta v_A`` with
``v_A = d E_A / d g_A`` taken through the *query slot* (keys ``g_B`` held fixed), i.e. the gradient
w.r.t. ``g`` of ``sum_A E_A(g_A | g_B fixed)`` -- :meth:`NRGPTBlock.grad_g`. Three things it is not:
the gradient of the global energy ``sum_A E_A`` (key-side terms dropped, eq. 12 / App. B.2), the
gradient w.r.t. ``x`` (the normalisation Jacobian is dropped: the step is applied to ``x``, eq. 6),
and, with the self-inclusive mask, the full partial ``dE_A/dg_A`` (the self-key term is dropped).
:meth:`NRGPTBlock.energy_grad` gives the exact ``x``-gradients so tests can measure each gap.

Inference rate ``eta`` (``rate=``): ``"gamma"`` = ``c diag(gamma)``, ``c > 0`` (Prop. 2.1);
``"matrix"`` = unconstrained ``D x D`` (the authors' code); ``"psd_skew"`` = ``U^T U + V - V^T``
with ``U`` of shape ``(D', D)`` (eq. 19, Prop. 2.2; the paper's ``U in R^{D x D'}`` does not
type-check).

Corrections with a switch to the paper's form: ``ff2w_form="paper"`` uses eq. (24) as printed
(wrong sign and second term); :func:`norm_jacobian` with ``form="paper"`` is eq. (28) (missing the
``1/D`` factor, and for LayerNorm the centring term ``-1 1^T/D``).
"""

from __future__ import annotations

import math

import torch
from torch import nn

from cemlib.energies import nrgpt as en
from cemlib.layers.base import EnergyLayer, check_norm_eps
from cemlib.layers.cache import KVCache, visible_keys
from cemlib.layers.norm import layer_norm, layer_norm_vjp, rms_norm, rms_norm_vjp
from cemlib.utils import check_positive_int, check_tensor

__all__ = ["NRGPTBlock", "norm_jacobian", "NORMS", "RATES", "RATE_INITS", "FF_KINDS"]

NORMS = ("layernorm", "rmsnorm", "none")
RATES = ("gamma", "matrix", "psd_skew")
FF_KINDS = ("ff1", "ff2w", "dam", "ff2")
RATE_INITS = ("identity", "normal")


def _choice(value, options, name):
    if value not in options:
        raise ValueError(f"{name} must be one of {options}, got {value!r}")
    return value


def norm_jacobian(x, norm="layernorm", gain=None, eps=1e-5, form="exact"):
    """Per-token Jacobian ``dg_A/dx_A``, shape ``(..., D, D)`` (row ``i`` = ``dg_i``).

    ``form="exact"``: RMSNorm ``diag(gamma)(I - y y^T / D) / r``; LayerNorm
    ``diag(gamma)(I - 1 1^T/D - y y^T / D) / r`` (``r`` includes ``eps``; rank ``D-2`` at ``eps=0``).
    ``form="paper"``: eq. (28)-(30), ``diag(gamma)(I - y y^T) / r`` with the same ``y`` and ``r``.
    """
    _choice(norm, NORMS, "norm")
    _choice(form, ("exact", "paper"), "form")
    D = x.shape[-1]
    eye = torch.eye(D, dtype=x.dtype, device=x.device)
    if norm == "none":
        return eye.expand(*x.shape, D).clone()
    c = x - x.mean(-1, keepdim=True) if norm == "layernorm" else x
    r = torch.sqrt(c.pow(2).mean(-1, keepdim=True) + eps)
    y = c / r
    yy = y[..., :, None] * y[..., None, :]
    if form == "paper":
        P = eye - yy
    else:
        P = eye - yy / D
        if norm == "layernorm":
            P = P - torch.ones_like(eye) / D
    G = torch.ones(D, dtype=x.dtype, device=x.device) if gain is None else gain
    return G[:, None] * P / r[..., None]


class NRGPTBlock(EnergyLayer):
    """One NRGPT step; ``forward(x) = x - eta v(N(x))`` with ``v`` from :meth:`grad_g`.

    ``forward(x)`` returns the **updated stream** (B, L, D), not an update: the residual and the
    normalisation ``N`` are inside the step, and the block replaces a whole (parallel) pre-norm
    block. Use it as ``x = block(x)``, or ``block.run(x, n_steps)`` for the recurrent model; never
    ``x + block(norm(x))``.

    The authors' released code differs in five places; each is an option here, off by default:
    ``ff="ff2"``, ``learn_ff_scale``, ``rate_init="normal"``, ``attn_dropout`` and
    ``learn_alpha=False``.

    :param d_model: the width ``D``.
    :param n_heads: heads ``H`` (one full ``D x D`` ``J_h`` per head, App. D).
    :param ff: the feed-forward energy, ``"ff1"``, ``"ff2w"``, ``"dam"`` or ``"ff2"`` (the
        authors' two-layer energy, first layer ``ff2_hidden`` wide).
    :param ff_hidden: the feed-forward hidden width ``M`` (default ``4 D``).
    :param act: ``"gelu"`` or ``"relu"``.
    :param ff_bias: biases in the feed-forward energy.
    :param norm: ``N``: ``"layernorm"``, ``"rmsnorm"`` or ``"none"`` (eq. 17).
    :param norm_eps: the normalisation's epsilon.
    :param learn_gain: learn the norm's gain (``False`` freezes ``gamma = 1``, as the authors'
        ``BareLayerNorm``).
    :param mask: ``"strict"`` (``B < A``, the paper) or ``"inclusive"`` (``B <= A``).
    :param beta: the attention's inverse temperature (default ``1/sqrt(D/H)``, eq. 10).
    :param rate: the inference rate ``eta``: ``"gamma"`` (``c diag(gamma)``, Prop. 2.1),
        ``"matrix"`` (unconstrained, the authors' code) or ``"psd_skew"`` (eq. 19).
    :param rate_scale: the scale ``c`` of the rate.
    :param rate_rank: ``D'`` of the ``"psd_skew"`` rate.
    :param ff2w_form: ``"exact"`` or ``"paper"`` (eq. 24 as printed: wrong sign and second term).
    :param init_std: standard deviation of the initial weights.
    :param learn_alpha: learned per-head weights ``alpha_h`` (``False``: none, as in the authors'
        code).
    :param learn_ff_scale: a learnable scalar ``s`` on the feed-forward energy,
        ``E_A = E^AT_A + s E^FF_A``, initialised to 1 (the authors' code).
    :param rate_init: ``"identity"`` (``rate_scale I``) or ``"normal"`` (the ``matrix`` rate drawn
        ``N(0, init_std^2)``: the authors' ``proj`` Linear).
    :param attn_dropout: dropout on the attention weights and on the attention update, in training
        mode only (the authors' code).
    :param ff2_hidden: the first layer width of ``ff="ff2"`` (default ``D``).
    :param learn_rate_scale: ``False`` freezes ``c`` of the ``gamma`` rate (with
        ``learn_gain=False`` and ``rate_scale=1`` the rate is fixed at ``eta = I``, the paper's
        Fig. 2 setting).
    """

    def __init__(self, d_model: int, n_heads: int = 1, *, ff: str = "ff2w", ff_hidden: int | None = None,
                 act: str = "gelu", ff_bias: bool = True, norm: str = "layernorm", norm_eps: float = 1e-5,
                 learn_gain: bool = True, mask: str = "strict", beta: float | None = None,
                 rate: str = "matrix", rate_scale: float = 1.0, rate_rank: int | None = None,
                 ff2w_form: str = "exact", init_std: float = 0.02, learn_alpha: bool = True,
                 learn_ff_scale: bool = False, rate_init: str = "identity", attn_dropout: float = 0.0,
                 ff2_hidden: int | None = None, learn_rate_scale: bool = True):
        super().__init__()
        D = self.d_model = check_positive_int(d_model, "d_model")
        H = self.n_heads = check_positive_int(n_heads, "n_heads")
        M = self.ff_hidden = check_positive_int(4 * D if ff_hidden is None else ff_hidden, "ff_hidden")
        self.ff, self.act = _choice(ff, FF_KINDS, "ff"), _choice(act, en.ACTIVATIONS, "act")
        self.norm, self.mask = _choice(norm, NORMS, "norm"), _choice(mask, en.MASKS, "mask")
        self.rate = _choice(rate, RATES, "rate")
        self.rate_init = _choice(rate_init, RATE_INITS, "rate_init")
        if not isinstance(learn_rate_scale, bool):
            raise ValueError(f"learn_rate_scale must be a bool, got {learn_rate_scale!r}")
        if not learn_rate_scale and rate != "gamma":
            raise ValueError(f"learn_rate_scale=False applies to rate='gamma' only, got rate={rate!r}")
        if rate_init != "identity" and rate != "matrix":
            raise ValueError(f"rate_init={rate_init!r} applies to rate='matrix' only, got rate={rate!r}")
        if isinstance(attn_dropout, bool) or not (isinstance(attn_dropout, (int, float))
                                                  and 0.0 <= attn_dropout < 1.0):
            raise ValueError(f"attn_dropout must be a probability in [0, 1), got {attn_dropout!r}")
        self.attn_dropout = float(attn_dropout)
        self.ff2w_form = _choice(ff2w_form, ("exact", "paper"), "ff2w_form")
        if ff2w_form == "paper" and (ff != "ff2w" or ff_bias):
            raise ValueError("ff2w_form='paper' needs ff='ff2w' and ff_bias=False (eq. 24 has no biases)")
        if not rate_scale > 0:
            raise ValueError(f"rate_scale must be positive, got {rate_scale!r}")
        self.norm_eps = check_norm_eps(norm_eps, "norm_eps")
        self.beta = float(math.sqrt(H / D) if beta is None else beta)
        if not self.beta > 0:
            raise ValueError(f"beta must be positive, got {beta!r}")

        def randn(*shape):
            return nn.Parameter(torch.randn(*shape) * init_std)

        # normalisation parameters (gamma, delta of eq. 17)
        if norm != "none":
            if learn_gain:
                self.gain = nn.Parameter(torch.ones(D))
            else:
                self.register_buffer("gain", torch.ones(D))
        else:
            self.gain = None
        self.bias = nn.Parameter(torch.zeros(D)) if norm == "layernorm" else None
        # attention: J_h (H, D, D) and head weights alpha_h (eq. 11)
        self.J = randn(H, D, D)
        if learn_alpha:
            self.alpha = nn.Parameter(torch.ones(H))
        else:
            self.register_buffer("alpha", torch.ones(H))
        self.drop = nn.Dropout(self.attn_dropout)
        # feed-forward: W1 (M, D) [ff2: (D1, D)], W2 (D, M) for ff2w, (M, D1) for ff2
        D1 = check_positive_int(D if ff2_hidden is None else ff2_hidden, "ff2_hidden") if ff == "ff2" else M
        self.W1 = randn(D1, D)
        self.b1 = nn.Parameter(torch.zeros(D1)) if ff_bias else None
        self.W2 = randn(D, M) if ff == "ff2w" else randn(M, D1) if ff == "ff2" else None
        b2_dim = {"ff2w": D, "ff2": M}.get(ff)
        self.b2 = nn.Parameter(torch.zeros(b2_dim)) if (b2_dim and ff_bias) else None
        self.ff_scale = nn.Parameter(torch.ones(())) if learn_ff_scale else None
        # inference rate eta
        self._rate_scale = float(rate_scale)
        if rate == "gamma":
            log_c = torch.tensor(math.log(rate_scale))
            if learn_rate_scale:
                self.log_c = nn.Parameter(log_c)
            else:  # kept for checkpoints; rate_matrix uses the exact c in the block's dtype
                self.register_buffer("log_c", log_c)
        elif rate == "matrix":
            self.eta = nn.Parameter(rate_scale * torch.eye(D) if rate_init == "identity"
                                    else torch.randn(D, D) * init_std)
        else:
            Dp = check_positive_int(D if rate_rank is None else rate_rank, "rate_rank")
            self.U = nn.Parameter(math.sqrt(rate_scale) * torch.eye(Dp, D))
            self.V = randn(D, D)

    # ------------------------------------------------------------------ normalisation
    def normalize(self, x: torch.Tensor) -> torch.Tensor:
        """``g = N(x)`` (eq. 17 / 25 / 26)."""
        if self.norm == "layernorm":
            return layer_norm(x, self.gain, self.bias, self.norm_eps)
        if self.norm == "rmsnorm":
            return rms_norm(x, self.gain, self.norm_eps)
        return x

    def norm_vjp(self, x: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        """``J_N(x)^T v`` per token (exact, from :mod:`cemlib.layers.norm`)."""
        if self.norm == "layernorm":
            return layer_norm_vjp(x, v, self.gain, self.norm_eps)
        if self.norm == "rmsnorm":
            return rms_norm_vjp(x, v, self.gain, self.norm_eps)
        return v

    def norm_jacobian(self, x: torch.Tensor, form: str = "exact") -> torch.Tensor:
        """Per-token ``dg_A/dx_A`` (see :func:`norm_jacobian`)."""
        return norm_jacobian(x, self.norm, self.gain, self.norm_eps, form)

    # ------------------------------------------------------------------ inference rate
    def rate_matrix(self) -> torch.Tensor:
        """``eta`` as a ``D x D`` matrix (acts on column vectors: ``dx_A = -eta v_A``). A frozen
        scale (``learn_rate_scale=False``) is ``rate_scale`` itself in the block's dtype, not the
        exponential of a logarithm rounded to float32 (3e-8 off in a float64 block)."""
        if self.rate == "gamma":
            gamma = self.gain if self.gain is not None else self.J.new_ones(self.d_model)
            c = torch.exp(self.log_c) if isinstance(self.log_c, nn.Parameter) else gamma.new_tensor(self._rate_scale)
            return c * torch.diag(gamma)
        if self.rate == "matrix":
            return self.eta
        return self.U.T @ self.U + self.V - self.V.T

    # ------------------------------------------------------------------ energies (g space)
    def _check(self, t: torch.Tensor, name: str) -> torch.Tensor:
        check_tensor(t, name, last_dim=self.d_model, finite="where_free")
        if t.dim() < 2:
            raise ValueError(f"{name} must have shape (..., N, {self.d_model}), got {tuple(t.shape)}")
        if t.shape[-2] == 0:
            raise ValueError(f"{name} is an empty sequence (shape {tuple(t.shape)}): NRGPTBlock needs "
                             f"at least one token")
        return t

    def _ff_args(self):
        if self.ff in ("ff2w", "ff2"):
            return self.W1, self.W2, self.act, self.b1, self.b2
        return self.W1, self.act, self.b1

    def _scaled_ff(self, value: torch.Tensor) -> torch.Tensor:
        """``s * value`` with the learnable feed-forward scale, if any."""
        return value if self.ff_scale is None else self.ff_scale * value

    def _ff_grad_exact(self, g: torch.Tensor) -> torch.Tensor:
        fn = {"ff1": en.ff1_grad, "ff2w": en.ff2w_grad, "dam": en.ff_dam_grad, "ff2": en.ff2_grad}[self.ff]
        return self._scaled_ff(fn(g, *self._ff_args()))

    def energy_parts_g(self, g: torch.Tensor, context: torch.Tensor | None = None):
        """``(E^AT_A, E^FF_A)`` per token at normalised tokens ``g`` (keys from ``context`` if given)."""
        self._check(g, "g")
        e_at = en.attention_energy(g, self.J, self.alpha, self.beta, self.mask, context)
        e_ff = {"ff1": en.ff1_energy, "ff2w": en.ff2w_energy, "dam": en.ff_dam_energy,
                "ff2": en.ff2_energy}[self.ff](g, *self._ff_args())
        return e_at, self._scaled_ff(e_ff)

    def energy_g(self, g: torch.Tensor, context: torch.Tensor | None = None) -> torch.Tensor:
        """Per-token ``E_A = E^AT_A + E^FF_A`` (eq. 3 with ``alpha_h``, FF term ``B = A`` only)."""
        e_at, e_ff = self.energy_parts_g(g, context)
        return e_at + e_ff

    def ff_grad_g(self, g: torch.Tensor) -> torch.Tensor:
        """``dE^FF_A/dg_A`` (or, with ``ff2w_form="paper"``, the paper's eq. 24 version)."""
        if self.ff == "ff2w" and self.ff2w_form == "paper":
            return self._scaled_ff(en.ff2w_grad_paper(g, self.W1, self.W2, self.act))
        return self._ff_grad_exact(g)

    def grad_g(self, g: torch.Tensor) -> torch.Tensor:
        """The update direction ``v_A``: query-slot ``dE_A/dg_A`` (eq. 12 + FF gradient), i.e.
        ``grad_g sum_A energy_g(g, context=g.detach())``."""
        self._check(g, "g")
        return en.attention_query_grad(g, self.J, self.alpha, self.beta, self.mask) + self.ff_grad_g(g)

    # ------------------------------------------------------------------ EnergyLayer protocol (x space)
    def energy(self, x: torch.Tensor, h: torch.Tensor | None = None) -> torch.Tensor:
        """Per-token ``E_A`` at ``g = N(x)``; ``h`` (optional, same shape) fixes the keys ``N(h)``."""
        self._check(x, "x")
        ctx = None if h is None else self.normalize(self._check(h, "h"))
        return self.energy_g(self.normalize(x), ctx)

    def energy_grad(self, x: torch.Tensor, h: torch.Tensor | None = None) -> torch.Tensor:
        """Exact ``grad_x energy(x, h).sum()`` in closed form. With ``h`` given (keys fixed) this is
        ``J_N(x_A)^T v_A``, the per-token x-gradient; with ``h=None`` it is the global gradient and
        adds the key-side term. Always uses the correct FF2W gradient."""
        self._check(x, "x")
        g = self.normalize(x)
        if h is None:
            v = en.attention_query_grad(g, self.J, self.alpha, self.beta, self.mask)
            v = v + en.attention_key_grad(g, self.J, self.alpha, self.beta, self.mask)
        else:
            ctx = self.normalize(self._check(h, "h"))
            if ctx.shape != g.shape:
                raise ValueError(f"h shape {tuple(h.shape)} != x shape {tuple(x.shape)}")
            v = en.attention_query_grad(g, self.J, self.alpha, self.beta, self.mask, ctx)
        return self.norm_vjp(x, v + self._ff_grad_exact(g))

    def _query_grad_cached(self, g: torch.Tensor, keys: torch.Tensor) -> torch.Tensor:
        """:meth:`grad_g`'s attention part for queries ``g`` (..., n, D) that are the last ``n``
        of the ``L`` tokens ``keys`` (..., L, D): ``-sum_h alpha_h J_h^T sum_B SM_BA g_B``
        (eq. 12) over the visible keys. Past the first token every row has a visible key."""
        n, L = g.shape[-2], keys.shape[-2]
        s = en.attention_scores(g, self.J, self.beta, keys)                  # (..., H, n, L)
        seen = visible_keys(n, L, strict=self.mask == "strict", device=g.device)
        p = torch.softmax(s.masked_fill(~seen, float("-inf")), dim=-1)
        o = torch.einsum("...hab,...bi->...hai", p, keys)
        return -torch.einsum("h,hji,...haj->...ai", self.alpha, self.J, o)

    def forward(self, x: torch.Tensor, cache: KVCache | None = None) -> torch.Tensor:
        """One step ``x <- x - eta v(N(x))`` (eq. 6), closed form. In training mode with
        ``attn_dropout > 0`` the attention part of ``v`` is regularised as in the authors' code:
        dropout on its weights, then on the summed attention update.

        ``cache`` (decoding, eval mode): ``x`` holds the tokens that follow the ``cache.length``
        kept ones; their ``g = N(x)`` (every head's keys and values) are kept, and their queries
        attend to every kept token."""
        self._check(x, "x")
        g = self.normalize(x)
        if cache is not None:
            if self.training and self.attn_dropout > 0:
                raise ValueError("decoding with a cache runs without attention dropout: call eval()")
            decoding = cache.length > 0
            keys = cache.append(g=g)["g"]
            if decoding:
                v = self._query_grad_cached(g, keys) + self.ff_grad_g(g)
                return x - v @ self.rate_matrix().T
        if self.training and self.attn_dropout > 0:
            att = en.attention_query_grad(g, self.J, self.alpha, self.beta, self.mask,
                                          weight_dropout=self.drop)
            v = self.drop(att) + self.ff_grad_g(g)
        else:
            v = self.grad_g(g)
        return x - v @ self.rate_matrix().T

    def energy_rate(self, x: torch.Tensor, form: str = "exact") -> torch.Tensor:
        """First-order change of each ``E_A`` under one step when only ``x_A`` moves (earlier tokens
        frozen, the premise of Prop. 2.1): ``-v_A^T (dg_A/dx_A) eta v_A``; ``form`` picks the exact
        or the paper's eq. (28) Jacobian."""
        self._check(x, "x")
        v = self.grad_g(self.normalize(x))
        step = v @ self.rate_matrix().T
        Jac = self.norm_jacobian(x, form)
        return -torch.einsum("...ai,...aij,...aj->...a", v, Jac, step)

    def run(self, x: torch.Tensor, n_steps: int, return_energies: bool = False,
            cache: list | None = None):
        """Apply the block ``n_steps`` times. With ``return_energies`` also return the per-token
        energies ``E_A`` at every state, shape ``(n_steps + 1, *x.shape[:-1])`` (detached).
        ``cache`` (decoding): one :class:`~cemlib.layers.cache.KVCache` per step (each step's
        keys are that step's states)."""
        check_positive_int(n_steps, "n_steps")
        if cache is not None and (return_energies or len(cache) != n_steps):
            raise ValueError(f"decoding needs one cache per step ({n_steps}, got {len(cache)}) and "
                             f"no energies")
        energies = []
        for t in range(n_steps + 1):
            if return_energies:
                with torch.no_grad():
                    energies.append(self.energy(x))
            if t < n_steps:
                x = self(x) if cache is None else self(x, cache=cache[t])
        return (x, torch.stack(energies)) if return_energies else x

    def new_cache(self, capacity: int) -> KVCache:
        """An empty :class:`~cemlib.layers.cache.KVCache` for one step: ``g`` (D per token, the
        keys and values of every head)."""
        return KVCache(capacity)

    def extra_repr(self) -> str:
        extra = "".join(f", {k}={v!r}" for k, v, default in (
            ("rate_init", self.rate_init, "identity"), ("attn_dropout", self.attn_dropout, 0.0),
            ("learn_ff_scale", self.ff_scale is not None, False),
            ("learn_alpha", isinstance(self.alpha, nn.Parameter), True),
            ("learn_rate_scale", isinstance(getattr(self, "log_c", None), nn.Parameter), self.rate == "gamma"))
            if v != default)
        return (f"d_model={self.d_model}, n_heads={self.n_heads}, ff={self.ff}, ff_hidden={self.ff_hidden}, "
                f"act={self.act}, norm={self.norm}, mask={self.mask}, rate={self.rate}, beta={self.beta:.4g}"
                + extra)
