"""Every task of cemlib.train end to end on CPU (tiny configs), exact resume, and bad input."""

import math

import pytest
import torch
from torch import nn

from cemlib.train import (EXPERIMENTS, ConfigError, ExperimentConfig, OptimConfig,
                          TrainConfig, Trainer, get_config, run_experiment)
from cemlib.train.config import resolve_precision
from cemlib.train.registry import build
from cemlib.train.folders import run_name
from cemlib.train.grid import grid_runs, grid_sweep, summary_markdown
from cemlib.train.datasets import load_cifar10, make_task, split_off
from cemlib.train.tasks import (AnswerTask, ClassificationTask, ExampleBatches, RegressionTask, TaskDataError,
                                TokenClassificationTask)

# experiment -> tiny overrides (a few seconds each on one CPU core)
TINY = {
    "listops-nrgpt": ["task.n_train=300", "task.n_test=40", "model.d_model=16", "model.n_steps=2"],
    "listops-rgpt": ["task.n_train=300", "task.n_test=40", "model.d_model=16", "model.n_steps=2"],
    "listops-gpt": ["task.n_train=300", "task.n_test=40", "model.d_model=16", "model.n_layers=2"],
    "lis-mha": ["task.L=6", "task.n_train=200", "task.n_test=20", "model.d_model=16", "model.n_layers=1"],
    "lis-mha2nd1st": ["task.L=6", "task.n_train=200", "task.n_test=20", "model.d_model=16", "model.n_layers=1"],
    "gp-gated": ["task.n_train=200", "task.n_val=40", "task.n_test=40"],
    "gp-cem-t2": ["task.n_train=200", "task.n_val=40", "task.n_test=40", "model.d_ff=32"],
    "gp-plain": ["task.n_train=200", "task.n_val=40", "task.n_test=40", "model.d_ff=32"],
    "sudoku-hyperset": ["task.n_train=64", "task.val_fraction=0.005", "task.n_test=40", "model.d=16",
                        "model.n_iter=2", "model.n_heads=2"],
    "sudoku-transformer": ["task.n_train=64", "task.val_fraction=0.005", "task.n_test=40", "model.d=16",
                           "model.n_iter=2", "model.n_heads=2"],
    "digits-hyperset": ["model.d=16", "model.n_iter=2", "model.n_heads=2"],
    "digits-transformer": ["model.d=16", "model.n_iter=2", "model.n_heads=2"],
    "shakespeare-nrgpt": ["model.d_model=16", "model.n_steps=2", "train.context_length=16"],
}
BUDGET = ["train.max_steps=6", "train.eval_interval=3", "train.eval_batches=2", "train.batch_size=8",
          "train.log_interval=1", "optim.warmup_steps=1"]


#: the slowest of these on two cores: the Shakespeare stream's whole-split evaluations
SLOW_TASKS = {"shakespeare-nrgpt"}


@pytest.mark.parametrize("name", [pytest.param(n, marks=pytest.mark.slow) if n in SLOW_TASKS else n
                                  for n in sorted(TINY)])
def test_task_trains_and_resumes_exactly(name, tmp_path):
    ovr = TINY[name] + BUDGET
    full = run_experiment(name, "cpu", ovr, out_dir=tmp_path / "full", verbose=False)
    m = full["metrics"]
    assert m["steps"] == 6 and [e["step"] for e in full["curves"]["eval"]] == [0, 3, 6]
    splits = full["task"]["splits"]
    assert {"train", "val"} <= set(splits)
    for split in splits:  # every split evaluated with every metric, finite
        for key, v in m["final"].items():
            assert math.isfinite(v), (key, v)
        assert f"{split}_loss" in m["final"]
    assert m["primary_metric"] in m["final"] and m["best_primary"] is not None
    # interrupted after step 4, resumed from its checkpoint: the same run, bit for bit
    run_experiment(name, "cpu", ovr, out_dir=tmp_path / "part", until=4, verbose=False)
    resumed = run_experiment(name, "cpu", ovr, out_dir=tmp_path / "part", verbose=False,
                             resume=tmp_path / "part" / "ckpt_000004.pt")
    assert resumed["curves"] == full["curves"]
    assert resumed["metrics"]["final"] == m["final"]


def test_every_experiment_builds_its_cpu_preset():
    for name in EXPERIMENTS:
        cfg = get_config(name, "cpu")
        if cfg.data.name in ("shakespeare", "listops", "lis") and name not in TINY:
            continue  # built by the other tests (Shakespeare LMs) or costly to generate at full size
        model, task = build(get_config(name, "cpu", TINY.get(name, [])))
        assert sum(p.numel() for p in model.parameters()) > 0 and task.kind


def test_metrics_are_right_on_a_known_model():
    """Accuracy, cell/board accuracy and RMSE against hand-computed values."""
    class Const(nn.Module):  # ignores its input, returns fixed outputs
        def __init__(self, out):
            super().__init__()
            self.out, self.p = out, nn.Parameter(torch.zeros(()))

        def forward(self, x):
            return self.out[: x.shape[0]] + 0 * self.p

    y = torch.tensor([0, 1, 2, 1])
    task = ClassificationTask({"train": (torch.zeros(4, 2, 3), y), "val": (torch.zeros(4, 2, 3), y)}, 3, 0)
    logits = torch.nn.functional.one_hot(torch.tensor([0, 1, 1, 1]), 3).float() * 5
    s = task.eval_stats(Const(logits), (torch.zeros(4, 2, 3), y)).tolist()
    assert task.summarize(s)["accuracy"] == 0.75
    # Sudoku-like: 2 boards x 3 cells, mask = blanks
    yy = torch.tensor([[0, 1, 2], [2, 2, 2]])
    mask = torch.tensor([[True, True, False], [True, False, False]])
    pred = torch.tensor([[0, 1, 0], [1, 2, 2]])  # board 0: both blanks right; board 1: blank wrong
    t2 = TokenClassificationTask({"train": (yy, yy, mask), "val": (yy, yy, mask)}, 3, 0)
    s = t2.eval_stats(Const(torch.nn.functional.one_hot(pred, 3).float()), (yy, yy, mask)).tolist()
    out = t2.summarize(s)
    assert out["cell_accuracy"] == pytest.approx(2 / 3) and out["board_accuracy"] == 0.5
    # regression: residuals 1 and -3 -> RMSE sqrt(5)
    t3 = RegressionTask({"train": (torch.zeros(2, 1), torch.zeros(2, 1)),
                         "val": (torch.zeros(2, 1), torch.zeros(2, 1))}, 0)
    s = t3.eval_stats(Const(torch.tensor([[1.0], [-3.0]])), (torch.zeros(2, 1), torch.zeros(2, 1))).tolist()
    assert t3.summarize(s)["rmse"] == pytest.approx(math.sqrt(5))


def test_greedy_decoding_feeds_predictions_back():
    """A model that predicts "the next token equals this one", scored on the last token only.
    Row 1 is right teacher-forced (its true last input is 4) but wrong when the earlier output
    tokens are its own predictions (it generates 3, 3, 3)."""
    class CopyCurrent(nn.Module):
        def __init__(self):
            super().__init__()
            self.p = nn.Parameter(torch.zeros(()))

        def forward(self, x):
            return torch.nn.functional.one_hot(x, 5).float() * 10 + 0 * self.p

    x = torch.tensor([[1, 2, 2, 2], [1, 3, 4, 4]])
    y = torch.tensor([[-100, 2, 2, 2], [-100, 4, 4, 4]])  # outputs at positions 1..3
    mask = torch.zeros_like(x, dtype=torch.bool)
    mask[:, -1] = True                                    # only the final answer is scored
    task = AnswerTask({"train": (x, y, mask), "val": (x, y, mask)}, 5, 0, greedy=True)
    model = CopyCurrent()
    s = task.summarize(task.eval_stats(model, (x, y, mask), "test").tolist(), "test")
    assert s["accuracy"] == 1.0 and s["greedy_accuracy"] == 0.5
    assert task.greedy_correct(model, x, y, mask).tolist() == [True, False]
    for split in ("train", "val"):  # greedy decoding is the test metric only (it is costly)
        assert "greedy_accuracy" not in task.summarize(task.eval_stats(model, (x, y, mask), split).tolist(),
                                                       split)


def test_example_batches_are_epochs_and_pure():
    b = ExampleBatches((torch.arange(10),), seed=3)
    first_epoch = torch.cat([b.batch(n, 5)[0] for n in range(2)])
    assert sorted(first_epoch.tolist()) == list(range(10))  # each example once per epoch
    assert torch.equal(b.batch(7, 5)[0], ExampleBatches((torch.arange(10),), seed=3).batch(7, 5)[0])
    assert torch.equal(b.micro_batch(1, 4, 1, 2)[0], b.batch(1, 4)[0][2:])


def test_bad_input_is_rejected_clearly():
    with pytest.raises(ConfigError, match="unknown dataset data.name='imagenet'"):
        make_task(get_config("gp-gated", "cpu", ["data.name=imagenet"]))
    with pytest.raises(ConfigError, match=r"task options \['kernal'\] are not options of the 'gp' data"):
        make_task(get_config("gp-gated", "cpu", ["task.kernal=rbf"]))
    with pytest.raises(TaskDataError, match="the train split is empty"):
        ExampleBatches((torch.zeros(0, 3),), name="train")
    with pytest.raises(TaskDataError, match=r"labels must lie in 0..2; found values in 0..3"):
        ClassificationTask({"train": (torch.zeros(2, 3), torch.tensor([0, 3])),
                            "val": (torch.zeros(1, 3), torch.tensor([0]))}, 3, 0)
    with pytest.raises(TaskDataError, match="x must be .N, d_in. and y .N, d_out."):
        RegressionTask({"train": (torch.zeros(4), torch.zeros(4, 1)),
                        "val": (torch.zeros(2, 1), torch.zeros(2, 1))}, 0)
    with pytest.raises(TaskDataError, match="needs a 'val' split"):
        RegressionTask({"train": (torch.zeros(4, 1), torch.zeros(4, 1))}, 0)
    with pytest.raises(TaskDataError, match="must be integer class labels"):
        ClassificationTask({"train": (torch.zeros(2, 3), torch.tensor([0.0, 1.0])),
                            "val": (torch.zeros(1, 3), torch.tensor([0]))}, 3, 0)
    with pytest.raises(TaskDataError, match="every example needs at least one scored position"):
        AnswerTask({"train": (torch.zeros(2, 3, dtype=torch.long), torch.full((2, 3), -100)),
                    "val": (torch.zeros(2, 3, dtype=torch.long), torch.full((2, 3), -100))}, 4, 0)
    # a model whose output does not fit the task
    model, task = build(get_config("gp-gated", "cpu", TINY["gp-gated"]))
    x, y = task.train.batch(0, 4)
    with pytest.raises(TaskDataError, match=r"must map x \(4, 10\) to predictions \(4, 1\); got \(4, 2\)"):
        task.loss(nn.Linear(10, 2), (x, y))
    with pytest.raises(ConfigError, match="model.arch must be one of"):
        build(get_config("sudoku-hyperset", "cpu", ["model.arch=rnn", "task.n_train=8"]))
    with pytest.raises(ConfigError, match="reads a local copy only"):
        make_task(get_config("digits-hyperset", "cpu", ["data.name=cifar10"]))


def _fake_cifar10(folder, n=3, seed=0):
    import numpy as np
    rng = np.random.default_rng(seed)
    for name in [f"data_batch_{i}.bin" for i in range(1, 6)] + ["test_batch.bin"]:
        rec = np.concatenate([rng.integers(0, 10, (n, 1)), rng.integers(0, 256, (n, 3072))], 1)
        rec.astype(np.uint8).tofile(folder / name)


def test_cifar10_binary_reader(tmp_path, monkeypatch):
    """The opt-in CIFAR-10 reader on a fake binary distribution (3 images per file, where the real
    one has 10,000: the reader is told so)."""
    import cemlib.train.datasets as td
    _fake_cifar10(tmp_path)
    data = load_cifar10(tmp_path, records_per_file=3)
    assert data["train"][0].shape == (15, 3, 32, 32) and data["test"][1].shape == (3,)
    monkeypatch.setattr(td, "CIFAR10_RECORDS", 3)
    task = make_task(get_config("digits-hyperset", "cpu", ["data.name=cifar10", f"data.path={tmp_path}",
                                                          "task.val_fraction=0.2"]))
    assert task.info["n_positions"] == 64 and task.info["patch_dim"] == 48
    assert task.info["data_source"].endswith("read 15 train and 3 test images; 12 train / 3 val / 3 test used")
    (tmp_path / "test_batch.bin").write_bytes(b"\x00" * 100)
    with pytest.raises(TaskDataError, match="not a CIFAR-10 binary batch"):
        load_cifar10(tmp_path, records_per_file=3)
    with pytest.raises(FileNotFoundError, match="never downloads"):
        load_cifar10(tmp_path / "absent")


def test_split_off_is_seeded_and_disjoint():
    keep, held = split_off(50, 0.2, 1)
    assert len(held) == 10 and not set(keep.tolist()) & set(held.tolist())
    assert torch.equal(held, split_off(50, 0.2, 1)[1]) and not torch.equal(held, split_off(50, 0.2, 2)[1])


# ------------------------------------------------------------------------------ precision
def test_precision_choice_mocked_capabilities(monkeypatch):
    assert resolve_precision("auto", "cpu", False) == "fp32"
    assert resolve_precision("auto", "cuda", True) == "bf16"
    assert resolve_precision("auto", "cuda", False) == "fp16"  # a T4: fp16 + gradient scaler
    with pytest.raises(ConfigError, match="no bf16 support"):
        resolve_precision("bf16", "cuda", False)
    with pytest.raises(ConfigError, match="needs a CUDA GPU"):
        resolve_precision("fp16", "cpu", False)
    # the trainer asks torch for the capability: mocked, the choice follows it
    from cemlib.train import trainer as tr
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda *a, **k: False)
    assert tr.choose_precision("auto", torch.device("cuda")) == "fp16"
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda *a, **k: True)
    assert tr.choose_precision("auto", torch.device("cuda")) == "bf16"
    assert tr.choose_precision("auto", torch.device("cpu")) == "fp32"


def test_gradient_scaler_skips_an_overflowing_step():
    """An fp16-style overflow (an inf in one gradient, injected by a hook) under a gradient
    scaler: the step is skipped (weights unchanged, counted), the scale is lowered, and training
    goes on instead of stopping; the next clean step updates the weights."""
    cfg = get_config("gp-gated", "cpu", TINY["gp-gated"] + BUDGET)
    model, task = build(cfg)
    t = Trainer(model, task, cfg, verbose=False)
    t.scaler = torch.amp.GradScaler("cpu", init_scale=2.0 ** 16)
    hook = model.inp.weight.register_hook(lambda g: g * float("inf"))
    before = [p.detach().clone() for p in model.parameters()]
    loss, gnorm = t.train_step()
    assert math.isfinite(loss) and not math.isfinite(gnorm) and t.skipped_steps == 1 and t._skipped
    assert all(torch.equal(a, b) for a, b in zip(before, model.parameters()))
    assert t.scaler.get_scale() == 2.0 ** 15
    hook.remove()
    loss, gnorm = t.train_step()
    assert math.isfinite(gnorm) and not t._skipped
    assert not all(torch.equal(a, b) for a, b in zip(before, model.parameters()))


# ------------------------------------------------------------------------------ grids
def test_grid_sweep_writes_runs_and_a_summary(tmp_path):
    runs = grid_runs(["gp-gated", "gp-cem-t2"], {"task.kernel": ["rbf", "matern"]}, seeds=[0, 1])
    assert len(runs) == 8 and runs[0] == ("gp-gated", ["task.kernel=rbf"], 0)
    assert run_name("gp-cem-t2", ["task.kernel=matern"], 1) == "gp_cem_t2__task.kernel-matern__seed1"
    rows = grid_sweep(["gp-gated"], "cpu", {"model.d_ff": [16, 32]}, seeds=[0, 1], out_dir=tmp_path,
                      overrides=TINY["gp-gated"] + BUDGET, metrics=["test_rmse"])
    assert len(rows) == 2 and all(r["seeds"] == [0, 1] for r in rows)
    assert len(list(tmp_path.glob("gp_gated__model.d_ff-*__seed*.json"))) == 4
    mean, std = rows[0]["test_rmse"]
    assert mean > 0 and std > 0  # two seeds differ
    md = (tmp_path / "summary.md").read_text()
    assert "| gp-gated | model.d_ff=16 |" in md and "±" in md
    assert summary_markdown(rows, ["test_rmse"]) in md and rows.markdown in md
