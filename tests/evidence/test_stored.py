"""cemlib.evidence.stored finds the stored results in a checkout or in the installed package, and a wheel
carries them (so that a chapter opened alone, as Colab opens it, finds them)."""

import ast
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

import cemlib.evidence.stored as stored
from cemlib.evidence.stored import SHIPPED, stored_path

ROOT = Path(__file__).resolve().parents[2]


def test_in_the_repository_the_repository_folders_are_used():
    assert stored_path("book/results", start=ROOT / "book") == ROOT / "book" / "results"
    assert stored_path("benchmarks/results/cpu_speed.json", start=ROOT) == ROOT / "benchmarks" / "results" / "cpu_speed.json"
    # from an unrelated folder: the checkout this package was imported from
    assert stored_path("book/results", start="/") == ROOT / "book" / "results"


def test_outside_a_checkout_the_shipped_copy_is_used(tmp_path, monkeypatch):
    shipped = tmp_path / "site-packages" / "cemlib" / "_stored"
    (shipped / "book" / "results" / "sweep").mkdir(parents=True)
    (shipped / "book" / "results" / "sweep" / "a.json").write_text("{}")
    monkeypatch.setattr(stored, "_in_checkout", lambda root, rel: None)
    monkeypatch.setattr(stored, "shipped_root", lambda: shipped)
    assert stored_path("book/results", start=tmp_path) == shipped / "book" / "results"
    assert stored_path("book/results/sweep/a.json", start=tmp_path).read_text() == "{}"
    with pytest.raises(FileNotFoundError, match="benchmarks/results"):
        stored_path("benchmarks/results", start=tmp_path)
    monkeypatch.setattr(stored, "shipped_root", lambda: None)
    with pytest.raises(FileNotFoundError, match="ships no stored results"):
        stored_path("book/results", start=tmp_path)


def test_a_checkout_needs_the_cemlib_sources(tmp_path):
    (tmp_path / "book" / "results").mkdir(parents=True)
    assert stored._in_checkout(tmp_path, "book/results") is None      # some other project's book/results
    (tmp_path / "cemlib").mkdir()
    (tmp_path / "cemlib" / "__init__.py").write_text("")
    assert stored._in_checkout(tmp_path, "book/results") == tmp_path / "book" / "results"


def test_only_shipped_paths_are_resolved():
    for bad in ("book/ch01_associative_memory.ipynb", "tests", "book/results_old", "../book/results"):
        with pytest.raises(ValueError, match="not stored"):
            stored_path(bad)


def test_setup_py_and_manifest_ship_the_same_paths():
    tree = ast.parse((ROOT / "setup.py").read_text())
    stored_in_setup = next(ast.literal_eval(node.value) for node in ast.walk(tree)
                           if isinstance(node, ast.Assign) and getattr(node.targets[0], "id", None) == "STORED")
    assert tuple(stored_in_setup) == SHIPPED
    manifest = (ROOT / "MANIFEST.in").read_text()
    for rel in SHIPPED:
        assert (ROOT / rel).exists(), rel
        assert (f"graft {rel}" if (ROOT / rel).is_dir() else rel) in manifest, rel


def test_the_wheel_carries_every_stored_file(tmp_path):
    """Build the wheel (no dependencies, no isolation: a few seconds) and compare its stored copy with
    the repository's files."""
    run = subprocess.run([sys.executable, "-m", "pip", "wheel", str(ROOT), "--no-deps", "--no-build-isolation",
                          "-q", "-w", str(tmp_path)], capture_output=True, text=True, cwd=tmp_path)
    if run.returncode != 0 and "No module named pip" in run.stderr:
        pytest.skip("pip is not available")
    assert run.returncode == 0, run.stderr[-2000:]
    wheel = next(tmp_path.glob("cemlib-*.whl"))
    names = set(zipfile.ZipFile(wheel).namelist())
    expected = set()
    for rel in SHIPPED:
        src = ROOT / rel
        files = [src] if src.is_file() else [p for p in src.rglob("*") if p.is_file() and "__pycache__" not in p.parts]
        expected |= {f"cemlib/_stored/{p.relative_to(ROOT).as_posix()}" for p in files}
    assert expected and expected <= names, sorted(expected - names)[:10]
    assert "cemlib/evidence/stored.py" in names and not any(n.startswith(("book/", "benchmarks/", "tests/")) for n in names)
