"""Every cemlib module imports on its own, first (no import cycles that a lucky order hides),
and importing cemlib never imports Triton (it must be importable after TRITON_INTERPRET is set)."""

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
            "cemlib.energies, cemlib.data, cemlib.viz; print('triton' in sys.modules)")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "False"


def test_public_names_resolve():
    for pkg in ("cemlib.layers", "cemlib.models", "cemlib.kernels", "cemlib.train", "cemlib.data",
                "cemlib.viz"):
        mod = importlib.import_module(pkg)
        missing = [n for n in getattr(mod, "__all__", []) if not hasattr(mod, n)]
        assert not missing, f"{pkg}.__all__ names missing: {missing}"


# The package reads bottom-up: a module imports (at module level) only from its own level or below.
# viz and metrics sit beside models (they draw and measure energies, layers and models).
LEVELS = {"cemlib.utils": 0, "cemlib.positional": 0, "cemlib.normalization": 0, "cemlib.testing": 0,
          "cemlib.data": 1, "cemlib.energies": 1, "cemlib.kernels": 2, "cemlib.layers": 3,
          "cemlib.models": 4, "cemlib.metrics": 4, "cemlib.viz": 4, "cemlib.train": 5,
          "cemlib.generate": 6, "cemlib.cli": 6}


def _level(module: str) -> int | None:
    """The level of the longest prefix in LEVELS that ``module`` falls under (None: not cemlib's)."""
    prefixes = [p for p in LEVELS if module == p or module.startswith(p + ".")]
    return LEVELS[max(prefixes, key=len)] if prefixes else None


def _module_level_imports(path):
    import ast

    tree = ast.parse(path.read_text())
    for node in tree.body:                    # module level only: lazy imports inside functions are allowed
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            yield node.module
        elif isinstance(node, ast.Import):
            yield from (a.name for a in node.names)


def test_imports_run_bottom_up_utils_energies_kernels_layers_models_train():
    from pathlib import Path

    root = Path(cemlib.__file__).parent
    bad = []
    for path in sorted(root.rglob("*.py")):
        name = "cemlib." + ".".join(path.relative_to(root).with_suffix("").parts)
        name = name.removesuffix(".__init__")
        here = _level(name)
        if here is None:
            continue
        for target in _module_level_imports(path):
            there = _level(target)
            if there is not None and there > here:
                bad.append(f"{name} (level {here}) imports {target} (level {there})")
    assert not bad, "\n".join(bad)
