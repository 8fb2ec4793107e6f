"""Longest Increasing Subsequence (LIS), the task of "Transformers as intrinsic optimizers".

Anonymous, "Transformers as Intrinsic Optimizers: Forward Inference through the Energy Principle",
ICLR 2026 submission.

The paper (App. A.9) follows Feng et al. (2024) and Yang et al. (2024a): sequence lengths
``L`` in {10, 20, 30, 40}, 51,200 train / 5,120 test samples per ``L``, loss on the answer tokens
and greedy decoding. It does not give the number range or the format; we take both from Feng et
al.'s public LIS generator (described, not copied):

* *Vocabulary.* Integer tokens ``0 .. R-1`` with ``R = L + 150``; input numbers lie in
  ``L+1 .. R-1`` so that they never collide with the DP values ``1..L``; then ``<sep>`` (id ``R``).
  ``vocab_size = R + 1``.
* *Sequences.* ``k`` in {1, 2, 3} strictly increasing runs with ``total`` in ``3..L`` elements in
  all are planted at random positions of a random sequence (so that long increasing subsequences
  are common; uniform random sequences would have LIS ~ 2 sqrt(L)).
* *Format.* With ``cot=True`` (chain of thought, Feng et al.'s "chain" files):
  ``s_1 .. s_L <sep> dp_1 .. dp_L <sep> answer``, with ``dp_i`` the length of the longest
  increasing subsequence ending at ``i`` and ``answer = max dp``; length ``2L + 3``. With
  ``cot=False`` ("direct"): ``s_1 .. s_L <sep> answer``, length ``L + 2``.

*Layout.* :class:`LISDataset` holds ``tokens`` int64 ``(N, T)`` (no padding: all rows have the same
length) and ``answer`` int64 ``(N,)``. ``dataset[i]`` is ``(tokens[i, :-1], target)`` with
``target = tokens[i, 1:]`` at the output positions (everything after the first ``<sep>``) and
``-100`` on the input positions, i.e. cross-entropy on the answer tokens only.
"""

from __future__ import annotations

import numbers
from dataclasses import dataclass

import numpy as np
import torch
from torch.utils.data import Dataset

from cemlib.utils import check_positive_int

__all__ = ["lis_dp", "lis_length", "sample_sequence", "LISVocab", "LISDataset", "LISSplits", "make_lis"]


def lis_dp(seq) -> list[int]:
    """``dp[i]``: length of the longest strictly increasing subsequence ending at ``i`` (O(L^2) DP)."""
    s = [int(v) for v in seq]
    dp = [1] * len(s)
    for i in range(len(s)):
        for j in range(i):
            if s[j] < s[i] and dp[j] + 1 > dp[i]:
                dp[i] = dp[j] + 1
    return dp


def lis_length(seq) -> int:
    """Length of the longest strictly increasing subsequence (0 for an empty sequence)."""
    return max(lis_dp(seq), default=0)


@dataclass(frozen=True)
class LISVocab:
    """Token ids for length ``L``: integers ``0..R-1`` (``R = L + 150``), then ``<sep>``."""

    L: int

    @property
    def number_range(self) -> int:
        return self.L + 150

    @property
    def sep_id(self) -> int:
        return self.number_range

    @property
    def vocab_size(self) -> int:
        return self.number_range + 1

    def decode(self, ids) -> str:
        return " ".join("<sep>" if int(i) == self.sep_id else str(int(i)) for i in ids)


def sample_sequence(rng: np.random.Generator, L: int) -> np.ndarray:
    """One input sequence of length ``L`` with 1..3 planted increasing runs (values in ``L+1..L+149``)."""
    lo, hi = L + 1, L + 150
    total = int(rng.integers(3, L + 1))  # planted elements, 3..L
    k = int(rng.integers(1, 4))  # number of runs
    cuts = np.sort(rng.choice(np.arange(1, total), size=k - 1, replace=False)) if k > 1 else []
    sizes = np.diff(np.concatenate([[0], cuts, [total]])).astype(int)
    runs = [np.sort(rng.choice(np.arange(lo, hi), size=m, replace=False)) for m in sizes]
    seq = rng.integers(lo, hi, size=L)
    seq[np.sort(rng.choice(L, size=total, replace=False))] = np.concatenate(runs)
    return seq


class LISDataset(Dataset):
    """Fixed-length LIS examples; see the module docstring for the layout."""

    def __init__(self, tokens: torch.Tensor, answer: torch.Tensor, vocab: LISVocab):
        self.tokens, self.answer, self.vocab = tokens, answer, vocab
        self.n_input = vocab.L + 1  # s_1..s_L and the first <sep>

    def __len__(self) -> int:
        return len(self.tokens)

    def __getitem__(self, i):
        x, y = self.tokens[i, :-1], self.tokens[i, 1:].clone()
        y[: self.n_input - 1] = -100  # no loss while reading the input
        return x, y


@dataclass
class LISSplits:
    train: LISDataset
    test: LISDataset
    vocab: LISVocab


def _example(seq: np.ndarray, vocab: LISVocab, cot: bool) -> tuple[int, ...]:
    dp = lis_dp(seq)
    body = list(seq) + [vocab.sep_id] + (dp + [vocab.sep_id] if cot else [])
    return tuple(int(v) for v in body + [max(dp)])


def make_lis(L: int = 10, n_train: int = 51_200, n_test: int = 5_120, seed: int = 0,
             cot: bool = True) -> LISSplits:
    """Train and test sets for length ``L``, deterministic in ``seed``.

    As in Feng et al.: train examples are distinct, and test examples are distinct and absent from
    train. Raises if ``L`` is too small to produce that many distinct examples.
    """
    L = check_positive_int(L, "L")
    if L < 3:
        raise ValueError(f"L must be at least 3 (3..L planted elements), got {L}")
    n_train, n_test = check_positive_int(n_train, "n_train"), check_positive_int(n_test, "n_test")
    if isinstance(seed, bool) or not isinstance(seed, numbers.Integral) or seed < 0:
        raise ValueError(f"seed must be a non-negative integer, got {seed!r}")
    seed = int(seed)
    vocab, rng = LISVocab(L), np.random.default_rng([seed, L, int(cot)])
    splits: list[dict[tuple[int, ...], None]] = [{}, {}]  # insertion-ordered sets
    for split, n in zip(splits, (n_train, n_test)):
        tries = 0
        while len(split) < n:
            ex = _example(sample_sequence(rng, L), vocab, cot)
            tries += 1
            if ex not in splits[0]:
                split[ex] = None
            if tries > 20 * n:
                raise ValueError(f"cannot draw {n} distinct examples of length L={L}")
    out = []
    for split in splits:
        tokens = torch.tensor(list(split), dtype=torch.long)
        out.append(LISDataset(tokens, tokens[:, -1].clone(), vocab))
    return LISSplits(out[0], out[1], vocab)
