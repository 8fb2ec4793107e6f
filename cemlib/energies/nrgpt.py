"""NRGPT energies (Dehmamy et al., "NRGPT: an energy-based alternative for GPT"), as functions of
the normalised tokens ``g`` (shape ``(..., N, D)``; token ``A`` is ``g[..., A, :]``).

Every energy here is *per token*: it returns shape ``g.shape[:-1]``. Each comes with a closed-form
gradient (no autograd) that the tests compare with ``torch.autograd.grad`` in float64.

Attention energy, eq. (11) (eq. (3) without the head weights ``alpha_h``)::

    E^AT_A = -(1/beta) sum_h alpha_h log sum_{B<A} exp(beta g_B^T J_h g_A)

``J`` has shape ``(H, D, D)`` (a full ``D x D`` matrix per head, as in the paper's App. D and code).
Which gradient a token's update uses (Dehmamy et al. 2025, NRGPT, §2.1): token ``A`` follows
the *query-slot* gradient of its own energy, eq. (12), ``-sum_h alpha_h J_h^T sum_B SM_BA g_B``,
computed by :func:`attention_query_grad`. This is the gradient of
``sum_A E_A(query g_A | keys held fixed)``, i.e. :func:`attention_energy` with ``context`` given.
It is *not* the gradient of the global energy ``sum_A E_A`` (which adds the key-side term of
:func:`attention_key_grad`, the Energy-Transformer gradient). With the strict mask ``B<A`` of the
paper, ``g_A`` never appears as a key of its own energy, so the query-slot gradient *is*
``dE_A/dg_A``; with the self-inclusive mask ``B<=A`` (the code's Shakespeare setting) the own-slot
partial also has the self-key term ``alpha_h p_AA J_h g_A``, which the update omits.

First token under the strict mask: the sum over ``B<A`` is empty, the paper's ``log 0`` makes
``E^AT_1 = +inf`` (never addressed in the paper). cemlib defines ``E^AT_1 = 0`` with zero
gradient and zero attention weights -- the empty sum contributes nothing, so the first token is
driven by its feed-forward energy alone (the same convention as the authors' code).

Feed-forward energies (per token, the single term ``B = A``; eq. (3)'s sum over all ``B`` inside
``E_A`` changes the value of ``E_A`` but not its gradient w.r.t. ``g_A``):

- DAM, eq. (14)/(16): ``-1^T F(W1 g)`` with ``F' = sigma`` (``F = relu^2/2`` or the GELU primitive);
- FF1: ``-||sigma(W g + b)||^2``; its gradient is an MLP with activation ``2 sigma sigma'``, not the
  ``sigma`` that "same as eq. (14)" claims (equal only for ReLU, and then with a factor 2);
- FF2 (the authors' ``GradFeedForward_2Lay``, used in their Shakespeare sweep; not in the paper):
  ``-||sigma(W2 sigma(W1 g + b1) + b2)||^2``, two layers ``D -> D -> M``;
- FF2W: ``-g^T (W2 sigma(W1 g + b1) + b2)``; correct gradient
  ``-(W2 sigma(u) + W1^T [sigma'(u) * W2^T g] + b2)``; the paper's eq. (24) is wrong
  (:func:`ff2w_grad_paper` reproduces it for the tests).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from cemlib.utils import check_tensor

__all__ = [
    "MASKS", "ACTIVATIONS", "attention_scores", "attention_energy", "attention_weights",
    "attention_query_grad", "attention_key_grad", "activation", "activation_grad",
    "activation_primitive", "ff_dam_energy", "ff_dam_grad", "ff1_energy", "ff1_grad",
    "ff2w_energy", "ff2w_grad", "ff2w_grad_paper", "ff2_energy", "ff2_grad",
]

MASKS = ("strict", "inclusive")
ACTIVATIONS = ("relu", "gelu")
_SQRT2 = math.sqrt(2.0)


# ----------------------------------------------------------------------------- attention, eq. (11)

def _check_attention(g, J, alpha, mask, context=None):
    check_tensor(g, "g", finite="where_free")
    if g.dim() < 2:
        raise ValueError(f"g must have shape (..., N, D), got {tuple(g.shape)}")
    D = g.shape[-1]
    check_tensor(J, "J", ndim=3, last_dim=D, finite="where_free")
    if J.shape[1] != D:
        raise ValueError(f"J must have shape (H, {D}, {D}), got {tuple(J.shape)}")
    check_tensor(alpha, "alpha", ndim=1, finite="where_free")
    if alpha.shape[0] != J.shape[0]:
        raise ValueError(f"alpha has {alpha.shape[0]} heads but J has {J.shape[0]}")
    if mask not in MASKS:
        raise ValueError(f"mask must be one of {MASKS}, got {mask!r}")
    if context is not None:
        check_tensor(context, "context", finite="where_free")
        if context.shape != g.shape:
            raise ValueError(f"context shape {tuple(context.shape)} != g shape {tuple(g.shape)}")


def _allowed(N: int, mask: str, device) -> torch.Tensor:
    """(N, N) boolean: key B is visible to query A (strict: B < A; inclusive: B <= A)."""
    return torch.ones(N, N, dtype=torch.bool, device=device).tril(-1 if mask == "strict" else 0)


def attention_scores(g, J, beta, context=None):
    """``s[..., h, A, B] = beta g_B^T J_h g_A`` with queries ``g`` and keys ``context`` (default
    ``g``). Eq. (10)'s logits."""
    keys = g if context is None else context
    Jq = torch.einsum("hij,...aj->...hai", J, g)  # J_h g_A
    return beta * torch.einsum("...hai,...bi->...hab", Jq, keys)


def _masked_lse(s, mask):
    """Log-sum-exp over visible keys; rows with no visible key (the first token, strict mask)
    get ``lse = 0`` and all-zero weights. Returns ``(lse, p)``; safe for autograd (no NaN)."""
    N = s.shape[-1]
    allowed = _allowed(N, mask, s.device)
    empty = ~allowed.any(-1)  # (N,)
    # a finite dummy logit in empty rows keeps logsumexp (and its backward) finite
    dummy = torch.zeros_like(allowed)
    dummy[empty, 0] = True
    s = torch.where(dummy, torch.zeros_like(s), s.masked_fill(~(allowed | dummy), float("-inf")))
    lse = torch.logsumexp(s, dim=-1)
    p = torch.exp(s - lse[..., None])
    lse = lse.masked_fill(empty, 0.0)
    p = p.masked_fill(empty[:, None], 0.0)
    return lse, p


def attention_energy(g, J, alpha, beta, mask="strict", context=None):
    """Per-token attention energy ``E^AT_A``, eq. (11); shape ``g.shape[:-1]``.

    ``context`` (same shape as ``g``) supplies the keys ``g_B``; by default the keys are ``g``
    itself. With ``context = g.detach()``, autograd w.r.t. ``g`` gives the query-slot gradient
    that the NRGPT update uses (:func:`attention_query_grad`). First token, strict mask: ``0``.
    """
    _check_attention(g, J, alpha, mask, context)
    lse, _ = _masked_lse(attention_scores(g, J, beta, context), mask)
    return -(alpha[:, None] * lse).sum(-2) / beta


def attention_weights(g, J, beta, mask="strict", context=None):
    """Softmax weights ``SM_BA`` of eq. (10), shape ``(..., H, N, N)`` indexed ``[h, A, B]``."""
    return _masked_lse(attention_scores(g, J, beta, context), mask)[1]


def attention_query_grad(g, J, alpha, beta, mask="strict", context=None, weight_dropout=None):
    """``d/dg_A`` of ``E^AT_A`` through the query slot only, eq. (12) divided by ``-eta``:
    ``-sum_h alpha_h J_h^T sum_B SM_BA g_B`` (zero for the first token under the strict mask).

    ``weight_dropout`` (a callable, e.g. an ``nn.Dropout`` in training mode) is applied to the
    weights ``SM_BA`` first, as the authors' code does when training with dropout; the result is
    then a regularised update, not the gradient of any energy."""
    _check_attention(g, J, alpha, mask, context)
    keys = g if context is None else context
    p = attention_weights(g, J, beta, mask, context)
    if weight_dropout is not None:
        p = weight_dropout(p)
    o = torch.einsum("...hab,...bi->...hai", p, keys)  # sum_B SM_BA g_B
    return -torch.einsum("h,hji,...haj->...ai", alpha, J, o)


def attention_key_grad(g, J, alpha, beta, mask="strict"):
    """Key-side part of ``d/dg_B sum_A E^AT_A``: ``-sum_h alpha_h sum_A SM_BA J_h g_A``. The global
    (Energy-Transformer) gradient is ``attention_query_grad + attention_key_grad``; NRGPT drops
    this term (paper §2.1, App. B.2)."""
    _check_attention(g, J, alpha, mask)
    p = attention_weights(g, J, beta, mask)
    Jq = torch.einsum("hij,...aj->...hai", J, g)
    return -torch.einsum("h,...hab,...hai->...bi", alpha, p, Jq)


# ----------------------------------------------------------------------------- activations

def _check_act(name):
    if name not in ACTIVATIONS:
        raise ValueError(f"activation must be one of {ACTIVATIONS}, got {name!r}")


def activation(u, name="gelu"):
    """``sigma(u)``: ReLU or exact (erf) GELU."""
    _check_act(name)
    return F.relu(u) if name == "relu" else F.gelu(u)


def activation_grad(u, name="gelu"):
    """``sigma'(u)``: ``[u > 0]`` for ReLU, ``Phi(u) + u phi(u)`` for GELU."""
    return _act_and_grad(u, name)[1]


def _act_and_grad(u, name):
    """``(sigma(u), sigma'(u))`` sharing ``Phi`` and ``phi`` for GELU (one erf, one exp)."""
    _check_act(name)
    if name == "relu":
        return F.relu(u), (u > 0).to(u.dtype)
    Phi = 0.5 * (1.0 + torch.erf(u / _SQRT2))
    uphi = u * torch.exp(-0.5 * u * u) / math.sqrt(2.0 * math.pi)
    return u * Phi, Phi + uphi


def activation_primitive(u, name="relu"):
    """``F(u)`` with ``F' = sigma`` and ``F(0) = 0``: ``relu(u)^2 / 2`` (eq. 16) or, for GELU,
    ``((u^2 - 1) Phi(u) + u phi(u)) / 2 + 1/4``."""
    _check_act(name)
    if name == "relu":
        return 0.5 * F.relu(u) ** 2
    Phi = 0.5 * (1.0 + torch.erf(u / _SQRT2))
    phi = torch.exp(-0.5 * u * u) / math.sqrt(2.0 * math.pi)
    return 0.5 * ((u * u - 1.0) * Phi + u * phi) + 0.25


# ----------------------------------------------------------------------------- feed-forward

def _check_ff(g, W, name, rows_dim=False):
    check_tensor(g, "g", finite="where_free")
    check_tensor(W, name, ndim=2, finite="where_free")
    D = g.shape[-1]
    if (W.shape[0] if rows_dim else W.shape[1]) != D:
        want = f"({D}, M)" if rows_dim else f"(M, {D})"
        raise ValueError(f"{name} must have shape {want} for token width {D}, got {tuple(W.shape)}")


def _pre(g, W, b):
    u = g @ W.T
    return u if b is None else u + b


def ff_dam_energy(g, W1, act="relu", b1=None):
    """Dense-associative-memory energy, eq. (14): ``E^FF_A = -1^T F(W1 g_A + b1)``, ``F' = sigma``."""
    _check_ff(g, W1, "W1")
    return -activation_primitive(_pre(g, W1, b1), act).sum(-1)


def ff_dam_grad(g, W1, act="relu", b1=None):
    """``dE^FF_A/dg_A = -W1^T sigma(W1 g_A + b1)`` (eq. 14 divided by ``-eta``): a ReLU/GELU MLP whose
    output weights are tied to the input weights (eq. 15)."""
    _check_ff(g, W1, "W1")
    return -activation(_pre(g, W1, b1), act) @ W1


def ff1_energy(g, W, act="gelu", b=None):
    """NRGPT_H_FF1 energy (§3): ``E^FF_A = -||sigma(W g_A + b)||^2`` (App. D omits the minus)."""
    _check_ff(g, W, "W")
    return -activation(_pre(g, W, b), act).pow(2).sum(-1)


def ff1_grad(g, W, act="gelu", b=None):
    """``dE^FF_A/dg_A = -2 W^T [sigma(u) sigma'(u)]``, ``u = W g_A + b`` (activation ``2 sigma sigma'``)."""
    _check_ff(g, W, "W")
    s, ds = _act_and_grad(_pre(g, W, b), act)
    return -2.0 * (s * ds) @ W


def _check_ff2w(g, W1, W2):
    _check_ff(g, W1, "W1")
    _check_ff(g, W2, "W2", rows_dim=True)
    if W2.shape[1] != W1.shape[0]:
        raise ValueError(f"W2 must have shape ({g.shape[-1]}, {W1.shape[0]}), got {tuple(W2.shape)}")


def ff2w_energy(g, W1, W2, act="gelu", b1=None, b2=None):
    """NRGPT_H_FF2W energy: ``E^FF_A = -g_A^T (W2 sigma(W1 g_A + b1) + b2)``; ``W1`` is ``(M, D)``,
    ``W2`` is ``(D, M)`` (the shape eq. 24 needs)."""
    _check_ff2w(g, W1, W2)
    y = activation(_pre(g, W1, b1), act) @ W2.T
    if b2 is not None:
        y = y + b2
    return -(g * y).sum(-1)


def ff2w_grad(g, W1, W2, act="gelu", b1=None, b2=None):
    """Correct gradient of :func:`ff2w_energy` (corrects eq. 24):
    ``dE^FF_A/dg_A = -(W2 sigma(u) + W1^T [sigma'(u) * (W2^T g_A)] + b2)``, ``u = W1 g_A + b1``."""
    _check_ff2w(g, W1, W2)
    s, ds = _act_and_grad(_pre(g, W1, b1), act)
    grad = s @ W2.T + (ds * (g @ W2)) @ W1
    if b2 is not None:
        grad = grad + b2
    return -grad


def _check_ff2(g, W1, W2):
    _check_ff(g, W1, "W1")
    check_tensor(W2, "W2", ndim=2, finite="where_free")
    if W2.shape[1] != W1.shape[0]:
        raise ValueError(f"W2 must have shape (M, {W1.shape[0]}) to follow W1 {tuple(W1.shape)}, "
                         f"got {tuple(W2.shape)}")


def ff2_energy(g, W1, W2, act="gelu", b1=None, b2=None):
    """The authors' two-layer energy (``GradFeedForward_2Lay``, model ``NRGPT_H_FF2``; the FF2 variant
of the authors' code, a two-layer form of the feed-forward energy of NRGPT eq. 14):
    ``E^FF_A = -||sigma(W2 sigma(W1 g_A + b1) + b2)||^2`` with ``W1`` (D1, D), ``W2`` (M, D1); the
    authors use ``D1 = D``, ``M = 4D`` and biases."""
    _check_ff2(g, W1, W2)
    return -activation(_pre(activation(_pre(g, W1, b1), act), W2, b2), act).pow(2).sum(-1)


def ff2_grad(g, W1, W2, act="gelu", b1=None, b2=None):
    """``dE^FF_A/dg_A = -2 W1^T [sigma'(u1) * W2^T (sigma(u2) sigma'(u2))]`` with ``u1 = W1 g + b1``,
    ``u2 = W2 sigma(u1) + b2`` (back-propagation through the two layers, in closed form)."""
    _check_ff2(g, W1, W2)
    s1, ds1 = _act_and_grad(_pre(g, W1, b1), act)
    s2, ds2 = _act_and_grad(_pre(s1, W2, b2), act)
    return -2.0 * (ds1 * ((s2 * ds2) @ W2)) @ W1


def ff2w_grad_paper(g, W1, W2, act="gelu"):
    """The paper's eq. (24) read as the gradient it claims, ``FF = -eta dE/dg`` with
    ``dE/dg = W2 sigma(W1 g) + W1^T [sigma'(W1 g) * sigma(W2^T g)]`` (the only type-correct reading
    of its ``sigma'(W1 g)^T * W1^T sigma(W2 g)``). It has the wrong sign (it matches ``+g^T W2
    sigma(W1 g)``, App. D) and applies ``sigma`` to ``W2^T g``; kept only to test the correction."""
    _check_ff2w(g, W1, W2)
    u = g @ W1.T
    return activation(u, act) @ W2.T + (activation_grad(u, act) * activation(g @ W2, act)) @ W1
