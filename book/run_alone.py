"""Run chapters as Colab opens them: alone in an empty folder, with cemlib installed from a wheel.

For each chapter: build the wheel of this checkout (``pip wheel``, no dependencies), install it into
a fresh virtual environment that borrows the packages of the Python running this script
(:func:`venv_like_this_one`: torch, ipywidgets, nbval come from it, be it a venv, conda or the
system Python; cemlib comes from the wheel, which is checked), copy
the notebook **alone** into an empty folder outside the repository, and run it there under nbval
in strict mode, exactly as CI runs the chapters (the outputs must equal the committed ones). A last
cell, appended to the copy, asserts that the kernel imported cemlib from the wheel. The stored
results a chapter reads must therefore come through :func:`cemlib.evidence.stored.stored_path`, from the
copy shipped in the wheel.

    python book/run_alone.py book/ch05_cem_transformer.ipynb book/ch10_four_energies_benchmark.ipynb
    python book/run_alone.py --stored          # every chapter that reads stored results

Slow (each chapter runs in full, 2.5-5 minutes a chapter on two cores; the wheel and the venv take
about a minute): ``tests/book/test_chapters_alone.py`` runs it only when ``CEMLIB_TEST_ALONE=1`` is set.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import nbformat

ROOT = Path(__file__).resolve().parent.parent

# how a chapter reads stored results: through the resolver, or by a path next to the notebook
_STORED_RE = re.compile(r"stored_path\(|Path\(\s*\"results\"\s*\)|Path\(\s*\"\.\.\"\s*\)|benchmarks")
_LOCAL_RE = re.compile(r"Path\(\s*\"results\"\s*\)|Path\(\s*\"\.\.\"\s*\)|git\", \"clone|git clone")

CHECK_CELL = ("import sys as _sys\nimport cemlib as _cemlib\n"
              "assert _cemlib.__file__.startswith(_sys.prefix), _cemlib.__file__  # the wheel, not a checkout")


def _code(path: Path) -> str:
    nb = nbformat.read(path, as_version=4)
    return "\n".join(c.source for c in nb.cells if c.cell_type == "code")


def reads_stored_results(path: Path) -> bool:
    """The chapter reads stored results (``book/results``, ``benchmarks/...``)."""
    return bool(_STORED_RE.search(_code(path)))


def needs_its_repository(path: Path) -> bool:
    """The chapter still reads stored results by a path relative to the notebook (or clones the
    repository), so it cannot run alone."""
    return bool(_LOCAL_RE.search(_code(path)))


def _env() -> dict:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "TRITON_INTERPRET", "VIRTUAL_ENV")}
    env["CEMLIB_DEVICE"] = "cpu"
    return env


def site_packages() -> list[str]:
    """The folders the running Python imports third-party packages from (its ``site-packages`` or
    ``dist-packages`` on ``sys.path``: a venv's, conda's or the system's alike)."""
    out: list[str] = []
    for entry in sys.path:
        p = Path(entry)
        if p.name in ("site-packages", "dist-packages") and p.is_dir() and str(p) not in out:
            out.append(str(p))
    return out


def venv_like_this_one(dest: Path) -> Path:
    """A fresh virtual environment at ``dest`` that sees the packages of the running Python, and
    returns its python. Not ``venv --system-site-packages``: run from inside a venv, that borrows
    the *base* interpreter's packages (no torch there), which is how the README's test command
    failed in a virtual environment. Instead a ``.pth`` file lists this Python's package folders
    (:func:`site_packages`; their own ``.pth`` files, an editable cemlib's among them, are not
    run), so a wheel installed into ``dest`` is the cemlib it imports."""
    dest = Path(dest)
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(dest)], check=True, timeout=300)
    py = dest / ("Scripts" if os.name == "nt" else "bin") / ("python.exe" if os.name == "nt" else "python")
    purelib = subprocess.run([str(py), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                             check=True, capture_output=True, text=True, env=_env(), timeout=120).stdout.strip()
    Path(purelib).mkdir(parents=True, exist_ok=True)
    (Path(purelib) / "_parent_environment.pth").write_text("".join(f"{p}\n" for p in site_packages()))
    return py


def make_venv(work: Path) -> Path:
    """Build the wheel and install it into ``work/venv`` (:func:`venv_like_this_one`); returns the
    venv's python."""
    wheels = work / "wheel"
    subprocess.run([sys.executable, "-m", "pip", "wheel", str(ROOT), "--no-deps", "--no-build-isolation", "-q",
                    "-w", str(wheels)], check=True, cwd=work, env=_env())
    py = venv_like_this_one(work / "venv")
    # --force-reinstall: an (editable) cemlib of the running Python must not count as installed
    subprocess.run([str(py), "-m", "pip", "install", "-q", "--no-deps", "--no-index", "--force-reinstall",
                    str(next(wheels.glob("cemlib-*.whl")))], check=True, cwd=work, env=_env())
    where = subprocess.run([str(py), "-c", "import cemlib; print(cemlib.__file__)"], check=True, cwd=work,
                           env=_env(), capture_output=True, text=True).stdout.strip()
    if not Path(where).resolve().is_relative_to((work / "venv").resolve()):
        raise RuntimeError(f"the venv imports cemlib from {where}, not from the wheel")
    return py


def run_alone(chapter: Path, py: Path, work: Path, timeout: int = 1800) -> tuple[int, float, str]:
    """Run ``chapter`` alone under nbval with the venv's python; returns (exit code, seconds, output tail)."""
    harness = work / chapter.stem
    folder = harness / "notebook"                   # holds the notebook and nothing else
    folder.mkdir(parents=True)
    nb = nbformat.read(chapter, as_version=4)
    nb.cells.append(nbformat.v4.new_code_cell(CHECK_CELL))
    nbformat.write(nb, folder / chapter.name)
    shutil.copy(ROOT / "book" / "conftest.py", harness / "conftest.py")
    shutil.copy(ROOT / "book" / "portable_numerics.py", harness / "portable_numerics.py")  # conftest imports it
    shutil.copy(ROOT / "tests" / "nbval_sanitize.cfg", harness / "nbval_sanitize.cfg")
    t0 = time.perf_counter()
    run = subprocess.run([str(py), "-m", "pytest", "-q", "-p", "no:cacheprovider", "--nbval", "--nbval-current-env",
                          "--nbval-sanitize-with", "nbval_sanitize.cfg", f"notebook/{chapter.name}"],
                         cwd=harness, env=_env(), capture_output=True, text=True, timeout=timeout)
    return run.returncode, time.perf_counter() - t0, (run.stdout + run.stderr)[-6000:]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("chapters", nargs="*", type=Path)
    ap.add_argument("--stored", action="store_true", help="every chapter of _toc.yml that reads stored results")
    args = ap.parse_args(argv)
    chapters = [p.resolve() for p in args.chapters]
    if args.stored:
        sys.path.insert(0, str(ROOT / "book"))
        from rerun import chapters_from_toc
        chapters += [p for p in chapters_from_toc(ROOT) if reads_stored_results(p)]
    if not chapters:
        ap.error("name chapters or pass --stored")
    failed = 0
    with tempfile.TemporaryDirectory(prefix="cemlib-alone-") as tmp:
        work = Path(tmp)
        t0 = time.perf_counter()
        py = make_venv(work)
        print(f"wheel built and installed in a fresh venv in {time.perf_counter() - t0:.0f} s", flush=True)
        for ch in chapters:
            code, secs, tail = run_alone(ch, py, work)
            status = "passed" if code == 0 else f"FAILED (exit {code})"
            print(f"{ch.name}: {status} in {secs:.0f} s", flush=True)
            if code:
                failed += 1
                print(tail)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
