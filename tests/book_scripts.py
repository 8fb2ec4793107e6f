"""The book's scripts (``book/rerun.py``, ``sync_colab.py``, ``site_check.py``, ``run_alone.py``) as
modules, for the tests that check them (``book/`` is not a package)."""

import importlib.util
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def load(name: str):
    """Import ``book/<name>.py`` and return the module."""
    spec = importlib.util.spec_from_file_location(name, ROOT / "book" / f"{name}.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod
