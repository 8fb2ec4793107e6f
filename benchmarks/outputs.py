"""Where a benchmark writes its JSON: never over a stored result unless asked to.

The chapters read the committed files in ``benchmarks/results/``. A benchmark run with its defaults
therefore writes its *default* file only if that file does not exist yet; otherwise it writes a new
file beside it, ``<name>-<UTC date and time>.json``, and says so. ``--replace`` overwrites the
default file (to refresh a stored result on purpose); ``--out PATH`` writes exactly ``PATH``.
Every script prints where it will write before it starts and where it wrote at the end.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

__all__ = ["RESULTS", "add_output_arguments", "output_path", "write_json", "announce",
           "command_line"]

#: the folder of the stored benchmark results (next to this file, wherever it is run from)
RESULTS = Path(__file__).resolve().parent / "results"
_REPOSITORY = Path(__file__).resolve().parent.parent


def add_output_arguments(parser: argparse.ArgumentParser, default: str) -> None:
    """``--out PATH`` and ``--replace`` on a benchmark's command line; ``default`` names the stored
    file in words for the help text."""
    parser.add_argument("--out", default=None,
                        help=f"output JSON file, overwritten if it exists (default: {default}, or a new "
                             f"file beside it if that exists; see --replace)")
    parser.add_argument("--replace", action="store_true",
                        help=f"overwrite the stored {default} (by default an existing one is kept and a "
                             f"new file is written beside it)")


def output_path(default: str | Path, out: str | Path | None = None, replace: bool = False,
                now: float | None = None) -> tuple[Path, bool]:
    """``(path, is_default)``: ``out`` if given; else ``default`` if it does not exist or ``replace``;
    else a new ``<stem>-<YYYYmmddTHHMMSSZ>[-n].json`` beside it (``now``: the time to name it by)."""
    if out is not None:
        return Path(out), False
    default = Path(default)
    if replace or not default.exists():
        return default, True
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime(now))
    path, n = default.with_name(f"{default.stem}-{stamp}{default.suffix}"), 1
    while path.exists():
        n += 1
        path = default.with_name(f"{default.stem}-{stamp}-{n}{default.suffix}")
    return path, False


def write_json(payload: dict, default: str | Path, out: str | Path | None = None,
               replace: bool = False) -> Path:
    """Write ``payload`` where :func:`output_path` says (decided now, at the end of the run, so a
    file that appeared meanwhile is not overwritten either) and print where it went."""
    path, is_default = output_path(default, out, replace)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(payload, indent=1) + "\n")
    kept = "" if out is not None or is_default else \
        f" (the stored {Path(default).name} is kept; --replace overwrites it, --out PATH picks the file)"
    print(f"wrote {_shown(path)}{kept}", flush=True)
    return path


def announce(default: str | Path, out: str | Path | None = None, replace: bool = False) -> None:
    """Print, before a long run, where its results will go."""
    path, is_default = output_path(default, out, replace)
    if out is not None:
        what = "--out"
    elif not is_default:
        what = f"a new file: the stored {Path(default).name} is kept"
    else:
        what = "replacing the stored file" if Path(default).exists() else "the default file, none stored yet"
    print(f"results will be written to {_shown(path)} ({what})", flush=True)


def command_line(script: str, argv=None) -> str:
    """The command that reproduces a run of ``script`` (a file of the repository, such as
    ``benchmarks/cpu_speed.py`` or ``tools/gpu/host_overhead.py``; ``argv``: its arguments,
    default this process's), with the path after ``--out`` shown as ``<file>`` (a machine's path
    stays out of the results)."""
    args = list(argv if argv is not None else sys.argv[1:])
    args = ["<file>" if i and args[i - 1] == "--out" else a for i, a in enumerate(args)]
    try:
        where = Path(script).resolve().relative_to(_REPOSITORY).as_posix()
    except ValueError:  # a copy outside the repository: named as the benchmark it copies
        where = f"benchmarks/{os.path.basename(script)}"
    return " ".join([f"python {where}", *args])


def _shown(path: Path) -> str:
    """``path`` relative to the working folder where it lies below it, else as given."""
    try:
        return str(path.resolve().relative_to(Path.cwd().resolve()))
    except ValueError:
        return str(path)
