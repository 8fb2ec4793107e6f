"""ListOps (NRGPT section 3.2): answers checked by an independent evaluator, determinism, layout."""

import pytest
import torch
from torch.utils.data import DataLoader

from cemlib.data.listops import ListOpsTokenizer, evaluate, make_listops, to_string


def _oracle(equation: str, modulus: int) -> int:
    """Evaluate the equation text with Python itself (independent of the tree evaluator)."""
    env = {"MAX": lambda *a: max(a), "MEDIAN": lambda *a: sorted(a)[len(a) // 2],
           "SUM": lambda *a: sum(a) % modulus, "__builtins__": {}}
    return eval(equation, env)  # noqa: S307 -- text produced by our own generator


@pytest.fixture(scope="module")
def splits():
    return make_listops(n_train=600, n_test=100, seed=3)


def test_paper_example():
    # the paper's example SUM(2, MAX(4,13,1), MEDIAN(5,3,16)) = (2 + 13 + 5) mod 20 = 0
    tree = ("SUM", [2, ("MAX", [4, 13, 1]), ("MEDIAN", [5, 3, 16])])
    assert to_string(tree) == "SUM(2,MAX(4,13,1),MEDIAN(5,3,16))"
    assert evaluate(tree, 20) == 0
    assert evaluate(("SUM", [2, ("MAX", [4, 13, 1])]), 20) == 15
    assert evaluate(("SUM", [2, ("MAX", [4, 13, 1])]), 10) == 5  # the repository's modulus
    assert evaluate(("MEDIAN", [7, 1, 9, 3]), 20) == 7  # upper median of an even count


@pytest.mark.parametrize("modulus", [20, 10])
def test_answers_match_independent_evaluator(modulus):
    s = make_listops(n_train=300, n_test=50, seed=1, modulus=modulus)
    tok = s.tokenizer
    for ds in (s.train, s.test):
        for i in range(len(ds)):
            text = ds.text(i)
            equation, answer = text.split("=")
            assert int(answer) == int(ds.answer[i]) == _oracle(equation, modulus)
        assert ds.answer.min() >= 0 and ds.answer.max() < modulus
        values = ds.tokens[ds.tokens < modulus]  # value tokens have id = value
        assert values.max() < modulus
    assert tok.vocab_size == modulus + 3 + 4 + 1


def _parse(tokens: list[str], k: int = 0, depth: int = 1):
    """Recursive-descent parser: returns (position after the node, max depth, argument counts)."""
    if tokens[k].isdigit():
        return k + 1, depth - 1, []
    assert tokens[k + 1] == "("
    k, best, counts, n = k + 2, depth, [], 0
    while True:
        k, d, c = _parse(tokens, k, depth + 1)
        best, counts, n = max(best, d), counts + c, n + 1
        if tokens[k] == ")":
            return k + 1, best, counts + [n]
        assert tokens[k] == ","
        k += 1


def test_structure_follows_the_defaults(splits):
    tok = splits.tokenizer
    depths = []
    for i in range(len(splits.train)):
        tokens = tok.split(splits.train.text(i))
        end, depth, counts = _parse(tokens)
        assert tokens[end] == "=" and end == len(tokens) - 2
        assert all(2 <= n <= 3 for n in counts)  # 2..3 arguments per function
        depths.append(depth)
    assert set(depths) == {1, 2}  # max_depth 2, and both flat and nested equations occur
    assert splits.train.tokens.shape[1] == splits.test.tokens.shape[1]


def test_deterministic_and_seed_dependent():
    a = make_listops(n_train=200, n_test=20, seed=5)
    b = make_listops(n_train=200, n_test=20, seed=5)
    c = make_listops(n_train=200, n_test=20, seed=6)
    assert torch.equal(a.train.tokens, b.train.tokens) and torch.equal(a.test.tokens, b.test.tokens)
    assert not torch.equal(a.train.tokens, c.train.tokens)


def test_test_split_is_disjoint_from_train(splits):
    train = {splits.train.text(i) for i in range(len(splits.train))}
    assert not any(splits.test.text(i) in train for i in range(len(splits.test)))


def test_tokenizer_roundtrip_and_errors():
    tok = ListOpsTokenizer(20)
    text = "MEDIAN(19,SUM(3,4),0)=4"
    ids = tok.encode(text)
    assert tok.decode(ids) == text
    assert tok.encode("MAX( 1 , 2 )").tolist() == tok.encode("MAX(1,2)").tolist()
    with pytest.raises(ValueError, match="'20'"):
        tok.encode("MAX(20,1)")
    with pytest.raises(ValueError, match="'MIN'"):
        tok.encode("MIN(2,1)")


def test_next_token_layout_and_dataloader(splits):
    ds = splits.train
    x, y = ds[0]
    p = int(ds.answer_pos[0])
    assert x.shape == y.shape == (ds.tokens.shape[1] - 1,)
    assert int(x[p - 1]) == splits.tokenizer.eq_id  # the answer is predicted from the '=' position
    assert int(y[p - 1]) == int(ds.answer[0]) and (y != -100).sum() == 1
    assert (ds.tokens[0, p + 1:] == splits.tokenizer.pad_id).all()
    xb, yb = next(iter(DataLoader(ds, batch_size=8)))
    assert xb.shape == (8, ds.tokens.shape[1] - 1) and xb.dtype == yb.dtype == torch.long
    loss = torch.nn.functional.cross_entropy(torch.zeros(8 * xb.shape[1], 30), yb.reshape(-1))
    assert torch.isfinite(loss)


def test_bad_arguments():
    with pytest.raises(ValueError, match="n_train"):
        make_listops(n_train=0)
    with pytest.raises(ValueError, match="min_args"):
        make_listops(n_train=10, n_test=5, min_args=3, max_args=2)
    with pytest.raises(ValueError, match="func_prob"):
        make_listops(n_train=10, n_test=5, func_prob=1.5)
    with pytest.raises(ValueError, match="cannot draw"):
        make_listops(n_train=2000, n_test=500, modulus=2, max_depth=1, max_args=2)
