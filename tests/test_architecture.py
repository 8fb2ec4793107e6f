"""The package's import structure: layers that import only downwards, and no import cycle.

``pyproject.toml``'s ``[tool.importlinter]`` holds the contracts; ``lint-imports`` (import-linter)
checks them on every import statement, function-local ones included. A planted cycle and a
planted upward import, in a copy of the package, show that the check can fail."""

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
LINT = [sys.executable, "-c", "import sys; from importlinter.cli import lint_imports_command as c; "
        "sys.exit(c())"]

pytest.importorskip("importlinter")


def _lint(cwd: Path) -> subprocess.CompletedProcess:
    env = {"PYTHONPATH": str(cwd), "PATH": "/usr/bin:/bin", "HOME": str(cwd)}
    return subprocess.run(LINT + ["--no-cache"], cwd=cwd, capture_output=True, text=True, env=env,
                          timeout=300)


def test_the_import_contracts_are_kept():
    run = _lint(ROOT)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-2000:]
    assert "2 kept, 0 broken" in run.stdout


@pytest.mark.parametrize("planted, broken", [
    ("from cemlib.train.grid import grid_sweep", "No import cycle"),      # folders <-> grid
    ("from cemlib.viz.style import use_book_style", "Layers"),            # train -> viz: upwards
])
def test_a_planted_violation_breaks_a_contract(tmp_path, planted, broken):
    shutil.copytree(ROOT / "cemlib", tmp_path / "cemlib", ignore=shutil.ignore_patterns("__pycache__", "_stored"))
    shutil.copy(ROOT / "pyproject.toml", tmp_path / "pyproject.toml")
    with open(tmp_path / "cemlib" / "train" / "folders.py", "a") as f:
        f.write(f"\n\ndef _planted():\n    {planted}\n")
    run = _lint(tmp_path)
    assert run.returncode != 0
    assert any(broken in line and "BROKEN" in line for line in run.stdout.splitlines()), run.stdout[-3000:]


def test_every_part_of_the_package_has_a_layer():
    """A new top-level module or subpackage must be placed in the layers, or it escapes the contract."""
    import pkgutil
    import tomllib

    import cemlib
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["importlinter"]
    layers = next(c["layers"] for c in config["contracts"] if c["type"] == "layers")
    placed = {name.strip() for layer in layers for name in layer.split("|")}
    parts = {f"cemlib.{m.name}" for m in pkgutil.iter_modules(cemlib.__path__) if m.name != "__main__"}
    assert parts <= placed, f"not in any layer of pyproject.toml: {sorted(parts - placed)}"
