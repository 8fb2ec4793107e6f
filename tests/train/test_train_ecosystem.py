"""Issue 59, item 7: what nanoGPT / LitGPT / the HF Trainer users expect: safetensors weights,
a choice of learning-rate schedule with warm-up, early stopping, TensorBoard as an extra."""

from __future__ import annotations

import json
import math
import tomllib
from pathlib import Path

import pytest
import torch
from torch import nn

from cemlib.train.checkpoint import CheckpointError
from cemlib.train.cli import main
from cemlib.train.config import ConfigError, OptimConfig
from cemlib.train.export import export_safetensors
from cemlib.train.folders import run_id
from cemlib.train.optim import make_scheduler
from cemlib.train.registry import get_config
from cemlib.train.run import run_experiment
from cemlib.train.trained import load_trained
from cemlib.train.weights import load_weights, save_weights

ROOT = Path(__file__).resolve().parents[2]
TINY = ["model.d_model=16", "model.n_layers=1", "model.n_heads=2", "train.batch_size=4", "train.context_length=16",
        "train.eval_batches=1", "optim.warmup_steps=1", "train.final_whole_eval=false"]


# ------------------------------------------------------------------------------ schedules
def _lrs(schedule, steps=10, warmup=2, ratio=0.1):
    p = nn.Parameter(torch.zeros(1))
    opt = torch.optim.SGD([p], lr=1.0)
    sched = make_scheduler(opt, OptimConfig(lr=1.0, warmup_steps=warmup, min_lr_ratio=ratio, schedule=schedule),
                           steps)
    out = []
    for _ in range(steps):
        out.append(opt.param_groups[0]["lr"])
        opt.step()
        sched.step()
    return out


def test_three_schedules_each_with_warm_up():
    """Before: one schedule only (``--set optim.schedule=linear``: "optim has no field")."""
    cos, lin, const = _lrs("cosine"), _lrs("linear"), _lrs("constant")
    for lrs in (cos, lin, const):
        assert lrs[:2] == pytest.approx([1 / 3, 2 / 3])  # the same warm-up
    assert lin[2:] == pytest.approx([0.1 + 0.9 * (1 - k / 8) for k in range(8)])
    assert cos[2:] == pytest.approx([0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * k / 8)) for k in range(8)])
    assert const[2:] == [1.0] * 8
    with pytest.raises(ConfigError, match=r"optim.schedule must be one of cosine, linear, constant, got "
                                          r"'linaer' \(did you mean 'linear'\?\)"):
        get_config("shakespeare-llama", "cpu", ["optim.schedule=linaer"])
    with pytest.raises(ConfigError, match="optim.min_lr_ratio=0.5 is not used by optim.schedule=constant"):
        get_config("shakespeare-llama", "cpu", ["optim.schedule=constant", "optim.min_lr_ratio=0.5"])


def test_new_fields_at_their_defaults_keep_every_run_id():
    """The schedule, patience and kept checkpoints are new fields: at their defaults a preset's
    run id is the one it had (stored results keep their folders); another value is another run."""
    cfg = get_config("shakespeare-llama", "cpu")
    assert run_id(cfg) == run_id(get_config("shakespeare-llama", "cpu", ["train.keep_checkpoints=5"]))
    assert run_id(cfg) != run_id(get_config("shakespeare-llama", "cpu", ["optim.schedule=linear"]))
    assert run_id(cfg) != run_id(get_config("shakespeare-llama", "cpu", ["train.patience=2"]))
    old = cfg.to_dict()
    for section, name in (("optim", "schedule"), ("train", "patience"), ("train", "keep_checkpoints")):
        old[section].pop(name)
    assert run_id(old) == run_id(cfg)  # a config written before the fields existed


# ------------------------------------------------------------------------------ early stopping
def test_early_stopping_on_the_primary_metric(tmp_path, monkeypatch, capsys):
    """Before: no early stopping (``--set train.patience=2``: "train has no field")."""
    import cemlib.train.trainer as trainer_mod
    losses = iter([3.0, 2.0, 2.5, 2.6, 2.7, 2.8, 2.9, 3.0])
    monkeypatch.setattr(trainer_mod.Trainer, "evaluate",
                        lambda self: {"train_loss": 1.0, "val_loss": next(losses)})
    out = tmp_path / "run"
    res = run_experiment("shakespeare-llama", "cpu", TINY + ["train.max_steps=14", "train.eval_interval=2",
                                                             "train.patience=2"], out_dir=out, verbose=True)
    assert "early stop at step 6/14: val_loss has not improved for 2 evaluations" in capsys.readouterr().out
    m = res["metrics"]
    assert res["status"] == "complete" and m["steps"] == 6
    assert m["stopped_early"] == {"step": 6, "best_step": 2, "patience": 2, "metric": "val_loss"}
    assert torch.load(out / "last.pt", weights_only=True)["step"] == 6 and not (out / "ckpt_000006.pt").exists()
    assert main(["--resume", str(out)]) == 0
    assert "already finished: stopped early at step 6/14" in capsys.readouterr().err


# ------------------------------------------------------------------------------ safetensors
@pytest.fixture(scope="module")
def run(tmp_path_factory):
    out = tmp_path_factory.mktemp("st") / "run"
    run_experiment("shakespeare-llama", "cpu", TINY + ["train.max_steps=2", "model.tie_embeddings=true"],
                   out_dir=out, verbose=False)
    return out


def test_export_to_safetensors_and_load_either(run, capsys):
    """Before: no safetensors export; ``load_trained`` read ``.pt`` checkpoints only."""
    assert main_export([str(run)]) == 0
    assert "wrote" in capsys.readouterr().out and (run / "model.safetensors").is_file()
    a, b = load_trained(run / "last.pt"), load_trained(run / "model.safetensors")
    assert a.step == b.step == 2 and a.config == b.config and a.tokenizer.chars == b.tokenizer.chars
    x = torch.randint(0, a.task_info["vocab_size"], (2, 8))
    with torch.no_grad():
        assert torch.equal(a.model(x), b.model(x))
    state, meta = load_weights(run / "model.safetensors")
    assert meta["experiment"] == "shakespeare-llama" and meta["step"] == 2
    path = export_safetensors(run / "best.pt" if (run / "best.pt").exists() else run, run / "other.safetensors")
    assert path.is_file()
    with pytest.raises(CheckpointError, match="must end in .safetensors"):
        export_safetensors(run, run / "weights.bin")


def main_export(argv):
    from cemlib.cli import main as cemlib_main
    return cemlib_main(["export", *argv])


def test_save_and_load_weights_of_a_model_built_in_python(tmp_path):
    class Tied(nn.Module):
        def __init__(self):
            super().__init__()
            self.emb = nn.Embedding(5, 3)
            self.head = nn.Linear(3, 5, bias=False)
            self.head.weight = self.emb.weight

    model = Tied()
    save_weights(model, tmp_path / "m.safetensors", metadata={"d": 3, "note": "mine"})
    fresh = Tied()
    state, meta = load_weights(tmp_path / "m.safetensors", fresh)
    assert meta == {"format": "cemlib.safetensors/1", "d": 3, "note": "mine"}
    assert torch.equal(fresh.head.weight, model.head.weight) and fresh.head.weight is fresh.emb.weight
    with pytest.raises(CheckpointError, match="does not match the model"):
        load_weights(tmp_path / "m.safetensors", nn.Linear(3, 5))
    (tmp_path / "bad.safetensors").write_bytes(b"\x10\x00")
    with pytest.raises(CheckpointError, match="not a readable safetensors file"):
        load_weights(tmp_path / "bad.safetensors")


# ------------------------------------------------------------------------------ TensorBoard
def test_tensorboard_is_an_optional_extra():
    """Before: TensorBoard was offered (``--log tensorboard``) but not installable from the
    project's extras."""
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    assert any(r.startswith("tensorboard") for r in extras["tensorboard"])
    src = (ROOT / "cemlib" / "train" / "trainer.py").read_text()
    assert 'pip install "\\"cemlib[tensorboard]\\""' in src or 'cemlib[tensorboard]' in src
    assert json.dumps(extras)  # a plain table
