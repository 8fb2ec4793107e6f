"""Grids under faults (issue 36, items 1-5; issue 35, item 1): one run identity, complete grid runs,
one writer per folder, and the checks made before the first run trains. Each test reproduces a
failure the fault probes found (named in its docstring) and passes now."""

import json
import os
import shlex
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest

import cemlib.train.checkpoint as ckpt_mod
import cemlib.train.grid as experiments
import cemlib.train.grid as sweep
from cemlib.train.cli import main
from cemlib.train.checkpoint import atomic_write_bytes, remove_stale_tmp
from cemlib.train.results import load_results
from cemlib.train.grid import grid_sweep, plan_grid
from cemlib.train.trainer import Trainer

REPO = Path(__file__).resolve().parents[2]
# a GP regressor of a few hundred parameters, 4 steps with a checkpoint every 2: about a second a run
GP = ["task.n_train=120", "task.n_val=30", "task.n_test=30", "model.d_model=8", "model.d_ff=8",
      "train.max_steps=4", "train.eval_interval=2", "train.eval_batches=1", "train.batch_size=8",
      "train.log_interval=1", "optim.warmup_steps=1", "train.checkpoint_interval=2"]


def grid_cli(out, *extra):
    args = ["--experiment", "gp-gated", "--quiet", "--out", str(out)]
    for o in GP:
        args += ["--set", o]
    return main(args + list(extra))


def results_in(out):
    return [load_results(p) for p in sorted(Path(out).glob("*.json")) if p.name != "summary.json"]


def no_training(*args, **kwargs):
    pytest.fail("a run trained although the grid should have been refused or skipped")


# ------------------------------------------------------------------------------ identity
def test_a_changed_set_or_preset_is_a_new_run_not_the_old_result(tmp_path, capsys):
    """re-running a grid with another ``--set`` (or ``--preset``) printed the first
    grid's results again, because the file names left those settings out."""
    out = tmp_path / "grid"
    assert grid_cli(out, "--seeds", "0,1") == 0
    assert grid_cli(out, "--seeds", "0,1", "--set", "train.max_steps=6") == 0
    err = capsys.readouterr().err
    assert "grid: 2 runs = 1 experiment(s) x 1 grid point(s) x 2 seed(s)" in err
    assert "0 already complete there" in err
    assert sorted(r["metrics"]["steps"] for r in results_in(out)) == [4, 4, 6, 6]
    grids = list(json.loads((out / "summary.json").read_text())["grids"].values())
    assert len(grids) == 2  # the first grid's summary is kept beside the second's (issue 59)
    six = [r["metrics"]["final"]["test_rmse"] for r in results_in(out) if r["metrics"]["steps"] == 6]
    rows = grids[-1]["rows"]
    assert rows[0]["final"]["test_rmse"]["mean"] == pytest.approx(sum(six) / 2)  # the new runs, not the old ones
    assert grid_cli(out, "--seeds", "0", "--preset", "gpu") == 0
    assert any("__gpu-" in p.name for p in out.glob("*.json"))
    assert len(results_in(out)) == 5


def test_an_identical_run_is_skipped_and_said_so(tmp_path, capsys, monkeypatch):
    out = tmp_path / "grid"
    assert grid_cli(out, "--seeds", "0") == 0
    capsys.readouterr()
    monkeypatch.setattr(experiments, "run_config", no_training)
    assert grid_cli(out, "--seeds", "0") == 0
    err = capsys.readouterr().err
    assert "1 already complete there" in err and "skipped, the same run is stored in gp_gated__seed0__cpu-" in err


def test_a_stored_run_under_its_old_name_is_recognised(tmp_path, capsys, monkeypatch):
    """A new grid writing into a folder of stored results (named before run ids existed) must not
    train again what is stored, nor rename the stored file; a run that differs does train."""
    stored = REPO / "book/results/gp_table3/cem/gp_cem_t1__task.kernel-matern__seed0.json"
    res = load_results(stored)
    argv = shlex.split(res["command"])
    sets = [argv[i + 1] for i, a in enumerate(argv) if a == "--set"]
    grid_ovr = res["sweep"]["overrides"]
    common = [s for s in sets if s not in grid_ovr and not s.startswith("train.seed=")]
    out = tmp_path / "stored"
    out.mkdir()
    shutil.copy(stored, out / stored.name)
    monkeypatch.setattr(experiments, "run_config", no_training)
    grid = {k: [v] for k, v in (o.split("=", 1) for o in grid_ovr)}
    rows = grid_sweep([res["experiment"]], res["preset"], grid, [0], out, common)
    assert rows.skipped and not rows.failed and rows[0]["seeds"] == [0]
    assert f"skipped, the same run is stored in {stored.name}" in capsys.readouterr().err
    assert sorted(p.name for p in out.glob("*.json")) == [stored.name, "summary.json"]

    class Trained(Exception):
        pass

    def trains(*args, **kwargs):
        raise Trained
    monkeypatch.setattr(experiments, "run_config", trains)
    with pytest.raises(Trained):  # another model width: not the stored run
        grid_sweep([res["experiment"]], res["preset"], grid, [0], out, common + ["model.d_model=32"])


# ------------------------------------------------------------------------------ complete runs
def test_each_grid_run_has_its_folder_and_ctrl_c_saves_the_current_run(tmp_path, capsys, monkeypatch):
    """grid runs wrote no checkpoints; SIGINT in a grid lost the current run ("nothing saved
    (no out_dir)") although --out was given. Now it is saved, and the same command continues."""
    assert grid_cli(tmp_path / "clean", "--seeds", "0,1") == 0
    clean = {r["config"]["train"]["seed"]: r for r in results_in(tmp_path / "clean")}
    out = tmp_path / "grid"
    real = Trainer.train_step

    def interrupt_seed_1(self):
        loss = real(self)
        if self.cfg.train.seed == 1 and self.step == 2:  # during the third step of the second run
            os.kill(os.getpid(), signal.SIGINT)
        return loss
    monkeypatch.setattr(Trainer, "train_step", interrupt_seed_1)
    capsys.readouterr()
    assert grid_cli(out, "--seeds", "0,1") == 128 + signal.SIGINT
    err = capsys.readouterr().err
    assert "interrupted: grid stopped in run 2/2" in err and "the same command continues the grid" in err
    assert "nothing saved" not in err and "Traceback" not in err
    folder = next(p for p in out.iterdir() if p.is_dir() and "seed1" in p.name)
    assert (folder / "ckpt_000003.pt").is_file()
    monkeypatch.undo()
    assert grid_cli(out, "--seeds", "0,1") == 0
    err = capsys.readouterr().err
    assert "seed0__cpu-" in err and "skipped, the same run is stored" in err
    assert "resuming from ckpt_000003.pt" in err
    resumed = {r["config"]["train"]["seed"]: r for r in results_in(out)}
    assert resumed[1]["curves"] == clean[1]["curves"]  # the resumed run is the uninterrupted one
    assert resumed[1]["metrics"]["final"] == clean[1]["metrics"]["final"]
    for run in (p for p in out.iterdir() if p.is_dir()):
        assert {"last.pt", "best.pt", "train_log.csv", "eval_log.csv"} <= {p.name for p in run.iterdir()}


def test_a_diverging_run_is_recorded_and_the_grid_goes_on(tmp_path, capsys, monkeypatch):
    """one diverging value (--grid optim.lr=1e-3,1e20,2e-3) aborted the grid, skipped the
    later runs and wrote no summary, so that grid could never finish."""
    out = tmp_path / "grid"
    assert grid_cli(out, "--grid", "optim.lr=1e-3,1e20,2e-3") == 1
    cap = capsys.readouterr()
    assert "FAILED: non-finite values" in cap.err and "1 of the grid's runs failed" in cap.err
    assert sorted(r["config"]["optim"]["lr"] for r in results_in(out)) == [1e-3, 2e-3]
    md = (out / "summary.md").read_text()
    assert "Failed runs (not in the means above)" in md and "optim.lr-1e20" in md
    assert "| gp-gated | optim.lr=2e-3 |" in md
    failed = list(json.loads((out / "summary.json").read_text())["grids"].values())[-1]["failed"]
    assert len(failed) == 1 and failed[0]["overrides"] == ["optim.lr=1e20"]
    monkeypatch.setattr(experiments, "run_config", no_training)  # the same command: nothing retrains
    assert grid_cli(out, "--grid", "optim.lr=1e-3,1e20,2e-3") == 1
    assert "failed before" in capsys.readouterr().err


def test_an_unusable_out_or_too_long_paths_fail_before_any_run_trains(tmp_path, capsys, monkeypatch):
    """an unwritable --out, or a run name over 255 characters, was found only after the first
    run had trained."""
    monkeypatch.setattr(experiments, "run_config", no_training)
    (tmp_path / "f").write_text("x")
    assert grid_cli(tmp_path / "f" / "grid", "--seeds", "0,1") == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "is a file" in err
    monkeypatch.setattr(sweep, "_path_max", lambda folder: 60)
    assert grid_cli(tmp_path / "grid", "--seeds", "0,1") == 2
    assert "choose a shorter --out" in capsys.readouterr().err
    long = "0.00" + "0" * 300 + "1"  # a valid learning rate, 305 characters long
    runs = plan_grid(["gp-gated"], "cpu", {"optim.lr": [long, "0.002"]}, [0], GP)
    assert all(len(r.stem) <= 200 for r in runs) and len({r.stem for r in runs}) == 2
    assert runs[0].stem.startswith("gp_gated__optim.lr-0.000") and "~__seed0__cpu-" in runs[0].stem


# ------------------------------------------------------------------------------ one writer
def test_a_second_writer_on_the_same_folder_is_refused_by_name(tmp_path, capsys):
    """two processes sharing one --out were not detected (one seed's files silently replaced
    the other's, or a run died with a misleading "No such file or directory")."""
    out = tmp_path / "run"
    code = ("import sys, time\nfrom cemlib.train.folders import out_dir_lock\n"
            "with out_dir_lock(sys.argv[1]):\n    print('held', flush=True)\n    time.sleep(120)\n")
    holder = subprocess.Popen([sys.executable, "-c", code, str(out)], stdout=subprocess.PIPE, text=True,
                              cwd=REPO, env={**os.environ, "OMP_NUM_THREADS": "1"})
    try:
        assert holder.stdout.readline().strip() == "held"
        assert grid_cli(out, "--seeds", "0") == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and "is in use by another writer (pid " in err
        assert f"pid {holder.pid} on " in err and str(out) in err
        assert main(["--experiment", "gp-gated", "--quiet", "--out", str(out)] +
                    [a for o in GP for a in ("--set", o)]) == 2
        assert f"pid {holder.pid}" in capsys.readouterr().err
    finally:
        holder.kill()
        holder.wait()
    assert grid_cli(out, "--seeds", "0") == 0  # the holder ended: the folder is free


def test_temporary_files_are_unique_per_writer(tmp_path, monkeypatch):
    """every writer used the same ``<name>.tmp``."""
    names = []
    real = ckpt_mod._write_file

    def record(path, data):
        names.append(Path(path).name)
        real(path, data)
    monkeypatch.setattr(ckpt_mod, "_write_file", record)
    atomic_write_bytes(tmp_path / "r.json", b"1")
    atomic_write_bytes(tmp_path / "r.json", b"2")
    assert names[0] != names[1] and all(n.startswith(f".r.json.{os.getpid()}.") for n in names)
    assert (tmp_path / "r.json").read_bytes() == b"2" and not list(tmp_path.glob("*.tmp"))
    gone = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True,
                          text=True).stdout.strip()  # a writer that has ended
    (tmp_path / f".x.pt.{gone}.0123abcd.tmp").write_bytes(b"half")
    (tmp_path / f".y.pt.{os.getppid()}.0123abcd.tmp").write_bytes(b"in flight")  # a live writer
    assert [p.name for p in remove_stale_tmp(tmp_path)] == [f".x.pt.{gone}.0123abcd.tmp"]
    assert (tmp_path / f".y.pt.{os.getppid()}.0123abcd.tmp").is_file()


# ------------------------------------------------------------------------------ checks first
@pytest.mark.parametrize("args,message", [
    (["--seeds", "0,0"], "--seeds repeats a seed"),
    (["--experiment", "gp-gated", "--seeds", "0"], "--experiment repeats 'gp-gated'"),
    (["--grid", "optim.lr=1e-3", "--grid", "optim.lr=2e-3"], "--grid optim.lr is given twice"),
    (["--grid", "optim.lr=1e-3,1e-3"], "repeats a value"),
    (["--grid", "model.d_ff=8,8.0"], "are the same run"),
    (["--seeds", "0,1", "--grid", "train.seed=2,3"], "give the seeds once"),
    (["--seeds", "0,1", "--set", "train.seed=5"], "contradict each other"),
    (["--seeds", ",".join(map(str, range(1001)))], "the grid has 1,001 runs, more than max_runs=1,000"),
])
def test_wrong_statistics_are_refused_before_anything_trains(args, message, tmp_path, capsys, monkeypatch):
    """``--seeds 0,0`` or a repeated ``--experiment`` gave n = 2 with std 0, a repeated
    ``--grid`` key dropped the first axis, and a 1,000,000-run grid started without a word."""
    monkeypatch.setattr(experiments, "run_config", no_training)
    assert grid_cli(tmp_path / "grid", *args) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("error: ") and message in err


def test_grid_train_seed_values_are_the_seeds(tmp_path, capsys):
    """``--grid train.seed=1,2`` ran seed 1337 twice."""
    assert grid_cli(tmp_path, "--grid", "train.seed=2,3", "--print-config") == 0
    runs = json.loads(capsys.readouterr().out)
    assert [r["config"]["train"]["seed"] for r in runs] == [2, 3]


def test_print_config_and_resume_in_grid_mode(tmp_path, capsys, monkeypatch):
    """``--print-config --seeds 0,1`` trained the whole grid; ``--resume`` was ignored."""
    monkeypatch.setattr(experiments, "run_config", no_training)
    assert grid_cli(tmp_path / "grid", "--seeds", "0,1", "--grid", "model.d_ff=8,16", "--print-config") == 0
    runs = json.loads(capsys.readouterr().out)
    assert [(r["config"]["model"]["d_ff"], r["config"]["train"]["seed"]) for r in runs] == \
        [(8, 0), (8, 1), (16, 0), (16, 1)]
    assert all(r["run"].startswith("gp_gated__model.d_ff-") for r in runs)
    assert not (tmp_path / "grid").exists()
    assert grid_cli(tmp_path / "grid", "--seeds", "0,1", "--resume", str(tmp_path)) == 2
    err = capsys.readouterr().err
    assert "--resume continues one run; to continue a grid, run the same grid command again" in err
