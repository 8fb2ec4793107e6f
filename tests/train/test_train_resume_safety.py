"""Issue 59, items 1 and 2: nothing being resumed is deleted, and nothing silent on resume.

Each test names the input that failed before (data lost, a silent run, or an unhelpful refusal).
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from cemlib.train.cli import main
from cemlib.train.folders import RunFolderError
from cemlib.train.registry import get_config
from cemlib.train.run import run_config, run_experiment

TINY = ["model.d_model=16", "model.n_layers=1", "model.n_heads=2", "train.batch_size=4", "train.context_length=16",
        "train.eval_batches=1", "optim.warmup_steps=1", "train.eval_interval=4", "train.checkpoint_interval=4",
        "train.final_whole_eval=false", "train.max_steps=8"]


def _sets(overrides):
    return [a for o in overrides for a in ("--set", o)]


def _run(out: Path, extra=(), until=None, data=None):
    overrides = TINY + list(extra) + ([f"data.path={data}"] if data else [])
    return run_experiment("shakespeare-llama", "cpu", overrides, out_dir=out, until=until, verbose=False)


def _err(capsys) -> str:
    err = capsys.readouterr().err
    return err.strip().splitlines()[-1]


@pytest.fixture
def finished(tmp_path):
    out = tmp_path / "D"
    _run(out)
    return out


@pytest.mark.parametrize("extra", [[], ["--set", "train.max_steps=8"], ["LAST_GOOD"]])
def test_resume_with_overwrite_is_refused_and_deletes_nothing(finished, extra, capsys):
    """Before: ``--resume D --overwrite`` deleted every checkpoint in D, the one resumed included,
    then failed with "checkpoint 'D/last.pt' does not exist"."""
    before = sorted(p.name for p in finished.iterdir())
    target = str(finished)
    if extra == ["LAST_GOOD"]:
        shutil.copy(finished / "last.pt", finished / "last_good.pt")
        before = sorted(p.name for p in finished.iterdir())
        target, extra = str(finished / "last_good.pt"), []
    assert main(["--resume", target, "--overwrite", *extra]) == 2
    msg = _err(capsys)
    assert "would delete the checkpoint being resumed" in msg and "drop --overwrite" in msg
    assert sorted(p.name for p in finished.iterdir()) == before


def test_the_python_call_refuses_resume_with_overwrite_too(finished):
    cfg = get_config("shakespeare-llama", "cpu", TINY)
    with pytest.raises(RunFolderError, match="would delete the checkpoint being resumed"):
        run_config(cfg, finished, resume=finished, overwrite=True, verbose=False)
    assert (finished / "last.pt").is_file()


def test_no_refusal_recommends_overwrite_while_resuming(tmp_path, capsys):
    """Before: ``--resume D --set optim.lr=0.1`` answered "... or --overwrite to replace it"."""
    out = tmp_path / "D"
    _run(out, until=4)
    assert main(["--resume", str(out), "--set", "optim.lr=0.1", "--quiet"]) == 2
    msg = _err(capsys)
    assert "optim.lr" in msg and "--overwrite" not in msg
    assert (out / "ckpt_000004.pt").is_file()


def test_an_in_place_resume_after_an_evaluation_only_change(tmp_path, capsys):
    """Before: ``--resume D --set train.eval_interval=2`` was refused ("holds a run of another
    configuration ... or --overwrite to replace it")."""
    out = tmp_path / "D"
    _run(out, until=4)
    assert main(["--resume", str(out), "--set", "train.eval_interval=2", "--quiet"]) == 0, capsys.readouterr().err
    res = json.loads((out / "results.json").read_text())
    assert res["status"] == "complete" and [e["step"] for e in res["curves"]["eval"]] == [0, 4, 6, 8]


def test_resume_from_last_good_of_the_same_configuration(tmp_path, capsys):
    """Before: a folder left by a NaN stop (``last_good.pt`` and the logs, no results, no periodic
    checkpoint) could not be resumed: "configuration cannot be read ... --overwrite"."""
    out = tmp_path / "D"
    _run(out, until=4)
    shutil.copy(out / "ckpt_000004.pt", out / "last_good.pt")
    (out / "ckpt_000004.pt").unlink()
    assert main(["--resume", str(out / "last_good.pt"), "--quiet"]) == 0, capsys.readouterr().err
    assert json.loads((out / "results.json").read_text())["metrics"]["steps"] == 8


def test_resuming_a_finished_run_says_already_finished(finished, capsys):
    """Before: "resuming ... from step 8/8", then the final evaluation and results again."""
    stamp = (finished / "results.json").stat().st_mtime_ns
    assert main(["--resume", str(finished)]) == 0
    err = capsys.readouterr().err
    assert "already finished: step 8/8; nothing to train" in err
    assert (finished / "results.json").stat().st_mtime_ns == stamp


def _text(path: Path, swap: bool = False) -> None:
    chars = list("the quick brown fox jumps over the lazy dog. " * 120)
    if swap:  # the same characters, the same length, the same vocabulary: two swapped
        chars[2001], chars[2002] = chars[2002], chars[2001]
        assert chars[2001] != chars[2002]
    path.write_text("".join(chars))


def test_resuming_on_changed_text_is_refused_naming_both(tmp_path, capsys):
    """Before: after the user's text file changed (here: two characters swapped, so its length,
    vocabulary and sampled checksum stay the same), ``--resume`` trained on the new text in
    silence."""
    text = tmp_path / "mine.txt"
    _text(text)
    out = tmp_path / "D"
    _run(out, until=4, data=text)
    _text(text, swap=True)
    assert main(["--resume", str(out), "--quiet"]) == 2
    msg = _err(capsys)
    assert "was trained on other data than data.path=" in msg and "mine.txt" in msg
    assert "in the checkpoint vs" in msg and "vocabulary: 28 characters then, 28 characters now" in msg
    _text(text)  # the text back as it was: the run resumes
    assert main(["--resume", str(out), "--quiet"]) == 0


@pytest.mark.parametrize("edit,message", [
    (lambda d: d.update(trainer={"max_steps": 3}), r"unknown key 'trainer' \(did you mean 'train'\?\)"),
    (lambda d: d.update(optimizer=d.pop("optim")), r"unknown key 'optimizer' \(did you mean 'optim'\?\)"),
    (lambda d: d["optim"].update(lrr=0.1), r"optim has no field 'lrr' \(did you mean 'lr'\?\); known fields"),
    (lambda d: d["train"].update(max_step=3), r"train has no field 'max_step' \(did you mean 'max_steps'\?\)"),
    (lambda d: d["data"].update(paht="x.txt"), r"data has no field 'paht' \(did you mean 'path'\?\)"),
    (lambda d: d["model"].update(d_modle=8), r"\['d_modle'\] .*\(did you mean 'd_model'\?\)"),
    (lambda d: d["task"].update(train_char=100), r"\['train_char'\] .*\(did you mean 'train_chars'\?\)"),
])
def test_unknown_keys_at_every_level_of_a_config_file_are_refused(tmp_path, capsys, edit, message):
    """Before: an unknown top-level section (``"trainer"``, a misspelt ``"optimizer"``) was
    ignored and the run trained on the preset's values."""
    assert main(["--experiment", "shakespeare-llama", "--print-config"]) == 0
    d = json.loads(capsys.readouterr().out)
    edit(d)
    path = tmp_path / "cfg.json"
    path.write_text(json.dumps(d))
    assert main(["--config", str(path), "--print-config"]) == 2
    import re
    assert re.search(message, _err(capsys))
