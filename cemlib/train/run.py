"""Train a named experiment, or any validated config, into a run folder: the one call chapters make.

:func:`run_experiment` takes an experiment and preset (``cpu``: about a minute on 2 cores; ``gpu``:
the mid-size model) with ``--set``-style overrides and returns the results dictionary
(:mod:`cemlib.train.results`); :func:`run_config` trains a config from
:func:`~cemlib.train.registry.get_config`, a ``--config`` file or a checkpoint. The output folder
holds this run only (:func:`~cemlib.train.folders.check_run_folder`) and one writer at a time
(:func:`~cemlib.train.folders.out_dir_lock`).
"""

from __future__ import annotations

import contextlib
import os
import sys
import time

import torch

from cemlib.train.config import ExperimentConfig
from cemlib.train.distributed import resolve_device
from cemlib.train.folders import RunFolderError, check_run_folder, out_dir_lock, resolve_checkpoint
from cemlib.train.registry import EXPERIMENTS, build, get_config, preset_overrides, reproduce_command
from cemlib.train.trainer import Trainer, prepare_out_dir

__all__ = ["run_experiment", "run_config"]


def run_experiment(experiment: str, preset: str = "cpu", overrides=(), out_dir=None, *, resume=None,
                   until: int | None = None, verbose: bool = True, strategy: str = "ddp",
                   started_at: float | None = None, started_from: str = "caller's start time",
                   overwrite: bool = False, log=()) -> dict:
    """Build and train one preset; return its results dictionary (see :mod:`cemlib.train.results`).

    ``out_dir`` is checked (created, written to, holding no other run) before the data load;
    ``started_at`` (``time.time()``, default: this call) is when the run began, for the start-up
    time in the results (``started_from`` names that moment, e.g. "process start"). See
    ``run_config`` (same module) for ``resume``, ``overwrite`` and ``log``."""
    t0 = time.time() if started_at is None else started_at
    notes: list[str] = []
    cfg = get_config(experiment, preset, overrides, notes)
    cmd = reproduce_command(experiment, preset, overrides, int(os.environ.get("WORLD_SIZE", "1")), strategy)
    return run_config(cfg, out_dir, resume=resume, until=until, verbose=verbose, strategy=strategy,
                      started_at=t0, started_from=started_from if started_at is not None else "run_experiment call",
                      command=cmd, notes=notes, overwrite=overwrite, log=log)


def _busy_cpu_note(device) -> str | None:
    """A note when the CPU trains with several threads on a machine busy with other work (a small
    model then runs many times slower than with one thread); ``None`` otherwise."""
    threads, cores = torch.get_num_threads(), os.cpu_count() or 1
    try:
        load = os.getloadavg()[0]
    except (OSError, AttributeError):  # pragma: no cover - no load average (Windows)
        return None
    if device.type != "cpu" or threads < 2 or load < cores - 0.5:
        return None
    return (f"the CPU is busy (load average {load:.1f} on {cores} cores) and torch uses {threads} threads: "
            f"a small model may train several times faster with --threads 1")


def _gpu_preset_on_cpu(cfg: ExperimentConfig, model, task, device) -> str:
    """What a ``gpu`` preset started on a CPU is in for: the time measured here (a step of the
    built model, :func:`~cemlib.train.estimate.measured_estimate`) and what to run instead."""
    from cemlib.train.estimate import about, measured_estimate, stored_estimate
    est = measured_estimate(model, task, cfg, device)
    first = f"; its first evaluation (step 0, before any line is printed) alone {about(est.first_eval_s)}" \
        if est.first_eval_s else ""
    cpu = ""
    if "cpu" in EXPERIMENTS[cfg.experiment].presets:
        stored = stored_estimate(EXPERIMENTS[cfg.experiment].presets["cpu"], "cpu")
        cpu = f" ({stored.text()})" if stored else ""
    return (f"the gpu preset is sized for a GPU and runs here on the CPU: {est.text()}{first}; --preset cpu is "
            f"sized for a CPU{cpu}, or --set train.max_steps=N shortens this run")


def run_config(cfg: ExperimentConfig, out_dir=None, *, resume=None, until: int | None = None,
               verbose: bool = True, strategy: str = "ddp", started_at: float | None = None,
               started_from: str = "caller's start time", command: str | None = None, notes=(),
               overwrite: bool = False, results_path=None, extra: dict | None = None, log=()) -> dict:
    """Train ``cfg`` (already validated, e.g. by :func:`~cemlib.train.registry.get_config`) and return
    its results.

    Before any data loads: the device is checked, ``out_dir`` is created, proved writable and
    held by this process alone (:func:`~cemlib.train.folders.out_dir_lock`), and must not hold
    another run (:func:`~cemlib.train.folders.check_run_folder`: when resuming it may hold this one;
    ``overwrite=True`` deletes an earlier run's files first). ``resume`` is a checkpoint file or a
    run folder (its newest checkpoint). ``command`` is recorded as the reproduce command (default:
    ``--set`` overrides of the preset); ``notes`` go into the results; ``results_path``, ``extra``
    and ``log`` are passed to the :class:`~cemlib.train.trainer.Trainer`."""
    t0 = time.time() if started_at is None else started_at
    main = int(os.environ.get("RANK", "0")) == 0
    if resume is not None and overwrite:
        raise RunFolderError("resume and overwrite together would delete the checkpoint being resumed; drop "
                             "overwrite (--overwrite) to continue the run, or drop resume (--resume) to train "
                             "it again from the start")
    notes = list(notes)
    if verbose and main:
        for note in dict.fromkeys(notes):
            print(f"note: {note}", file=sys.stderr)
    device = resolve_device(cfg.train.device)
    if resume is not None:
        resume = resolve_checkpoint(resume)
    held = contextlib.nullcontext()
    if out_dir is not None and main:
        prepare_out_dir(out_dir)
        held = out_dir_lock(out_dir)
    with held:
        if out_dir is not None and main:
            removed = check_run_folder(out_dir, cfg, resuming=resume is not None, overwrite=overwrite,
                                       resume_from=resume)
            if removed and verbose:
                print(f"note: --overwrite: removed {len(removed)} file(s) of the earlier run in {out_dir}",
                      file=sys.stderr)
        busy = _busy_cpu_note(device)
        if busy and verbose and main:
            print(f"note: {busy}", file=sys.stderr)
        model, task = build(cfg)
        if verbose and main and task.info.get("data_source"):
            print(f"data: {task.info['data_source']}", file=sys.stderr)
        exp = EXPERIMENTS.get(cfg.experiment)
        caveat = exp.caveats.get(cfg.preset) if exp is not None else None
        if caveat:
            notes.append(f"{cfg.experiment} ({cfg.preset}): {caveat}")
            if verbose and main:
                print(f"note: {notes[-1]}", file=sys.stderr)
        if device.type == "cpu" and cfg.preset == "gpu" and main and verbose:
            warning = _gpu_preset_on_cpu(cfg, model, task, device)  # measures a step: only when shown
            notes.append(warning)
            print(f"warning: {warning}", file=sys.stderr, flush=True)
        if command is None:
            command = reproduce_command(cfg.experiment, cfg.preset, preset_overrides(cfg),
                                        int(os.environ.get("WORLD_SIZE", "1")), strategy)
        trainer = Trainer(model, task, cfg, out_dir=out_dir, command=command, strategy=strategy, verbose=verbose,
                          started_at=t0, notes=notes, results_path=results_path, extra=extra, log=log)
        trainer.started_from = started_from if started_at is not None else "run_config call"
        return trainer.fit(resume=resume, until=until)
