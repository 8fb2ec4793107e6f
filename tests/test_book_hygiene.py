"""The committed chapters are executed top to bottom, error-free, and free of machine paths;
the re-execution helper refuses notebooks that are not."""

import importlib.util
from pathlib import Path

import nbformat
import pytest

ROOT = Path(__file__).resolve().parent.parent
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
