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
"""

from __future__ import annotations

import math

import torch

__all__ = ["generate", "sample_next", "check_sampling_options", "check_decoding", "GenerationMixin"]


def check_sampling_options(max_new_tokens, temperature, top_k, seed) -> None:
    """Raise ``ValueError`` naming the first option of :func:`generate` that is out of range."""
    if isinstance(max_new_tokens, bool) or not isinstance(max_new_tokens, int) or max_new_tokens < 0:
        raise ValueError(f"max_new_tokens must be a non-negative integer, got {max_new_tokens!r}")
    if isinstance(temperature, bool) or not isinstance(temperature, (int, float)) \
            or not math.isfinite(temperature) or temperature < 0:
        raise ValueError(f"temperature must be a finite number >= 0 (0 = greedy), got {temperature!r}")
    if top_k is not None and (isinstance(top_k, bool) or not isinstance(top_k, int) or top_k < 1):
        raise ValueError(f"top_k must be a positive integer or None (no cut), got {top_k!r}")
    if seed is not None and (isinstance(seed, bool) or not isinstance(seed, int) or seed < 0):
        raise ValueError(f"seed must be a non-negative integer or None, got {seed!r}")


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
    generator)."""
    if logits.dim() != 2:
        raise ValueError(f"logits must have shape (B, V), got {tuple(logits.shape)}")
    logits = logits.float()
    if temperature == 0:
        return logits.argmax(dim=-1, keepdim=True)
    logits = logits / temperature
    if top_k is not None and top_k < logits.shape[-1]:
        kth = torch.topk(logits, top_k, dim=-1).values[:, -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    probs = torch.softmax(logits, dim=-1)
    return torch.multinomial(probs, num_samples=1, generator=generator)


@torch.no_grad()
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
    window at every step.
    """
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
    generator = None
    if seed is not None:
        generator = torch.Generator(device=idx.device)
        generator.manual_seed(seed)
    was_training = model.training
    model.eval()
    try:
        cache = None
        for _ in range(max_new_tokens):
            if not use_cache or idx.shape[1] > context:
                cache = None
                logits = model(idx[:, -context:])               # the (cropped) window, whole
            elif cache is None:
                cache = model.new_cache()
                logits = model(idx, cache=cache)                # prefill
            else:
                logits = model(idx[:, -1:], cache=cache)        # the newest token alone
            if logits.dim() != 3 or logits.shape[-1] != vocab:
                raise ValueError(f"{type(model).__name__} must map idx (B, L) to logits (B, L, {vocab}); "
                                 f"got {tuple(logits.shape)}")
            nxt = sample_next(logits[:, -1, :], temperature, top_k, generator)
            idx = torch.cat([idx, nxt.to(idx.dtype)], dim=1)
    finally:
        model.train(was_training)
    return idx.squeeze(0) if squeeze else idx


class GenerationMixin:
    """Adds ``generate(idx, max_new_tokens, temperature=1.0, top_k=None, seed=None)`` (see
    :func:`generate`) to a causal language model that has ``context_length`` and ``vocab_size``."""

    def generate(self, idx: torch.Tensor, max_new_tokens: int, *, temperature: float = 1.0,
                 top_k: int | None = None, seed: int | None = None,
                 use_cache: bool = True) -> torch.Tensor:
        """``idx`` (B, L) followed by ``max_new_tokens`` sampled tokens (see :func:`generate`;
        ``use_cache`` decodes with the model's cache)."""
        return generate(self, idx, max_new_tokens, temperature=temperature, top_k=top_k, seed=seed,
                        use_cache=use_cache)
