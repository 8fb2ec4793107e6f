"""Tasks: what varies between experiments -- the data splits, how a batch is fed, the loss, the metrics.

A :class:`Task` owns its splits (``train``, ``val`` and optionally ``test``), each a *batch
source* whose global batch ``n`` is a pure function of ``(seed, n)`` (so the data position a
checkpoint saves is the step counter, and DDP cuts the same global batch into micro-batches).
The :class:`~cemlib.train.trainer.Trainer` calls only:

- ``task.loss(model, batch)`` -- the mean training loss of one micro-batch;
- ``task.eval_batches(split, size, rank, world)`` and ``task.eval_stats(model, batch)`` -- the
  batches of a split this process evaluates and their *sums* (summed over processes), turned into
  metrics by ``task.summarize(sums)``.

Kinds (each checks its data and the model's output shape, with errors that say what is wrong):

- :class:`LanguageModelTask` -- next-token prediction on a token stream (tiny Shakespeare);
  metric ``loss`` (nats/token) on ``eval_batches`` random windows, as before this module existed.
- :class:`AnswerTask` -- next-token prediction scored on chosen positions only (ListOps, NRGPT
  §3.2; LIS, Transformers-as-intrinsic-optimizers App. A.9): ``targets`` hold ``-100`` where no
  loss is taken; metrics ``loss``, ``token_accuracy`` and ``accuracy`` (every scored token of the
  row right, teacher-forced), and with ``greedy=True`` also ``greedy_accuracy`` on the test
  split (the answer generated token by token from the prompt, as LIS is scored).
- :class:`RegressionTask` -- vectors to vectors with MSE (CEM Table 3); metrics ``loss`` (MSE)
  and ``rmse``.
- :class:`TokenClassificationTask` -- one class per position (Sudoku, Hyper-SET §5.1): loss on
  every position or on the masked ones only; metrics ``loss``, ``cell_accuracy`` (masked
  positions) and ``board_accuracy`` (every masked position of the example right).
- :class:`ClassificationTask` -- one class per example (digits as patches, CIFAR-10); metrics
  ``loss`` and ``accuracy``.

Fixed datasets are served by :class:`ExampleBatches`: epochs of seeded permutations for training
and the whole split, in order, for evaluation (the ``train`` split is evaluated on a fixed
subset of ``eval_batches`` batches, or all of it if smaller).
"""

from __future__ import annotations

import hashlib
import json
import math

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from cemlib.train.batches import DataMismatchError, TokenBatches

__all__ = ["Task", "ExampleBatches", "LanguageModelTask", "AnswerTask", "RegressionTask",
           "TokenClassificationTask", "ClassificationTask", "TaskDataError", "IGNORE_INDEX", "lm_loss",
           "tensors_sha256"]

IGNORE_INDEX = -100


class TaskDataError(ValueError):
    """A task's data or a model's output does not have the shape, type or range the task needs."""


def _checksum(t: torch.Tensor) -> float:
    flat = t.reshape(-1)
    return float(flat[:: max(1, flat.numel() // 4096)].double().sum())


def tensors_sha256(*tensors: torch.Tensor) -> str:
    """SHA-256 over the dtype, shape and bytes of ``tensors`` (what a checkpoint records of its
    data, so that resuming on other data is found)."""
    h = hashlib.sha256()
    for t in tensors:
        t = t.detach().to("cpu").contiguous()
        h.update(f"{t.dtype}{tuple(t.shape)};".encode())
        if t.numel():
            h.update(t.reshape(-1).view(torch.uint8).numpy())
    return h.hexdigest()


# ------------------------------------------------------------------------------ batch sources
class ExampleBatches:
    """Global batch ``n`` of a fixed dataset: rows ``n*B .. (n+1)*B - 1`` of an endless sequence of
    epochs, epoch ``e`` being the permutation drawn from NumPy's generator seeded with
    ``[seed, e]``. ``tensors`` share their first dimension (the examples)."""

    def __init__(self, tensors: tuple[torch.Tensor, ...], seed: int = 0, name: str = "train"):
        if not tensors or not all(isinstance(t, torch.Tensor) for t in tensors):
            raise TaskDataError(f"{name}: expected a tuple of tensors, got {type(tensors).__name__}")
        n = tensors[0].shape[0] if tensors[0].dim() else 0
        if n == 0:
            raise TaskDataError(f"the {name} split is empty (0 examples)")
        for t in tensors:
            if t.dim() == 0 or t.shape[0] != n:
                raise TaskDataError(f"{name}: tensors disagree on the number of examples: "
                                    f"{[tuple(t.shape) for t in tensors]}")
        if isinstance(seed, bool) or not isinstance(seed, int) or seed < 0:
            raise ValueError(f"seed must be a non-negative integer, got {seed!r}")
        self.tensors, self.n, self.seed, self.name = tuple(tensors), n, seed, name
        self._perm_cache: tuple[int, np.ndarray] | None = None

    def __len__(self) -> int:
        return self.n

    def _perm(self, epoch: int) -> np.ndarray:
        if self._perm_cache is None or self._perm_cache[0] != epoch:
            self._perm_cache = (epoch, np.random.default_rng([self.seed, epoch]).permutation(self.n))
        return self._perm_cache[1]

    def indices(self, n: int, batch_size: int) -> torch.Tensor:
        """Example indices of global batch ``n``."""
        if n < 0:
            raise ValueError(f"batch index must be >= 0, got {n}")
        pos = np.arange(n * batch_size, (n + 1) * batch_size, dtype=np.int64)
        out = np.empty(batch_size, dtype=np.int64)
        for epoch in np.unique(pos // self.n):
            sel = pos // self.n == epoch
            out[sel] = self._perm(int(epoch))[pos[sel] % self.n]
        return torch.from_numpy(out)

    def take(self, idx: torch.Tensor) -> tuple[torch.Tensor, ...]:
        return tuple(t[idx] for t in self.tensors)

    def batch(self, n: int, batch_size: int) -> tuple[torch.Tensor, ...]:
        return self.take(self.indices(n, batch_size))

    def micro_batch(self, n: int, batch_size: int, m: int, size: int) -> tuple[torch.Tensor, ...]:
        if size * (m + 1) > batch_size:
            raise ValueError(f"micro-batch {m} of size {size} exceeds the global batch {batch_size}")
        return self.take(self.indices(n, batch_size)[m * size:(m + 1) * size])

    def state_dict(self) -> dict:
        return {"name": self.name, "n_examples": self.n, "seed": self.seed,
                "checksum": [_checksum(t) for t in self.tensors]}

    def check_state(self, state: dict) -> None:
        for key, value in self.state_dict().items():
            if state.get(key) != value:
                raise DataMismatchError(f"checkpoint data {key} = {state.get(key)!r} but the current "
                                        f"{self.name} split has {key} = {value!r}")


# ------------------------------------------------------------------------------ base class
class Task:
    """Base class. Subclasses set ``kind``, ``metric_names``, ``primary`` (metric, "min"/"max")
    and implement :meth:`loss` and :meth:`eval_stats`; ``info`` is what model factories read
    (``vocab_size``, ``context_length``, ``n_classes``, ``in_dim``, ...)."""

    kind = "task"
    metric_names: tuple[str, ...] = ("loss",)
    primary: tuple[str, str] = ("loss", "min")

    def __init__(self, splits: dict, info: dict, tokens_per_example: int, eval_batches: int = 10):
        for required in ("train", "val"):
            if required not in splits:
                raise TaskDataError(f"a {self.kind} task needs a {required!r} split; got {sorted(splits)}")
        self.splits, self.info = splits, dict(info)
        self.tokens_per_example, self.eval_batches_n = int(tokens_per_example), int(eval_batches)

    @property
    def train(self):
        return self.splits["train"]

    @property
    def eval_splits(self) -> tuple[str, ...]:
        return tuple(s for s in ("train", "val", "test") if s in self.splits)

    def data_hashes(self) -> dict:
        """SHA-256 hashes of every split's data and of the vocabulary (``None`` where the task has
        none), computed once: a checkpoint records them, and a resume on other data is refused."""
        if getattr(self, "_hashes", None) is None:
            out = {}
            for name, data in self.splits.items():
                tensors = (data.tokens,) if hasattr(data, "tokens") else tuple(getattr(data, "tensors", ()))
                out[name] = tensors_sha256(*tensors) if tensors else None
            tok = self.info.get("tokenizer")
            out["vocabulary"] = (hashlib.sha256(json.dumps(tok, sort_keys=True).encode()).hexdigest()
                                 if tok is not None else None)
            self._hashes = out
        return self._hashes

    def describe(self) -> dict:
        """What a results file records about the task."""
        return {"kind": self.kind, "primary_metric": self.primary[0], "primary_mode": self.primary[1],
                "splits": {s: (len(d) if hasattr(d, "__len__") else None) for s, d in self.splits.items()},
                "info": self.info, "tokens_per_example": self.tokens_per_example}

    # -- evaluation over fixed datasets: the whole split in order (train: a fixed subset)
    def eval_batches(self, split: str, size: int, rank: int = 0, world: int = 1,
                     n_batches: int | None = None):
        """``(weight, batch)`` pairs this process evaluates; every process gets the same count
        (FSDP needs matching collectives), padding with weight-0 repeats. The train split is
        evaluated on a fixed random subset of ``n_batches`` batches of ``size * world`` examples
        (default: the task's count), the same subset for any number of processes."""
        data = self.splits[split]
        if split == "train":
            n = self.eval_batches_n if n_batches is None else n_batches
            order = torch.from_numpy(np.random.default_rng([data.seed, 2 ** 31 - 1]).permutation(data.n))
            order = order[: min(data.n, n * size * world)]
        else:
            order = torch.arange(data.n)
        chunks = list(torch.split(order, size))
        per_rank = math.ceil(len(chunks) / world)
        for j in range(per_rank):
            i = rank + world * j
            yield (1.0, data.take(chunks[i])) if i < len(chunks) else (0.0, data.take(chunks[0]))

    # -- the final evaluation on a whole split, and what each evaluation estimates
    #: whether the periodic evaluation of ``val`` already covers the whole split (fixed datasets:
    #: yes; token streams: no, it samples ``eval_batches`` batches of random windows)
    val_eval_is_whole = True

    def whole_batches(self, split: str, size: int, rank: int = 0, world: int = 1):
        """``(weight, batch)`` pairs covering the whole ``split`` once (as :meth:`eval_batches`)."""
        n = self.splits[split].n if split == "train" else None
        return self.eval_batches(split, size, rank, world,
                                 None if n is None else math.ceil(n / size))

    def whole_stats(self, model: nn.Module, batch, split: str | None = None) -> torch.Tensor:
        """Sums over a batch of :meth:`whole_batches`, read by :meth:`summarize_whole`."""
        return self.eval_stats(model, batch, split)

    def summarize_whole(self, sums: list[float], split: str | None = None) -> dict:
        return self.summarize(sums, split)

    def estimate(self, split: str, size: int, whole: bool = False) -> str:
        """In words, what a metric of ``split`` is computed on (recorded in the results)."""
        data = self.splits[split]
        n = len(data) if hasattr(data, "__len__") else None
        if whole or split != "train":
            return f"the whole {split} split ({n} examples)"
        k = min(n, self.eval_batches_n * size)
        return f"a fixed subset of {k} of the {n} {split} examples"

    def loss(self, model: nn.Module, batch) -> torch.Tensor:
        raise NotImplementedError

    def eval_stats(self, model: nn.Module, batch, split: str | None = None) -> torch.Tensor:
        """Sums over the batch as one float64 vector, in the order :meth:`summarize` reads them."""
        raise NotImplementedError

    def summarize(self, sums: list[float], split: str | None = None) -> dict:
        raise NotImplementedError


def _check_logits(out: torch.Tensor, shape: tuple, what: str) -> None:
    if not isinstance(out, torch.Tensor) or tuple(out.shape[:-1]) != tuple(shape):
        got = tuple(out.shape) if isinstance(out, torch.Tensor) else type(out).__name__
        raise TaskDataError(f"the model must map inputs to {what} [{', '.join(map(str, shape))}, C]; "
                            f"got {got}")


def _check_labels(y: torch.Tensor, n_classes: int, name: str, ignore: bool = False) -> None:
    if y.is_floating_point() or y.is_complex():
        raise TaskDataError(f"{name} must be integer class labels, got dtype {y.dtype}")
    valid = y[y != IGNORE_INDEX] if ignore else y
    if valid.numel() and (int(valid.min()) < 0 or int(valid.max()) >= n_classes):
        raise TaskDataError(f"{name} must lie in 0..{n_classes - 1}"
                            f"{' (or -100 = ignored)' if ignore else ''}; found values in "
                            f"{int(valid.min())}..{int(valid.max())}")


def lm_loss(model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """Mean next-token cross-entropy of ``model(x)`` (logits ``[B, L, V]``) against ``y``."""
    logits = model(x)
    if logits.dim() != 3 or logits.shape[:2] != x.shape:
        raise TaskDataError(f"model must map idx {tuple(x.shape)} to logits [B, L, V], got {tuple(logits.shape)}")
    return F.cross_entropy(logits.float().reshape(-1, logits.shape[-1]), y.reshape(-1))


def _f64(*values) -> torch.Tensor:
    """Scalars (tensors on any one device, or Python numbers) as one float64 vector on that device."""
    dev = next((v.device for v in values if isinstance(v, torch.Tensor)), torch.device("cpu"))
    return torch.stack([torch.as_tensor(v, device=dev).detach().double().reshape(()) for v in values])


# ------------------------------------------------------------------------------ language modelling
class LanguageModelTask(Task):
    """Next-token prediction on token streams: ``train`` and ``val`` (and optionally ``test``)
    :class:`~cemlib.train.batches.TokenBatches` of random windows. Evaluation: ``eval_batches`` fixed
    random windows per split, the loss averaged over batches; the train split is evaluated on its
    own stream seeded ``train.seed + 1``. ``tokenizer``: what decodes the ids (e.g.
    :meth:`cemlib.data.shakespeare.CharTokenizer.to_dict`), kept in ``info["tokenizer"]`` so that
    results files and checkpoints can be decoded without the text (``cemlib generate``)."""

    kind = "language_modelling"
    metric_names = ("loss",)

    def __init__(self, train: TokenBatches, val: TokenBatches, vocab_size: int | None = None,
                 eval_batches: int = 10, test: TokenBatches | None = None, tokenizer: dict | None = None):
        splits = {"train": train, "val": val, **({"test": test} if test is not None else {})}
        for name, data in splits.items():
            if not isinstance(data, TokenBatches):
                raise TaskDataError(f"the {name} split of a language-modelling task must be "
                                    f"TokenBatches, got {type(data).__name__}")
            if data.context_length != train.context_length:
                raise TaskDataError(f"{name} windows have context_length {data.context_length}, "
                                    f"train has {train.context_length}")
        if vocab_size is None:  # only informative: the model defines its vocabulary
            vocab_size = 1 + max(int(d.tokens.max()) for d in splits.values())
        for name, data in splits.items():
            _check_labels(data.tokens, vocab_size, f"{name} tokens")
        info = {"vocab_size": vocab_size, "context_length": train.context_length}
        if tokenizer is not None:
            chars = tokenizer.get("chars") if isinstance(tokenizer, dict) else None
            if chars is not None and len(chars) != vocab_size:
                raise TaskDataError(f"the tokenizer has {len(chars)} characters, the task {vocab_size} "
                                    f"token ids")
            info["tokenizer"] = dict(tokenizer)
        super().__init__(splits, info, train.context_length, eval_batches)
        self._train_eval = TokenBatches(train.tokens, train.context_length, seed=train.seed + 1,
                                        name=train.name + "-eval")

    def eval_batches(self, split, size, rank=0, world=1, n_batches=None):
        """Batches ``0 .. n-1`` of ``size * world`` random windows each, the sample one process
        evaluates with the same global batch; under torchrun each process takes its ``size`` rows
        of every batch (the mean over equal parts is the batch mean), so the sample does not
        depend on the number of processes."""
        data = self._train_eval if split == "train" else self.splits[split]
        n = self.eval_batches_n if n_batches is None else n_batches
        for j in range(n):
            yield 1.0, data.micro_batch(j, size * world, rank, size)


    def loss(self, model, batch):
        return lm_loss(model, *batch)

    def eval_stats(self, model, batch, split=None):
        return _f64(self.loss(model, batch), 1.0)

    def summarize(self, sums, split=None):
        return {"loss": sums[0] / sums[1]}

    val_eval_is_whole = False

    def whole_batches(self, split, size, rank=0, world=1):
        """Every next-token target of the ``split`` stream exactly once: consecutive
        non-overlapping windows of ``context_length`` inputs, then one window ending at the last
        token whose already-scored targets are masked with ``-100``. Every process gets the same
        number of batches (weight-0 repeats pad)."""
        data = self.splits[split]
        tokens, C = data.tokens, data.context_length
        n_targets = tokens.numel() - 1
        starts = torch.arange(0, n_targets - C + 1, C)
        idx = starts[:, None] + torch.arange(C + 1)
        w = tokens[idx]
        x, y = w[:, :-1], w[:, 1:].clone()
        covered = starts.numel() * C
        if covered < n_targets:  # the tail: a window ending at the last token
            tail = tokens[n_targets - C:]
            ty = tail[1:].clone()
            ty[: C - (n_targets - covered)] = IGNORE_INDEX
            x, y = torch.cat([x, tail[None, :-1]]), torch.cat([y, ty[None]])
        chunks = list(zip(torch.split(x, size), torch.split(y, size)))
        per_rank = math.ceil(len(chunks) / world)
        for j in range(per_rank):
            i = rank + world * j
            yield (1.0, chunks[i]) if i < len(chunks) else (0.0, chunks[0])

    def whole_stats(self, model, batch, split=None):
        x, y = batch
        logits = model(x)
        if logits.dim() != 3 or logits.shape[:2] != x.shape:
            raise TaskDataError(f"model must map idx {tuple(x.shape)} to logits [B, L, V], got "
                                f"{tuple(logits.shape)}")
        ce = F.cross_entropy(logits.float().reshape(-1, logits.shape[-1]), y.reshape(-1),
                             ignore_index=IGNORE_INDEX, reduction="sum")
        return _f64(ce, (y != IGNORE_INDEX).sum())

    def summarize_whole(self, sums, split=None):
        return {"loss": sums[0] / sums[1]}

    def estimate(self, split, size, whole=False):
        data = self.splits[split]
        C = data.context_length
        if whole:
            return (f"the whole {split} split: each of its {data.tokens.numel() - 1} next-token "
                    f"targets once, in non-overlapping windows of {C} tokens")
        return (f"a sample: {self.eval_batches_n} fixed batches of {size} random windows of {C} "
                f"tokens of the {split} split (the mean of the per-batch losses)")


# ------------------------------------------------------------------------------ answer prediction
class AnswerTask(Task):
    """Next-token prediction scored where ``targets != -100`` (ListOps, LIS).

    ``inputs`` and ``targets``: int64 ``(N, T)``; ``targets[i, t]`` is the token that should follow
    ``inputs[i, :t+1]`` or ``-100``. ``answer_mask`` (bool ``(N, T)``, default ``targets !=
    -100``) selects the positions the accuracies score, so the loss may cover more (e.g. every
    next token) than the answer. ``greedy=True`` adds ``greedy_accuracy`` on the test split: every
    output position (``targets != -100``) is generated left to right, each prediction fed back as
    the next input, and the ``answer_mask`` positions are scored (for a single answer token it
    equals ``accuracy``).
    """

    kind = "answer_prediction"
    primary = ("accuracy", "max")

    def __init__(self, splits: dict, vocab_size: int, seed: int, eval_batches: int = 10,
                 greedy: bool = False):
        made = {}
        for name, arrays in splits.items():
            x, y = arrays[0], arrays[1]
            mask = arrays[2] if len(arrays) > 2 else (y != IGNORE_INDEX)
            if x.dim() != 2 or y.shape != x.shape or mask.shape != x.shape:
                raise TaskDataError(f"{name}: inputs, targets and answer_mask must all be (N, T); got "
                                    f"{tuple(x.shape)}, {tuple(y.shape)}, {tuple(mask.shape)}")
            _check_labels(x, vocab_size, f"{name} inputs")
            _check_labels(y, vocab_size, f"{name} targets", ignore=True)
            if mask.dtype != torch.bool:
                raise TaskDataError(f"{name} answer_mask must be bool, got {mask.dtype}")
            if bool((mask & (y == IGNORE_INDEX)).any()):
                raise TaskDataError(f"{name}: answer_mask selects positions whose target is -100")
            if x.shape[0] and not bool(mask.any(1).all()):
                raise TaskDataError(f"{name}: every example needs at least one scored position")
            made[name] = ExampleBatches((x.long(), y.long(), mask), seed=seed + len(made), name=name)
        T = made["train"].tensors[0].shape[1]
        super().__init__(made, {"vocab_size": vocab_size, "context_length": T}, T, eval_batches)
        self.greedy = bool(greedy)
        self.metric_names = ("loss", "token_accuracy", "accuracy") + (("greedy_accuracy",) if greedy else ())

    def _greedy_on(self, split) -> bool:
        """Greedy decoding costs one forward pass per generated token: it runs on the test split
        only (the paper's test metric); model selection on val uses the teacher-forced accuracy."""
        return self.greedy and split == "test"

    def _logits(self, model, x):
        logits = model(x)
        _check_logits(logits, tuple(x.shape), "logits")
        return logits

    def loss(self, model, batch):
        x, y, _ = batch
        logits = self._logits(model, x)
        return F.cross_entropy(logits.float().reshape(-1, logits.shape[-1]), y.reshape(-1),
                               ignore_index=IGNORE_INDEX)


    def eval_stats(self, model, batch, split=None):
        x, y, mask = batch
        logits = self._logits(model, x).float()
        ce = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), y.reshape(-1),
                             ignore_index=IGNORE_INDEX, reduction="sum")
        hit = (logits.argmax(-1) == y) | ~mask
        stats = [ce, (y != IGNORE_INDEX).sum(), (hit & mask).sum(), mask.sum(), hit.all(1).sum(),
                 x.shape[0]]
        if self._greedy_on(split):
            stats.append(self.greedy_correct(model, x, y, mask).sum())
        return _f64(*stats)

    @torch.no_grad()
    def greedy_correct(self, model, x, y, mask) -> torch.Tensor:
        """Per row: are all scored tokens right when every output token (``y != -100``) is
        generated from the model's own earlier predictions (greedy decoding)?"""
        x = x.clone()
        ok = torch.ones(x.shape[0], dtype=torch.bool, device=x.device)
        gen = y != IGNORE_INDEX  # every output position is generated; ``mask`` ones are scored
        for t in torch.nonzero(gen.any(0)).flatten().tolist():
            pred = self._logits(model, x[:, : t + 1])[:, t].argmax(-1)
            ok &= ~mask[:, t] | (pred == y[:, t])
            if t + 1 < x.shape[1]:
                x[:, t + 1] = torch.where(gen[:, t], pred, x[:, t + 1])
        return ok

    def summarize(self, s, split=None):
        out = {"loss": s[0] / s[1], "token_accuracy": s[2] / s[3], "accuracy": s[4] / s[5]}
        if self._greedy_on(split):
            out["greedy_accuracy"] = s[6] / s[5]
        return out


# ------------------------------------------------------------------------------ regression
class RegressionTask(Task):
    """``x`` float ``(N, d_in)`` -> ``y`` float ``(N, d_out)``, mean squared error (CEM Table 3)."""

    kind = "regression"
    metric_names = ("loss", "rmse")
    primary = ("rmse", "min")

    def __init__(self, splits: dict, seed: int, eval_batches: int = 10, dtype=torch.float32):
        made = {}
        for name, (x, y) in splits.items():
            if not (x.is_floating_point() and y.is_floating_point()):
                raise TaskDataError(f"{name}: regression inputs and targets must be floating point, "
                                    f"got {x.dtype} and {y.dtype}")
            if x.dim() != 2 or y.dim() != 2:
                raise TaskDataError(f"{name}: x must be (N, d_in) and y (N, d_out); got "
                                    f"{tuple(x.shape)} and {tuple(y.shape)}")
            if not (torch.isfinite(x).all() and torch.isfinite(y).all()):
                raise TaskDataError(f"{name}: x and y must be finite")
            made[name] = ExampleBatches((x.to(dtype), y.to(dtype)), seed=seed + len(made), name=name)
        x0, y0 = made["train"].tensors
        for name, d in made.items():
            if d.tensors[0].shape[1:] != x0.shape[1:] or d.tensors[1].shape[1:] != y0.shape[1:]:
                raise TaskDataError(f"{name}: feature widths differ from the train split's")
        super().__init__(made, {"in_dim": x0.shape[1], "out_dim": y0.shape[1]}, 1, eval_batches)

    def _pred(self, model, x, y):
        out = model(x)
        if not isinstance(out, torch.Tensor) or out.shape != y.shape:
            raise TaskDataError(f"the model must map x {tuple(x.shape)} to predictions "
                                f"{tuple(y.shape)}; got {tuple(getattr(out, 'shape', ()))}")
        return out.float()

    def loss(self, model, batch):
        x, y = batch
        return F.mse_loss(self._pred(model, x, y), y.float())


    def eval_stats(self, model, batch, split=None):
        x, y = batch
        return _f64(((self._pred(model, x, y) - y.float()) ** 2).sum(), y.numel())

    def summarize(self, s, split=None):
        return {"loss": s[0] / s[1], "rmse": math.sqrt(s[0] / s[1])}


# ------------------------------------------------------------------------------ per-position classes
class TokenClassificationTask(Task):
    """``x`` ``(N, T)`` int tokens (or ``(N, T, d)`` floats) -> a class per position ``y`` ``(N, T)``.

    ``mask`` (bool ``(N, T)``) marks the positions the accuracies score (Sudoku: the blanks);
    ``loss_on="all"`` takes the loss on every position, ``"mask"`` on the marked ones only.
    """

    kind = "token_classification"
    metric_names = ("loss", "cell_accuracy", "board_accuracy")
    primary = ("cell_accuracy", "max")

    def __init__(self, splits: dict, n_classes: int, seed: int, eval_batches: int = 10,
                 loss_on: str = "all", vocab_size: int | None = None):
        if loss_on not in ("all", "mask"):
            raise TaskDataError(f"loss_on must be 'all' or 'mask', got {loss_on!r}")
        made = {}
        for name, (x, y, mask) in splits.items():
            if y.dim() != 2 or tuple(x.shape[:2]) != tuple(y.shape) or mask.shape != y.shape:
                raise TaskDataError(f"{name}: x must be (N, T[, d]), y and mask (N, T); got "
                                    f"{tuple(x.shape)}, {tuple(y.shape)}, {tuple(mask.shape)}")
            _check_labels(y, n_classes, f"{name} labels")
            if vocab_size is not None:
                _check_labels(x, vocab_size, f"{name} inputs")
            if mask.dtype != torch.bool:
                raise TaskDataError(f"{name} mask must be bool, got {mask.dtype}")
            made[name] = ExampleBatches((x, y.long(), mask), seed=seed + len(made), name=name)
        T = made["train"].tensors[1].shape[1]
        info = {"n_classes": n_classes, "n_positions": T}
        if vocab_size is not None:
            info["vocab_size"] = vocab_size
        super().__init__(made, info, T, eval_batches)
        self.n_classes, self.loss_on = n_classes, loss_on

    def _logits(self, model, x, y):
        logits = model(x)
        _check_logits(logits, tuple(y.shape), "per-position logits")
        if logits.shape[-1] != self.n_classes:
            raise TaskDataError(f"the model gives {logits.shape[-1]} classes, the task has {self.n_classes}")
        return logits.float()

    def _ce(self, logits, y, mask, reduction):
        target = y if self.loss_on == "all" else y.masked_fill(~mask, IGNORE_INDEX)
        return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), target.reshape(-1),
                               ignore_index=IGNORE_INDEX, reduction=reduction)

    def loss(self, model, batch):
        x, y, mask = batch
        return self._ce(self._logits(model, x, y), y, mask, "mean")


    def eval_stats(self, model, batch, split=None):
        x, y, mask = batch
        logits = self._logits(model, x, y)
        hit = logits.argmax(-1) == y
        n_loss = y.numel() if self.loss_on == "all" else mask.sum()
        return _f64(self._ce(logits, y, mask, "sum"), n_loss, (hit & mask).sum(), mask.sum(),
                    (hit | ~mask).all(1).sum(), y.shape[0])

    def summarize(self, s, split=None):
        return {"loss": s[0] / max(s[1], 1.0), "cell_accuracy": s[2] / max(s[3], 1.0),
                "board_accuracy": s[4] / s[5]}


# ------------------------------------------------------------------------------ classification
class ClassificationTask(Task):
    """``x`` ``(N, ...)`` (e.g. patches ``(N, P, d)``) -> one class ``y`` ``(N,)``."""

    kind = "classification"
    metric_names = ("loss", "accuracy")
    primary = ("accuracy", "max")

    def __init__(self, splits: dict, n_classes: int, seed: int, eval_batches: int = 10):
        made = {}
        for name, (x, y) in splits.items():
            if y.dim() != 1 or x.dim() < 2 or x.shape[0] != y.shape[0]:
                raise TaskDataError(f"{name}: x must be (N, ...) and y (N,); got {tuple(x.shape)} "
                                    f"and {tuple(y.shape)}")
            _check_labels(y, n_classes, f"{name} labels")
            if x.is_floating_point() and not bool(torch.isfinite(x).all()):
                raise TaskDataError(f"{name}: inputs must be finite")
            made[name] = ExampleBatches((x, y.long()), seed=seed + len(made), name=name)
        x0 = made["train"].tensors[0]
        info = {"n_classes": n_classes, "input_shape": tuple(x0.shape[1:])}
        if x0.dim() == 3:
            info.update(n_positions=x0.shape[1], patch_dim=x0.shape[2])
        super().__init__(made, info, x0.shape[1] if x0.dim() == 3 else 1, eval_batches)
        self.n_classes = n_classes

    def _logits(self, model, x):
        logits = model(x)
        _check_logits(logits, (x.shape[0],), "class logits")
        if logits.shape[-1] != self.n_classes:
            raise TaskDataError(f"the model gives {logits.shape[-1]} classes, the task has {self.n_classes}")
        return logits.float()

    def loss(self, model, batch):
        x, y = batch
        return F.cross_entropy(self._logits(model, x), y)


    def eval_stats(self, model, batch, split=None):
        x, y = batch
        logits = self._logits(model, x)
        return _f64(F.cross_entropy(logits, y, reduction="sum"), (logits.argmax(-1) == y).sum(), y.numel())

    def summarize(self, s, split=None):
        return {"loss": s[0] / s[2], "accuracy": s[1] / s[2]}
