"""The training loop every chapter uses, for any :class:`~cemlib.train.tasks.Task`.

``Trainer(model, task, cfg).fit()`` runs AdamW with warm-up + cosine, gradient clipping and
accumulation, bf16 (or fp16 with a gradient scaler, on GPUs without bf16) autocast and optional
``torch.compile`` on CUDA, DDP/FSDP under ``torchrun``, periodic evaluation of every split with
the task's metrics, checkpoints and NaN/Inf detection, and returns the results dictionary (also
written to ``out_dir/results.json``). One optimiser step consumes global batch ``step`` of the
task's train split, so the data position is the step counter. ``Trainer(model, train, val, cfg)``
with two :class:`~cemlib.train.data.TokenBatches` is language modelling (the original form).
"""

from __future__ import annotations

import contextlib
import math
import os
import sys
import time
import warnings
from pathlib import Path
from typing import Callable

import torch
import torch.nn.functional as F
from torch import nn
from tqdm.auto import tqdm

from cemlib.train import checkpoint as ckpt
from cemlib.train.config import ExperimentConfig, micro_batch_size, resolve_precision
from cemlib.train.data import TokenBatches
from cemlib.train.tasks import LanguageModelTask, Task, lm_loss  # lm_loss: re-exported
from cemlib.train.distributed import DistInfo, all_reduce_mean, init_distributed, unwrap_model, wrap_model
from cemlib.train.flops import forward_flops_per_token, mfu, stated_peak_tflops
from cemlib.train.optim import make_optimizer, make_scheduler
from cemlib.train.results import SCHEMA, environment_info, git_commit, save_results
from cemlib.utils import default_device, seed_everything

__all__ = ["Trainer", "NonFiniteError", "lm_loss", "choose_precision"]


class NonFiniteError(FloatingPointError):
    """Loss or gradients became NaN/Inf; the message names the step and the first parameter."""


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
    """

    def __init__(self, model: nn.Module, task: Task | TokenBatches, *args, out_dir: str | Path | None = None,
                 loss_fn: Callable | None = None, command: str | None = None, strategy: str = "ddp",
                 verbose: bool = True):
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
        if self.out_dir is not None and self.out_dir.exists() and not self.out_dir.is_dir():
            # fail before training, not at the first checkpoint
            raise NotADirectoryError(f"out_dir must be a folder (it receives results.json and "
                                     f"checkpoints), but {self.out_dir} is a file")
        self.verbose = verbose
        tc = cfg.train
        self.dist: DistInfo = init_distributed(default_device(tc.device))
        self.device = self.dist.device
        self.micro = micro_batch_size(tc, self.dist.world_size)
        self.train_data = task.train
        self.tokens_per_step = tc.batch_size * task.tokens_per_example
        self.precision = choose_precision(tc.precision, self.device)
        self.use_bf16 = self.precision == "bf16"
        # fp16 autocast needs loss scaling; bf16 and fp32 do not (the scaler is then a no-op)
        self.scaler = torch.amp.GradScaler("cuda", enabled=self.precision == "fp16")
        self.skipped_steps, self._skipped = 0, False
        self.raw_model = model.to(self.device)
        self.forward_flops, self.flops_source = forward_flops_per_token(self.raw_model)
        self.num_parameters = sum(p.numel() for p in self.raw_model.parameters())
        self.model = wrap_model(self.raw_model, self.dist, strategy)  # before AdamW: FSDP swaps params
        self.ddp = self.model if isinstance(self.model, nn.parallel.DistributedDataParallel) else None
        self.optimizer = make_optimizer(self.raw_model, cfg.optim)
        self.scheduler = make_scheduler(self.optimizer, cfg.optim, tc.max_steps)
        if tc.compile and self.device.type == "cuda":
            self.model = torch.compile(self.model)
        elif tc.compile and self.dist.is_main:
            print("note: train.compile is honoured on CUDA only; running eagerly", file=sys.stderr)
        self.step, self.history, self.train_time, self.timed_tokens = 0, {"train": [], "eval": []}, 0.0, 0
        seed_everything(tc.seed + 1 + self.dist.rank)  # dropout stream, distinct per process

    # ----------------------------------------------------------------------------- helpers
    def _autocast(self):
        if self.precision in ("bf16", "fp16"):
            dtype = torch.bfloat16 if self.precision == "bf16" else torch.float16
            return torch.autocast(self.device.type, dtype=dtype)
        return contextlib.nullcontext()

    def _loss(self, batch) -> torch.Tensor:
        if self.loss_fn is not None:
            return self.loss_fn(self.model, *batch)
        return self.task.loss(self.model, batch)

    def _named_params(self):
        return list(unwrap_model(self.model).named_parameters())

    def _first_nonfinite(self) -> str:
        def finite(t):  # FSDP holds DTensor shards: check the full tensor
            return bool(torch.isfinite(t.full_tensor() if hasattr(t, "full_tensor") else t).all())
        for name, p in self._named_params():
            if not finite(p.detach()):
                return f"parameter {name!r} (its values)"
        for name, p in self._named_params():
            if p.grad is not None and not finite(p.grad):
                return f"parameter {name!r} (its gradient)"
        return "no parameter (the loss itself)"

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
                "world_size": self.dist.world_size}

    def save_checkpoint(self, path: str | Path, rng: dict | None = None) -> Path | None:
        """Write a checkpoint of the current state (every process calls; rank 0 writes)."""
        state = self._state(rng if rng is not None else ckpt.rng_state())
        if self.dist.is_main:
            ckpt.save_checkpoint(path, state)
        return Path(path)

    def load_checkpoint(self, path: str | Path) -> None:
        """Restore model, optimiser, scheduler, RNG, data position and history from ``path``."""
        payload = ckpt.load_checkpoint(path, map_location="cpu")
        diffs = ckpt.config_differences(payload["config"], self.cfg.to_dict())
        if diffs:
            raise ckpt.CheckpointError(f"checkpoint {Path(path).name!r} was written by a different "
                                       f"configuration: " + "; ".join(diffs))
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
        self.history = payload.get("history", {"train": [], "eval": []})
        rngs = payload["rng"]
        if len(rngs) == self.dist.world_size:
            ckpt.set_rng_state(rngs[self.dist.rank])
        else:  # a different number of processes: fresh, deterministic dropout streams
            seed_everything(self.cfg.train.seed + 1 + self.dist.rank + 7919 * self.step)

    # ----------------------------------------------------------------------------- evaluation
    @torch.no_grad()
    def evaluate(self) -> dict:
        """The task's metrics on each split (``train_loss``, ``val_accuracy``, ...): sums over the
        split's evaluation batches, added up across processes, then divided."""
        self.model.eval()
        out, world = {}, self.dist.world_size
        for split in self.task.eval_splits:
            acc = None
            for weight, batch in self.task.eval_batches(split, self.micro, self.dist.rank, world,
                                                        self.cfg.train.eval_batches):
                batch = tuple(t.to(self.device) for t in batch)
                with self._autocast():
                    stats = self.task.eval_stats(self.model, batch, split)
                if acc is None:
                    acc = torch.zeros_like(stats)
                if weight:
                    acc += stats
            if self.dist.enabled:
                torch.distributed.all_reduce(acc)
            for name, value in self.task.summarize(acc.tolist(), split).items():
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

        ``resume`` continues from a checkpoint; on CPU the result is bit-identical to an
        uninterrupted run. Raises :class:`NonFiniteError` on NaN/Inf after saving ``last_good.pt``.
        """
        tc = self.cfg.train
        if resume is not None:
            self.load_checkpoint(resume)
        stop = tc.max_steps if until is None else until
        if not self.step <= stop <= tc.max_steps:
            raise ValueError(f"until={until} must lie between the current step {self.step} "
                             f"and train.max_steps={tc.max_steps}")
        show = (self.verbose and self.dist.is_main and sys.stderr.isatty() and not os.environ.get("CI"))
        bar = tqdm(total=tc.max_steps, initial=self.step, disable=not show, dynamic_ncols=True,
                   desc=self.cfg.experiment)
        self.model.train()
        t_start = time.perf_counter()
        while self.step < stop:
            rng = ckpt.rng_state()
            self._maybe_evaluate()
            lr = self.optimizer.param_groups[0]["lr"]
            t0 = time.perf_counter()
            loss, gnorm = self.train_step()
            if not (math.isfinite(loss) and math.isfinite(gnorm)) and not self._skipped:
                self._stop_nonfinite(loss, gnorm, rng)
            dt = time.perf_counter() - t0
            if self.step > 0 or stop == 1:  # the first step carries warm-up / compilation
                self.train_time += dt
                self.timed_tokens += self.tokens_per_step
            self.step += 1
            if self.step % tc.log_interval == 0 or self.step == stop:
                self.history["train"].append({"step": self.step, "loss": loss, "grad_norm": gnorm,
                                              "lr": lr})
            bar.update(1)
            bar.set_postfix(loss=f"{loss:.4f}", tok_s=f"{self._tokens_per_s():.0f}")
            if self.out_dir is not None and tc.checkpoint_interval and self.step % tc.checkpoint_interval == 0:
                self.save_checkpoint(self.out_dir / f"ckpt_{self.step:06d}.pt")
        bar.close()
        if self.step == tc.max_steps:
            self._maybe_evaluate()
        wall = time.perf_counter() - t_start
        if self.out_dir is not None:
            self.save_checkpoint(self.out_dir / ("last.pt" if self.step == tc.max_steps else
                                                 f"ckpt_{self.step:06d}.pt"))
        results = self.results(wall)
        if self.out_dir is not None and self.dist.is_main and self.step == tc.max_steps:
            save_results(self.out_dir / "results.json", results)
        return results

    def _maybe_evaluate(self) -> None:
        tc = self.cfg.train
        due = self.step % tc.eval_interval == 0 or self.step == tc.max_steps
        if due and not any(e["step"] == self.step for e in self.history["eval"]):
            ev = {"step": self.step, **self.evaluate()}
            self.history["eval"].append(ev)
            if self.verbose and self.dist.is_main:
                extra = "".join(f"  {k} {v:.4f}" for k, v in ev.items()
                                if k not in ("step", "train_loss", "val_loss") and k.startswith("val_"))
                print(f"step {self.step:>6}/{tc.max_steps}  train {ev['train_loss']:.4f}  "
                      f"val {ev['val_loss']:.4f}{extra}", flush=True)

    def _stop_nonfinite(self, loss: float, gnorm: float, rng: dict) -> None:
        where = self._first_nonfinite()
        self.optimizer.zero_grad(set_to_none=True)
        saved = "no checkpoint saved (out_dir not set)"
        if self.out_dir is not None:
            path = self.save_checkpoint(self.out_dir / "last_good.pt", rng=rng)
            saved = f"last good state (before step {self.step}) saved to {path.name}"
        raise NonFiniteError(f"non-finite values at step {self.step}: loss {loss}, gradient norm "
                             f"{gnorm}; first offending: {where}; {saved}")

    def _tokens_per_s(self) -> float:
        return self.timed_tokens / self.train_time if self.train_time > 0 else 0.0

    def results(self, wall_time_s: float) -> dict:
        """The results dictionary (see :mod:`cemlib.train.results`)."""
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
        best = (min if mode == "min" else max)(ev, key=lambda e: e[key]) if ev else None
        tps = self._tokens_per_s()
        metrics = {
            "steps": self.step, "tokens": self.step * self.tokens_per_step,
            "final_train_loss": ev[-1]["train_loss"] if ev else None,
            "final_val_loss": ev[-1]["val_loss"] if ev else None,
            "initial_val_loss": ev[0]["val_loss"] if ev else None,
            "best_val_loss": best_loss["val_loss"] if best_loss else None,
            "best_val_step": best["step"] if best else None,
            "primary_metric": key, "best_primary": best[key] if best else None,
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
        }
        return {"schema": SCHEMA, "experiment": self.cfg.experiment, "preset": self.cfg.preset,
                "config": self.cfg.to_dict(), "task": self.task.describe(), "metrics": metrics,
                "curves": self.history,
                "num_parameters": self.num_parameters, "model_class": type(self.raw_model).__name__,
                "device": device, "versions": versions, "git_commit": git_commit(),
                "command": self.command}
