"""Chance baselines: what a task's trivial predictor scores, computed with the task's own metrics.

A model that has not beaten the trivial predictor has not learned the task, and a comparison of two
such models says nothing about the paper's claim (:mod:`cemlib.evidence.verdict`: "not testable at this
budget"). The trivial predictor of a task ignores its input and predicts what the training split
predicts on average (:class:`MarginalPredictor`):

- language modelling: the unigram distribution of the training characters (the loss is then the
  cross-entropy of the validation characters under it, about the unigram entropy);
- answer prediction (ListOps, LIS): at every output position, the distribution of that position's
  target over the training rows, so its accuracy is the majority answer's rate (ListOps) and, for
  LIS, the rate of the most frequent token at each position of the chain (greedy decoding of a
  predictor that ignores its input is the same as teacher forcing);
- per-position classes (Sudoku): the distribution of the class at each position over the scored
  (blank) cells of the training boards, about 1/9 per cell;
- classification (digits, CIFAR-10): the training class frequencies (the majority class);
- regression (GP, Table 3): the mean training target (RMSE: the spread of the targets).

Counts get add-one (Laplace) smoothing so that no log-probability is infinite. The predictor is
scored by the task's own whole-split evaluation (``whole_batches`` / ``whole_stats`` /
``summarize_whole``), exactly as the trainer scores a model, so the chance level is computed, never
typed.
"""

from __future__ import annotations

import math

import torch
from torch import nn

from cemlib.train.tasks import (IGNORE_INDEX, AnswerTask, ClassificationTask, LanguageModelTask,
                                RegressionTask, Task, TokenClassificationTask)
from cemlib.evidence.verdict import Chance

__all__ = ["MarginalPredictor", "chance_metrics", "chance_level"]


def _log_freq(counts: torch.Tensor) -> torch.Tensor:
    counts = counts.double() + 1.0                                   # add-one smoothing
    return (counts / counts.sum(-1, keepdim=True)).log()


class MarginalPredictor(nn.Module):
    """The trivial predictor of ``task``, fitted on its training split; ``forward`` has the output
    shape the task expects (see the module docstring) and ignores the values of its input."""

    def __init__(self, task: Task):
        super().__init__()
        self.kind = task.kind
        train = task.splits["train"]
        if isinstance(task, LanguageModelTask):
            V = task.info["vocab_size"]
            self.register_buffer("logp", _log_freq(torch.bincount(train.tokens.reshape(-1), minlength=V)))
        elif isinstance(task, AnswerTask):
            _, y, _ = train.tensors
            V = task.info["vocab_size"]
            counts = torch.zeros(y.shape[1], V, dtype=torch.long)
            for t in range(y.shape[1]):
                col = y[:, t][y[:, t] != IGNORE_INDEX]
                counts[t] = torch.bincount(col, minlength=V)
            self.register_buffer("logp", _log_freq(counts))            # (T, V)
        elif isinstance(task, TokenClassificationTask):
            _, y, mask = train.tensors
            C = task.n_classes
            counts = torch.zeros(y.shape[1], C, dtype=torch.long)
            for t in range(y.shape[1]):
                scored = mask[:, t] if bool(mask[:, t].any()) else torch.ones_like(mask[:, t])
                counts[t] = torch.bincount(y[:, t][scored], minlength=C)
            self.register_buffer("logp", _log_freq(counts))            # (T, C)
        elif isinstance(task, ClassificationTask):
            _, y = train.tensors
            self.register_buffer("logp", _log_freq(torch.bincount(y, minlength=task.n_classes)))
        elif isinstance(task, RegressionTask):
            _, y = train.tensors
            self.register_buffer("mean", y.double().mean(0))
        else:
            raise TypeError(f"no trivial predictor for a {type(task).__name__}")

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        B = x.shape[0]
        if self.kind == "language_modelling":
            return self.logp.expand(B, x.shape[1], -1).float()
        if self.kind in ("answer_prediction", "token_classification"):
            return self.logp[: x.shape[1]].expand(B, -1, -1).float()
        if self.kind == "classification":
            return self.logp.expand(B, -1).float()
        return self.mean.expand(B, -1).float()


@torch.no_grad()
def chance_metrics(task: Task, split: str = "val", batch_size: int = 256) -> dict[str, float]:
    """The trivial predictor's metrics on the whole ``split``, as ``{f"{split}_{name}": value}``
    (the names the trainer records)."""
    model = MarginalPredictor(task)
    acc = None
    for weight, batch in task.whole_batches(split, batch_size):
        s = task.whole_stats(model, batch, split)
        if weight:
            acc = s if acc is None else acc + s
    return {f"{split}_{k}": float(v) for k, v in task.summarize_whole(acc.tolist(), split).items()}


def _perfect(metric: str) -> float:
    if "accuracy" in metric:
        return 1.0
    if metric in ("loss", "rmse") or metric.endswith("loss"):
        return 0.0
    raise ValueError(f"no perfect score known for metric {metric!r}")


def chance_level(res_or_task, metric: str, split: str = "val", min_gain: float = 0.1) -> Chance:
    """The :class:`~cemlib.evidence.verdict.Chance` of ``metric`` on ``split`` for a stored run (its
    recorded configuration rebuilds the task) or a task."""
    if isinstance(res_or_task, Task):
        task = res_or_task
    else:
        from cemlib.train.config import ExperimentConfig
        from cemlib.train.datasets import make_task
        task = make_task(ExperimentConfig.from_dict(res_or_task["config"]))
    value = chance_metrics(task, split)[f"{split}_{metric}"]
    if not math.isfinite(value):
        raise ValueError(f"the trivial predictor's {split}_{metric} is not finite: {value}")
    how = {"language_modelling": "the unigram distribution of the training split",
           "answer_prediction": "per output position, the training split's most frequent target",
           "token_classification": "per position, the training split's class frequencies",
           "classification": "the training split's class frequencies",
           "regression": "the mean training target"}[task.kind]
    return Chance(value=value, perfect=_perfect(metric), how=how, min_gain=min_gain)
