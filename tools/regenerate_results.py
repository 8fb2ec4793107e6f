"""Train the stored CPU results again from their recorded commands, and replace them.

The book's stored results (``book/results/``) are re-run by the test suite and compared with what is
stored (``tests/evidence/test_stored_results.py``). When a change to cemlib is *meant* to change the
numbers (another summation order, a fixed bug, a new default), the stored files are regenerated
with this script instead of loosening that comparison, so no number is frozen by a golden file::

    git commit ...                                        # the change itself, first
    python tools/regenerate_results.py book/results/shakespeare_blocks_cpu book/results/gp_table3
    python tools/regenerate_results.py --check book/results   # which files would be re-run

Each results file whose device is a CPU is trained again with its own ``command`` (and the thread
count it recorded) into a temporary folder, and the new ``results.json`` replaces the file under the
same name; the grid entry of a run that a grid wrote (``sweep``: its overrides and seed) is kept, so
loaders still key it as before. GPU results are left alone (a GPU re-runs them). The results must
come from a clean commit, so the script refuses a working tree with uncommitted changes
(``--allow-dirty`` is for trying it out: the data gate then refuses the files it wrote).
"""

from __future__ import annotations

import argparse
import json
import shlex
import sys
import tempfile
from pathlib import Path

import torch

from cemlib.train.cli import main as train_main
from cemlib.train.results import git_commit, load_results, save_results

ROOT = Path(__file__).resolve().parent.parent


def stored_files(paths: list[str]) -> list[Path]:
    """The results files under ``paths`` (files or folders), ``summary.json`` left out."""
    out = []
    for p in map(Path, paths):
        if p.is_dir():
            out += sorted(f for f in p.rglob("*.json") if f.name != "summary.json")
        elif p.is_file():
            out.append(p)
        else:
            raise FileNotFoundError(f"{p} is neither a results file nor a folder of them")
    return out


def regenerate(path: Path) -> dict:
    """Train ``path``'s recorded command again and write the new results over it; returns them."""
    stored = load_results(path)
    argv = shlex.split(stored["command"])
    if argv[:3] != ["python", "-m", "cemlib.train"]:
        raise ValueError(f"{path}: its command is not a `python -m cemlib.train` run: {stored['command']}")
    threads, before = stored["device"].get("threads"), torch.get_num_threads()
    if threads:
        torch.set_num_threads(threads)
    try:
        with tempfile.TemporaryDirectory() as tmp:
            if train_main(argv[3:] + ["--quiet", "--out", tmp]) != 0:
                raise RuntimeError(f"{path}: the recorded command failed")
            fresh = json.loads((Path(tmp) / "results.json").read_text())
    finally:
        torch.set_num_threads(before)
    if stored.get("sweep") is not None:
        fresh["sweep"] = stored["sweep"]
    save_results(path, fresh)
    return fresh


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python tools/regenerate_results.py",
                                description=__doc__.split("\n\n", 1)[0])
    p.add_argument("paths", nargs="+", help="results files or folders of them")
    p.add_argument("--check", action="store_true", help="list what would be re-run, then exit")
    p.add_argument("--allow-dirty", action="store_true",
                   help="run from a working tree with uncommitted changes (the files then record it)")
    args = p.parse_args(argv)
    files = [f for f in stored_files(args.paths) if load_results(f)["device"]["type"] == "cpu"]
    for f in files:
        print(f"{'would re-run' if args.check else 're-running'} {f}: {load_results(f)['command']}")
    if args.check:
        return 0
    commit = git_commit(ROOT) or ""
    if commit.endswith("+dirty") and not args.allow_dirty:
        print("error: the working tree has uncommitted changes; commit first, so that the files record "
              "the commit that wrote them (or pass --allow-dirty to try it out)", file=sys.stderr)
        return 2
    for f in files:
        fresh = regenerate(f)
        print(f"wrote {f} ({fresh['metrics'].get('final_whole_val') or fresh['metrics'].get('final')})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
