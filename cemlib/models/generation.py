"""Sampling from a causal language model: one implementation for every cemlib family.

:func:`generate` extends a batch of token ids one token at a time, as nanoGPT's ``generate`` does:
at every step the model gives the logits of the last position for the last ``context_length``
tokens, the logits are divided by ``temperature``, all but the ``top_k`` largest are dropped, and the next
token is drawn from the softmax (``temperature=0``: the most likely token, greedy decoding). The
model runs in eval mode (no dropout) under ``torch.no_grad``; its training mode is restored
afterwards. With ``seed`` the draws come from a generator of their own, so the same seed gives the
same text and the global random state is left alone.

A model can sample if it maps ``idx`` (B, L) to logits (B, L, V) causally (position ``i`` sees only
tokens ``<= i``) and says how long a context it takes (``context_length``) and how many tokens it
knows (``vocab_size``). :class:`GenerationMixin` adds the method ``model.generate(...)`` to such a
class; the language models of cemlib that have it: :class:`~cemlib.models.lm.LanguageModel` (every
attention and MLP variant, CEM and Llama), :class:`~cemlib.models.nrgpt.NRGPTModel`,
:class:`~cemlib.models.nrgpt.RecurrentGPTModel`, :class:`~cemlib.models.nrgpt.GPTModel` and
:class:`~cemlib.models.newton_transformer.NewtonTransformer`. Hyper-SET and the recurrent
Transformer attend in both directions, so they do not generate text.

Decoding with a cache (``use_cache=True``, the default): the prompt goes through the model once
with an empty :class:`~cemlib.layers.cache.DecodeCache` (the *prefill*), then each new token alone,
its attention reading the keys and values every layer kept (:mod:`cemlib.layers.cache`): a step
costs one token's projections and ``L`` attention scores per head instead of a forward pass over
``L`` tokens. The logits are those of the uncached path (``use_cache=False``: the whole window at
every step) up to rounding: the tests hold float64 to 1e-10 and float32 to 1e-5 for every family.

Past the window. Once the text is longer than ``context_length``, the uncached path feeds the last
``context_length`` tokens: the oldest token drops out, and with it every deeper layer's keys change
(they depend on the whole window), so a sliding cache would not give the same logits in a model of
more than one layer. Exactness first: from then on every step runs the cropped window whole, as
the uncached path does, at its cost (a forward pass over ``context_length`` tokens per new token).
The cache saves the steps while the text fits the window: ``context_length`` minus the prompt's
length of them.

Streaming. :func:`stream_tokens` (``model.stream_tokens(...)``) is the same loop as a generator: it
yields each new token (a LongTensor ``(B,)``) as soon as it is drawn, and keeps only the window,
so its memory does not grow with the length asked for; :func:`generate` collects its tokens, and
``cemlib generate`` writes each one as it comes. The same seed gives the same tokens either way.

What cannot be sampled is refused with a ``ValueError`` naming the argument: a seed outside
``[0, 2**64 - 1]`` (what a ``torch.Generator`` takes); a temperature below float32's smallest
normal number (tokens are drawn in float32; dividing by a subnormal or zero temperature overflows
every logit to infinity); a temperature whose division overflows the logits at hand; logits that
are not finite (NaN or ``+inf``: weights that diverged, for instance), greedy decoding included.
"""

from __future__ import annotations

import math

import torch

__all__ = ["generate", "stream_tokens", "sample_next", "check_sampling_options", "check_decoding",
           "GenerationMixin", "MAX_SEED"]

#: the largest seed: a ``torch.Generator`` takes the integers 0 .. 2**64 - 1
MAX_SEED = 2**64 - 1
_F32 = torch.finfo(torch.float32)  # the dtype tokens are drawn in


def check_sampling_options(max_new_tokens, temperature, top_k, seed) -> None:
    """Raise ``ValueError`` naming the first option of :func:`generate` that is out of range."""
    if isinstance(max_new_tokens, bool) or not isinstance(max_new_tokens, int) or max_new_tokens < 0:
        raise ValueError(f"max_new_tokens must be a non-negative integer, got {max_new_tokens!r}")
    if isinstance(temperature, bool) or not isinstance(temperature, (int, float)) \
            or not math.isfinite(temperature) or temperature < 0:
        raise ValueError(f"temperature must be a finite number >= 0 (0 = greedy), got {temperature!r}")
    if 0 < temperature < _F32.tiny:
        raise ValueError(f"temperature {temperature!r} is below {_F32.tiny:.2g}, float32's smallest normal "
                         f"number (tokens are drawn in float32): the logits divided by it overflow to "
                         f"infinity; use temperature=0 for greedy decoding, what a temperature near 0 "
                         f"tends to")
    if top_k is not None and (isinstance(top_k, bool) or not isinstance(top_k, int) or top_k < 1):
        raise ValueError(f"top_k must be a positive integer or None (no cut), got {top_k!r}")
    if seed is not None and (isinstance(seed, bool) or not isinstance(seed, int)
                             or not 0 <= seed <= MAX_SEED):
        raise ValueError(f"seed must be an integer from 0 to 2**64 - 1 (what a torch.Generator takes) or "
                         f"None, got {seed!r}")


def check_decoding(model: torch.nn.Module, idx: torch.Tensor) -> None:
    """Raise ``ValueError`` unless ``model`` can decode ``idx`` with a cache: eval mode (dropout
    would make cached and uncached steps differ) and ``idx`` of shape (B, n) with ``n >= 1``."""
    if model.training:
        raise ValueError(f"decoding with a cache runs in eval mode: call {type(model).__name__}.eval() "
                         f"(generate does)")
    if idx.dim() != 2 or idx.shape[1] < 1:
        raise ValueError(f"idx must have shape (B, n) with n >= 1 new tokens, got {tuple(idx.shape)}")


def sample_next(logits: torch.Tensor, temperature: float = 1.0, top_k: int | None = None,
                generator: torch.Generator | None = None) -> torch.Tensor:
    """One token per row from ``logits`` (B, V): ``(B, 1)`` ids.

    ``temperature=0`` takes the arg-max (greedy). Otherwise the logits are divided by
    ``temperature``, every logit below the ``top_k``-th largest is set to ``-inf`` (ties with it
    stay), and the token is drawn from the softmax with ``generator`` (``None``: PyTorch's global
    generator).

    Raises ``ValueError`` where a row cannot be sampled: a NaN or ``+inf`` logit, or every logit
    ``-inf`` (one ``-inf`` is a token ruled out, and allowed); a ``temperature`` whose division
    overflows float32."""
    if logits.dim() != 2:
        raise ValueError(f"logits must have shape (B, V), got {tuple(logits.shape)}")
    logits = logits.float()
    top = logits.amax(dim=-1)           # NaN where a row holds one, +inf where one is, -inf: all are
    if not bool(torch.isfinite(top).all()):
        nan = int(torch.isnan(logits).sum())
        raise ValueError(f"the logits are not finite ({nan} NaN, {int(torch.isposinf(logits).sum())} +inf, "
                         f"{int((top == float('-inf')).sum())} rows all -inf): the model's weights or "
                         f"activations are not finite (weights that diverged?)")
    if temperature == 0:
        return logits.argmax(dim=-1, keepdim=True)
    logits = logits / temperature
    if not bool(torch.isfinite(logits.amax(dim=-1)).all()):
        largest = float(top.abs().max())
        raise ValueError(f"temperature {temperature!r} overflows float32 (tokens are drawn in float32): the "
                         f"largest logit, {largest:.3g}, divided by it exceeds {_F32.max:.3g}; "
                         f"use temperature=0 for greedy decoding, what a temperature near 0 tends to, or "
                         f"at least {largest / _F32.max:.2g}")
    if top_k is not None and top_k < logits.shape[-1]:
        kth = torch.topk(logits, top_k, dim=-1).values[:, -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    probs = torch.softmax(logits, dim=-1)
    return torch.multinomial(probs, num_samples=1, generator=generator)


def _prepare(model, idx, max_new_tokens, temperature, top_k, seed, use_cache):
    """Check every argument of :func:`stream_tokens` / :func:`generate`; return ``idx`` as (B, L),
    whether it was 1-D, and the model's window and vocabulary size."""
    check_sampling_options(max_new_tokens, temperature, top_k, seed)
    if not isinstance(use_cache, bool):
        raise ValueError(f"use_cache must be True or False, got {use_cache!r}")
    if not isinstance(idx, torch.Tensor) or idx.dtype != torch.long:
        raise TypeError(f"idx must be a LongTensor of token ids, got "
                        f"{getattr(idx, 'dtype', type(idx).__name__)}")
    squeeze = idx.dim() == 1
    if squeeze:
        idx = idx.unsqueeze(0)
    if idx.dim() != 2 or idx.shape[1] == 0:
        raise ValueError(f"idx must have shape (B, L) with L >= 1 (a prompt of at least one token), got "
                         f"{tuple(idx.shape)}")
    context = getattr(model, "context_length", None)
    vocab = getattr(model, "vocab_size", None)
    if not isinstance(context, int) or not isinstance(vocab, int):
        raise TypeError(f"{type(model).__name__} does not say its context_length and vocab_size: it is "
                        f"not one of cemlib's causal language models")
    if use_cache and not callable(getattr(model, "new_cache", None)):
        raise TypeError(f"{type(model).__name__} has no decode cache (no new_cache method): pass "
                        f"use_cache=False to run the whole window at every step")
    if idx.numel() and (int(idx.min()) < 0 or int(idx.max()) >= vocab):
        raise ValueError(f"token ids must lie in [0, {vocab}), got range [{int(idx.min())}, {int(idx.max())}]")
    return idx, squeeze, context, vocab


def stream_tokens(model: torch.nn.Module, idx: torch.Tensor, max_new_tokens: int, *, temperature: float = 1.0,
                  top_k: int | None = None, seed: int | None = None, use_cache: bool = True):
    """The tokens :func:`generate` appends to ``idx``, one step at a time: an iterator of
    ``max_new_tokens`` LongTensors of shape (B,) (a 1-D ``idx``: shape ()), each yielded as soon as
    it is drawn.

    The arguments are those of :func:`generate` and are checked when this is called (not at the
    first token). Only the last ``context_length`` tokens are kept, so memory stays that of the
    window however many tokens are asked for. The model is in eval mode under ``torch.no_grad``
    while the stream runs; its mode comes back when the stream ends or is closed (``close()``,
    leaving a ``for`` loop over it early and dropping it, or an exception inside it)."""
    idx, squeeze, context, vocab = _prepare(model, idx, max_new_tokens, temperature, top_k, seed, use_cache)
    generator = None
    if seed is not None:
        generator = torch.Generator(device=idx.device)
        generator.manual_seed(seed)
    return _stream(model, idx, max_new_tokens, temperature, top_k, generator, use_cache, context, vocab,
                   squeeze)


@torch.no_grad()
def _stream(model, idx, max_new_tokens, temperature, top_k, generator, use_cache, context, vocab, squeeze):
    was_training = model.training
    model.eval()
    try:
        length = idx.shape[1]                                   # of the whole text so far
        window = idx[:, -context:]                              # its last context_length tokens
        cache = None
        for step in range(max_new_tokens):
            if not use_cache or length > context:
                cache = None
                logits = model(window)                          # the (cropped) window, whole
            elif cache is None:
                cache = model.new_cache()
                logits = model(window, cache=cache)             # prefill (the text fits the window)
            else:
                logits = model(window[:, -1:], cache=cache)     # the newest token alone
            if logits.dim() != 3 or logits.shape[-1] != vocab:
                raise ValueError(f"{type(model).__name__} must map idx (B, L) to logits (B, L, {vocab}); "
                                 f"got {tuple(logits.shape)}")
            try:
                nxt = sample_next(logits[:, -1, :], temperature, top_k, generator).to(idx.dtype)
            except ValueError as err:
                if str(err).startswith("the logits"):           # say whose, and where
                    raise ValueError(f"the logits of {type(model).__name__} at new token {step + 1}"
                                     f"{str(err)[len('the logits'):]}") from None
                raise
            window = torch.cat([window, nxt], dim=1)[:, -context:]
            length += 1
            yield nxt[0, 0] if squeeze else nxt[:, 0]
    finally:
        model.train(was_training)


def generate(model: torch.nn.Module, idx: torch.Tensor, max_new_tokens: int, *, temperature: float = 1.0,
             top_k: int | None = None, seed: int | None = None, use_cache: bool = True) -> torch.Tensor:
    """``idx`` (B, L) followed by ``max_new_tokens`` sampled tokens: a LongTensor (B, L + n).

    ``model`` maps ``idx`` to logits (B, L, V) causally and has the attributes ``context_length``
    and ``vocab_size`` (every cemlib language model has them). Only the last ``context_length`` tokens are fed at
    each step. ``temperature=0`` is greedy decoding; ``top_k`` keeps the ``top_k`` most likely tokens
    (``top_k=1`` is greedy too); ``seed`` makes the draws reproducible (a generator on ``idx``'s
    device; the global random state is not touched). A 1-D ``idx`` (one prompt) gives a 1-D result.
    ``use_cache`` decodes with the model's cache (``model.new_cache()``, ``model(idx, cache=...)``;
    every cemlib language model has one): prefill, then one token at a time while the text fits
    the window, the cropped window whole past it (module docstring); ``False`` runs the whole
    window at every step. To see each token as it is drawn: :func:`stream_tokens` (the same tokens).
    """
    stream = stream_tokens(model, idx, max_new_tokens, temperature=temperature, top_k=top_k, seed=seed,
                           use_cache=use_cache)
    rows = idx.unsqueeze(0) if idx.dim() == 1 else idx
    length = rows.shape[1]
    out = torch.empty(rows.shape[0], length + max_new_tokens, dtype=rows.dtype, device=rows.device)
    out[:, :length] = rows
    for i, nxt in enumerate(stream):
        out[:, length + i] = nxt
    return out.squeeze(0) if idx.dim() == 1 else out


class GenerationMixin:
    """Adds ``generate(idx, max_new_tokens, temperature=1.0, top_k=None, seed=None)`` (see
    :func:`generate`) and ``stream_tokens(...)`` (the same tokens as they are drawn, see
    :func:`stream_tokens`) to a causal language model that has ``context_length`` and
    ``vocab_size``."""

    def generate(self, idx: torch.Tensor, max_new_tokens: int, *, temperature: float = 1.0,
                 top_k: int | None = None, seed: int | None = None,
                 use_cache: bool = True) -> torch.Tensor:
        """``idx`` (B, L) followed by ``max_new_tokens`` sampled tokens (see :func:`generate`;
        ``use_cache`` decodes with the model's cache)."""
        return generate(self, idx, max_new_tokens, temperature=temperature, top_k=top_k, seed=seed,
                        use_cache=use_cache)

    def stream_tokens(self, idx: torch.Tensor, max_new_tokens: int, *, temperature: float = 1.0,
                      top_k: int | None = None, seed: int | None = None, use_cache: bool = True):
        """The new tokens of :meth:`generate`, each yielded as it is drawn (see :func:`stream_tokens`)."""
        return stream_tokens(self, idx, max_new_tokens, temperature=temperature, top_k=top_k, seed=seed,
                             use_cache=use_cache)
