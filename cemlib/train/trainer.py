"""The training loop every chapter uses, for any :class:`~cemlib.train.tasks.Task`.

``Trainer(model, task, cfg).fit()`` runs AdamW with warm-up + cosine, gradient clipping and
accumulation, bf16 (or fp16 with a gradient scaler, on GPUs without bf16) autocast and optional
``torch.compile`` on CUDA, DDP/FSDP under ``torchrun``, periodic evaluation of every split with
the task's metrics, checkpoints and NaN/Inf detection, and returns the results dictionary (also
written to ``out_dir/results.json``). One optimiser step consumes global batch ``step`` of the
task's train split, so the data position is the step counter.

Under misuse: ``out_dir`` is created and proved writable before the first step, and held by one
writer at a time (:func:`~cemlib.train.folders.out_dir_lock`); SIGINT / SIGTERM (Ctrl-C) finish the
current step (or stop the final evaluation), save a checkpoint and the results so far, and raise
:class:`TrainingInterrupted` (the command line exits with 128 + the signal number); a NaN/Inf in
the loss, the gradients or a layer's own finite check, or parameters made non-finite by an update,
stop the run naming the step and the parameter, and ``last_good.pt`` (never holding a NaN/Inf)
keeps the state before that step; a learning rate too large for the parameters' dtype is refused
before the first step; wall time and tokens accumulate across resumes.

Besides ``results.json`` and the checkpoints, ``out_dir`` receives ``best.pt`` (the state at the
best evaluation after step 0 by the task's primary metric, e.g. ``val_accuracy``), ``train_log.csv`` and
``eval_log.csv`` (every logged step; ``elapsed_s`` is the training wall time) and, with
``log=("tensorboard",)`` and the ``tensorboard`` package installed (``pip install
cemlib[tensorboard]``), TensorBoard event files.

Checkpoints: the newest ``train.keep_checkpoints`` periodic ``ckpt_<step>.pt`` are kept (older ones
are deleted as new ones are written; ``0`` keeps all), ``last.pt`` holds the final step (no
``ckpt_<step>.pt`` is written for it), and where ``best.pt`` holds the same step as a periodic
checkpoint or ``last.pt`` the two names are one file on disk (a hard link, where the file system
has them). Each checkpoint records SHA-256 hashes of the data and the vocabulary; resuming on
other data (an edited text file) is refused, naming both. ``train.patience`` > 0 stops the run
early once that many evaluations in a row have not improved the primary metric
(``metrics["stopped_early"]`` says where; ``last.pt`` then holds that step and the run is
complete).
``Trainer(model, train, val, cfg)`` with two :class:`~cemlib.train.batches.TokenBatches` is language
modelling (the original form).
"""

from __future__ import annotations

import contextlib
import csv
import json
import math
import os
import re
import signal
import sys
import threading
import time
import warnings
from datetime import datetime, timezone
from pathlib import Path
from typing import Callable

import torch
import torch.nn.functional as F
from torch import nn
from tqdm.auto import tqdm

from cemlib.train import checkpoint as ckpt
from cemlib.train.config import ExperimentConfig, micro_batch_size, resolve_precision, uses_cuda_graphs
from cemlib.train.batches import TokenBatches
from cemlib.train.tasks import LanguageModelTask, Task, lm_loss  # lm_loss: re-exported
from cemlib.train.config import ConfigError
from cemlib.train.distributed import (DistInfo, all_reduce_mean, init_distributed, resolve_device, unwrap_model,
                                      wrap_model)
from cemlib.train.flops import forward_flops_per_token, mfu, stated_peak_tflops
from cemlib.train.optim import make_optimizer, make_scheduler
from cemlib.train.results import SCHEMA, environment_info, git_commit, save_results
from cemlib.train.folders import out_dir_lock, run_id
from cemlib.train.datasets import data_label, recorded_config
from cemlib.utils import seed_everything

__all__ = ["Trainer", "NonFiniteError", "TrainingInterrupted", "lm_loss", "choose_precision",
           "prepare_out_dir"]

# the message of cemlib.utils.check_tensor when a layer's own finite check finds NaN/Inf
_LAYER_NONFINITE = re.compile(r"contains \d+ NaN/Inf value\(s\)")


class _EvaluationStopped(Exception):
    """A signal arrived during a periodic evaluation (the loop then saves and stops)."""


class NonFiniteError(FloatingPointError):
    """Loss or gradients became NaN/Inf; the message names the step and the first parameter."""


class TrainingInterrupted(KeyboardInterrupt):
    """SIGINT or SIGTERM stopped :meth:`Trainer.fit` after a step; ``checkpoint`` and ``results``
    are the files written (``None`` without ``out_dir``), ``signum`` the signal."""

    def __init__(self, message: str, signum: int, step: int, checkpoint: Path | None,
                 results: Path | None):
        super().__init__(message)
        self.signum, self.step, self.checkpoint, self.results = signum, step, checkpoint, results


def prepare_out_dir(out_dir: str | Path) -> Path:
    """Create ``out_dir`` and prove that a file can be written in it (so an unusable ``--out``
    fails before any training step, not after the last), and remove the ``.tmp`` files an
    interrupted write left there. Raises ``NotADirectoryError`` / ``PermissionError`` /
    ``OSError`` with a one-line message naming the folder."""
    out_dir = Path(out_dir)
    if out_dir.exists() and not out_dir.is_dir():
        raise NotADirectoryError(f"out_dir must be a folder (it receives results.json and "
                                 f"checkpoints), but {out_dir} is a file")
    try:
        out_dir.mkdir(parents=True, exist_ok=True)
    except (FileExistsError, NotADirectoryError):
        blocker = next((q for q in out_dir.parents if q.exists() and not q.is_dir()), None)
        raise NotADirectoryError(f"out_dir {out_dir} cannot be created: {blocker} is a file, not a "
                                 f"folder") from None
    except OSError as err:
        raise OSError(err.errno, f"out_dir {out_dir} cannot be created: {err.strerror}") from None
    probe = out_dir / f".write-test-{os.getpid()}.tmp"
    try:
        with open(probe, "wb") as f:
            f.write(b"cemlib")
        probe.unlink()
    except OSError as err:
        with contextlib.suppress(OSError):
            probe.unlink()
        raise OSError(err.errno, f"out_dir {out_dir} is not writable ({ckpt.os_error_cause(err)}); results and "
                                 f"checkpoints could not be saved") from None
    ckpt.remove_stale_tmp(out_dir)
    return out_dir


def _completed(config: dict) -> dict:
    """A checkpoint's config dict with the fields added since it was written at their defaults
    (so that an older checkpoint still resumes); the dict itself where it cannot be read."""
    try:
        return ExperimentConfig.from_dict(config).to_dict()
    except ConfigError:
        return config


def resume_command(folder) -> str:
    """The command that continues the run in ``folder``: ``cemlib train --resume FOLDER``."""
    import shlex
    return f"cemlib train --resume {shlex.quote(str(folder))}"


def _clock(seconds: float) -> str:
    """``h:mm:ss`` for a duration in seconds."""
    seconds = int(max(0.0, seconds))
    return f"{seconds // 3600}:{seconds // 60 % 60:02d}:{seconds % 60:02d}"


def check_lr_fits(model: nn.Module, optim_cfg) -> None:
    """Refuse a peak learning rate whose AdamW step overflows the parameters' dtype: the first step
    multiplies by ``lr / (1 - beta1)`` (the bias correction), which must be a finite number of that
    dtype (torch would stop with "value cannot be converted to type float without overflow")."""
    factor = optim_cfg.lr / (1.0 - optim_cfg.beta1) if optim_cfg.beta1 < 1 else math.inf
    for dtype in {p.dtype for p in model.parameters() if p.requires_grad and p.is_floating_point()}:
        biggest = torch.finfo(dtype).max
        if not factor <= biggest:
            name = str(dtype).replace("torch.", "")
            raise ConfigError(f"optim.lr={optim_cfg.lr!r} is too large for {name} parameters: AdamW's first "
                              f"step multiplies by lr / (1 - beta1) = {factor:.3g}, beyond the largest {name} "
                              f"value {biggest:.3g}")


def _utc(t: float | None) -> str | None:
    return None if t is None else datetime.fromtimestamp(t, timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


class _CSVLog:
    """One metric log (``train_log.csv`` or ``eval_log.csv``): a header, then one row per logged
    step with its ``elapsed_s`` (training wall time), flushed as written. Opening it rewrites it
    from ``rows`` (the history so far), keeping the elapsed times an earlier segment logged."""

    def __init__(self, path: Path, rows: list[dict]):
        elapsed = {}
        if path.is_file():
            with contextlib.suppress(OSError, csv.Error, KeyError, UnicodeDecodeError):
                with open(path, newline="") as f:
                    elapsed = {r["step"]: r.get("elapsed_s", "") for r in csv.DictReader(f)}
        self.f = open(path, "w", newline="")
        self.writer = None
        for r in rows:
            self.write(r, elapsed.get(str(r["step"]), ""))

    def write(self, row: dict, elapsed) -> bool:
        """Append ``row``; ``False`` if the disk refused it."""
        try:
            if self.writer is None:
                self.writer = csv.DictWriter(self.f, fieldnames=[*row, "elapsed_s"], restval="",
                                             extrasaction="ignore")
                self.writer.writeheader()
            self.writer.writerow({**row, "elapsed_s": elapsed if isinstance(elapsed, str) else f"{elapsed:.3f}"})
            self.f.flush()
            return True
        except OSError:
            return False

    def close(self) -> None:
        self.f.close()


def _tensorboard_writer_class():
    """``torch.utils.tensorboard.SummaryWriter``, or ``None`` when the tensorboard package is absent."""
    try:
        from torch.utils.tensorboard import SummaryWriter
    except ImportError:
        return None
    return SummaryWriter


def choose_precision(precision: str, device: torch.device) -> str:
    """:func:`~cemlib.train.config.resolve_precision` with this machine's bf16 capability."""
    bf16_ok = device.type == "cuda" and torch.cuda.is_bf16_supported()
    return resolve_precision(precision, device.type, bf16_ok)


class Trainer:
    """Train ``model`` on ``task`` as ``cfg`` says: ``Trainer(model, task, cfg)``, or
    ``Trainer(model, train_batches, val_batches, cfg)`` for language modelling.

    ``out_dir`` receives ``results.json``, periodic checkpoints ``ckpt_<step>.pt``, ``last.pt`` at
    the end and ``last_good.pt`` when a NaN/Inf stops the run. ``command`` is recorded in the
    results as the exact reproduce command. ``strategy`` is ``"ddp"`` or ``"fsdp"`` under torchrun.
    ``loss_fn(model, *batch)``, if given, replaces the task's training loss (not its metrics).
    ``started_at`` (``time.time()``) is when the run began (process start or the
    :func:`~cemlib.train.run.run_experiment` call; default: now), for the start-up time in
    the results; ``notes`` are lines recorded in the results (e.g. a clamped warm-up).
    ``results_path`` is where the results go (default ``out_dir/results.json``; a grid run writes
    ``<out>/<run>.json`` beside its folder); ``extra`` holds entries added to the results (e.g. a
    grid's ``sweep``); ``log`` may hold ``"tensorboard"``.
    """

    def __init__(self, model: nn.Module, task: Task | TokenBatches, *args, out_dir: str | Path | None = None,
                 loss_fn: Callable | None = None, command: str | None = None, strategy: str = "ddp",
                 verbose: bool = True, started_at: float | None = None, notes: list[str] | None = None,
                 results_path: str | Path | None = None, extra: dict | None = None, log=()):
        if isinstance(task, TokenBatches) and len(args) == 2 and isinstance(args[0], TokenBatches):
            val, cfg = args
            task = LanguageModelTask(task, val, eval_batches=cfg.train.eval_batches)
        elif isinstance(task, Task) and len(args) == 1:
            cfg, = args
        else:
            raise TypeError("use Trainer(model, task, cfg) or Trainer(model, train_batches, "
                            "val_batches, cfg)")
        if not isinstance(cfg, ExperimentConfig):
            raise TypeError(f"cfg must be an ExperimentConfig, got {type(cfg).__name__}")
        self.task = task
        self.cfg, self.loss_fn, self.command, self.strategy = cfg, loss_fn, command, strategy
        self.out_dir = Path(out_dir) if out_dir is not None else None
        self.results_path = (Path(results_path) if results_path is not None else
                             self.out_dir / "results.json" if self.out_dir is not None else None)
        self.extra = dict(extra or {})
        unknown_logs = sorted(set(log) - {"csv", "tensorboard"})
        if unknown_logs:
            raise ConfigError(f"unknown log {unknown_logs}; known: csv (always), tensorboard")
        self.log = tuple(log)
        if self.out_dir is not None and self.out_dir.exists() and not self.out_dir.is_dir():
            # fail before training, not at the first checkpoint
            raise NotADirectoryError(f"out_dir must be a folder (it receives results.json and "
                                     f"checkpoints), but {self.out_dir} is a file")
        self.verbose = verbose
        self.started_at = time.time() if started_at is None else float(started_at)
        self.started_from = "Trainer construction" if started_at is None else "given start time"
        self.notes = list(notes or [])
        tc = cfg.train
        self.dist: DistInfo = init_distributed(resolve_device(tc.device))
        if self.out_dir is not None and self.dist.is_main:
            prepare_out_dir(self.out_dir)  # before any step: an unusable --out fails at once
        self.device = self.dist.device
        self.micro = micro_batch_size(tc, self.dist.world_size)
        self.train_data = task.train
        self.tokens_per_step = tc.batch_size * task.tokens_per_example
        self.precision = choose_precision(tc.precision, self.device)
        self.use_bf16 = self.precision == "bf16"
        # fp16 autocast needs loss scaling; bf16 and fp32 do not (the scaler is then a no-op)
        self.scaler = torch.amp.GradScaler("cuda", enabled=self.precision == "fp16")
        self.skipped_steps, self._skipped = 0, False
        check_lr_fits(model, cfg.optim)
        self.raw_model = model.to(self.device)
        self.forward_flops, self.flops_source = forward_flops_per_token(self.raw_model)
        self.num_parameters = sum(p.numel() for p in self.raw_model.parameters())
        self.model = wrap_model(self.raw_model, self.dist, strategy)  # before AdamW: FSDP swaps params
        self.ddp = self.model if isinstance(self.model, nn.parallel.DistributedDataParallel) else None
        self.optimizer = make_optimizer(self.raw_model, cfg.optim)
        self.scheduler = make_scheduler(self.optimizer, cfg.optim, tc.max_steps)
        # CUDA graphs (train.compile_mode "reduce-overhead" or "max-autotune"): each forward is
        # marked as a new step for PyTorch's graph trees (_step_begin)
        self._graphs = bool(tc.compile and self.device.type == "cuda" and uses_cuda_graphs(tc.compile_mode))
        if self._graphs and strategy == "fsdp" and self.dist.enabled:
            raise ConfigError(f"train.compile_mode={tc.compile_mode!r} replays CUDA graphs, which this trainer does "
                              "not support with FSDP; use compile_mode='default' or the DDP strategy")
        if tc.compile and self.device.type == "cuda":
            self.model = torch.compile(self.model, mode=None if tc.compile_mode == "default" else tc.compile_mode)
        elif tc.compile and self.dist.is_main:
            print("note: train.compile is honoured on CUDA only; running eagerly", file=sys.stderr)
        self.step, self.history, self.train_time, self.timed_tokens = 0, {"train": [], "eval": []}, 0.0, 0
        # wall time of the training loops and start-up of earlier segments (restored on resume)
        self._wall_done, self._startup_done, self._segments, self._first_start = 0.0, 0.0, 0, None
        self._t_loop: float | None = None
        self._signal: int | None = None
        self._whole_val: dict | None = None
        self._final_eval_s: float | None = None
        self._final_interrupted = False
        self._stopped_early: dict | None = None
        self._in_loop = False
        self._show_bar = False
        self._logs: dict = {}
        seed_everything(tc.seed + 1 + self.dist.rank)  # dropout stream, distinct per process

    # ----------------------------------------------------------------------------- helpers
    def _autocast(self):
        if self.precision in ("bf16", "fp16"):
            dtype = torch.bfloat16 if self.precision == "bf16" else torch.float16
            return torch.autocast(self.device.type, dtype=dtype)
        return contextlib.nullcontext()

    def _step_begin(self) -> None:
        """Before each forward of the compiled model under CUDA graphs: a new step for PyTorch's
        graph trees (the outputs of the previous replay may then be overwritten; the trainer has
        read them by then)."""
        if self._graphs:
            torch.compiler.cudagraph_mark_step_begin()

    def _loss(self, batch) -> torch.Tensor:
        self._step_begin()
        if self.loss_fn is not None:
            return self.loss_fn(self.model, *batch)
        return self.task.loss(self.model, batch)

    def _named_params(self):
        return list(unwrap_model(self.model).named_parameters())

    def _first_nonfinite(self, default: str = "no parameter (the loss itself)") -> str:
        def finite(t):  # FSDP holds DTensor shards: check the full tensor
            return bool(torch.isfinite(t.full_tensor() if hasattr(t, "full_tensor") else t).all())
        for name, p in self._named_params():
            if not finite(p.detach()):
                return f"parameter {name!r} (its values)"
        for name, p in self._named_params():
            if p.grad is not None and not finite(p.grad):
                return f"parameter {name!r} (its gradient)"
        return default

    def _wall_total(self) -> float:
        """Wall time of the training loops so far, all segments (resumes) together."""
        return self._wall_done + (time.perf_counter() - self._t_loop if self._t_loop is not None else 0.0)

    def _timing_state(self) -> dict:
        return {"train_time": self.train_time, "timed_tokens": self.timed_tokens,
                "wall_time_s": self._wall_total(), "startup_s": self._startup_done,
                "segments": self._segments, "start_utc": self._first_start}

    # ----------------------------------------------------------------------------- checkpoints
    def _state(self, rng: dict) -> dict:
        """Checkpoint payload (collective under DDP/FSDP: every process must call it)."""
        if self.strategy == "fsdp" and self.dist.enabled:
            from torch.distributed.checkpoint.state_dict import StateDictOptions, get_state_dict
            model_sd, optim_sd = get_state_dict(self.model, self.optimizer, options=StateDictOptions(
                full_state_dict=True, cpu_offload=True))
        else:
            model_sd, optim_sd = self.raw_model.state_dict(), self.optimizer.state_dict()
        rngs = [rng]
        if self.dist.enabled:
            rngs = [None] * self.dist.world_size
            torch.distributed.all_gather_object(rngs, rng)
        return {"format": ckpt.FORMAT, "step": self.step, "model": model_sd, "optimizer": optim_sd,
                "scheduler": self.scheduler.state_dict(), "rng": rngs,
                "data": {"position": self.step, "train": self.train_data.state_dict()},
                "scaler": self.scaler.state_dict(), "skipped_steps": self.skipped_steps,
                "config": self.cfg.to_dict(), "history": self.history,
                "world_size": self.dist.world_size, "timing": self._timing_state(), "run": self._run_info(),
                "data_sha256": self.task.data_hashes(), "stopped_early": self._stopped_early,
                # what the model reads and writes (vocabulary, context, classes), JSON-plain so the
                # file stays weights-only: ``cemlib generate`` decodes with it, no dataset needed
                "task": json.loads(json.dumps({"kind": self.task.kind, "info": self.task.info}))}

    def _run_info(self) -> dict:
        """What ``--resume FOLDER`` needs besides the config: the command, where the results go
        (relative to the checkpoint's folder) and the extra results entries."""
        results = None
        if self.results_path is not None and self.out_dir is not None:
            results = os.path.relpath(self.results_path, self.out_dir)
        return {"command": self.command, "results": results, "extra": self.extra}

    def save_checkpoint(self, path: str | Path, rng: dict | None = None) -> Path | None:
        """Write a checkpoint of the current state (every process calls; rank 0 writes)."""
        state = self._state(rng if rng is not None else ckpt.rng_state())
        if self.dist.is_main:
            ckpt.save_checkpoint(path, state)
        return Path(path)

    def load_checkpoint(self, path: str | Path) -> None:
        """Restore model, optimiser, scheduler, RNG, data position and history from ``path``."""
        payload = ckpt.load_checkpoint(path, map_location="cpu")
        diffs = ckpt.config_differences(_completed(payload["config"]), self.cfg.to_dict())
        if diffs:
            raise ckpt.CheckpointError(f"checkpoint {Path(path).name!r} was written by a different "
                                       f"configuration: " + "; ".join(diffs))
        self._check_data_hashes(payload, Path(path).name)
        self.train_data.check_state(payload["data"]["train"])
        ckpt.check_model_state(payload["model"], self.raw_model.state_dict(), Path(path).name)
        try:
            if self.strategy == "fsdp" and self.dist.enabled:
                from torch.distributed.checkpoint.state_dict import StateDictOptions, set_state_dict
                set_state_dict(self.model, self.optimizer, model_state_dict=payload["model"],
                               optim_state_dict=payload["optimizer"],
                               options=StateDictOptions(full_state_dict=True))
            else:
                self.raw_model.load_state_dict(payload["model"])
                self.optimizer.load_state_dict(payload["optimizer"])
            self.scheduler.load_state_dict(payload["scheduler"])
        except (RuntimeError, ValueError, KeyError) as err:
            raise ckpt.CheckpointError(f"checkpoint {Path(path).name!r} could not be restored: {err}") from err
        if payload.get("scaler"):
            self.scaler.load_state_dict(payload["scaler"])
        self.skipped_steps = int(payload.get("skipped_steps", 0))
        self.step = int(payload["step"])
        stopped = payload.get("stopped_early")
        # an early-stopped run is finished, unless its patience changed since
        self._stopped_early = stopped if stopped and stopped.get("patience") == self.cfg.train.patience else None
        self.history = payload.get("history", {"train": [], "eval": []})
        timing = payload.get("timing") or {}  # cumulative over the segments before this one
        self.train_time = float(timing.get("train_time", 0.0))
        self.timed_tokens = int(timing.get("timed_tokens", 0))
        self._wall_done = float(timing.get("wall_time_s", 0.0))
        self._startup_done = float(timing.get("startup_s", 0.0))
        self._segments = int(timing.get("segments", 0))
        self._first_start = timing.get("start_utc")
        rngs = payload["rng"]
        if len(rngs) == self.dist.world_size:
            ckpt.set_rng_state(rngs[self.dist.rank])
        else:  # a different number of processes: fresh, deterministic dropout streams
            seed_everything(self.cfg.train.seed + 1 + self.dist.rank + 7919 * self.step)

    def _check_data_hashes(self, payload: dict, name: str) -> None:
        """Refuse a checkpoint whose data (or vocabulary) hashes differ from this task's, naming
        both; checkpoints written before hashes were recorded are not checked here."""
        stored = payload.get("data_sha256")
        if not isinstance(stored, dict):
            return
        now = self.task.data_hashes()
        differ = [k for k in ("train", "val", "vocabulary") if stored.get(k) and now.get(k) and stored[k] != now[k]]
        if not differ:
            return
        d = self.cfg.data
        source = f"data.path={d.path!r}" if d.path else f"the {d.name!r} data (data.name)"

        def vocab(info):
            chars = ((info or {}).get("tokenizer") or {}).get("chars")
            return f"{len(chars)} characters" if isinstance(chars, str) else "a vocabulary"
        then_vocab = vocab((payload.get("task") or {}).get("info"))
        now_vocab = vocab(self.task.info)
        parts = [f"{'vocabulary' if k == 'vocabulary' else k + ' split'} SHA-256 {stored[k][:12]} in the checkpoint "
                 f"vs {now[k][:12]} now" for k in differ]
        raise ckpt.CheckpointError(
            f"checkpoint {name!r} was trained on other data than {source} holds now ({'; '.join(parts)}; "
            f"vocabulary: {then_vocab} then, {now_vocab} now): restore the data the run was trained on to "
            f"resume it, or start a new run without --resume")

    def _prune_checkpoints(self) -> None:
        """Delete all but the newest ``train.keep_checkpoints`` periodic ``ckpt_<step>.pt``."""
        keep = self.cfg.train.keep_checkpoints
        if self.out_dir is None or not self.dist.is_main or keep <= 0:
            return
        found = sorted((int(m.group(1)), q) for q in self.out_dir.glob("ckpt_*.pt")
                       if (m := re.match(r"^ckpt_(\d+)\.pt$", q.name)))
        for _, old in found[:-keep]:
            with contextlib.suppress(OSError):
                old.unlink()

    def _same_file(self, source: Path, other: Path) -> None:
        """Make ``other`` the same file as ``source`` (a hard link, replacing it atomically), so
        one step is stored once; where the file system has no hard links, the copy stays."""
        if not self.dist.is_main or not source.is_file() or not other.is_file():
            return
        tmp = ckpt.tmp_name(other)
        try:
            os.link(source, tmp)
            os.replace(tmp, other)
        except OSError:
            with contextlib.suppress(OSError):
                tmp.unlink()

    # ----------------------------------------------------------------------------- evaluation
    @torch.no_grad()
    def evaluate(self) -> dict:
        """The task's metrics on each split (``train_loss``, ``val_accuracy``, ...): sums over the
        split's evaluation batches, added up across processes, then divided."""
        self.model.eval()
        out, world = {}, self.dist.world_size
        for split in self.task.eval_splits:
            batches = self.task.eval_batches(split, self.micro, self.dist.rank, world, self.cfg.train.eval_batches)
            sums = self._summed_stats(batches, lambda b: self.task.eval_stats(self.model, b, split))
            for name, value in self.task.summarize(sums, split).items():
                out[f"{split}_{name}"] = value
        self.model.train()
        return out

    # ----------------------------------------------------------------------------- one step
    def train_step(self) -> tuple[float, float]:
        """One optimiser step on global batch ``self.step``; returns ``(loss, grad_norm)``."""
        tc, accum = self.cfg.train, self.cfg.train.grad_accum
        self._skipped = False
        total = torch.zeros((), device=self.device)
        for a in range(accum):
            m = self.dist.rank * accum + a
            batch = self.train_data.micro_batch(self.step, tc.batch_size, m, self.micro)
            batch = tuple(t.to(self.device, non_blocking=True) for t in batch)
            sync_now = a == accum - 1 or self.ddp is None  # DDP: all-reduce on the last micro-step
            with contextlib.nullcontext() if sync_now else self.ddp.no_sync():
                with self._autocast():
                    loss = self._loss(batch)
                self.scaler.scale(loss / accum).backward()
            total += loss.detach().float()
        loss_mean = all_reduce_mean(total / accum, self.dist)
        params = [p for p in self.raw_model.parameters() if p.grad is not None]
        if self.scaler.is_enabled():
            self.scaler.unscale_(self.optimizer)  # true gradients before measuring and clipping
        gnorm = nn.utils.get_total_norm([p.grad for p in params])  # measured before any clipping
        gnorm_full = gnorm.full_tensor() if hasattr(gnorm, "full_tensor") else gnorm
        loss_val, gnorm_val = torch.stack([loss_mean, gnorm_full.float().to(self.device)]).tolist()
        if self.scaler.is_enabled() and math.isfinite(loss_val) and not math.isfinite(gnorm_val):
            # fp16 overflow in the backward pass: the scaler skips this update and lowers its scale
            self.scaler.step(self.optimizer)
            self.scaler.update()
            self.optimizer.zero_grad(set_to_none=True)
            with warnings.catch_warnings():  # the schedule follows the step counter, skipped or not
                warnings.filterwarnings("ignore", message=r"Detected call of `lr_scheduler.step\(\)`")
                self.scheduler.step()
            self.skipped_steps += 1
            self._skipped = True
            return loss_val, gnorm_val
        if not (math.isfinite(loss_val) and math.isfinite(gnorm_val)):
            return loss_val, gnorm_val  # grads untouched, so the offending parameter can be named
        if self.cfg.optim.grad_clip > 0:
            nn.utils.clip_grads_with_norm_(params, self.cfg.optim.grad_clip, gnorm)
        self.scaler.step(self.optimizer)  # a plain optimizer.step() when the scaler is disabled
        self.scaler.update()
        self.optimizer.zero_grad(set_to_none=True)
        self.scheduler.step()
        return loss_val, gnorm_val

    # ----------------------------------------------------------------------------- the loop
    def fit(self, resume: str | Path | None = None, until: int | None = None) -> dict:
        """Train to ``cfg.train.max_steps`` (or stop early after step ``until`` with a checkpoint).

        ``resume`` continues from a checkpoint (or a run folder: its newest checkpoint, see
        :func:`~cemlib.train.folders.newest_checkpoint`); on CPU the result is bit-identical to an
        uninterrupted run. Raises :class:`NonFiniteError` on NaN/Inf after saving ``last_good.pt``,
        and :class:`TrainingInterrupted` after SIGINT / SIGTERM (checkpoint and results so far
        saved). At ``max_steps`` the final model is also evaluated on the whole validation split;
        a signal during that evaluation saves ``last.pt`` and the results without it (resuming
        from ``last.pt`` runs the final evaluation only). ``out_dir`` is held by this process
        alone while it trains.
        """
        lock = out_dir_lock(self.out_dir) if self.out_dir is not None and self.dist.is_main else \
            contextlib.nullcontext()
        with lock:
            try:
                return self._fit(resume, until)
            finally:
                self._close_logs()

    def _fit(self, resume, until) -> dict:
        tc = self.cfg.train
        if resume is not None:
            from cemlib.train.folders import resolve_checkpoint
            self.load_checkpoint(resolve_checkpoint(resume))
        stop = tc.max_steps if until is None else until
        if self._stopped_early is not None:  # an early-stopped run resumed: finished where it stopped
            stop = self.step
        if not self.step <= stop <= tc.max_steps:
            raise ValueError(f"until={until} must lie between the current step {self.step} "
                             f"and train.max_steps={tc.max_steps}")
        show = (self.verbose and self.dist.is_main and sys.stderr.isatty() and not os.environ.get("CI"))
        lines = self.verbose and self.dist.is_main and not show  # piped output: a line per log interval
        self._show_bar = show
        bar = tqdm(total=tc.max_steps, initial=self.step, disable=not show, dynamic_ncols=True,
                   desc=self.cfg.experiment)
        self._open_logs()
        self.model.train()
        now = time.time()
        self._first_start = self._first_start or _utc(self.started_at)
        self._startup_done += max(0.0, now - self.started_at)
        self._segments += 1
        self._t_loop = time.perf_counter()
        first_step, t_first = self.step, self._t_loop  # for the ETA of piped output
        self._in_loop = True  # a signal now also stops a periodic evaluation (one process)
        with self._catch_signals():
            while self.step < stop:
                rng = ckpt.rng_state()
                try:
                    try:
                        self._maybe_evaluate()
                    except _EvaluationStopped:  # a signal during a periodic evaluation: stop now
                        break
                    if self._stopped_early is not None:
                        break
                    lr = self.optimizer.param_groups[0]["lr"]
                    t0 = time.perf_counter()
                    loss, gnorm = self.train_step()
                except ValueError as err:  # a layer's own finite check: report it as a NaN/Inf
                    if not _LAYER_NONFINITE.search(str(err)):
                        raise
                    self._stop_nonfinite(float("nan"), float("nan"), rng, cause=str(err))
                if not (math.isfinite(loss) and math.isfinite(gnorm)) and not self._skipped:
                    self._stop_nonfinite(loss, gnorm, rng)
                if not self._skipped and not self._params_finite():  # the update itself overflowed
                    self._stop_nonfinite(loss, gnorm, rng, updated=lr)
                dt = time.perf_counter() - t0
                if self.step > 0 or stop == 1:  # the first step carries warm-up / compilation
                    self.train_time += dt
                    self.timed_tokens += self.tokens_per_step
                self.step += 1
                if self.step % tc.log_interval == 0 or self.step == stop:
                    row = {"step": self.step, "loss": loss, "grad_norm": gnorm, "lr": lr}
                    self.history["train"].append(row)
                    self._log_row("train", row)
                    if lines:
                        spent = time.perf_counter() - t_first
                        eta = spent / (self.step - first_step) * (stop - self.step)
                        print(f"step {self.step:>6}/{tc.max_steps}  loss {loss:.4f}  lr {lr:.3e}  "
                              f"{self._tokens_per_s():.0f} tokens/s  elapsed {_clock(self._wall_total())}  "
                              f"eta {_clock(eta)}", flush=True)
                bar.update(1)
                bar.set_postfix(loss=f"{loss:.4f}", tok_s=f"{self._tokens_per_s():.0f}")
                if self.out_dir is not None and tc.checkpoint_interval and self.step != stop \
                        and self.step % tc.checkpoint_interval == 0:  # the last step: last.pt (below)
                    self.save_checkpoint(self.out_dir / f"ckpt_{self.step:06d}.pt")
                    self._prune_checkpoints()
                if self.step < stop and self._stop_requested():
                    break
        self._in_loop = False
        bar.close()
        interrupted = self.step < stop and self._stopped_early is None
        at_end = self.step == tc.max_steps or self._stopped_early is not None
        if at_end:
            with self._interruptible():  # a signal stops it: last.pt and the results without it
                self._maybe_evaluate()
        wall = self._wall_total()
        self._wall_done, self._t_loop = wall, None
        saved = None
        if self.out_dir is not None:
            saved = self.save_checkpoint(self.out_dir / ("last.pt" if at_end else f"ckpt_{self.step:06d}.pt"))
            if not at_end:
                self._prune_checkpoints()
            elif self.dist.is_main:  # last.pt holds this step (an early stop's periodic checkpoint too)
                with contextlib.suppress(OSError):
                    (self.out_dir / f"ckpt_{self.step:06d}.pt").unlink()
            best = self._best_eval()
            if at_end and best is not None and best["step"] == self.step:
                self._same_file(saved, self.out_dir / "best.pt")
        if at_end and tc.final_whole_eval and not self._final_interrupted:
            t0 = time.perf_counter()
            with self._interruptible():
                self._whole_val = self._final_whole_val()
                self._final_eval_s = time.perf_counter() - t0
        results = self.results(wall)
        written = None
        if self.results_path is not None and self.dist.is_main and (at_end or interrupted):
            written = save_results(self.results_path, results)
        name = signal.Signals(self._signal).name if self._signal else "a signal"
        if self._final_interrupted:
            where = (f"{saved} and the results without the final evaluation ({written or 'on rank 0'}) "
                     f"saved; finish with: {resume_command(self.out_dir)} (it runs the final evaluation only)"
                     if saved else "nothing saved (no out_dir)")
            raise TrainingInterrupted(f"{name} during the final evaluation (step {self.step}/{tc.max_steps}): "
                                      f"{where}", int(self._signal or signal.SIGINT), self.step, saved, written)
        if interrupted:
            where = (f"checkpoint {saved} and results {written or 'on rank 0'} saved; continue with: "
                     f"{resume_command(self.out_dir)}") if saved else "nothing saved (no out_dir)"
            raise TrainingInterrupted(f"{name} at step {self.step}/{tc.max_steps}: {where}",
                                      int(self._signal or signal.SIGINT), self.step, saved, written)
        return results

    @contextlib.contextmanager
    def _interruptible(self):
        """For the final evaluations: SIGINT / SIGTERM stop the block at once (recorded in
        ``_final_interrupted``) instead of killing the process. Main thread only."""
        if threading.current_thread() is not threading.main_thread():
            yield
            return

        def handler(signum, frame):
            self._signal = signum
            raise KeyboardInterrupt
        old = {}
        for sig in (signal.SIGINT, signal.SIGTERM):
            with contextlib.suppress(ValueError, OSError):
                old[sig] = signal.signal(sig, handler)
        try:
            yield
        except KeyboardInterrupt:
            self._final_interrupted = True
            self.model.train()
        finally:
            for sig, h in old.items():
                signal.signal(sig, h if h is not None else signal.SIG_DFL)

    def _params_finite(self) -> bool:
        """Are all parameters finite (after an update)? Under FSDP every process checks its shards."""
        params = [p.detach() for p in self.raw_model.parameters()]
        if not params:
            return True
        ok = torch.stack([torch.isfinite(p.to_local() if hasattr(p, "to_local") else p).all()
                          for p in params]).all()
        if self.strategy == "fsdp" and self.dist.enabled:
            bad = (~ok).float().reshape(1)
            torch.distributed.all_reduce(bad, op=torch.distributed.ReduceOp.MAX)
            return not bool(bad.item())
        return bool(ok)

    # ----------------------------------------------------------------------------- metric logs
    def _open_logs(self) -> None:
        """``train_log.csv`` / ``eval_log.csv`` from the history so far (a resumed run keeps the
        elapsed times its earlier segments logged), then a row per logged step; TensorBoard if
        asked for and installed."""
        self._close_logs()
        self._logs = {}
        if self.out_dir is None or not self.dist.is_main:
            return
        for kind in ("train", "eval"):
            rows = [r for r in self.history[kind] if r["step"] <= self.step]
            try:
                self._logs[kind] = _CSVLog(self.out_dir / f"{kind}_log.csv", rows)
            except OSError as err:
                print(f"note: {kind}_log.csv cannot be written ({ckpt.os_error_cause(err)}); no CSV log",
                      file=sys.stderr)
        if "tensorboard" in self.log:
            writer_class = _tensorboard_writer_class()
            if writer_class is None:
                print("note: --log tensorboard: the tensorboard package is not installed (pip install "
                      "\"cemlib[tensorboard]\"); the metrics go to train_log.csv and eval_log.csv only", file=sys.stderr)
            else:
                self._logs["tensorboard"] = writer_class(log_dir=str(self.out_dir),
                                                         purge_step=self.step or None)

    def _log_row(self, kind: str, row: dict) -> None:
        log = self._logs.get(kind)
        if log is not None and not log.write(row, self._wall_total()):
            print(f"note: {kind}_log.csv could not be written; the CSV log stops here (the results and "
                  f"checkpoints are not affected)", file=sys.stderr)
            del self._logs[kind]
        tb = self._logs.get("tensorboard")
        if tb is not None:
            for k, v in row.items():
                if k != "step":
                    tb.add_scalar(f"{kind}/{k}", v, row["step"])

    def _close_logs(self) -> None:
        for log in self._logs.values():
            with contextlib.suppress(Exception):
                log.close()
        self._logs = {}

    @contextlib.contextmanager
    def _catch_signals(self):
        """While training, SIGINT / SIGTERM only set a flag; the loop stops after the current step
        (a second signal raises ``KeyboardInterrupt`` at once). Main thread only."""
        self._signal = None
        if threading.current_thread() is not threading.main_thread():
            yield
            return

        def handler(signum, frame):
            if self._signal is not None:
                raise KeyboardInterrupt
            self._signal = signum
        old = {}
        for sig in (signal.SIGINT, signal.SIGTERM):
            try:
                old[sig] = signal.signal(sig, handler)
            except (ValueError, OSError):  # pragma: no cover - e.g. an embedded interpreter
                pass
        try:
            yield
        finally:
            for sig, h in old.items():
                signal.signal(sig, h if h is not None else signal.SIG_DFL)

    def _stop_requested(self) -> bool:
        """Has a signal asked to stop? Under torchrun every process must agree (one all-reduce)."""
        flag = self._signal is not None
        if self.dist.enabled:
            t = torch.tensor([1.0 if flag else 0.0], device=self.device)
            torch.distributed.all_reduce(t, op=torch.distributed.ReduceOp.MAX)
            if bool(t.item()) and self._signal is None:
                self._signal = int(signal.SIGTERM)
            flag = bool(t.item())
        return flag

    def _final_whole_val(self) -> dict:
        """The final model's metrics on the whole validation split (``val_*`` keys)."""
        if self.task.val_eval_is_whole:  # the periodic evaluation already covered all of it
            last = self.history["eval"][-1] if self.history["eval"] else {}
            return {k: v for k, v in last.items() if k.startswith("val_")}
        return self.evaluate_whole("val")

    @torch.no_grad()
    def evaluate_whole(self, split: str = "val") -> dict:
        """The task's metrics on the whole ``split`` (every example, or every token once)."""
        self.model.eval()
        batches = self.task.whole_batches(split, self.micro, self.dist.rank, self.dist.world_size)
        sums = self._summed_stats(batches, lambda b: self.task.whole_stats(self.model, b, split))
        self.model.train()
        return {f"{split}_{k}": v for k, v in self.task.summarize_whole(sums, split).items()}

    def _summed_stats(self, batches, stats_of) -> list:
        """Sum ``stats_of(batch)`` over ``(weight, batch)`` pairs (a zero weight: a padding batch
        that every process must still run, counted as nothing), then over processes."""
        acc = None
        for weight, batch in batches:
            if self._signal is not None and self._in_loop and not self.dist.enabled:
                raise _EvaluationStopped  # one process: a long evaluation stops at the signal
            batch = tuple(t.to(self.device) for t in batch)
            self._step_begin()
            with self._autocast():
                stats = stats_of(batch)
            if acc is None:
                acc = torch.zeros_like(stats)
            if weight:
                acc += stats
        if self.dist.enabled:
            torch.distributed.all_reduce(acc)
        return acc.tolist()

    def _maybe_evaluate(self) -> None:
        tc = self.cfg.train
        due = self.step % tc.eval_interval == 0 or self.step == tc.max_steps
        if due and not any(e["step"] == self.step for e in self.history["eval"]):
            ev = {"step": self.step, **self.evaluate()}
            earlier = list(self.history["eval"])
            self.history["eval"].append(ev)
            self._log_row("eval", ev)
            if self.out_dir is not None and self.step > 0 and self._improves(ev, earlier):
                # every process (it is collective); not at step 0, before the optimiser has a state
                # (FSDP's state-dict call would initialise it with a step of its own)
                best = self.save_checkpoint(self.out_dir / "best.pt")
                # the periodic checkpoint of this step becomes the same file (one step stored once)
                self._same_file(best, self.out_dir / f"ckpt_{self.step:06d}.pt")
            if tc.patience and self._stopped_early is None and self.step < tc.max_steps:
                self._check_patience()
            if self.verbose and self.dist.is_main:
                extra = "".join(f"  {k} {v:.4f}" for k, v in ev.items()
                                if k not in ("step", "train_loss", "val_loss") and k.startswith("val_"))
                line = (f"step {self.step:>6}/{tc.max_steps}  train {ev['train_loss']:.4f}  "
                        f"val {ev['val_loss']:.4f}{extra}")
                if self._show_bar:  # above the progress bar, not through it
                    tqdm.write(line, file=sys.stdout)
                else:
                    print(line, flush=True)

    def _best_eval(self) -> dict | None:
        """The evaluation with the best primary metric (the first of equals), or ``None``."""
        primary, mode = self.task.primary
        key = f"val_{primary}"
        ev = [e for e in self.history["eval"] if math.isfinite(e.get(key, math.nan))]
        if not ev:
            return None
        return (min if mode == "min" else max)(ev, key=lambda e: e[key])

    def _check_patience(self) -> None:
        """Early stopping: after ``train.patience`` evaluations in a row without a better primary
        metric than the best before them, record the stop (the loop then ends)."""
        tc = self.cfg.train
        best = self._best_eval()
        if best is None:
            return
        since = sum(1 for e in self.history["eval"] if e["step"] > best["step"])
        if since >= tc.patience:
            primary, _ = self.task.primary
            self._stopped_early = {"step": self.step, "best_step": best["step"], "patience": tc.patience,
                                   "metric": f"val_{primary}"}
            if self.verbose and self.dist.is_main:
                line = (f"early stop at step {self.step}/{tc.max_steps}: val_{primary} has not improved for "
                        f"{since} evaluations (train.patience={tc.patience}); best at step {best['step']}")
                if self._show_bar:
                    tqdm.write(line, file=sys.stdout)
                else:
                    print(line, flush=True)

    def _improves(self, ev: dict, earlier: list[dict]) -> bool:
        """Is ``ev`` better than every earlier evaluation by the task's primary metric (the first
        evaluation is)? The one criterion of ``best.pt`` and of ``metrics["best"]``."""
        primary, mode = self.task.primary
        key = f"val_{primary}"
        value = ev.get(key)
        if value is None or not math.isfinite(value):
            return False
        previous = [e[key] for e in earlier if math.isfinite(e.get(key, math.nan))]
        if not previous:
            return True
        return value < min(previous) if mode == "min" else value > max(previous)

    def _stop_nonfinite(self, loss: float, gnorm: float, rng: dict, cause: str | None = None,
                        updated: float | None = None) -> None:
        """Raise :class:`NonFiniteError`; save ``last_good.pt`` (the state before this step) unless
        the parameters themselves are no longer finite (``updated``: the learning rate of an update
        that made them so; the state before it is gone, and the newest checkpoint is named)."""
        where = self._first_nonfinite("no parameter (the loss itself)" if cause is None else
                                      "no parameter (the activations)")
        self.optimizer.zero_grad(set_to_none=True)
        self.model.train()
        saved = "no checkpoint saved (out_dir not set)"
        if self.out_dir is not None:
            if updated is None and self._params_finite():
                path = self.save_checkpoint(self.out_dir / "last_good.pt", rng=rng)
                saved = f"last good state (before step {self.step}) saved to {path.name}"
            else:
                from cemlib.train.folders import newest_checkpoint
                newest = newest_checkpoint(self.out_dir)
                saved = ("the state before this step is not kept (no checkpoint holds non-finite values); "
                         + (f"the newest checkpoint is {newest.name}" if newest else "no checkpoint was saved yet"))
        if updated is not None:
            what = (f"the update (lr {updated:.3g}) made the parameters non-finite although loss {loss} and "
                    f"gradient norm {gnorm} were finite (is optim.lr too large?)")
        elif cause is None:
            what = f"loss {loss}, gradient norm {gnorm}"
        else:
            what = f"a layer's finite check found them in the forward pass ({cause})"
        raise NonFiniteError(f"non-finite values at step {self.step}: {what}; first offending: {where}; "
                             f"{saved}")

    def _tokens_per_s(self) -> float:
        return self.timed_tokens / self.train_time if self.train_time > 0 else 0.0

    def results(self, wall_time_s: float) -> dict:
        """The results dictionary (see :mod:`cemlib.train.results`).

        Besides the metrics of the periodic evaluations, ``metrics["final_whole_val"]`` holds the
        final model's metrics on the whole validation split and ``metrics["estimates"]`` says in
        words what each number is computed on; ``timing`` holds the wall-clock start and end, the
        start-up time before the first step and the time of the final evaluation; ``status`` is
        ``"complete"``, ``"interrupted"`` (a signal, also one during the final evaluation) or
        ``"partial"`` (stopped at ``until``). ``metrics["best"]`` is the best evaluation by the
        task's primary metric (its value, step and ``best.pt``); ``config`` leaves out the fields
        the dataset does not read; ``run_id`` names the run (:func:`~cemlib.train.folders.run_id`)."""
        tc = self.cfg.train
        device, versions = environment_info(self.device, self.dist.world_size)
        peak_tflops, peak_source = tc.peak_tflops, "train.peak_tflops"
        if peak_tflops is None and self.device.type == "cuda":
            peak_tflops, peak_source = stated_peak_tflops(device["name"]), "vendor dense bf16 table"
        if peak_tflops is None:
            peak_source = "none known for this device"
        ev = self.history["eval"]
        primary, mode = self.task.primary
        key = f"val_{primary}"
        best_loss = min(ev, key=lambda e: e["val_loss"]) if ev else None
        best = self._best_eval() if ev else None
        tps = self._tokens_per_s()
        metrics = {
            "steps": self.step, "tokens": self.step * self.tokens_per_step,
            "final_train_loss": ev[-1]["train_loss"] if ev else None,
            "final_val_loss": ev[-1]["val_loss"] if ev else None,
            "initial_val_loss": ev[0]["val_loss"] if ev else None,
            # each best beside the step of its own criterion: the lowest sampled validation loss,
            # and the best primary metric (the criterion of best.pt and metrics["best"])
            "best_val_loss": best_loss["val_loss"] if best_loss else None,
            "best_val_loss_step": best_loss["step"] if best_loss else None,
            "primary_metric": key, "best_primary": best[key] if best else None,
            "best_primary_step": best["step"] if best else None,
            "final": {k: v for k, v in ev[-1].items() if k != "step"} if ev else {},
            "at_best": {k: v for k, v in best.items() if k != "step"} if best else {},
            "examples_per_s": tps / self.task.tokens_per_example, "skipped_steps": self.skipped_steps,
            "tokens_per_s": tps, "wall_time_s": wall_time_s,
            "forward_flops_per_token": self.forward_flops, "flops_source": self.flops_source,
            "peak_tflops_per_device": peak_tflops, "peak_source": peak_source,
            "mfu": mfu(self.forward_flops, tps, peak_tflops * 1e12 if peak_tflops else None,
                       self.dist.world_size),
            "precision": {"bf16": "bf16-autocast", "fp16": "fp16-autocast+grad-scaler",
                          "fp32": "fp32"}[self.precision],
            "best": {"metric": key, "mode": mode, "value": best[key] if best else None,
                     "step": best["step"] if best else None,
                     "checkpoint": "best.pt" if best and best["step"] > 0 and self.out_dir is not None
                     else None},
            "stopped_early": self._stopped_early,
        }
        per_eval = self.micro * self.dist.world_size  # the examples of one evaluation batch, all processes
        sample = self.task.estimate("val", per_eval)
        whole = self.task.estimate("val", per_eval, whole=True)
        train_est = self.task.estimate("train", per_eval)
        metrics["final_whole_val"] = self._whole_val
        metrics["estimates"] = {
            "final_val_loss": sample, "best_val_loss": sample, "initial_val_loss": sample, "best_primary": sample,
            "final": f"val_*: {sample}; train_*: {train_est}", "curves.eval": f"val_*: {sample}; "
            f"train_*: {train_est}", "final_train_loss": train_est,
            "final_whole_val": whole if self._whole_val is not None else (
                "not evaluated (train.final_whole_eval is false)" if not self.cfg.train.final_whole_eval
                else "not evaluated (interrupted during the final evaluation)" if self._final_interrupted
                else "not evaluated (the run stopped before max_steps)"),
            "tokens_per_s": "training steps only (step 0, which carries the warm-up, excluded), all "
                            "segments",
            "wall_time_s": "the training loops with their periodic evaluations, all segments; "
                           "start-up and the final whole-split evaluation are in timing"}
        finished = self.step == tc.max_steps or self._stopped_early is not None
        status = "complete" if finished and not self._final_interrupted else (
            "interrupted" if self._signal is not None else "partial")
        timing = {"start_utc": self._first_start or _utc(self.started_at), "end_utc": _utc(time.time()),
                  "startup_s": self._startup_done, "startup_from": self.started_from,
                  "wall_time_s": wall_time_s, "final_eval_s": self._final_eval_s,
                  "segments": self._segments}
        hashes = self.task.data_hashes()
        return {"schema": SCHEMA, "experiment": self.cfg.experiment, "preset": self.cfg.preset,
                "config": recorded_config(self.cfg), "task": self.task.describe(), "metrics": metrics,
                "data": {"name": self.cfg.data.name, "label": data_label(self.cfg), "path": self.cfg.data.path,
                         "sha256": {k: v for k, v in hashes.items() if v is not None}},
                "curves": self.history,
                "num_parameters": self.num_parameters, "model_class": type(self.raw_model).__name__,
                "device": device, "versions": versions, "git_commit": git_commit(),
                "command": self.command, "status": status, "timing": timing, "notes": self.notes,
                "run_id": run_id(self.cfg), **self.extra}
