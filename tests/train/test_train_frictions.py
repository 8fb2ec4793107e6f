"""Issue 59, items 5 and 6: the frictions a newcomer met on the training side, and the last
unhelpful messages. Each test names the input that failed before."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import torch

from cemlib.train.cli import _whole_commands, main
from cemlib.train.config import ConfigError
from cemlib.train.folders import default_out_dir, run_id
from cemlib.train.grid import write_summary
from cemlib.train.registry import get_config
from cemlib.train.results import curve_labels, plot_curves
from cemlib.train.run import run_experiment

TINY = ["model.d_model=16", "model.n_layers=1", "model.n_heads=2", "train.batch_size=4", "train.context_length=16",
        "train.eval_batches=1", "optim.warmup_steps=1", "train.eval_interval=2", "train.final_whole_eval=false"]


def _sets(overrides):
    return [a for o in overrides for a in ("--set", o)]


# ------------------------------------------------------------------------------ 1. runs told apart
def test_a_run_on_ones_own_text_is_named_after_it(tmp_path):
    """Before: a run on my_text.txt was called ``shakespeare-llama-cpu-<hash>`` and its results said
    only ``data.name: shakespeare``."""
    text = tmp_path / "my_text.txt"
    text.write_text("all the world's a stage, and all the men and women merely players. " * 80)
    cfg = get_config("shakespeare-llama", "cpu", [f"data.path={text}"])
    assert default_out_dir(cfg) == Path("runs") / f"shakespeare-llama-cpu-my_text-{run_id(cfg)}"
    assert default_out_dir(get_config("shakespeare-llama", "cpu")).name.startswith("shakespeare-llama-cpu-")
    res = run_experiment("shakespeare-llama", "cpu", TINY + ["train.max_steps=2", f"data.path={text}"],
                         out_dir=tmp_path / "run", verbose=False)
    assert res["data"]["label"] == "my_text.txt" and len(res["data"]["sha256"]["train"]) == 64
    assert curve_labels([res])[0].startswith("shakespeare-llama on my_text.txt (cpu, CPU)")


def _fake(lr=0.003, seed=0, path=None, exp="shakespeare-llama"):
    return {"experiment": exp, "preset": "cpu", "run_id": f"{lr}{seed}",
            "device": {"type": "cpu", "name": "x", "count": 1, "label": "CPU"},
            "config": {"optim": {"lr": lr}, "train": {"seed": seed, "batch_size": 2, "context_length": 4},
                       "data": {"name": "shakespeare", "path": path}},
            "curves": {"eval": [{"step": 0, "val_loss": 4.0}, {"step": 2, "val_loss": 3.0}]}}


def test_default_legends_are_distinct_and_say_what_differs():
    """Before: ``plot_curves`` gave every run of one preset the same legend,
    ``shakespeare-llama (cpu, CPU)``, unless ``labels=`` was passed."""
    runs = [_fake(0.003, 0), _fake(0.001, 0), _fake(0.003, 1)]
    labels = [t.get_text() for t in plot_curves(runs).get_legend().get_texts()]
    assert len(set(labels)) == 3
    assert labels[0] == "shakespeare-llama (cpu, CPU) optim.lr=0.003 train.seed=0"
    assert curve_labels([_fake(), _fake()]) == ["shakespeare-llama (cpu, CPU) #1", "shakespeare-llama (cpu, CPU) #2"]
    with pytest.raises(ValueError, match="labels has 1 entries for 2 results"):
        plot_curves([_fake(), _fake(seed=1)], labels=["one"])


# ------------------------------------------------------------------------------ 3. grid summaries
def _result(exp, seed, overrides, rmse, best):
    return {"experiment": exp, "preset": "cpu", "sweep": {"overrides": overrides, "seed": seed},
            "config": {"train": {"seed": seed}}, "num_parameters": 1234,
            "device": {"label": "CPU"},
            "metrics": {"final": {"train_loss": 0.5, "val_loss": rmse ** 2, "val_rmse": rmse, "test_rmse": rmse + 0.1},
                        "wall_time_s": 1.0, "primary_metric": "val_rmse",
                        "best": {"metric": "val_rmse", "mode": "min", "value": best, "step": 250 * (seed + 1)}}}


def test_grid_summaries_mark_the_primary_metric_state_the_spread_and_keep_each_grid(tmp_path):
    """Before: alphabetical columns, the primary metric neither first nor marked, final vs best and
    the sample std unstated, ``summary.json`` an unlabelled list of ``[mean, std]`` pairs without
    per-seed values, neither the preset nor the common ``--set`` shown, and a second grid into the
    same folder overwrote the first's summary."""
    first = [_result("gp-gated", s, ["model.d_ff=16"], 0.2 + s / 10, 0.15 + s / 10) for s in (0, 1)]
    desc = {"experiments": ["gp-gated"], "preset": "cpu", "grid": {"model.d_ff": ["16"]}, "seeds": [0, 1],
            "overrides": ["train.max_steps=4"]}
    rows, md = write_summary(tmp_path, first, grid=desc)
    head = [line for line in md.splitlines() if line.startswith("| experiment")][0]
    cols = [c.strip() for c in head.strip("|").split("|")]
    assert cols[:6] == ["experiment", "grid values", "params", "n", "★ val_rmse (final)", "★ val_rmse (best)"]
    assert cols[6] == "test_rmse (final)"  # the same metric on the other splits next
    assert "preset cpu" in md and "common --set train.max_steps=4" in md and "seeds 0, 1" in md
    assert "sample standard deviation (ddof = 1) over the n seeds" in md and "lower is better" in md
    assert "| 0.25 ± 0.071 | 0.2 ± 0.071 |" in md
    data = json.loads((tmp_path / "summary.json").read_text())
    (gid, sec), = data["grids"].items()
    row = sec["rows"][0]
    assert row["final"]["val_rmse"] == {"mean": pytest.approx(0.25), "std": pytest.approx(0.0707107, rel=1e-5),
                                        "n": 2, "per_seed": {"0": 0.2, "1": pytest.approx(0.3)}}
    assert row["best"]["val_rmse"]["step_per_seed"] == {"0": 250, "1": 500}
    second = [_result("gp-cem-t2", 0, [], 0.3, 0.3)]
    write_summary(tmp_path, second, grid={**desc, "experiments": ["gp-cem-t2"], "seeds": [0], "grid": {}})
    data = json.loads((tmp_path / "summary.json").read_text())
    assert len(data["grids"]) == 2 and gid in data["grids"]
    md_all = (tmp_path / "summary.md").read_text()
    assert "gp-gated" in md_all and "gp-cem-t2" in md_all
    write_summary(tmp_path, first, grid=desc)  # the first grid again: its own section replaced
    assert len(json.loads((tmp_path / "summary.json").read_text())["grids"]) == 2


def test_a_foreign_file_a_grid_run_would_write_is_not_overwritten(tmp_path, capsys):
    """Before: a grid rerun said a foreign ``<run>.json`` was "left alone", then overwrote it."""
    out = tmp_path / "grid"
    args = ["--experiment", "gp-gated", "--seeds", "0", "--out", str(out), "--quiet",
            *_sets(["model.d_ff=8", "train.max_steps=2", "train.eval_interval=2", "task.n_train=40",
                    "task.n_val=10", "task.n_test=10", "train.batch_size=8", "optim.warmup_steps=1"])]
    assert main(args) == 0
    (results,) = [p for p in out.glob("*.json") if p.name != "summary.json"]
    results.write_text("my notes, not a results file")
    (out / results.stem / "last.pt").unlink()  # the run is to train again
    for p in (out / results.stem).iterdir():
        p.unlink()
    capsys.readouterr()
    assert main(args) == 2
    msg = capsys.readouterr().err.strip().splitlines()[-1]
    assert f"writes its results to {results.name}, which is not a results file" in msg and "move that file" in msg
    assert results.read_text() == "my notes, not a results file"


# ------------------------------------------------------------------------------ 2. checkpoints
def test_a_few_checkpoints_are_kept_and_no_step_is_stored_twice(tmp_path):
    """Before: every ``ckpt_<step>.pt`` was kept, and ``ckpt_<last>.pt``, ``last.pt`` and
    ``best.pt`` could hold the same step in three files."""
    out = tmp_path / "run"
    run_experiment("shakespeare-llama", "cpu", TINY + ["train.max_steps=12", "train.checkpoint_interval=2"],
                   out_dir=out, verbose=False)
    ckpts = sorted(p.name for p in out.glob("ckpt_*.pt"))
    assert ckpts == ["ckpt_000008.pt", "ckpt_000010.pt"]  # train.keep_checkpoints = 2; last.pt holds 12
    inodes = {}
    for p in out.glob("*.pt"):
        step = torch.load(p, weights_only=True)["step"]
        inodes.setdefault(step, set()).add(p.stat().st_ino)
    assert all(len(v) == 1 for v in inodes.values()), inodes  # one file on disk per step
    res = json.loads((out / "results.json").read_text())
    best = res["metrics"]["best"]
    assert (out / "best.pt").is_file() and torch.load(out / "best.pt", weights_only=True)["step"] == best["step"]


# ------------------------------------------------------------------------------ 4. time and caveats
def test_list_shows_stored_cpu_times_and_caveats(capsys):
    """Before: ``--list`` gave no CPU time for the cpu presets, and nothing said that
    ``sudoku-hyperset``'s cpu preset ends at chance."""
    assert main(["--list"]) == 0
    out = capsys.readouterr().out
    block = out[out.index("shakespeare-llama "):].split("\n")[:3]
    assert re.search(r"cpu: about \d+ s on a CPU \(median of \d+ stored runs on .* threads? of an", block[1])
    sudoku = out[out.index("sudoku-hyperset "):].split("\n")[:4]
    assert any("cpu: note: at this budget (200 steps) the cpu preset ends near chance" in line for line in sudoku)
    assert "no stored run (--estimate measures it here)" in out


def test_a_gpu_preset_started_on_a_cpu_warns_with_a_measured_estimate(tmp_path, capsys):
    """Before: ``--preset gpu --set train.max_steps=2`` of a GPU-sized model printed nothing for
    10 minutes (its first evaluation alone is 50 batches of 64 x 256 tokens)."""
    small = ["model.d_model=16", "model.n_layers=1", "model.n_heads=2", "train.eval_batches=1",
             "train.batch_size=4", "train.context_length=16", "train.max_steps=2", "train.final_whole_eval=false"]
    assert main(["--experiment", "shakespeare-llama", "--preset", "gpu", *_sets(small), "--out",
                 str(tmp_path / "run")]) == 0
    err = capsys.readouterr().err
    assert re.search(r"warning: the gpu preset is sized for a GPU and runs here on the CPU: (about .*|under a "
                     r"second) on a CPU "
                     r"\(measured here .* a forward and backward pass of \d+ examples? took", err)
    assert "--preset cpu is sized for a CPU (about" in err
    notes = json.loads((tmp_path / "run" / "results.json").read_text())["notes"]
    assert any(n.startswith("the gpu preset is sized for a GPU") for n in notes)
    assert main(["--experiment", "shakespeare-llama", *_sets(small), "--estimate"]) == 0
    assert re.search(r"here: (about .*|under a second) on a CPU \(measured here", capsys.readouterr().out)


def test_the_caveat_goes_into_the_results(tmp_path):
    res = run_experiment("sudoku-hyperset", "cpu", ["train.max_steps=1", "train.eval_interval=1",
                                                    "task.n_train=8", "task.n_test=4", "train.batch_size=4",
                                                    "optim.warmup_steps=0", "train.final_whole_eval=false"],
                         out_dir=tmp_path / "s", verbose=False)
    assert any("ends near chance" in n and "sudoku-easy-hyperset-authors" in n for n in res["notes"])


# ------------------------------------------------------------------------------ 7. the final line, bests
def test_the_final_line_shows_the_whole_split_loss_and_each_best_has_its_step(tmp_path, capsys):
    """Before: the final line left out the whole-split loss, and ``results.json`` paired
    ``best_val_loss`` (the lowest loss) with ``best_val_step`` (the step of the best primary
    metric)."""
    out = tmp_path / "run"
    sets = [o for o in TINY if o != "train.final_whole_eval=false"] + ["train.max_steps=4"]
    assert main(["--experiment", "shakespeare-llama", *_sets(sets), "--out", str(out)]) == 0
    last = capsys.readouterr().out.strip().splitlines()[-1]
    m = json.loads((out / "results.json").read_text())["metrics"]
    assert f"whole val split: val_loss {m['final_whole_val']['val_loss']:.4f}" in last
    assert "best_val_step" not in m
    ev = json.loads((out / "results.json").read_text())["curves"]["eval"]
    assert m["best_val_loss_step"] == min(ev, key=lambda e: e["val_loss"])["step"]
    assert m["best_primary_step"] == m["best"]["step"] and m["best_primary"] == m["best"]["value"]


# ------------------------------------------------------------------------------ 8. papercuts
def test_help_says_cemlib_train(capsys):
    """Before: ``cemlib train --help`` said ``usage: python -m cemlib.train``."""
    with pytest.raises(SystemExit):
        main(["--help"])
    assert capsys.readouterr().out.startswith("usage: cemlib train ")


def test_the_interrupt_hint_is_a_whole_command_with_the_threads():
    """Before: the hint was ``--resume X``, not a command, and dropped ``--threads``."""
    msg = "SIGINT at step 4/8: checkpoint D/ckpt_000004.pt and results D/results.json saved; continue with: " \
          "cemlib train --resume D"
    argv = ["--experiment", "shakespeare-llama", "--threads", "1"]
    assert _whole_commands(msg, argv).endswith("continue with: cemlib train --resume D --threads 1")
    assert _whole_commands(msg, ["--experiment", "x"]).endswith("continue with: cemlib train --resume D")
    grid = _whole_commands("grid stopped in run 2/4 (r): x; the same command continues the grid (finished runs "
                           "are skipped)", ["--experiment", "gp-gated", "--seeds", "0,1"])
    assert "continues the grid: cemlib train --experiment gp-gated --seeds 0,1" in grid


def test_one_warm_up_option_is_printed_and_a_fraction_that_would_be_ignored_is_refused(capsys):
    """Before: ``--print-config`` printed ``optim.warmup_steps`` and ``warmup_fraction`` with no word
    on which wins, and ``--set optim.warmup_fraction=0.2`` on a preset with warm-up steps was
    ignored in silence."""
    assert main(["--experiment", "shakespeare-llama", "--print-config"]) == 0
    optim = json.loads(capsys.readouterr().out)["optim"]
    assert "warmup_steps" in optim and "warmup_fraction" not in optim
    with pytest.raises(ConfigError, match=r"optim.warmup_fraction=0.2 is not used: the warm-up is "
                                          r"optim.warmup_steps=\d+ \(the preset's\), which wins"):
        get_config("shakespeare-llama", "cpu", ["optim.warmup_fraction=0.2"])
    cfg = get_config("shakespeare-llama", "cpu", ["optim.warmup_steps=none", "optim.warmup_fraction=0.2"])
    assert cfg.optim.warmup(100) == 20


def test_the_rerun_script_takes_a_folder_of_chapters(tmp_path, capsys):
    """Before: ``python book/rerun.py book`` said "no such notebook"."""
    from book_scripts import load
    rerun = load("rerun")
    paths = rerun.expand([Path(rerun.ROOT) / "book"])
    assert paths and all(p.suffix == ".ipynb" and p.parent.name == "book" for p in paths)
    assert paths == [p for p in rerun.chapters_from_toc() if p.parent == Path(rerun.ROOT) / "book"]
    (tmp_path / "notes.txt").write_text("x")
    assert rerun.main([str(tmp_path / "notes.txt"), "--check"]) == 2
    assert "is not a notebook (.ipynb)" in capsys.readouterr().err
    assert rerun.main([str(tmp_path), "--check"]) == 2
    assert "holds no notebook" in capsys.readouterr().err


def test_verdict_functions_refuse_bad_input():
    """Issue 59 item 2 (done in cemlib.evidence, checked here): ``t_interval(level=0)`` decided any
    claim, ``level=1.5`` gave NaN bounds, ``paired`` took float seed keys."""
    from cemlib.evidence.stats import paired, t_interval
    for level in (0, 1, 1.5):
        with pytest.raises(ValueError):
            t_interval([1.0, 2.0, 3.0], level=level)
    with pytest.raises((ValueError, TypeError)):
        paired({0.7: 1.0, 0.2: 2.0}, {0: 1.0, 1: 2.0})

