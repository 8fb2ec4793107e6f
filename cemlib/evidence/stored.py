"""Where the book's stored results are: in the repository, or shipped inside the installed package.

The chapters read results that do not fit the CPU budget (seed sweeps, GPU runs, benchmark
measurements) from files written by recorded commands: the repository's ``book/results/`` and
``benchmarks/results/``. A chapter opened alone, as Colab opens it, has no repository around it, so
these folders are also **shipped in the wheel**, under ``cemlib/_stored/`` (``setup.py`` copies them at build
time; see ``STORED`` there): an install at the book's pinned ref carries exactly the results
written for that ref, and needs no network.

:func:`stored_path` finds a repository path, first in a checkout of the repository (the working
directory or one of its parents, which is where a chapter runs, in ``book/``; then the checkout
this package was imported from, for an editable install), else in the installed package's copy.
"""

from __future__ import annotations

import os
from importlib import resources
from pathlib import Path

__all__ = ["SHIPPED", "stored_path", "shipped_root"]

#: repository folders and files shipped inside the wheel, under ``cemlib/_stored/`` (keep in step
#: with ``STORED`` in ``setup.py``)
SHIPPED = ("book/results", "benchmarks/results")


def _in_checkout(root: Path, rel: str) -> Path | None:
    """``root / rel`` when ``root`` is a checkout of this repository (it holds the cemlib sources)."""
    p = root / rel
    if p.exists() and (root / "cemlib" / "__init__.py").is_file():
        return p
    return None


def shipped_root() -> Path | None:
    """The folder of the copies shipped in the installed package, or ``None`` (a source checkout
    has none: it reads the repository's own folders)."""
    root = resources.files("cemlib") / "_stored"
    return Path(str(root)) if root.is_dir() else None


def stored_path(rel: str, start: str | os.PathLike | None = None) -> Path:
    """The path of the repository file or folder ``rel`` (one of :data:`SHIPPED` or inside one,
    e.g. ``"book/results"`` or ``"benchmarks/results/cpu_speed.json"``).

    Looked up in order: a checkout of the repository at ``start`` (default: the working directory)
    or one of its parents; the checkout this package was imported from; the copy shipped in the
    installed package. Raises ``FileNotFoundError`` naming the places tried."""
    rel = Path(rel).as_posix().strip("/")
    if not any(rel == s or rel.startswith(s + "/") for s in SHIPPED):
        raise ValueError(f"{rel!r} is not stored: it must be one of {SHIPPED} or inside one")
    here = Path(start if start is not None else Path.cwd()).resolve()
    tried = []
    for root in (here, *here.parents, Path(__file__).resolve().parents[2]):
        found = _in_checkout(root, rel)
        if found is not None:
            return found
    tried.append(f"a checkout of the repository at or above {here}")
    shipped = shipped_root()
    if shipped is not None and (shipped / rel).exists():
        return shipped / rel
    tried.append(f"the installed package ({shipped / rel if shipped else 'it ships no stored results'})")
    raise FileNotFoundError(f"{rel} not found in " + " nor in ".join(tried) +
                            ": install cemlib from the book's repository (pip install git+URL@REF) or run "
                            "the chapter inside a clone of it")
