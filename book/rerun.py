"""Re-execute the book's chapters in place on the reference CPU environment.

    python book/rerun.py                 # every chapter in _toc.yml
    python book/rerun.py book/ch01_associative_memory.ipynb
    python book/rerun.py book            # a folder: its chapters, in the book's order
    python book/rerun.py --check         # only check the committed notebooks, execute nothing

A notebook is written back only if the fresh run passes the checks that CI relies on: no error
output (except in cells tagged ``raises-exception``), cells executed once each, top to bottom, in
one kernel, no path of this machine in any output, and ``nbval-ignore-output`` only on cells that
print numbers of a live training run. Chapters run with ``CEMLIB_DEVICE=cpu`` and the portable CPU
numerics of ``book/portable_numerics.py`` (as under nbval), so the committed outputs are the CPU
reference that nbval compares against on any x86-64 machine (except a live float32 training run's
numbers, which still depend on the processor: those cells carry the tag).

One notebook that fails (unreadable, a dead kernel, a cell over the timeout, refused by the checks)
is named with the cause (the cell, where there is one) and the others still run; the exit status
is then 1. A notebook that cannot be written back keeps its execution: it is written next to it as
``<name>.executed.ipynb`` (or into the temporary folder) and the line says where. A notebook that
does not exist is an error before anything runs (status 2).
"""

from __future__ import annotations

import argparse
import ast
import json
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


def expand(paths: list[Path]) -> list[Path]:
    """The notebooks named: a folder stands for its chapters (those of ``_toc.yml`` in it, in the
    book's order, else every ``.ipynb`` in it); a file that is not a notebook, or a folder without
    one, raises ``ValueError`` saying so."""
    out: list[Path] = []
    for p in paths:
        if p.is_dir():
            listed = [c for c in chapters_from_toc() if c.parent == p]
            found = listed or sorted(q for q in p.glob("*.ipynb") if not q.name.endswith(".executed.ipynb"))
            if not found:
                raise ValueError(f"{p} is a folder that holds no notebook (.ipynb); name notebooks, or give none "
                                 f"to run every chapter of _toc.yml")
            out += found
        elif p.exists() and p.suffix != ".ipynb":
            raise ValueError(f"{p} is not a notebook (.ipynb); name chapters such as "
                             f"book/ch01_associative_memory.ipynb, or a folder of them")
        else:
            out.append(p)
    return list(dict.fromkeys(out))


def _machine_path_pattern() -> re.Pattern:
    roots = {str(ROOT), str(ROOT.parent), os.path.expanduser("~"), tempfile.gettempdir(), sys.prefix}
    roots = sorted((r.rstrip("/") + "/" for r in roots if r and len(r) > 1), key=len, reverse=True)
    return re.compile("|".join(re.escape(r) for r in roots))


def problems(nb) -> list[str]:
    """What is wrong with an executed notebook, as a list of messages (empty if nothing): errors,
    cells not run once each in order, machine paths in outputs, and the ``nbval-ignore-output``
    tag on a cell that reads nothing from a live training run (:func:`names_from_live_runs`)."""
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
    live = names_from_live_runs(nb)
    for idx, cell in enumerate(nb.cells):
        if cell.cell_type == "code" and IGNORE_OUTPUT_TAG in cell.get("metadata", {}).get("tags", []):
            if not live[idx]:
                out.append(f"cell {idx}: tagged {IGNORE_OUTPUT_TAG} but uses nothing from a live training run "
                           f"(only such cells may leave their printed numbers unchecked)")
    return out


IGNORE_OUTPUT_TAG = "nbval-ignore-output"
# cemlib.train's entry point (a live training run) and its checkpoint reader (a run's trained weights)
LIVE_RUN_CALLS = ("run_experiment", "load_checkpoint")


def _code(source: str) -> str:
    """A cell's source without IPython magics and shell lines (which ``ast`` cannot parse)."""
    return "\n".join("" if line.lstrip().startswith(("%", "!")) else line for line in source.splitlines())


def names_from_live_runs(nb) -> list[bool]:
    """For each cell of ``nb``: does it call a live training run or read its weights
    (:data:`LIVE_RUN_CALLS`), or read a name whose value came from one? Names are followed
    through the notebook in order: a name bound (assignment, loop, ``with``) from an expression
    that calls a run or reads such a name, or a name whose method is called with such an argument
    (``rows.append(...)``), carries the run's numbers on. Cells that do not parse count as not
    live."""
    tainted: set[str] = set()
    live = []

    def reads_live(node) -> bool:
        for sub in ast.walk(node):
            if isinstance(sub, ast.Call):
                f = sub.func
                name = f.id if isinstance(f, ast.Name) else f.attr if isinstance(f, ast.Attribute) else None
                if name in LIVE_RUN_CALLS:
                    return True
            if isinstance(sub, ast.Name) and sub.id in tainted:
                return True
        return False

    def bound(target) -> set[str]:
        """The names an assignment target binds or changes (``runs[exp] = ...`` changes ``runs``)."""
        if isinstance(target, ast.Name):
            return {target.id}
        if isinstance(target, (ast.Tuple, ast.List)):
            return set().union(*(bound(t) for t in target.elts))
        if isinstance(target, (ast.Starred, ast.Subscript, ast.Attribute)):
            return bound(target.value)
        return set()

    for cell in nb.cells:
        if cell.cell_type != "code":
            live.append(False)
            continue
        try:
            tree = ast.parse(_code(cell.source))
        except SyntaxError:
            live.append(False)
            continue
        changed = True
        while changed:                         # to a fixed point: a later line may taint an earlier name
            changed = False
            for node in ast.walk(tree):
                pairs = []
                if isinstance(node, (ast.Assign, ast.AugAssign, ast.AnnAssign)) and node.value is not None:
                    targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                    pairs = [(t, node.value) for t in targets]
                elif isinstance(node, (ast.For, ast.comprehension)):
                    pairs = [(node.target, node.iter)]
                elif isinstance(node, ast.withitem) and node.optional_vars is not None:
                    pairs = [(node.optional_vars, node.context_expr)]
                for target, value in pairs:
                    names = bound(target) - tainted
                    if names and reads_live(value):
                        tainted.update(names)
                        changed = True
                if isinstance(node, ast.Expr) and isinstance(node.value, ast.Call):
                    # a method call on a name with a live argument (rows.append(live_value)) taints the name
                    f = node.value.func
                    if isinstance(f, ast.Attribute) and isinstance(f.value, ast.Name) and f.value.id not in tainted:
                        if any(reads_live(a) for a in node.value.args):
                            tainted.add(f.value.id)
                            changed = True
        live.append(reads_live(tree))
    return live


class ExecutionFailed(RuntimeError):
    """A notebook could not be executed; the message names the cell where there is one."""


def execute(path: Path, timeout: int = 900) -> tuple[object, float]:
    """Execute ``path`` in a fresh kernel (working directory: the notebook's folder). Raises
    :class:`ExecutionFailed` naming the cell when the kernel dies or a cell runs out of time."""
    from nbclient import NotebookClient
    from nbclient.exceptions import CellTimeoutError, DeadKernelError

    nb = nbformat.read(path, as_version=4)
    os.environ["CEMLIB_DEVICE"] = "cpu"
    portable_numerics.apply()
    os.environ.setdefault("MPLBACKEND", "module://matplotlib_inline.backend_inline")
    current = {"cell": None}

    def on_cell_start(cell, cell_index, **kwargs):
        current["cell"] = cell_index

    client = NotebookClient(nb, timeout=timeout, kernel_name="python3", allow_errors=True,
                            resources={"metadata": {"path": str(path.parent)}}, on_cell_start=on_cell_start)
    t0 = time.perf_counter()
    try:
        client.execute()
    except DeadKernelError:
        raise ExecutionFailed(f"the kernel died while executing cell {current['cell']}") from None
    except CellTimeoutError:
        raise ExecutionFailed(f"cell {current['cell']} ran longer than the {timeout} s timeout "
                              f"(--timeout)") from None
    return nb, time.perf_counter() - t0


def write_back(nb, path: Path) -> Path:
    """Write the executed ``nb`` to ``path``; if that fails, next to it as ``<name>.executed.ipynb``
    or into the temporary folder, so the execution is not lost. Returns where it went."""
    last = None
    for target in (path, path.with_name(path.stem + ".executed.ipynb"),
                   Path(tempfile.gettempdir()) / (path.stem + ".executed.ipynb")):
        try:
            nbformat.write(nb, target)
            return target
        except OSError as err:
            last = err
    raise ExecutionFailed(f"the executed notebook could not be written anywhere ({last})")


def _read_error(err: Exception) -> str:
    return f"{type(err).__name__}: {' '.join(str(err).split())[:300]}"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("notebooks", nargs="*", type=Path)
    ap.add_argument("--check", action="store_true", help="check committed notebooks, execute nothing")
    ap.add_argument("--timeout", type=int, default=900, help="per-cell timeout in seconds")
    args = ap.parse_args(argv)
    try:
        paths = expand([p.resolve() for p in args.notebooks]) if args.notebooks else chapters_from_toc()
    except OSError as err:
        print(f"error: cannot list the chapters ({_read_error(err)})", file=sys.stderr)
        return 2
    except ValueError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    missing = [str(p) for p in paths if not p.is_file()]
    if missing:
        print(f"error: no such notebook: {', '.join(missing)}", file=sys.stderr)
        return 2
    failed = []
    for path in paths:
        name = path.relative_to(ROOT) if path.is_relative_to(ROOT) else path.name
        try:
            if args.check:
                nb, secs = nbformat.read(path, as_version=4), None
            else:
                nb, secs = execute(path, args.timeout)
        except ExecutionFailed as err:
            failed.append(name)
            print(f"FAILED {name}: {err}")
            continue
        except (OSError, ValueError, json.JSONDecodeError, nbformat.ValidationError) as err:
            failed.append(name)  # not a readable notebook (nbformat raises ValueError subclasses)
            print(f"FAILED {name}: cannot read it ({_read_error(err)})")
            continue
        except Exception as err:  # noqa: BLE001 -- one notebook's failure must not stop the rest
            failed.append(name)
            print(f"FAILED {name}: {_read_error(err)}")
            continue
        bad = problems(nb)
        if bad:
            failed.append(name)
            print(f"REFUSED {name}:" + "".join(f"\n  - {b}" for b in bad))
            continue
        timing = f" ({secs:.1f} s)" if secs is not None else ""
        if not args.check:
            try:
                target = write_back(nb, path)
            except ExecutionFailed as err:
                failed.append(name)
                print(f"FAILED {name}{timing}: {err}")
                continue
            if target != path:
                failed.append(name)
                print(f"NOT WRITTEN {name}{timing}: it cannot be written back; the executed notebook is in {target}")
                continue
        print(f"ok {name}{timing}")
    if failed:
        print(f"{len(failed)} of {len(paths)} notebook(s) failed: {', '.join(map(str, failed))}")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
