"""Re-execute the book's chapters in place on the reference CPU environment.

    python book/rerun.py                 # every chapter in _toc.yml
    python book/rerun.py book/ch01_associative_memory.ipynb
    python book/rerun.py --check         # only check the committed notebooks, execute nothing

A notebook is written back only if the fresh run passes the checks that CI relies on: no error
output (except in cells tagged ``raises-exception``), cells executed once each, top to bottom, in
one kernel, and no path of this machine in any output. Chapters run with ``CEMLIB_DEVICE=cpu`` and
the portable CPU numerics of ``book/portable_numerics.py`` (as under nbval), so the committed outputs
are the CPU reference that nbval compares against on any x86-64 machine.
"""

from __future__ import annotations

import argparse
import os
import re
import sys
import tempfile
import time
from pathlib import Path

import nbformat

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(Path(__file__).resolve().parent))
import portable_numerics  # noqa: E402  (book/portable_numerics.py)

sys.path.pop(0)


def chapters_from_toc(root: Path = ROOT) -> list[Path]:
    """The notebooks listed in ``_toc.yml``, in order."""
    files = re.findall(r"file:\s*(\S+)", (root / "_toc.yml").read_text())
    return [root / f"{f}.ipynb" for f in files if (root / f"{f}.ipynb").exists()]


def _machine_path_pattern() -> re.Pattern:
    roots = {str(ROOT), str(ROOT.parent), os.path.expanduser("~"), tempfile.gettempdir(), sys.prefix}
    roots = sorted((r.rstrip("/") + "/" for r in roots if r and len(r) > 1), key=len, reverse=True)
    return re.compile("|".join(re.escape(r) for r in roots))


def problems(nb) -> list[str]:
    """What is wrong with an executed notebook, as a list of messages (empty if nothing)."""
    out, counts = [], []
    path_re = _machine_path_pattern()
    for idx, cell in enumerate(nb.cells):
        if cell.cell_type != "code" or not cell.source.strip():
            continue
        if cell.get("execution_count") is None:
            out.append(f"cell {idx}: not executed")
            continue
        counts.append(cell.execution_count)
        tags = cell.get("metadata", {}).get("tags", [])
        for o in cell.get("outputs", []):
            if o.get("output_type") == "error" and "raises-exception" not in tags:
                out.append(f"cell {idx}: raised {o.get('ename')}: {o.get('evalue')}")
            m = path_re.search(str(o))
            if m:
                out.append(f"cell {idx}: output contains a machine path ({m.group(0)}...)")
    if counts != list(range(1, len(counts) + 1)):
        out.append(f"cells not executed once each, top to bottom, in one kernel: {counts}")
    return out


def execute(path: Path, timeout: int = 900) -> tuple[object, float]:
    """Execute ``path`` in a fresh kernel (working directory: the notebook's folder)."""
    from nbclient import NotebookClient

    nb = nbformat.read(path, as_version=4)
    os.environ["CEMLIB_DEVICE"] = "cpu"
    portable_numerics.apply()
    os.environ.setdefault("MPLBACKEND", "module://matplotlib_inline.backend_inline")
    client = NotebookClient(nb, timeout=timeout, kernel_name="python3", allow_errors=True,
                            resources={"metadata": {"path": str(path.parent)}})
    t0 = time.perf_counter()
    client.execute()
    return nb, time.perf_counter() - t0


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("notebooks", nargs="*", type=Path)
    ap.add_argument("--check", action="store_true", help="check committed notebooks, execute nothing")
    ap.add_argument("--timeout", type=int, default=900, help="per-cell timeout in seconds")
    args = ap.parse_args(argv)
    paths = [p.resolve() for p in args.notebooks] or chapters_from_toc()
    failed = False
    for path in paths:
        name = path.relative_to(ROOT) if path.is_relative_to(ROOT) else path.name
        if args.check:
            nb, secs = nbformat.read(path, as_version=4), None
        else:
            nb, secs = execute(path, args.timeout)
        bad = problems(nb)
        if bad:
            failed = True
            print(f"REFUSED {name}:" + "".join(f"\n  - {b}" for b in bad))
            continue
        if not args.check:
            nbformat.write(nb, path)
        print(f"ok {name}" + (f" ({secs:.1f} s)" if secs is not None else ""))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
