"""The tests mirror the package: one folder per part of cemlib (and for the book, the benchmarks and
the tools), and every test file name is unique across tests/, so a file is found by its name alone
(the errata registry and the docs cite tests that way)."""

import collections
import pkgutil
from pathlib import Path

import cemlib

TESTS = Path(__file__).resolve().parent


def test_every_part_of_cemlib_has_its_test_folder():
    parts = {m.name for m in pkgutil.iter_modules(cemlib.__path__) if m.ispkg}
    missing = sorted(p for p in parts if not (TESTS / p).is_dir())
    assert not missing, f"no tests/<part>/ for: {missing}"


def test_test_file_names_are_unique():
    names = collections.Counter(p.name for p in TESTS.rglob("test_*.py"))
    assert not [n for n, k in names.items() if k > 1], [n for n, k in names.items() if k > 1]
