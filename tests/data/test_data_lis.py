"""LIS task (intrinsic optimizers App. A.9): DP against brute force and patience sorting, layout, seeds."""

import bisect
import itertools
import random

import numpy as np
import pytest
import torch
from torch.utils.data import DataLoader

from cemlib.data.lis import LISVocab, lis_dp, lis_length, make_lis, sample_sequence


def _brute_force(seq) -> int:
    for k in range(len(seq), 0, -1):
        if any(all(a < b for a, b in zip(c, c[1:])) for c in itertools.combinations(seq, k)):
            return k
    return 0


def _patience(seq) -> int:
    tails: list[int] = []
    for v in seq:
        j = bisect.bisect_left(tails, v)  # strict increase: replace the first tail >= v
        tails[j:j + 1] = [v]
    return len(tails)


def test_lis_against_brute_force_and_patience_sorting():
    rng = random.Random(0)
    for _ in range(200):
        seq = [rng.randrange(6) for _ in range(rng.randrange(0, 9))]  # ties are common
        assert lis_length(seq) == _brute_force(seq) == _patience(seq)
    for _ in range(50):
        seq = [rng.randrange(200) for _ in range(40)]
        assert lis_length(seq) == _patience(seq)
    assert lis_dp([3, 1, 2, 2, 5]) == [1, 1, 2, 2, 3]


@pytest.mark.parametrize("cot", [True, False])
def test_layout_and_answers(cot):
    L = 10
    s = make_lis(L, n_train=300, n_test=60, seed=0, cot=cot)
    v = s.vocab
    assert v.number_range == L + 150 and v.sep_id == L + 150 and v.vocab_size == L + 151
    for ds in (s.train, s.test):
        t = ds.tokens
        assert t.shape[1] == (2 * L + 3 if cot else L + 2) and t.dtype == torch.long
        seq = t[:, :L]
        assert seq.min() >= L + 1 and seq.max() <= L + 149  # numbers never collide with DP values
        assert (t[:, L] == v.sep_id).all()
        for i in range(len(ds)):
            dp = lis_dp(seq[i].tolist())
            assert int(ds.answer[i]) == max(dp) == _patience(seq[i].tolist())
            if cot:
                assert t[i, L + 1:2 * L + 1].tolist() == dp and int(t[i, 2 * L + 1]) == v.sep_id
        assert ds.answer.min() >= 1 and ds.answer.max() <= L


def test_planted_runs_make_long_subsequences_common():
    rng = np.random.default_rng(0)
    answers = [lis_length(sample_sequence(rng, 20)) for _ in range(300)]
    # uniform random sequences of length 20 have LIS ~ 2 sqrt(20) ~ 7-8; planted runs reach 20
    assert max(answers) >= 15 and min(answers) >= 3


def test_deterministic_distinct_and_disjoint():
    a = make_lis(10, n_train=400, n_test=80, seed=4)
    b = make_lis(10, n_train=400, n_test=80, seed=4)
    c = make_lis(10, n_train=400, n_test=80, seed=5)
    assert torch.equal(a.train.tokens, b.train.tokens) and torch.equal(a.test.tokens, b.test.tokens)
    assert not torch.equal(a.train.tokens, c.train.tokens)
    train = {tuple(r) for r in a.train.tokens.tolist()}
    test = {tuple(r) for r in a.test.tokens.tolist()}
    assert len(train) == 400 and len(test) == 80 and not train & test


def test_targets_mask_the_input_and_dataloader():
    L = 5
    s = make_lis(L, n_train=64, n_test=8, seed=0)
    x, y = s.train[0]
    t = s.train.tokens[0]
    assert torch.equal(x, t[:-1])
    assert (y[:L] == -100).all()  # positions that read s_1..s_L (the next token is input)
    assert torch.equal(y[L:], t[L + 1:])  # dp_1..dp_L, <sep>, answer are all targets
    xb, yb = next(iter(DataLoader(s.train, batch_size=16)))
    assert xb.shape == yb.shape == (16, 2 * L + 2)
    logits = torch.zeros(16, 2 * L + 2, s.vocab.vocab_size)
    assert torch.isfinite(torch.nn.functional.cross_entropy(logits.transpose(1, 2), yb))
    assert s.vocab.decode(t).split()[L] == "<sep>"


def test_bad_arguments():
    with pytest.raises(ValueError, match="L must be at least 3"):
        make_lis(2, n_train=10, n_test=2)
    with pytest.raises(ValueError, match="n_test"):
        make_lis(10, n_train=10, n_test=0)
    assert LISVocab(40).vocab_size == 191
