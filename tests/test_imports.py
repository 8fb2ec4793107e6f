"""Every cemlib module imports on its own, first (no import cycles that a lucky order hides),
and importing cemlib never imports Triton (it must be importable after TRITON_INTERPRET is set).
The direction of imports is checked by import-linter (``tests/test_architecture.py``)."""

import importlib
import pkgutil
import subprocess
import sys

import cemlib


def _all_modules():
    names = []
    for info in pkgutil.walk_packages(cemlib.__path__, "cemlib."):
        if info.name.endswith("__main__"):
            continue
        names.append(info.name)
    return sorted(names)


def test_each_module_imports_first_in_a_fresh_interpreter():
    # One interpreter; between modules every cemlib entry is dropped from sys.modules, so each
    # module is imported as if it were the first (torch stays loaded, which keeps this fast).
    code = (
        "import importlib, sys, torch\n"
        f"names = {_all_modules()!r}\n"
        "bad = []\n"
        "for n in names:\n"
        "    for m in [m for m in sys.modules if m == 'cemlib' or m.startswith('cemlib.')]:\n"
        "        del sys.modules[m]\n"
        "    try:\n"
        "        importlib.import_module(n)\n"
        "    except Exception as e:\n"
        "        bad.append(f'{n}: {type(e).__name__}: {e}')\n"
        "print('\\n'.join(bad))\n"
        "sys.exit(1 if bad else 0)\n"
    )
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr


def test_importing_cemlib_does_not_import_triton():
    code = ("import sys, cemlib, cemlib.layers, cemlib.models, cemlib.kernels, cemlib.train, "
            "cemlib.evidence, cemlib.energies, cemlib.data, cemlib.viz; print('triton' in sys.modules)")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "False"


def test_public_names_resolve():
    for pkg in ("cemlib.layers", "cemlib.models", "cemlib.kernels", "cemlib.train", "cemlib.evidence",
                "cemlib.data", "cemlib.viz"):
        mod = importlib.import_module(pkg)
        missing = [n for n in getattr(mod, "__all__", []) if not hasattr(mod, n)]
        assert not missing, f"{pkg}.__all__ names missing: {missing}"
