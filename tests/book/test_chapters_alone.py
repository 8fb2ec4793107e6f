"""Chapters run opened alone, as Colab opens them (``book/run_alone.py``).

The long test, opt-in (``CEMLIB_TEST_ALONE=1``): a wheel of this checkout in a fresh venv that sees the
packages of the Python running the tests (a venv, conda or the system Python alike:
``run_alone.venv_like_this_one``), and each chapter that reads stored results run under nbval from an
empty folder outside the repository: about a minute for the wheel and the venv, then 2.5-5 minutes a
chapter on two cores (9 chapters, 30-45 minutes in all). A
chapter that still reads them by a path next to the notebook is expected to fail (strict xfail:
once it uses ``cemlib.evidence.stored.stored_path`` the mark goes away by itself). The fast tests always run.
"""

import os
from pathlib import Path

import nbformat
import pytest

from book_scripts import load

ROOT = Path(__file__).resolve().parents[2]


run_alone = load("run_alone")
rerun = load("rerun")
STORED_CHAPTERS = [p for p in rerun.chapters_from_toc(ROOT) if run_alone.reads_stored_results(p)]


def _nb(tmp_path, code):
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_markdown_cell("# T"), nbformat.v4.new_code_cell(code)]
    path = tmp_path / "x.ipynb"
    nbformat.write(nb, path)
    return path


def test_the_chapters_that_read_stored_results_are_found(tmp_path):
    names = {p.name[:4] for p in STORED_CHAPTERS}
    assert {"ch05", "ch10", "ch11"} <= names
    assert run_alone.needs_its_repository(_nb(tmp_path, 'RESULTS = Path("results")'))
    assert run_alone.needs_its_repository(_nb(tmp_path, 'BENCH = Path("..") / "benchmarks" / "results"'))
    ok = _nb(tmp_path, 'RESULTS = stored_path("book/results")')
    assert run_alone.reads_stored_results(ok) and not run_alone.needs_its_repository(ok)
    assert not run_alone.reads_stored_results(_nb(tmp_path, "x = 1"))


@pytest.fixture(scope="module")
def venv_python(tmp_path_factory):
    work = tmp_path_factory.mktemp("alone")
    return run_alone.make_venv(work), work


@pytest.mark.skipif(os.environ.get("CEMLIB_TEST_ALONE") != "1", reason="slow: set CEMLIB_TEST_ALONE=1")
@pytest.mark.parametrize("chapter", [
    pytest.param(p, marks=pytest.mark.xfail(strict=True, reason="reads stored results next to the notebook"))
    if run_alone.needs_its_repository(p) else p for p in STORED_CHAPTERS], ids=lambda p: p.name)
def test_chapter_runs_alone_from_a_wheel(chapter, venv_python):
    py, work = venv_python
    code, secs, tail = run_alone.run_alone(chapter, py, work)
    assert code == 0, tail
