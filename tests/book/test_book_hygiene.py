"""The committed chapters are executed top to bottom, error-free, and free of machine paths;
the re-execution helper refuses notebooks that are not."""

import importlib.util
from pathlib import Path

import nbformat
import pytest

ROOT = Path(__file__).resolve().parents[2]
_spec = importlib.util.spec_from_file_location("rerun", ROOT / "book" / "rerun.py")
rerun = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(rerun)

CHAPTERS = rerun.chapters_from_toc(ROOT)


def _nb(*cells):
    nb = nbformat.v4.new_notebook()
    for i, (src, outputs, count) in enumerate(cells):
        c = nbformat.v4.new_code_cell(src, execution_count=count)
        c.outputs = [nbformat.from_dict(o) for o in outputs]
        nb.cells.append(c)
    return nb


def test_toc_lists_only_existing_chapters():
    import re
    files = re.findall(r"file:\s*(\S+)", (ROOT / "_toc.yml").read_text())
    missing = [f for f in files if not any((ROOT / f"{f}{ext}").exists() for ext in (".ipynb", ".md"))]
    assert not missing, f"_toc.yml lists files that do not exist: {missing}"
    assert CHAPTERS, "no chapter notebook found in _toc.yml"


@pytest.mark.parametrize("path", CHAPTERS, ids=lambda p: p.name)
def test_committed_chapter_is_clean(path):
    assert rerun.problems(nbformat.read(path, as_version=4)) == []


def test_helper_refuses_errors_order_and_paths():
    ok = {"output_type": "stream", "name": "stdout", "text": "1\n"}
    assert rerun.problems(_nb(("print(1)", [ok], 1), ("print(1)", [ok], 2))) == []
    err = {"output_type": "error", "ename": "AssertionError", "evalue": "boom", "traceback": []}
    assert any("AssertionError" in p for p in rerun.problems(_nb(("assert 0", [err], 1))))
    assert any("top to bottom" in p for p in rerun.problems(_nb(("1", [], 2), ("2", [], 1))))
    leak = {"output_type": "stream", "name": "stdout", "text": str(ROOT) + "/cemlib/x.py\n"}
    assert any("machine path" in p for p in rerun.problems(_nb(("print()", [leak], 1))))
    assert any("not executed" in p for p in rerun.problems(_nb(("1", [], None))))


def _tagged(nb, *indices):
    for i in indices:
        nb.cells[i].metadata["tags"] = [rerun.IGNORE_OUTPUT_TAG]
    return nb


def test_only_cells_with_live_runs_may_leave_their_output_unchecked():
    """nbval-ignore-output is for the numbers of a live float32 training run (processor-dependent):
    the run's cell, and cells reading a name bound from it (through assignments, loops, appends);
    the helper (and so the committed-chapter test) refuses the tag anywhere else."""
    cells = [("live = run_experiment('x', 'cpu')\nprint(live['loss'])", [], 1),
             ("rows = []\nfor k, v in live.items():\n    rows.append((k, v))\nresult_table = table(rows)", [], 2),
             ("display(result_table)", [], 3),
             ("import math\nprint(math.pi)", [], 4),
             ("%matplotlib inline\nx = 2", [], 5)]
    assert rerun.names_from_live_runs(_nb(*cells)) == [True, True, True, False, False]
    assert rerun.problems(_tagged(_nb(*cells), 0, 1, 2)) == []
    refused = rerun.problems(_tagged(_nb(*cells), 2, 3))
    assert len(refused) == 1 and refused[0].startswith("cell 3: tagged nbval-ignore-output")
    # a name bound before the run is not live: the tag on a cell that reads only it is refused
    before = [("n = 3", [], 1), ("out = run_experiment('x', 'cpu', n)", [], 2), ("print(n)", [], 3)]
    assert rerun.names_from_live_runs(_nb(*before)) == [False, True, False]
    # a run's trained weights are live too, and so is a model that loads them
    weights = [("model = build(cfg)", [], 1), ("state = load_checkpoint(path)", [], 2),
               ("model.load_state_dict(state)", [], 3), ("print(model(x).sum())", [], 4)]
    assert rerun.names_from_live_runs(_nb(*weights)) == [False, True, True, True]


def test_book_conftest_sets_the_kernel_environment_only_around_a_notebook_cell_setup(monkeypatch):
    """book/conftest.py sets CEMLIB_DEVICE and the portable numerics for the chapter kernels (nbval
    starts one while setting up a notebook's first cell) and leaves this process's environment as it
    was: collected beside the tests it changed their numbers (oneMKL read MKL_CBWR=COMPATIBLE at its
    first call, and two stored CPU results re-ran 1.4 % and 0.3 % away from the recorded ones)."""
    import os
    import platform
    from types import SimpleNamespace

    keys = ["CEMLIB_DEVICE", *rerun.portable_numerics.PORTABLE_ENV]
    for key in keys:
        monkeypatch.setenv(key, "")
        monkeypatch.delenv(key)
    monkeypatch.setenv("OPENBLAS_CORETYPE", "Zen")             # a value already set is kept
    spec = importlib.util.spec_from_file_location("book_conftest_probe", ROOT / "book" / "conftest.py")
    conftest = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(conftest)                           # what collecting the book does
    assert {k: os.environ.get(k) for k in keys} == {**dict.fromkeys(keys), "OPENBLAS_CORETYPE": "Zen"}

    def around(path):
        hook = conftest.pytest_runtest_setup(SimpleNamespace(path=Path(path)))
        next(hook)                                              # what the cell's setup (the kernel) sees
        seen = {k: os.environ.get(k) for k in keys}
        with pytest.raises(StopIteration):
            next(hook)
        return seen

    inside = around("book/ch01_associative_memory.ipynb")
    assert inside["CEMLIB_DEVICE"] == "cpu" and inside["OPENBLAS_CORETYPE"] == "Zen"
    if platform.machine().lower() in ("x86_64", "amd64"):
        assert inside["MKL_CBWR"] == "COMPATIBLE" and inside["ATEN_CPU_CAPABILITY"] == "avx2"
    assert {k: os.environ.get(k) for k in keys} == {**dict.fromkeys(keys), "OPENBLAS_CORETYPE": "Zen"}
    assert around("tests/test_x.py")["MKL_CBWR"] is None       # a unit test's setup: untouched


def test_portable_numerics_reach_the_chapter_kernel(tmp_path, monkeypatch):
    """A chapter executed by the re-execution helper (as by nbval, whose kernels inherit the same
    environment from book/conftest.py) runs with the pinned kernel choice of
    book/portable_numerics.py on x86-64; a value already set is kept."""
    import json
    import os
    import platform

    for key in rerun.portable_numerics.PORTABLE_ENV:
        monkeypatch.setenv(key, "")                          # recorded, so the end of the test restores it
        monkeypatch.delenv(key)
    monkeypatch.setenv("OPENBLAS_CORETYPE", "Zen")          # a reader's own choice wins
    path = tmp_path / "probe.ipynb"
    nb = nbformat.v4.new_notebook()
    nb.cells.append(nbformat.v4.new_code_cell(
        "import json, os, torch\n"
        "print(json.dumps({'cap': torch.backends.cpu.get_cpu_capability(),\n"
        "                  **{k: os.environ.get(k) for k in ('MKL_CBWR', 'ATEN_CPU_CAPABILITY', 'OPENBLAS_CORETYPE')}}))"))
    nbformat.write(nb, path)
    executed, _ = rerun.execute(path, timeout=120)
    seen = json.loads(executed.cells[0].outputs[0]["text"])
    if platform.machine().lower() not in ("x86_64", "amd64"):
        assert seen["MKL_CBWR"] is None
        return
    assert seen["MKL_CBWR"] == "COMPATIBLE" and seen["ATEN_CPU_CAPABILITY"] == "avx2"
    assert seen["OPENBLAS_CORETYPE"] == "Zen"
    assert seen["cap"] in ("AVX2", "DEFAULT"), seen              # never AVX512, even where present
    assert os.environ["MKL_CBWR"] == "COMPATIBLE"                 # set in this process (restored after the test)
