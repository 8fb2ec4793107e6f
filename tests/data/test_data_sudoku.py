"""Sudoku: the bitmask/MRV solver against an independent exact-cover solver, the generator, the shipped set."""

import hashlib
import random
import shutil

import numpy as np
import pytest
import torch
from torch.utils.data import DataLoader

from cemlib.data.shakespeare import ChecksumError
from cemlib.data.sudoku import (SUDOKU_SHA256, _default_path, count_solutions, generate_puzzle,
                                generate_puzzles, is_valid_solution, load_sudoku, pack_boards,
                                solve, solved_by_singles, unpack_boards)


def _exact_cover_count(board, limit=2) -> int:
    """Independent oracle: Knuth's Algorithm X on the 324 Sudoku constraints (dict-of-sets form)."""
    rows = {}
    for i in range(81):
        r, c = divmod(i, 9)
        b = (r // 3) * 3 + c // 3
        for d in range(1, 10):
            rows[(i, d)] = [("cell", i), ("row", r, d), ("col", c, d), ("box", b, d)]
    X = {}
    for key, cols in rows.items():
        for col in cols:
            X.setdefault(col, set()).add(key)

    def select(key):
        removed = []
        for j in rows[key]:
            for i in X[j]:
                for k in rows[i]:
                    if k != j:
                        X[k].remove(i)
            removed.append(X.pop(j))
        return removed

    def deselect(key, removed):
        for j in reversed(rows[key]):
            X[j] = removed.pop()
            for i in X[j]:
                for k in rows[i]:
                    if k != j:
                        X[k].add(i)

    for i, v in enumerate(board):
        if v:
            if any(("cell", i) not in X or col not in X for col in rows[(i, int(v))]):
                return 0  # clashing givens
            select((i, int(v)))
    count = 0

    def search():
        nonlocal count
        if not X:
            count += 1
            return
        col = min(X, key=lambda c: len(X[c]))
        for key in list(X[col]):
            removed = select(key)
            search()
            deselect(key, removed)
            if count >= limit:
                return

    search()
    return min(count, limit)


GRID = [(r * 3 + r // 3 + c) % 9 + 1 for r in range(9) for c in range(9)]  # a valid full grid


def test_solver_basics_and_errors():
    assert is_valid_solution(GRID)
    assert count_solutions(GRID) == 1
    assert count_solutions([0] * 81) == 2 and count_solutions([0] * 81, limit=5) == 5
    holed = list(GRID)
    for i in (0, 40, 80):
        holed[i] = 0
    assert solve(holed) == GRID
    clash = list(holed)
    clash[1] = GRID[2]  # two equal digits in row 0
    assert count_solutions(clash) == 0 and not is_valid_solution(clash)
    with pytest.raises(ValueError, match="no solution"):
        solve(clash)
    with pytest.raises(ValueError, match="more than one"):
        solve([0] * 81)
    with pytest.raises(ValueError, match="81 cells, got 80"):
        count_solutions([0] * 80)
    with pytest.raises(ValueError, match="got 10"):
        count_solutions([10] + [0] * 80)
    with pytest.raises(ValueError, match="limit"):
        count_solutions(GRID, limit=0)
    assert count_solutions(np.array(GRID).reshape(9, 9)) == 1  # 9x9 input is accepted


def test_generator_is_deterministic_unique_minimal_and_hard():
    a_p, a_s = generate_puzzles(2, seed=11)
    b_p, b_s = generate_puzzles(2, seed=11)
    assert torch.equal(a_p, b_p) and torch.equal(a_s, b_s)
    assert not torch.equal(a_p, generate_puzzles(2, seed=12)[0])
    assert a_p.shape == (2, 81) and a_p.dtype == torch.long
    for p, s in zip(a_p.tolist(), a_s.tolist()):
        assert is_valid_solution(s, p) and 17 <= sum(v > 0 for v in p) <= 34
        assert _exact_cover_count(p) == 1 == count_solutions(p)
        assert not solved_by_singles(p)  # hard=True keeps only puzzles that need more than singles
        for i in [i for i in range(81) if p[i]]:  # minimal: no given can be dropped
            q = list(p)
            q[i] = 0
            assert count_solutions(q) == 2
        assert _exact_cover_count(q) == 2  # the oracle agrees on the last one
    assert generate_puzzle("x") == generate_puzzle("x")


def test_solver_agrees_with_exact_cover_on_random_boards():
    rng = random.Random(0)
    p, s = generate_puzzle(3)
    for _ in range(6):
        q = list(p)
        for i in rng.sample(range(81), 3):  # remove some givens (often several solutions) ...
            q[i] = 0
        j = rng.randrange(81)
        q[j] = q[j] or rng.randint(1, 9)  # ... and sometimes add a wrong one (no solution)
        assert count_solutions(q) == _exact_cover_count(q)


def test_singles_solve_easy_puzzles():
    holed = [0 if i % 4 == 0 else v for i, v in enumerate(GRID)]
    assert solved_by_singles(holed)
    assert not solved_by_singles([0] * 81)


def test_pack_roundtrip():
    p, s = generate_puzzles(3, seed=0, hard=False)
    nib, bits = pack_boards(p.numpy(), s.numpy())
    assert nib.shape == (3, 41) and bits.shape == (3, 11) and nib.dtype == bits.dtype == np.uint8
    p2, s2 = unpack_boards(nib, bits)
    assert np.array_equal(p2, p.numpy()) and np.array_equal(s2, s.numpy())


@pytest.fixture(scope="module")
def shipped():
    return load_sudoku()


def test_shipped_set_sizes_checksum_and_layout(shipped):
    assert hashlib.sha256(_default_path().read_bytes()).hexdigest() == SUDOKU_SHA256
    assert _default_path().stat().st_size < 2_000_000
    assert len(shipped.train) >= 10_000 and len(shipped.test) >= 1_000
    for ds in (shipped.train, shipped.test):
        g = ds.givens()
        assert g.min() >= 17 and g.max() <= 34 and g.float().mean() < 27
        assert ds.solution.min() == 1 and ds.solution.max() == 9
        assert ((ds.puzzle == 0) | (ds.puzzle == ds.solution)).all()
    train = {tuple(r) for r in shipped.train.puzzle.tolist()}
    assert not any(tuple(r) in train for r in shipped.test.puzzle.tolist())
    x, y = next(iter(DataLoader(shipped.test, batch_size=4)))
    assert x.shape == y.shape == (4, 81) and y.min() >= 0 and y.max() <= 8
    assert torch.equal(y + 1, shipped.test.solution[:4])


def test_shipped_sample_has_unique_valid_solutions(shipped):
    rng = random.Random(0)
    for ds in (shipped.train, shipped.test):
        for i in rng.sample(range(len(ds)), 25):
            p, s = ds.puzzle[i].tolist(), ds.solution[i].tolist()
            assert is_valid_solution(s, p)
            assert _exact_cover_count(p) == 1
            assert solve(p) == s
            assert not solved_by_singles(p)


def test_shipped_set_is_reproduced_by_the_generator(shipped):
    # make_sudoku.py takes the first hard candidates of stream 0 (train) and stream 1 (test)
    for seed, ds in ((0, shipped.train), (1, shipped.test)):
        puzzle, solution = generate_puzzles(3, seed=seed)
        assert torch.equal(puzzle, ds.puzzle[:3]) and torch.equal(solution, ds.solution[:3])


def test_corrupted_file_gives_a_clear_error(tmp_path):
    bad = tmp_path / "sudoku_hard.npz"
    shutil.copy(_default_path(), bad)
    raw = bytearray(bad.read_bytes())
    raw[len(raw) // 2] ^= 0xFF
    bad.write_bytes(bytes(raw))
    with pytest.raises(ChecksumError, match=rf"sudoku_hard\.npz.*expected {SUDOKU_SHA256}"):
        load_sudoku(bad, sha256=SUDOKU_SHA256)  # a copy is checked when asked to
    with pytest.raises(ValueError, match="sudoku_hard.npz"):  # and found broken without the checksum
        load_sudoku(bad)
    bad.write_bytes(bytes(raw[:1000]))  # truncated
    with pytest.raises(ChecksumError, match="sudoku_hard.npz"):
        load_sudoku(bad, sha256=SUDOKU_SHA256)
    with pytest.raises(ValueError, match="sudoku_hard.npz is not a .npz file"):
        load_sudoku(bad)
    with pytest.raises(FileNotFoundError, match="missing.npz"):
        load_sudoku(tmp_path / "missing.npz")


def test_a_set_of_ones_own_is_read_and_checked(tmp_path, shipped):
    """a user's own ``.npz`` (in the shipped layout or as plain boards) was refused as
    "corrupted"; it is now read, without the shipped checksum, and checked for valid grids."""
    own = tmp_path / "own.npz"
    tr, te = shipped.train, shipped.test
    np.savez(own, train_puzzle=tr.puzzle[:30].numpy(), train_solution=tr.solution[:30].numpy(),
             test_puzzle=te.puzzle[:7].numpy(), test_solution=te.solution[:7].numpy())
    s = load_sudoku(own)
    assert len(s.train) == 30 and len(s.test) == 7 and torch.equal(s.test.solution, te.solution[:7])
    nib, bits = pack_boards(tr.puzzle[:5].numpy(), tr.solution[:5].numpy())
    nib_t, bits_t = pack_boards(te.puzzle[:3].numpy(), te.solution[:3].numpy())
    np.savez(tmp_path / "packed.npz", train_solution=nib, train_givens=bits, test_solution=nib_t,
             test_givens=bits_t)
    assert torch.equal(load_sudoku(tmp_path / "packed.npz").train.puzzle, tr.puzzle[:5])
    broken = tr.solution[:30].numpy().copy()
    broken[4, :2] = broken[4, 1::-1]  # two cells swapped: a row still holds 1..9, a column does not
    np.savez(tmp_path / "bad.npz", train_puzzle=np.zeros_like(broken), train_solution=broken,
             test_puzzle=te.puzzle[:7].numpy(), test_solution=te.solution[:7].numpy())
    with pytest.raises(ValueError, match=r"bad.npz, train split: solution 4 is not a valid grid \(a column"):
        load_sudoku(tmp_path / "bad.npz")
    np.savez(tmp_path / "nosplit.npz", train_puzzle=tr.puzzle[:3].numpy())
    with pytest.raises(ValueError, match="no train split"):
        load_sudoku(tmp_path / "nosplit.npz")
    with pytest.raises(IsADirectoryError, match="is a folder"):
        load_sudoku(tmp_path)


def test_with_blanks_makes_easier_puzzles_with_the_same_solutions(shipped):
    hard = shipped.test
    easy = hard.with_blanks(10, seed=3)
    assert torch.equal(easy.solution, hard.solution)
    assert ((easy.puzzle == 0).sum(1) == 10).all()                       # every hard puzzle has > 10 blanks
    filled = (hard.puzzle == 0) & (easy.puzzle > 0)
    assert torch.equal(easy.puzzle[filled], hard.solution[filled])         # filled from the solution
    assert torch.equal(easy.puzzle[hard.puzzle > 0], hard.puzzle[hard.puzzle > 0])   # givens kept
    assert torch.equal(easy.puzzle, hard.with_blanks(10, seed=3).puzzle)  # seeded
    assert not torch.equal(easy.puzzle, hard.with_blanks(10, seed=4).puzzle)
    assert all(count_solutions(easy.puzzle[i].tolist()) == 1 for i in range(5))
    assert torch.equal(hard.with_blanks(81).puzzle, hard.puzzle)           # more blanks than any puzzle has
    with pytest.raises(ValueError):
        hard.with_blanks(0)


def test_sudoku_task_blanks_option():
    from cemlib.train import ConfigError, get_config
    from cemlib.train.datasets import make_task
    cfg = get_config("sudoku-hyperset", "cpu", ["task.blanks=12", "task.n_train=50", "task.n_test=20"])
    task = make_task(cfg)
    for split in ("train", "val", "test"):
        x, y, mask = task.splits[split].tensors
        assert (mask.sum(1) == 12).all() and torch.equal(mask, x == 0)
    with pytest.raises(ConfigError, match="task.blanks"):
        make_task(get_config("sudoku-hyperset", "cpu", ["task.blanks=0"]))
