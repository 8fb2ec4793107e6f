"""Batches of (input, target) windows drawn from a token stream, addressable by batch index.

Global batch ``n`` is a pure function of ``(seed, n)``: its ``batch_size`` window offsets are
drawn from NumPy's generator seeded with the sequence ``[seed, n]``. The data position a
checkpoint has to save is therefore one integer (the number of optimiser steps taken), a resumed
run sees exactly the batches an uninterrupted one would, and a DDP run can cut the *same* global
batch into per-process micro-batches, so it matches a single-process run with the same global
batch.

For a model built in Python, :func:`text_batches` is nanoGPT's ``get_batch`` without writing it:
a text file (or the shipped tiny Shakespeare) as train and validation :class:`TokenBatches` and
the tokenizer that decodes them::

    data = text_batches("my_text.txt", context_length=64)
    for step in range(1000):
        x, y = data.train.batch(step, batch_size=32)       # [32, 64] inputs and next-token targets
        loss = F.cross_entropy(model(x).flatten(0, 1), y.flatten())
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

__all__ = ["TokenBatches", "DataMismatchError", "TextBatches", "text_batches"]


class DataMismatchError(RuntimeError):
    """A checkpoint's data position refers to a different token stream or batching."""


class TokenBatches:
    """Random contiguous windows of ``context_length + 1`` tokens from a 1-D ``LongTensor``.

    ``batch(n, batch_size)`` returns ``x, y`` of shape ``[batch_size, context_length]`` with
    ``y`` shifted by one token (next-token targets). ``micro_batch(n, batch_size, m, size)`` is
    rows ``m*size : (m+1)*size`` of that global batch.
    """

    def __init__(self, tokens: torch.Tensor, context_length: int, seed: int = 0, name: str = "tokens"):
        if not isinstance(tokens, torch.Tensor) or tokens.dim() != 1 or tokens.is_floating_point():
            raise ValueError(f"{name} must be a 1-D integer tensor of token ids, got "
                             f"{type(tokens).__name__} {tuple(getattr(tokens, 'shape', ()))}")
        if isinstance(context_length, bool) or not isinstance(context_length, int) or context_length < 1:
            raise ValueError(f"context_length must be a positive integer, got {context_length!r}")
        if tokens.numel() < context_length + 2:
            raise ValueError(f"{name} has {tokens.numel()} tokens, too few for windows of "
                             f"context_length + 1 = {context_length + 1}")
        if isinstance(seed, bool) or not isinstance(seed, int) or seed < 0:
            raise ValueError(f"seed must be a non-negative integer, got {seed!r}")
        self.tokens, self.context_length, self.seed, self.name = tokens.long(), context_length, seed, name

    def offsets(self, n: int, batch_size: int) -> torch.Tensor:
        """Start offsets of the windows of global batch ``n``."""
        if n < 0:
            raise ValueError(f"batch index must be >= 0, got {n}")
        rng = np.random.default_rng([self.seed, n])  # SeedSequence: every (seed, n) a distinct stream
        high = self.tokens.numel() - self.context_length - 1
        return torch.from_numpy(rng.integers(0, high + 1, size=batch_size, dtype=np.int64))

    def batch(self, n: int, batch_size: int) -> tuple[torch.Tensor, torch.Tensor]:
        return self._windows(self.offsets(n, batch_size))

    def micro_batch(self, n: int, batch_size: int, m: int, size: int) -> tuple[torch.Tensor, torch.Tensor]:
        if size * (m + 1) > batch_size:
            raise ValueError(f"micro-batch {m} of size {size} exceeds the global batch {batch_size}")
        return self._windows(self.offsets(n, batch_size)[m * size:(m + 1) * size])

    def _windows(self, starts: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        idx = starts[:, None] + torch.arange(self.context_length + 1)
        w = self.tokens[idx]
        return w[:, :-1].contiguous(), w[:, 1:].contiguous()

    def state_dict(self) -> dict:
        """What identifies the stream and batching (the position itself is the step counter)."""
        return {"name": self.name, "n_tokens": int(self.tokens.numel()),
                "context_length": self.context_length, "seed": self.seed,
                "checksum": int(self.tokens[:: max(1, self.tokens.numel() // 4096)].sum())}

    def check_state(self, state: dict) -> None:
        """Raise :class:`DataMismatchError` naming the first field that differs from ``state``."""
        mine = self.state_dict()
        for key, value in mine.items():
            if state.get(key) != value:
                raise DataMismatchError(f"checkpoint data {key} = {state.get(key)!r} but the current "
                                        f"{self.name} stream has {key} = {value!r}")


@dataclass
class TextBatches:
    """What :func:`text_batches` returns: ``train`` and ``val`` batch sources and the
    ``tokenizer`` (:class:`~cemlib.data.shakespeare.CharTokenizer`) that encodes and decodes them."""

    train: TokenBatches
    val: TokenBatches
    tokenizer: object

    @property
    def vocab_size(self) -> int:
        return self.tokenizer.vocab_size


def text_batches(path=None, context_length: int = 128, val_fraction: float = 0.1, seed: int = 0) -> TextBatches:
    """A UTF-8 text file (``.gz`` too; ``None``: the tiny Shakespeare shipped with cemlib) as
    character-level training and validation batches: the first ``1 - val_fraction`` of the text
    trains, the rest validates (the split of :func:`cemlib.data.shakespeare.load_shakespeare`).
    ``train.batch(n, batch_size)`` is the ``n``-th batch of random windows (a pure function of
    ``seed`` and ``n``; the validation windows are drawn with ``seed + 2``, as the trainer does)."""
    from cemlib.data.shakespeare import load_shakespeare
    s = load_shakespeare(val_fraction=val_fraction, path=path)
    return TextBatches(TokenBatches(s.train, context_length, seed=seed, name="train"),
                       TokenBatches(s.val, context_length, seed=seed + 2, name="val"), s.tokenizer)
