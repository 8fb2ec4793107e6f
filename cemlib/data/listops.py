"""Nested ListOps as in NRGPT (Dehmamy et al. 2025, §3.2): MAX, MEDIAN and SUM mod 20 over 0..19.

An equation such as ``SUM(2,MAX(4,13,1),MEDIAN(5,3,16))=7`` is a tree: the root is a function;
each of its 2..3 arguments (``min_args``..``max_args``) is a nested function with probability
``func_prob`` if that keeps the nesting within ``max_depth`` levels, and otherwise a value drawn
uniformly from ``0..modulus-1``.

*Paper deviation.* The paper's text (section 3.2 and App. F.3) says "sum modulo 20" with inputs
0..19; the repository's shipped file (``funcs(add_10,max_10,median_10)_depth2_args(2,3)_funcprob0.25``)
uses modulus 10. We follow the text: ``modulus=20`` by default, values and answers in ``0..19``;
``modulus=10`` reproduces the repository's setting. Depth 2, 2..3 arguments and function
probability 0.25 are taken from that file name. MEDIAN is the upper median ``sorted(a)[len(a)//2]``
(the repository's; the text does not say).

*Tokens.* One token per value (``"0"``..``"19"``), per function name, and for ``( , ) =``, plus
``<pad>``. The model reads the equation and predicts the answer token after ``=``.

*Layout.* :func:`make_listops` returns :class:`ListOpsDataset` splits holding ``tokens`` int64
``(N, T)`` (equation, ``=``, answer, right-padded with ``<pad>``), ``answer`` int64 ``(N,)`` (a
value in ``0..modulus-1``, equal to its token id) and ``answer_pos`` int64 ``(N,)`` (the column of
the answer token). ``dataset[i]`` is the next-token pair ``(tokens[i, :-1], target)`` where
``target`` is ``-100`` (ignored by ``F.cross_entropy``) everywhere except at column
``answer_pos - 1``, which holds the answer.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

import torch
from torch.utils.data import Dataset

from cemlib.utils import check_positive_int

__all__ = ["FUNCTIONS", "ListOpsTokenizer", "sample_expression", "evaluate", "to_string",
           "ListOpsDataset", "ListOpsSplits", "make_listops"]

FUNCTIONS = ("MAX", "MEDIAN", "SUM")


class ListOpsTokenizer:
    """Word-level tokenizer.

    Ids: the values ``0..modulus-1`` first (id = value), then the functions, ``( , ) =``, ``<pad>``.
    """

    def __init__(self, modulus: int = 20):
        self.modulus = check_positive_int(modulus, "modulus")
        self.vocab = [str(v) for v in range(modulus)] + list(FUNCTIONS) + ["(", ",", ")", "=", "<pad>"]
        self.stoi = {t: i for i, t in enumerate(self.vocab)}
        self.pad_id = self.stoi["<pad>"]
        self.eq_id = self.stoi["="]

    @property
    def vocab_size(self) -> int:
        return len(self.vocab)

    def split(self, text: str) -> list[str]:
        """``"SUM(2,MAX(4,13))=7"`` -> ``["SUM", "(", "2", ",", ...]`` (spaces are ignored)."""
        out, word = [], ""
        for ch in text.replace(" ", ""):
            if ch in "(),=":
                if word:
                    out.append(word)
                out.append(ch)
                word = ""
            else:
                word += ch
        if word:
            out.append(word)
        return out

    def encode(self, text: str) -> torch.Tensor:
        try:
            return torch.tensor([self.stoi[t] for t in self.split(text)], dtype=torch.long)
        except KeyError as err:
            raise ValueError(f"token {err.args[0]!r} is not in the ListOps vocabulary "
                             f"(modulus {self.modulus})") from None

    def decode(self, ids) -> str:
        return "".join(self.vocab[int(i)] for i in ids if int(i) != self.pad_id)


def sample_expression(rng: random.Random, modulus: int = 20, max_depth: int = 2, min_args: int = 2,
                      max_args: int = 3, func_prob: float = 0.25, depth: int = 1):
    """A random tree: ``(name, [args])`` for a function, an ``int`` for a value."""
    n = rng.randint(min_args, max_args)
    args = []
    for _ in range(n):
        if depth < max_depth and rng.random() < func_prob:
            args.append(sample_expression(rng, modulus, max_depth, min_args, max_args, func_prob, depth + 1))
        else:
            args.append(rng.randrange(modulus))
    return (FUNCTIONS[rng.randrange(len(FUNCTIONS))], args)


def evaluate(tree, modulus: int = 20) -> int:
    """Value of a tree: MAX, upper MEDIAN ``sorted(a)[len(a)//2]``, SUM modulo ``modulus``."""
    if isinstance(tree, int):
        return tree
    name, args = tree
    vals = [evaluate(a, modulus) for a in args]
    if name == "MAX":
        return max(vals)
    if name == "MEDIAN":
        return sorted(vals)[len(vals) // 2]
    if name == "SUM":
        return sum(vals) % modulus
    raise ValueError(f"unknown ListOps function {name!r}")


def to_string(tree) -> str:
    if isinstance(tree, int):
        return str(tree)
    name, args = tree
    return f"{name}(" + ",".join(to_string(a) for a in args) + ")"


class ListOpsDataset(Dataset):
    """Padded equations with their answers; see the module docstring for the layout."""

    def __init__(self, tokens: torch.Tensor, answer: torch.Tensor, answer_pos: torch.Tensor,
                 tokenizer: ListOpsTokenizer):
        self.tokens, self.answer, self.answer_pos, self.tokenizer = tokens, answer, answer_pos, tokenizer

    def __len__(self) -> int:
        return len(self.tokens)

    def __getitem__(self, i):
        target = torch.full((self.tokens.shape[1] - 1,), -100, dtype=torch.long)
        target[self.answer_pos[i] - 1] = self.answer[i]
        return self.tokens[i, :-1], target

    def text(self, i: int) -> str:
        return self.tokenizer.decode(self.tokens[i])


@dataclass
class ListOpsSplits:
    train: ListOpsDataset
    test: ListOpsDataset
    tokenizer: ListOpsTokenizer


def _encode_all(lines: list[str], tok: ListOpsTokenizer, width: int) -> ListOpsDataset:
    rows = [tok.encode(s) for s in lines]
    tokens = torch.full((len(rows), width), tok.pad_id, dtype=torch.long)
    for k, r in enumerate(rows):
        tokens[k, : len(r)] = r
    answer_pos = torch.tensor([len(r) - 1 for r in rows], dtype=torch.long)
    answer = tokens[torch.arange(len(rows)), answer_pos].clone()
    return ListOpsDataset(tokens, answer, answer_pos, tok)


def make_listops(n_train: int = 50_000, n_test: int = 2_000, seed: int = 0, modulus: int = 20,
                 max_depth: int = 2, min_args: int = 2, max_args: int = 3,
                 func_prob: float = 0.25) -> ListOpsSplits:
    """Train and test equations, deterministic in ``seed``; no test equation occurs in train.

    Both splits are padded to the same width (the longest equation of either). Defaults: the
    repository's 50k/2k split and shape parameters with the paper's modulus 20.
    """
    n_train, n_test = check_positive_int(n_train, "n_train"), check_positive_int(n_test, "n_test")
    check_positive_int(max_depth, "max_depth")
    if not 1 <= min_args <= max_args:
        raise ValueError(f"need 1 <= min_args <= max_args, got min_args={min_args}, max_args={max_args}")
    if not 0.0 <= func_prob <= 1.0:
        raise ValueError(f"func_prob must lie in [0, 1], got {func_prob}")
    tok = ListOpsTokenizer(modulus)
    rng = random.Random(f"listops:{int(seed)}")

    def draw() -> str:
        tree = sample_expression(rng, modulus, max_depth, min_args, max_args, func_prob)
        return f"{to_string(tree)}={evaluate(tree, modulus)}"

    train = [draw() for _ in range(n_train)]
    seen, test, tries = set(train), [], 0
    while len(test) < n_test:
        s = draw()
        tries += 1
        if s not in seen:
            test.append(s)
        elif tries > 100 * n_test:
            raise ValueError("cannot draw enough test equations outside the train set; "
                             "increase max_depth/max_args or reduce n_train")
    width = max(len(tok.split(s)) for s in train + test)
    return ListOpsSplits(_encode_all(train, tok, width), _encode_all(test, tok, width), tok)
