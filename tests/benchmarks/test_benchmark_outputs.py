"""Benchmarks never overwrite a stored result unless asked to (issue "cemlib as a tool people use",
item 3).

Before: ``python benchmarks/cpu_speed.py`` with its defaults overwrote the committed
``benchmarks/results/cpu_speed.json`` (which chapters read) and did not say where it wrote. Now
the scripts that default into ``benchmarks/results/`` (cpu_speed, energy_depth, compile_kernels)
write there only with ``--replace``, else to a new file beside the stored one, and print where.
"""

import importlib
import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
BENCH = ROOT / "benchmarks"


@pytest.fixture
def bench_modules(monkeypatch):
    monkeypatch.syspath_prepend(str(BENCH))
    return lambda name: importlib.import_module(name)


def test_output_path_keeps_an_existing_default(bench_modules, tmp_path):
    outputs = bench_modules("outputs")
    default = tmp_path / "speed.json"
    assert outputs.output_path(default) == (default, True)              # nothing stored yet
    default.write_text("{}")
    new, is_default = outputs.output_path(default, now=0.0)
    assert not is_default and new == tmp_path / "speed-19700101T000000Z.json"
    new.write_text("{}")
    assert outputs.output_path(default, now=0.0)[0] == tmp_path / "speed-19700101T000000Z-2.json"
    assert outputs.output_path(default, replace=True) == (default, True)
    assert outputs.output_path(default, out=tmp_path / "x.json", replace=True) == (tmp_path / "x.json", False)


def test_write_json_says_where_it_wrote(bench_modules, tmp_path, capsys):
    outputs = bench_modules("outputs")
    default = tmp_path / "speed.json"
    default.write_text('{"stored": true}\n')
    path = outputs.write_json({"new": 1}, default)
    assert json.loads(default.read_text()) == {"stored": True} and json.loads(path.read_text()) == {"new": 1}
    out = capsys.readouterr().out
    assert f"wrote {path}" in out and "the stored speed.json is kept; --replace overwrites it" in out
    outputs.write_json({"new": 2}, default, replace=True)
    assert json.loads(default.read_text()) == {"new": 2}


def test_cpu_speed_with_defaults_keeps_the_stored_file(bench_modules, tmp_path, monkeypatch, capsys):
    cpu_speed = bench_modules("cpu_speed")
    monkeypatch.setattr(cpu_speed, "RESULTS", tmp_path)   # stands for benchmarks/results
    stored = tmp_path / "cpu_speed.json"
    stored.write_text('{"stored": true}\n')
    args = ["--variants", "llama", "--rounds", "1", "--steps", "1", "--warmup", "0"]
    assert cpu_speed.main(args) == 0
    assert json.loads(stored.read_text()) == {"stored": True}
    new = [p for p in tmp_path.glob("cpu_speed-*.json")]
    assert len(new) == 1 and json.loads(new[0].read_text())["rows"]
    out = capsys.readouterr().out
    assert "results will be written to" in out and f"wrote {new[0]}" in out
    assert json.loads(new[0].read_text())["command"] == "python benchmarks/cpu_speed.py " + " ".join(args)
    assert cpu_speed.main(args + ["--replace"]) == 0
    replaced = json.loads(stored.read_text())
    assert replaced["rows"] and "--replace" not in replaced["command"]


@pytest.mark.parametrize("script", ["energy_depth.py", "compile_kernels.py"])
def test_other_result_writers_offer_replace(script):
    if script == "compile_kernels.py":
        pytest.importorskip("triton")
    r = subprocess.run([sys.executable, str(BENCH / script), "--help"], capture_output=True, text=True,
                       cwd=ROOT, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    text = " ".join(r.stdout.split())  # argparse wraps the help at the terminal's width
    assert "--replace" in text and "a new file" in text
