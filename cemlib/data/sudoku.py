"""Sudoku: a uniqueness-checking solver, a seeded generator of hard puzzles, and the shipped set.

Boards are 81 cells in row-major order, digits 1..9, 0 for an empty cell.

*Solver.* Bitmask backtracking with the minimum-remaining-values rule: every row, column and box
keeps a 9-bit mask of the digits it holds; at each node the empty cell with the fewest candidates
is branched on (a cell with one candidate is a forced move). :func:`count_solutions` stops at
``limit`` (2 by default), which is all a uniqueness check needs.

*Generator.* :func:`generate_puzzle` fills an empty board by randomised backtracking, then visits
the 81 cells in a random order and removes each given whose removal keeps the solution unique. The
result is a *minimal* puzzle: no given can be removed without losing uniqueness. Random minimal
puzzles have about 20-28 givens (the "hard" set of Palm et al. 2018 used by Hyper-SET, Hu et al.
2025, arXiv:2502.11646, §5.1, App. D.2, has 17-34). :func:`generate_puzzles` with ``hard=True``
keeps only the minimal puzzles that naked and hidden singles cannot solve
(:func:`solved_by_singles`), about 58 % of them: every kept puzzle needs search or a technique
beyond singles.

*Shipped set.* :func:`load_sudoku` reads ``files/sudoku_hard.npz`` (made by
``cemlib/data/make_sudoku.py``, never run by the tests), checks its SHA-256 and returns
:class:`SudokuDataset` splits. Layout: ``puzzle`` int64 ``(N, 81)`` with 0 = blank, ``solution``
int64 ``(N, 81)`` with digits 1..9. A ``.npz`` of one's own is read too (no checksum: it is not the
shipped file), in either of two layouts: the shipped one (:func:`pack_boards`: arrays
``train_solution``, ``train_givens``, ``test_solution``, ``test_givens``) or plain boards
(``train_puzzle``, ``train_solution``, ``test_puzzle``, ``test_solution``, integers ``(N, 81)``);
it must hold complete valid grids whose givens agree with them (:func:`check_boards`). For a model, :meth:`SudokuDataset.__getitem__` gives
``(puzzle, solution - 1)``: input tokens 0..9 (vocabulary of 10, 0 = blank) and class targets 0..8.
"""

from __future__ import annotations

import io
import random
import zipfile
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

import numpy as np
import torch
from torch.utils.data import Dataset

from cemlib.data.shakespeare import verify_sha256
from cemlib.utils import check_positive_int

__all__ = ["SUDOKU_SHA256", "check_boards", "count_solutions", "solve", "is_valid_solution", "solved_by_singles",
           "random_solution", "generate_puzzle", "candidate_puzzle", "generate_puzzles",
           "SudokuDataset", "SudokuSplits", "load_sudoku", "pack_boards", "unpack_boards"]

SUDOKU_SHA256 = "fb1051baf031967c3c47c13341a97a2a31226827a02a14391e4887ce3004d2da"  # make_sudoku.py output
_FILE = "sudoku_hard.npz"

_ROW = [i // 9 for i in range(81)]
_COL = [i % 9 for i in range(81)]
_BOX = [(i // 27) * 3 + (i % 9) // 3 for i in range(81)]
_POP = [bin(m).count("1") for m in range(512)]
_DIGITS = {1 << d: d + 1 for d in range(9)}  # single-bit mask -> digit


def _check_board(board) -> list[int]:
    cells = board.tolist() if hasattr(board, "tolist") else list(board)
    if cells and isinstance(cells[0], (list, tuple)):  # a 9x9 grid
        cells = [c for row in cells for c in row]
    cells = [int(v) for v in cells]
    if len(cells) != 81:
        raise ValueError(f"a Sudoku board has 81 cells, got {len(cells)}")
    bad = [c for c in cells if not 0 <= c <= 9]
    if bad:
        raise ValueError(f"Sudoku cells must be digits 0..9 (0 = blank), got {bad[0]}")
    return cells


def _masks(cells: list[int]):
    """Row/column/box masks of the givens, or None if two givens clash."""
    rows, cols, boxes = [0] * 9, [0] * 9, [0] * 9
    for i, v in enumerate(cells):
        if v:
            bit = 1 << (v - 1)
            r, c, b = _ROW[i], _COL[i], _BOX[i]
            if (rows[r] | cols[c] | boxes[b]) & bit:
                return None
            rows[r] |= bit
            cols[c] |= bit
            boxes[b] |= bit
    return rows, cols, boxes


def _search(cells, rows, cols, boxes, empty, limit, out, rng=None):
    """Depth-first search with MRV; appends solutions to ``out`` until it holds ``limit``."""
    if not empty:
        out.append(list(cells))
        return
    best, best_mask, best_n = -1, 0, 10
    for k, i in enumerate(empty):
        m = ~(rows[_ROW[i]] | cols[_COL[i]] | boxes[_BOX[i]]) & 511
        n = _POP[m]
        if n < best_n:
            best, best_mask, best_n = k, m, n
            if n <= 1:
                break
    if best_n == 0:
        return
    i = empty[best]
    empty[best] = empty[-1]
    empty.pop()
    r, c, b = _ROW[i], _COL[i], _BOX[i]
    bits = [1 << d for d in range(9) if best_mask >> d & 1]
    if rng is not None:  # randomised branching order (used to draw random full grids)
        rng.shuffle(bits)
    for bit in bits:
        cells[i] = _DIGITS[bit]
        rows[r] |= bit
        cols[c] |= bit
        boxes[b] |= bit
        _search(cells, rows, cols, boxes, empty, limit, out, rng)
        rows[r] ^= bit
        cols[c] ^= bit
        boxes[b] ^= bit
        if len(out) >= limit:
            break
    cells[i] = 0
    empty.append(i)
    empty[best], empty[-1] = empty[-1], empty[best]


def _solutions(board, limit: int, rng: random.Random | None = None) -> list[list[int]]:
    cells = _check_board(board)
    masks = _masks(cells)
    if masks is None:
        return []
    out: list[list[int]] = []
    empty = [i for i in range(81) if cells[i] == 0]
    _search(cells, *masks, empty, limit, out, rng)
    return out


def count_solutions(board, limit: int = 2) -> int:
    """Number of solutions of ``board`` (81 cells, 0 = blank), counted up to ``limit``.

    Returns 0 for a board whose givens clash. ``count_solutions(b) == 1`` is the uniqueness test.
    """
    if int(limit) < 1:
        raise ValueError(f"limit must be a positive integer, got {limit}")
    return len(_solutions(board, int(limit)))


def solve(board) -> list[int]:
    """The solution of a puzzle with exactly one; raises ``ValueError`` for zero or several."""
    sols = _solutions(board, 2)
    if len(sols) != 1:
        raise ValueError(f"the puzzle has {'no' if not sols else 'more than one'} solution")
    return sols[0]


def is_valid_solution(solution, puzzle=None) -> bool:
    """True if ``solution`` is a complete valid grid (and agrees with the givens of ``puzzle``)."""
    cells = _check_board(solution)
    if 0 in cells or _masks(cells) is None:
        return False
    if puzzle is not None:
        given = _check_board(puzzle)
        return all(g == 0 or g == s for g, s in zip(given, cells))
    return True


def random_solution(rng: random.Random) -> list[int]:
    """A random complete grid: the solver on an empty board, trying candidates in ``rng``-shuffled order."""
    return _solutions([0] * 81, 1, rng)[0]


def generate_puzzle(seed) -> tuple[list[int], list[int]]:
    """One minimal puzzle with a unique solution, deterministic in ``seed``: ``(puzzle, solution)``.

    ``seed`` is an int or a string (``random.Random`` hashes strings with SHA-512, so this is
    reproducible across runs and platforms). Removing the given ``v`` of cell ``i`` keeps the
    solution unique iff no solution has a digit other than ``v`` in cell ``i``; that search stops at
    its first solution.
    """
    rng = random.Random(seed)
    solution = random_solution(rng)
    puzzle = list(solution)
    order = list(range(81))
    rng.shuffle(order)
    for i in order:
        v = puzzle[i]
        puzzle[i] = 0
        masks = _masks(puzzle)
        rows, cols, boxes = masks
        others = ~(rows[_ROW[i]] | cols[_COL[i]] | boxes[_BOX[i]]) & 511 & ~(1 << (v - 1))
        if _has_solution_with(puzzle, masks, i, others):
            puzzle[i] = v  # removing it would admit a second solution: keep the given
    return puzzle, solution


def _has_solution_with(puzzle, masks, i, cand) -> bool:
    """Whether the puzzle has a solution whose cell ``i`` takes a digit in the mask ``cand``."""
    rows, cols, boxes = (list(m) for m in masks)
    cells = list(puzzle)
    empty = [j for j in range(81) if cells[j] == 0 and j != i]
    r, c, b = _ROW[i], _COL[i], _BOX[i]
    out: list[list[int]] = []
    for d in range(9):
        bit = 1 << d
        if not cand & bit:
            continue
        cells[i] = d + 1
        rows[r] |= bit
        cols[c] |= bit
        boxes[b] |= bit
        _search(cells, rows, cols, boxes, empty, 1, out)
        rows[r] ^= bit
        cols[c] ^= bit
        boxes[b] ^= bit
        if out:
            return True
    return False


def candidate_puzzle(seed: int, k: int) -> tuple[list[int], list[int], bool]:
    """Candidate ``k`` of the stream ``seed``: ``(puzzle, solution, hard)``.

    ``hard`` is True when naked and hidden singles alone cannot solve the puzzle.
    """
    puzzle, solution = generate_puzzle(f"sudoku:{int(seed)}:{int(k)}")
    return puzzle, solution, not solved_by_singles(puzzle)


def generate_puzzles(n: int, seed: int, hard: bool = True) -> tuple[torch.Tensor, torch.Tensor]:
    """``n`` minimal unique puzzles from the stream ``seed``: int64 ``(puzzle, solution)``, ``(n, 81)`` each.

    Candidates ``k = 0, 1, 2, ...`` of :func:`candidate_puzzle` are taken in order; with ``hard``
    only those that naked and hidden singles cannot solve are kept (about 60 % of them).
    """
    n = check_positive_int(n, "n")
    puzzles, solutions, k = [], [], 0
    while len(puzzles) < n:
        p, s, is_hard = candidate_puzzle(seed, k)
        k += 1
        if is_hard or not hard:
            puzzles.append(p)
            solutions.append(s)
    return torch.tensor(puzzles, dtype=torch.long), torch.tensor(solutions, dtype=torch.long)


_UNITS = ([[r * 9 + c for c in range(9)] for r in range(9)]
          + [[r * 9 + c for r in range(9)] for c in range(9)]
          + [[(b // 3) * 27 + (b % 3) * 3 + r * 9 + c for r in range(3) for c in range(3)]
             for b in range(9)])


def solved_by_singles(board) -> bool:
    """Whether naked and hidden singles alone (no guessing) complete the puzzle.

    Puzzles for which this is False need search or techniques beyond singles; the generator's
    ``hard`` option keeps only those.
    """
    cells = _check_board(board)
    masks = _masks(cells)
    if masks is None:
        return False
    rows, cols, boxes = masks
    progress = True
    while progress:
        progress = False
        cand = [0 if cells[i] else ~(rows[_ROW[i]] | cols[_COL[i]] | boxes[_BOX[i]]) & 511
                for i in range(81)]
        moves = {i: _DIGITS[m] for i, m in enumerate(cand) if _POP[m] == 1}  # naked singles
        for unit in _UNITS:  # hidden singles
            for d in range(9):
                where = [i for i in unit if cand[i] >> d & 1]
                if len(where) == 1:
                    moves.setdefault(where[0], d + 1)
        for i, v in moves.items():
            bit = 1 << (v - 1)
            if (rows[_ROW[i]] | cols[_COL[i]] | boxes[_BOX[i]]) & bit:
                return False  # contradiction
            cells[i] = v
            rows[_ROW[i]] |= bit
            cols[_COL[i]] |= bit
            boxes[_BOX[i]] |= bit
            progress = True
    return 0 not in cells


# --------------------------------------------------------------------------- shipped set


def pack_boards(puzzle: np.ndarray, solution: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Compact storage: solution digits as 4-bit nibbles ``(N, 41)``, the given-cell mask as bits ``(N, 11)``."""
    puzzle, solution = np.asarray(puzzle, np.uint8), np.asarray(solution, np.uint8)
    d = np.concatenate([solution, np.zeros((len(solution), 1), np.uint8)], axis=1)  # pad 81 -> 82
    nibbles = (d[:, 0::2] << 4) | d[:, 1::2]
    return nibbles.astype(np.uint8), np.packbits(puzzle > 0, axis=1)


def unpack_boards(nibbles: np.ndarray, mask_bits: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Inverse of :func:`pack_boards`: ``(puzzle, solution)`` as uint8 ``(N, 81)``."""
    d = np.empty((len(nibbles), 82), np.uint8)
    d[:, 0::2], d[:, 1::2] = nibbles >> 4, nibbles & 15
    solution = d[:, :81]
    given = np.unpackbits(mask_bits, axis=1, count=81).astype(bool)
    return np.where(given, solution, 0).astype(np.uint8), solution.copy()


class SudokuDataset(Dataset):
    """Puzzles and solutions as int64 ``(N, 81)`` tensors (row-major, 0 = blank in ``puzzle``).

    ``dataset[i]`` is ``(puzzle[i], solution[i] - 1)``: input tokens in 0..9 (``vocab_size`` = 10)
    and targets in 0..8; the Hyper-SET loss is the cross-entropy on blank cells (``puzzle == 0``).
    """

    vocab_size = 10
    num_classes = 9

    def __init__(self, puzzle: torch.Tensor, solution: torch.Tensor):
        if puzzle.shape != solution.shape or puzzle.ndim != 2 or puzzle.shape[1] != 81:
            raise ValueError(f"puzzle and solution must both be (N, 81), got {tuple(puzzle.shape)} "
                             f"and {tuple(solution.shape)}")
        self.puzzle, self.solution = puzzle.long(), solution.long()

    def __len__(self) -> int:
        return len(self.puzzle)

    def __getitem__(self, i):
        return self.puzzle[i], self.solution[i] - 1

    def givens(self) -> torch.Tensor:
        """Number of givens per puzzle, int64 ``(N,)``."""
        return (self.puzzle > 0).sum(1)

    def with_blanks(self, blanks: int, seed: int = 0) -> "SudokuDataset":
        """An easier set with the same solutions: each puzzle keeps ``blanks`` of its blank cells (a
        seeded random choice, puzzle by puzzle) and the others are filled in from its solution. A
        puzzle with fewer blanks than ``blanks`` is kept as it is. Filling cells of a puzzle with a
        unique solution keeps the solution unique, so every easier puzzle is a valid Sudoku."""
        check_positive_int(blanks, "blanks")
        if blanks > 81:
            raise ValueError(f"blanks must be at most 81, got {blanks}")
        rng = np.random.default_rng([seed, 81])
        puzzle = self.puzzle.clone()
        for i in range(len(puzzle)):
            empty = torch.nonzero(puzzle[i] == 0).flatten().numpy()
            if len(empty) > blanks:
                fill = rng.permutation(empty)[blanks:]
                puzzle[i, fill] = self.solution[i, fill]
        return SudokuDataset(puzzle, self.solution)


@dataclass
class SudokuSplits:
    train: SudokuDataset
    test: SudokuDataset


def _default_path() -> Path:
    return Path(str(resources.files("cemlib.data") / "files" / _FILE))


def check_boards(puzzle: np.ndarray, solution: np.ndarray, name: str = "boards") -> None:
    """Raise ``ValueError`` naming the first problem unless ``solution`` holds complete valid grids
    (every row, column and box a permutation of 1..9) and ``puzzle`` (0 = blank) agrees with them;
    both integer ``(N, 81)``, ``N >= 1``."""
    puzzle, solution = np.asarray(puzzle), np.asarray(solution)
    if puzzle.ndim != 2 or puzzle.shape != solution.shape or puzzle.shape[1:] != (81,) or not len(puzzle):
        raise ValueError(f"{name}: puzzle and solution must both be (N, 81) with N >= 1, got "
                         f"{puzzle.shape} and {solution.shape}")
    if puzzle.dtype.kind not in "iu" or solution.dtype.kind not in "iu":
        raise ValueError(f"{name}: boards must be integers, got {puzzle.dtype} and {solution.dtype}")
    if puzzle.min() < 0 or puzzle.max() > 9:
        raise ValueError(f"{name}: puzzle cells must be 0..9 (0 = blank)")
    if solution.min() < 1 or solution.max() > 9:
        raise ValueError(f"{name}: solution cells must be digits 1..9")
    wrong = np.nonzero(((puzzle != 0) & (puzzle != solution)).any(1))[0]
    if len(wrong):
        raise ValueError(f"{name}: board {wrong[0]} has givens that disagree with its solution")
    g = solution.reshape(-1, 9, 9)
    units = (g, g.transpose(0, 2, 1), g.reshape(-1, 3, 3, 3, 3).transpose(0, 1, 3, 2, 4).reshape(-1, 9, 9))
    digits = np.arange(1, 10)
    for what, u in zip(("a row", "a column", "a box"), units):
        bad = np.nonzero(~(np.sort(u, axis=2) == digits).all((1, 2)))[0]
        if len(bad):
            raise ValueError(f"{name}: solution {bad[0]} is not a valid grid ({what} repeats a digit)")


def _read_split(z, split: str, fname: str) -> tuple[np.ndarray, np.ndarray]:
    keys = set(z.files)
    if {f"{split}_solution", f"{split}_givens"} <= keys:
        return unpack_boards(z[f"{split}_solution"], z[f"{split}_givens"])
    if {f"{split}_puzzle", f"{split}_solution"} <= keys:
        return z[f"{split}_puzzle"], z[f"{split}_solution"]
    raise ValueError(f"{fname} has no {split} split: expected the arrays {split}_puzzle and "
                     f"{split}_solution (or the shipped {split}_solution and {split}_givens); "
                     f"found {sorted(keys)}")


def load_sudoku(path: str | Path | None = None, sha256: str | None = "shipped file only") -> SudokuSplits:
    """The shipped hard set (see ``make_sudoku.py``) after checking the file's SHA-256, or the
    ``.npz`` at ``path`` (see the module docstring for its layouts; checked with
    :func:`check_boards`, not against the shipped checksum unless ``sha256`` is given).

    Raises :class:`~cemlib.data.shakespeare.ChecksumError` naming the file and the expected
    checksum if the bytes do not match, and ``ValueError`` for a file of one's own that is not a
    complete Sudoku set.
    """
    p = Path(path) if path is not None else _default_path()
    shipped = path is None or (p.exists() and p.resolve() == _default_path().resolve())
    if sha256 == "shipped file only":
        sha256 = SUDOKU_SHA256 if shipped else None
    if p.is_dir():
        raise IsADirectoryError(f"Sudoku path {p} is a folder; give the .npz file itself")
    if not p.exists():
        raise FileNotFoundError(f"Sudoku file not found: {p.name}")
    raw = p.read_bytes()
    if sha256 is not None:
        verify_sha256(p, raw, sha256)
    try:
        z = np.load(io.BytesIO(raw), allow_pickle=False)
    except Exception as err:  # noqa: BLE001 -- numpy raises several kinds for a foreign file
        raise ValueError(f"{p.name} is not a .npz file ({type(err).__name__}: {err})") from None
    if not hasattr(z, "files"):
        raise ValueError(f"{p.name} holds one array, not the .npz of a Sudoku set")
    with z:
        splits = {}
        for name in ("train", "test"):
            try:
                puzzle, solution = _read_split(z, name, p.name)
            except (ValueError, OSError, EOFError, KeyError, zipfile.BadZipFile) as err:
                raise ValueError(f"{p.name}: the {name} split cannot be read ({err})") from None
            if sha256 is None:  # not verified by a checksum: check what it holds
                check_boards(puzzle, solution, f"{p.name}, {name} split")
            splits[name] = SudokuDataset(torch.from_numpy(np.asarray(puzzle)).long(),
                                         torch.from_numpy(np.asarray(solution)).long())
    return SudokuSplits(**splits)
