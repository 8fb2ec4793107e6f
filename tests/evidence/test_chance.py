"""Chance baselines (cemlib.evidence.chance): the trivial predictor of each task kind, scored by the
task's own whole-split evaluation, against the value computed by hand."""

import math

import pytest
import torch

from cemlib.evidence.chance import MarginalPredictor, chance_level, chance_metrics
from cemlib.train.batches import TokenBatches
from cemlib.train.tasks import (IGNORE_INDEX, AnswerTask, ClassificationTask, LanguageModelTask, RegressionTask,
                                TokenClassificationTask)


def test_language_model_chance_is_the_unigram_cross_entropy():
    g = torch.Generator().manual_seed(0)
    train = torch.multinomial(torch.tensor([0.6, 0.3, 0.1]), 3000, replacement=True, generator=g)
    val = torch.multinomial(torch.tensor([0.5, 0.3, 0.2]), 1001, replacement=True, generator=g)
    task = LanguageModelTask(TokenBatches(train, 16, name="train"), TokenBatches(val, 16, name="val"), 3)
    counts = torch.bincount(train, minlength=3).double() + 1
    logp = (counts / counts.sum()).log()
    want = float(-logp[val[1:]].mean())                       # every next-token target of val once
    got = chance_metrics(task, "val")["val_loss"]
    assert got == pytest.approx(want, rel=1e-6)
    c = chance_level(task, "loss")
    assert c.value == pytest.approx(want, rel=1e-6) and c.perfect == 0.0 and "unigram" in c.how


def test_answer_task_chance_is_the_per_position_majority_and_greedy_equals_forced():
    # two output positions; the answer (last) is 7 in 60 % of the train rows, 5 otherwise
    n = 50
    x = torch.zeros(n, 4, dtype=torch.long)
    y = torch.full((n, 4), IGNORE_INDEX)
    y[:, 2] = torch.where(torch.arange(n) % 5 < 3, 3, 4)       # 3 in 60 %
    y[:, 3] = torch.where(torch.arange(n) % 5 < 3, 7, 5)       # 7 in 60 %
    yt = y.clone()
    yt[:, 3] = torch.where(torch.arange(n) % 2 == 0, 7, 5)     # test: 7 in 50 %
    mask = torch.zeros_like(y, dtype=torch.bool)
    mask[:, 3] = True
    task = AnswerTask({"train": (x, y, mask), "val": (x, y, mask), "test": (x, yt, mask)}, 10, seed=0,
                      greedy=True)
    m = chance_metrics(task, "test")
    assert m["test_accuracy"] == pytest.approx(0.5) and m["test_greedy_accuracy"] == pytest.approx(0.5)
    assert chance_metrics(task, "val")["val_accuracy"] == pytest.approx(0.6)
    assert chance_level(task, "accuracy", "test").perfect == 1.0


def test_token_classification_chance_counts_the_scored_cells():
    n, T = 40, 5
    y = (torch.arange(n)[:, None] + torch.arange(T)) % 3          # classes 0..2
    mask = torch.ones(n, T, dtype=torch.bool)
    mask[:, 0] = False                                             # position 0 never scored
    y[:, 1] = 2                                                    # position 1 always class 2
    x = torch.zeros(n, T, dtype=torch.long)
    task = TokenClassificationTask({"train": (x, y, mask), "val": (x, y, mask)}, 3, seed=0, vocab_size=4)
    acc = chance_metrics(task, "val")["val_cell_accuracy"]
    want = sum(float((y[:, t] == torch.bincount(y[:, t], minlength=3).argmax()).double().mean())
               for t in range(1, T)) / (T - 1)
    assert acc == pytest.approx(want)


def test_classification_and_regression_chance():
    y = torch.tensor([0] * 30 + [1] * 50 + [2] * 20)
    x = torch.randn(100, 4, 3)
    yv = torch.tensor([1] * 7 + [0] * 13)
    task = ClassificationTask({"train": (x, y), "val": (x[:20], yv)}, 3, seed=0)
    assert chance_metrics(task, "val")["val_accuracy"] == pytest.approx(7 / 20)
    g = torch.Generator().manual_seed(1)
    xr, yr = torch.randn(200, 3, generator=g), 2.0 + torch.randn(200, 1, generator=g)
    xv, yvr = torch.randn(50, 3, generator=g), 2.0 + torch.randn(50, 1, generator=g)
    reg = RegressionTask({"train": (xr, yr), "val": (xv, yvr)}, seed=0)
    want = math.sqrt(float(((yvr - yr.mean()) ** 2).mean()))
    assert chance_metrics(reg, "val")["val_rmse"] == pytest.approx(want, rel=1e-5)
    assert chance_level(reg, "rmse").perfect == 0.0


def test_the_predictor_ignores_its_input():
    y = torch.tensor([0, 1, 1, 1])
    task = ClassificationTask({"train": (torch.randn(4, 2, 3), y), "val": (torch.randn(4, 2, 3), y)}, 2, seed=0)
    p = MarginalPredictor(task)
    a, b = p(torch.randn(3, 2, 3)), p(torch.randn(3, 2, 3) * 100)
    assert torch.equal(a, b) and a.shape == (3, 2) and int(a[0].argmax()) == 1
