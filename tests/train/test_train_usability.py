"""cemlib.train as a tool people use (issue 35, items 4, 5, 6, 10, 11 and 13; item 12 is in
test_train_ddp.py, item 1 in test_train_grid.py): the end-of-run summary, resuming in one word, output
folders that never mix runs, metric logs, config files and errors, threads, and ``--help``. Each
test reproduces what a user hit (named in its docstring) and passes now."""

import csv
import json
import os
import shlex

import pytest
import torch

import cemlib.train.trainer as trainer_mod
from cemlib.train.cli import _summary_line, main, printed_config
from cemlib.train.checkpoint import load_checkpoint
from cemlib.train.config import ConfigError
from cemlib.train.registry import get_config, reproduce_command
from cemlib.train.run import run_experiment
from cemlib.train.results import load_results

LM = ["--experiment", "shakespeare-llama", "--set", "model.d_model=16", "--set", "model.n_layers=1",
      "--set", "model.n_heads=2", "--set", "train.batch_size=4", "--set", "train.context_length=16",
      "--set", "train.eval_batches=1", "--set", "optim.warmup_steps=1", "--set", "train.eval_interval=2",
      "--set", "train.log_interval=1"]
LM_SETS = [LM[i + 1] for i, a in enumerate(LM) if a == "--set"]
DIGITS = ["model.d=16", "model.n_iter=2", "model.n_heads=2", "train.max_steps=30", "train.eval_interval=10",
          "train.eval_batches=1", "train.batch_size=32", "optim.warmup_steps=2", "optim.lr=1e-2"]


# ------------------------------------------------------------------------------ the summary
def test_the_summary_reports_best_value_and_step_by_one_criterion(tmp_path):
    """the end-of-run line printed "best 0.2656 at step 400" for digits while the val loss at
    step 400 was 0.3041 (the best loss with the step of the best accuracy), and never showed the
    task's main metric."""
    res = run_experiment("digits-hyperset", "cpu", DIGITS, out_dir=tmp_path, verbose=False)
    best = res["metrics"]["best"]
    curve = {e["step"]: e for e in res["curves"]["eval"]}
    assert best["metric"] == res["metrics"]["primary_metric"] == "val_accuracy"
    assert best["value"] == curve[best["step"]]["val_accuracy"] == max(e["val_accuracy"] for e in curve.values())
    line = _summary_line(res, tmp_path, tmp_path / "results.json")
    first, last = res["curves"]["eval"][0]["val_accuracy"], res["curves"]["eval"][-1]["val_accuracy"]
    assert line.startswith(f"val_accuracy {first:.4f} -> {last:.4f}, best {best['value']:.4f} at step "
                           f"{best['step']} ({tmp_path / 'best.pt'})")
    assert best["step"] > 0 and load_checkpoint(tmp_path / "best.pt")["step"] == best["step"]
    # the case of the report: the best loss and the best accuracy at different steps
    fake = json.loads(json.dumps(res))
    fake["curves"]["eval"] = [{"step": 0, "val_loss": 2.3, "val_accuracy": 0.1},
                              {"step": 100, "val_loss": 0.2656, "val_accuracy": 0.80},
                              {"step": 400, "val_loss": 0.3041, "val_accuracy": 0.92}]
    fake["metrics"]["best"] = {"metric": "val_accuracy", "value": 0.92, "step": 400, "checkpoint": "best.pt"}
    line = _summary_line(fake, tmp_path, tmp_path / "results.json")
    assert "best 0.9200 at step 400" in line and "0.2656" not in line


# ------------------------------------------------------------------------------ resume
def test_resume_alone_restores_the_run_and_its_folder(tmp_path, capsys):
    """the printed hint ``--resume ...`` alone failed ("--experiment is required"); without
    --out a resumed run wrote elsewhere; nothing said "resuming from step N"."""
    full = tmp_path / "full"
    assert main(LM + ["--set", "train.max_steps=8", "--quiet", "--out", str(full)]) == 0
    part = tmp_path / "part"
    run_experiment("shakespeare-llama", "cpu", LM_SETS + ["train.max_steps=8"], out_dir=part, until=5,
                   verbose=False)
    capsys.readouterr()
    here = os.getcwd()
    os.chdir(tmp_path)  # the default output folder would be runs/... under here: nothing may go there
    try:
        assert main(["--resume", str(part), "--quiet"]) == 0
    finally:
        os.chdir(here)
    assert f"resuming shakespeare-llama (cpu) from step 5/8 ({part / 'ckpt_000005.pt'}) in {part}" in \
        capsys.readouterr().err
    assert not (tmp_path / "runs").exists()
    res, ref = load_results(part / "results.json"), load_results(full / "results.json")
    assert res["status"] == "complete" and res["curves"] == ref["curves"]
    assert res["command"] == reproduce_command("shakespeare-llama", "cpu", LM_SETS + ["train.max_steps=8"])


# ------------------------------------------------------------------------------ one run per folder
def test_an_output_folder_never_mixes_two_runs(tmp_path, capsys):
    """re-using an output folder mixed runs (old checkpoints beside new results), without a
    warning and without --overwrite."""
    out = tmp_path / "run"
    args = LM + ["--quiet", "--out", str(out), "--set", "train.checkpoint_interval=2"]
    assert main(args + ["--set", "train.max_steps=6"]) == 0
    assert main(args + ["--set", "train.max_steps=6"]) == 2
    assert "already holds this run, complete (results.json); --overwrite trains it again" in capsys.readouterr().err
    assert main(args + ["--set", "train.max_steps=4"]) == 2
    err = capsys.readouterr().err
    assert "holds a run of another configuration (train.max_steps: 6 vs 4" in err and err.count("\n") == 1
    assert (out / "ckpt_000004.pt").is_file()  # (step 6 is last.pt alone: issue 59, no step twice)
    assert main(args + ["--set", "train.max_steps=4", "--overwrite"]) == 0
    assert not (out / "ckpt_000004.pt").exists() and (out / "ckpt_000002.pt").is_file()
    assert load_results(out / "results.json")["metrics"]["steps"] == 4
    os.remove(out / "results.json")
    os.remove(out / "last.pt")  # a run stopped after step 2's checkpoint ...
    assert main(args + ["--set", "train.max_steps=4"]) == 2
    assert f"stopped at step 2 (ckpt_000002.pt): continue it with --resume {out}" in capsys.readouterr().err


def test_default_output_folders_carry_the_run_id(tmp_path, capsys):
    here = os.getcwd()
    os.chdir(tmp_path)
    try:
        assert main(LM + ["--set", "train.max_steps=2", "--quiet"]) == 0
        assert main(LM + ["--set", "train.max_steps=4", "--quiet"]) == 0  # another folder, not refused
    finally:
        os.chdir(here)
    folders = sorted(p.name for p in (tmp_path / "runs").iterdir())
    assert len(folders) == 2 and all(f.startswith("shakespeare-llama-cpu-") for f in folders)


# ------------------------------------------------------------------------------ logging
def test_metrics_go_to_csv_files_and_survive_a_resume(tmp_path):
    """no CSV (or TensorBoard) log: the curves were in results.json only, at the end."""
    sets = LM_SETS + ["train.max_steps=6", "train.checkpoint_interval=2"]
    run_experiment("shakespeare-llama", "cpu", sets, out_dir=tmp_path, until=4, verbose=False)
    with open(tmp_path / "train_log.csv", newline="") as f:
        first = list(csv.DictReader(f))
    res = run_experiment("shakespeare-llama", "cpu", sets, out_dir=tmp_path, resume=tmp_path, verbose=False)
    with open(tmp_path / "train_log.csv", newline="") as f:
        train = list(csv.DictReader(f))
    with open(tmp_path / "eval_log.csv", newline="") as f:
        ev = list(csv.DictReader(f))
    assert [int(r["step"]) for r in train] == [e["step"] for e in res["curves"]["train"]] == list(range(1, 7))
    assert [float(r["loss"]) for r in train] == [e["loss"] for e in res["curves"]["train"]]
    assert [r["elapsed_s"] for r in train[:4]] == [r["elapsed_s"] for r in first]  # kept from the first segment
    assert [float(r["val_loss"]) for r in ev] == [e["val_loss"] for e in res["curves"]["eval"]]
    assert list(ev[0]) == ["step", "train_loss", "val_loss", "elapsed_s"]


def test_tensorboard_when_installed_and_a_note_when_not(tmp_path, capsys, monkeypatch):
    calls = []

    class Writer:
        def __init__(self, log_dir, purge_step):
            calls.append(("open", log_dir, purge_step))

        def add_scalar(self, tag, value, step):
            calls.append((tag, step))

        def close(self):
            calls.append(("close",))
    monkeypatch.setattr(trainer_mod, "_tensorboard_writer_class", lambda: Writer)
    run_experiment("shakespeare-llama", "cpu", LM_SETS + ["train.max_steps=2"], out_dir=tmp_path / "tb",
                   verbose=False, log=("tensorboard",))
    assert calls[0] == ("open", str(tmp_path / "tb"), None) and calls[-1] == ("close",)
    assert ("train/loss", 2) in calls and ("eval/val_loss", 2) in calls
    monkeypatch.setattr(trainer_mod, "_tensorboard_writer_class", lambda: None)  # not installed
    assert main(LM + ["--set", "train.max_steps=2", "--quiet", "--log", "tensorboard", "--out",
                      str(tmp_path / "none")]) == 0
    assert "note: --log tensorboard: the tensorboard package is not installed" in capsys.readouterr().err
    assert (tmp_path / "none" / "train_log.csv").is_file()


def test_eval_lines_go_above_the_progress_bar(tmp_path, capsys, monkeypatch):
    """evaluation lines were printed through the progress bar."""
    written = []
    monkeypatch.delenv("CI", raising=False)
    monkeypatch.setattr("sys.stderr.isatty", lambda: True)
    monkeypatch.setattr(trainer_mod.tqdm, "write", classmethod(lambda cls, s, **kw: written.append(s)))
    run_experiment("shakespeare-llama", "cpu", LM_SETS + ["train.max_steps=4"], out_dir=tmp_path, verbose=True)
    assert [w.split()[1] for w in written] == ["0/4", "2/4", "4/4"] and all(" val " in w for w in written)
    assert " val " not in capsys.readouterr().out


def test_piped_output_shows_elapsed_time_and_eta(tmp_path, capsys):
    """piped output had no elapsed time or ETA."""
    run_experiment("shakespeare-llama", "cpu", LM_SETS + ["train.max_steps=4"], out_dir=tmp_path, verbose=True)
    lines = [x for x in capsys.readouterr().out.splitlines() if "tokens/s" in x]
    assert len(lines) == 4 and all("  elapsed 0:00:" in x and "  eta 0:00:" in x for x in lines)
    assert lines[-1].endswith("eta 0:00:00")


# ------------------------------------------------------------------------------ config
def test_config_file_round_trip_and_overrides(tmp_path, capsys, monkeypatch):
    """no ``--config FILE`` to feed back what ``--print-config`` prints."""
    assert main(LM + ["--set", "train.max_steps=3", "--print-config"]) == 0
    printed = capsys.readouterr().out
    (tmp_path / "cfg.json").write_text(printed)
    assert main(["--config", str(tmp_path / "cfg.json"), "--print-config"]) == 0
    assert capsys.readouterr().out == printed
    assert main(["--config", str(tmp_path / "cfg.json"), "--set", "train.max_steps=2", "--quiet",
                 "--out", str(tmp_path / "run")]) == 0
    res = load_results(tmp_path / "run" / "results.json")
    assert res["config"]["model"]["d_model"] == 16 and res["metrics"]["steps"] == 2
    argv = shlex.split(res["command"])  # the recorded command reproduces the run's config
    assert argv[:7] == ["python", "-m", "cemlib.train", "--experiment", "shakespeare-llama", "--preset", "cpu"]
    again = get_config("shakespeare-llama", "cpu", [argv[i + 1] for i, a in enumerate(argv) if a == "--set"])
    assert printed_config(again) == {**json.loads(printed), "train": {**json.loads(printed)["train"], "max_steps": 2}}
    for text, message in (("{not json", "not valid JSON"), ("[1, 2]", "must be a JSON object"),
                          ('{"experiment": "shakespeare-llama"}', "lacks 'preset'")):
        (tmp_path / "bad.json").write_text(text)
        assert main(["--config", str(tmp_path / "bad.json"), "--print-config"]) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and message in err
    assert main(["--config", str(tmp_path / "none.json")]) == 2
    assert "none.json" in capsys.readouterr().err


def test_every_section_is_validated_before_the_run(capsys):
    """``data.val_fraction`` was silently ignored for ListOps, and a typo in a ``task.*``
    field passed ``--print-config``."""
    assert main(["--experiment", "gp-gated", "--set", "task.kernal=rbf", "--print-config"]) == 2
    assert "task options ['kernal'] are not options of the 'gp' data" in capsys.readouterr().err
    assert main(["--experiment", "listops-nrgpt", "--set", "data.val_fraction=0.2", "--print-config"]) == 2
    assert "data.val_fraction=0.2 is not used by the 'listops' data" in capsys.readouterr().err
    with pytest.raises(ConfigError, match=r"data.val_fraction must lie in \(0, 1\), got 2.0"):
        get_config("shakespeare-llama", "cpu", ["data.val_fraction=2.0"])


# ------------------------------------------------------------------------------ threads
def test_a_busy_cpu_gets_a_note_and_threads_can_be_set(tmp_path, capsys, monkeypatch):
    """on a loaded 2-core machine the default threads ran ~9x slower than one, without a word."""
    import cemlib.train.run as experiments
    monkeypatch.setattr(os, "getloadavg", lambda: (float(os.cpu_count() or 1) + 3.0, 0.0, 0.0))
    monkeypatch.setattr(torch, "get_num_threads", lambda: 4)
    assert "a small model may train several times faster with --threads 1" in \
        experiments._busy_cpu_note(torch.device("cpu"))
    assert experiments._busy_cpu_note(torch.device("cuda")) is None
    monkeypatch.setattr(torch, "get_num_threads", lambda: 1)
    assert experiments._busy_cpu_note(torch.device("cpu")) is None
    monkeypatch.undo()
    before = torch.get_num_threads()
    try:
        assert main(LM + ["--set", "train.max_steps=2", "--quiet", "--threads", "1", "--out", str(tmp_path)]) == 0
        assert load_results(tmp_path / "results.json")["device"]["threads"] == 1
    finally:
        torch.set_num_threads(before)


# ------------------------------------------------------------------------------ --help
def test_help_covers_grids_the_default_folder_exit_codes_and_threads(capsys):
    """--help omitted grids, the default output folder and exit codes."""
    with pytest.raises(SystemExit) as info:
        main(["--help"])
    assert info.value.code == 0
    out = " ".join(capsys.readouterr().out.split())
    for needed in ("Grids:", "--seeds 0,1,2", "runs/<experiment>-<preset>-<run id>", "runs/grid-<preset>",
                   "Exit status: 0 done; 1 a run diverged", "2 an error", "128 + the signal number",
                   "--threads 1", "--resume FOLDER_OR_CHECKPOINT", "--config FILE", "--overwrite",
                   "--log {csv,tensorboard}", "--max-runs N", "train_log.csv", "model fields"):
        assert needed in out, needed
