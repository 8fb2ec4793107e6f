"""Packaging hook: ship the book's stored results inside the wheel (everything else is in pyproject.toml).

A chapter opened alone (Colab opens one notebook, no repository around it) reads its stored
results through :func:`cemlib.evidence.stored.stored_path`, which falls back to copies inside the
installed package. ``build_py`` copies the repository paths of ``STORED`` to ``cemlib/_stored/``
in the build tree, so a wheel (and ``pip install git+URL@REF``) carries the results written for
that ref. An editable install reads the repository's own folders and gets no copy.
``MANIFEST.in`` puts the same paths into the source distribution.

``build_py`` also writes ``cemlib/_build_info.json``: the commit the wheel was built from (the
environment variable ``CEMLIB_GIT_COMMIT`` if set, else ``git rev-parse HEAD`` here, ``+dirty``
when tracked files are modified), so that a run of an installed wheel records its commit
(:func:`cemlib.train.results.git_commit`).
"""

import json
import os
import shutil
import subprocess
from datetime import datetime, timezone
from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py

HERE = Path(__file__).resolve().parent
# keep in step with cemlib.evidence.stored.SHIPPED
STORED = ("book/results", "benchmarks/results")


def _commit() -> str | None:
    if os.environ.get("CEMLIB_GIT_COMMIT"):
        return os.environ["CEMLIB_GIT_COMMIT"]
    try:
        head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=HERE, capture_output=True, text=True, timeout=10)
        if head.returncode:
            return None
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=HERE,
                               capture_output=True, text=True, timeout=10).stdout.strip()
        return head.stdout.strip() + ("+dirty" if dirty else "")
    except (OSError, subprocess.SubprocessError):
        return None


class build_py_with_stored_results(build_py):
    def run(self):
        super().run()
        if getattr(self, "editable_mode", False):
            return
        info = {"git_commit": _commit(), "built_utc": datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")}
        (Path(self.build_lib) / "cemlib" / "_build_info.json").write_text(json.dumps(info) + "\n")
        dest = Path(self.build_lib) / "cemlib" / "_stored"
        shutil.rmtree(dest, ignore_errors=True)          # no stale copy from an earlier build
        for rel in STORED:
            src = HERE / rel
            if src.is_dir():
                shutil.copytree(src, dest / rel, dirs_exist_ok=True,
                                ignore=shutil.ignore_patterns("__pycache__", "*.pyc", ".ipynb_checkpoints"))
            elif src.is_file():
                (dest / rel).parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(src, dest / rel)
            else:
                raise FileNotFoundError(f"{rel} is listed in setup.py's STORED but does not exist")


setup(cmdclass={"build_py": build_py_with_stored_results})
