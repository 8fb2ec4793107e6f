"""``book/rerun.py`` under faults (issue 36, item 12): a notebook that cannot be written back keeps
its execution, one bad file does not stop the others, a dead kernel is reported with the notebook
and the cell, and every error is one line. Each test executes two or three one-cell notebooks."""

import importlib.util
from pathlib import Path

import nbformat
import pytest

ROOT = Path(__file__).resolve().parents[2]
_spec = importlib.util.spec_from_file_location("rerun", ROOT / "book" / "rerun.py")
rerun = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(rerun)


def notebook(path: Path, *sources: str) -> Path:
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell(s) for s in sources]
    nbformat.write(nb, path)
    return path


def test_one_bad_notebook_does_not_stop_the_others(tmp_path, capsys):
    """one bad file aborted the rest without being named."""
    good = [notebook(tmp_path / f"good{i}.ipynb", f"print({i})") for i in (1, 2)]
    bad = tmp_path / "bad.ipynb"
    bad.write_text("{ this is not a notebook")
    assert rerun.main([str(good[0]), str(bad), str(good[1])]) == 1
    out = capsys.readouterr().out
    assert "ok good1.ipynb" in out and "ok good2.ipynb" in out
    assert "FAILED bad.ipynb: cannot read it (" in out
    assert "1 of 3 notebook(s) failed: bad.ipynb" in out
    for path in good:
        assert nbformat.read(path, as_version=4).cells[0].outputs[0]["text"].strip() in ("1", "2")


def test_a_dead_kernel_names_the_notebook_and_the_cell(tmp_path, capsys):
    """a dead kernel was reported without the notebook or the cell."""
    dead = notebook(tmp_path / "dead.ipynb", "x = 1", "import os\nos._exit(1)", "print(x)")
    assert rerun.main([str(dead)]) == 1
    out = capsys.readouterr().out
    assert "FAILED dead.ipynb: the kernel died while executing cell 1" in out


def test_a_notebook_that_cannot_be_written_back_keeps_its_execution(tmp_path, capsys, monkeypatch):
    """a notebook that could not be written back lost its execution."""
    path = notebook(tmp_path / "chapter.ipynb", "print(6 * 7)")
    real = nbformat.write

    def read_only(nb, target, *args, **kwargs):
        if Path(target) == path:
            raise PermissionError(13, "Permission denied", str(target))
        return real(nb, target, *args, **kwargs)
    monkeypatch.setattr(rerun.nbformat, "write", read_only)
    assert rerun.main([str(path)]) == 1
    out = capsys.readouterr().out
    kept = tmp_path / "chapter.executed.ipynb"
    assert f"NOT WRITTEN chapter.ipynb" in out and f"the executed notebook is in {kept}" in out
    assert nbformat.read(kept, as_version=4).cells[0].outputs[0]["text"] == "42\n"
    assert nbformat.read(path, as_version=4).cells[0].outputs == []  # the original is untouched


def test_a_missing_notebook_is_one_line_before_anything_runs(tmp_path, capsys):
    good = notebook(tmp_path / "good.ipynb", "print(1)")
    assert rerun.main([str(good), str(tmp_path / "absent.ipynb")]) == 2
    cap = capsys.readouterr()
    assert cap.err.count("\n") == 1 and "error: no such notebook:" in cap.err and "absent.ipynb" in cap.err
    assert cap.out == "" and nbformat.read(good, as_version=4).cells[0].outputs == []


@pytest.mark.parametrize("text", ["", "[]", '{"cells": 1}'])
def test_check_mode_names_unreadable_notebooks(tmp_path, capsys, text):
    bad = tmp_path / "bad.ipynb"
    bad.write_text(text)
    assert rerun.main(["--check", str(bad)]) == 1
    assert "FAILED bad.ipynb" in capsys.readouterr().out
