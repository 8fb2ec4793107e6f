"""Command line: ``cemlib train --experiment shakespeare-llama --preset cpu`` (or ``python -m cemlib.train``).

The same command runs under ``torchrun --standalone --nproc_per_node=N -m cemlib.train ...``
(DDP; ``--strategy fsdp`` to shard). ``--set section.field=value`` overrides any config field,
e.g. ``--set train.max_steps=200 --set model.d_model=128``; ``--config FILE`` starts from a JSON
config (what ``--print-config`` prints; a key no config has is refused); ``--list`` prints the
experiments and presets with how long each takes (the stored runs' wall time, where there is one);
``--estimate`` measures a step of the configuration on this machine and prints how long the run
would take. Every config section (model, task, data, optim, train) is validated before any data
loads. A ``gpu`` preset started on a CPU prints a warning with the measured estimate first.

Output: ``--out`` (default ``runs/<experiment>-<preset>-<run id>``, the run id a hash of the
resolved config, so a changed ``--set`` or ``--preset`` is a new folder) receives ``results.json``,
checkpoints (the newest ``train.keep_checkpoints`` = 2 ``ckpt_<step>.pt``, ``last.pt`` at the end,
``best.pt`` at the best evaluation), and the metric logs ``train_log.csv`` / ``eval_log.csv``
(``--log tensorboard`` adds TensorBoard files: ``pip install cemlib[tensorboard]``). A run on a file
of one's own (``--set data.path=my_text.txt``) has the file's name in its folder's name. A folder
that holds another run is refused (``--overwrite`` replaces it). ``--resume FOLDER_OR_CHECKPOINT``
alone continues a run: the config comes from the checkpoint and the results go to the same folder;
``--set`` may change only the evaluation, logging, checkpoint and early-stopping fields then, and
``--overwrite`` is refused with it (it would delete what is resumed). A finished run says so.

Schedules and early stopping: ``--set optim.schedule=linear`` (or ``constant``; default
``cosine``), each after the warm-up ``optim.warmup_steps`` (or ``optim.warmup_fraction`` of the
steps when ``warmup_steps`` is none); ``--set train.patience=3`` stops after 3 evaluations without
a better primary metric.

Grids: ``--seeds 0,1,2`` and/or ``--grid task.kernel=rbf,matern`` (repeatable) run every
experiment given (``--experiment`` may be repeated) x grid x seeds, e.g.
``python -m cemlib.train --experiment gp-gated --experiment gp-cem-t2 --seeds 0,1,2 --out runs/gp``
(default ``--out runs/grid-<preset>``). The grid's size is printed first (more than
``--max-runs``, default 1000, is refused); each run gets its own folder ``<out>/<run>/`` and
results file ``<out>/<run>.json``, named by experiment, grid values, seed, preset and run id; a run
already stored there with the same resolved config is skipped (and said so), an unfinished one
resumes; ``summary.md`` / ``summary.json`` hold, for each grid run into the folder, the mean and
sample std over seeds (the primary metric first, final and best values, the seeds' values), the
preset and the ``--set`` values common to the grid. A run that diverges is recorded as failed and
the grid goes on. ``--print-config`` prints every run's config.

Threads: torch uses one thread per core. On a CPU busy with other work a small model can train
many times faster with ``--threads 1``; the run prints a note when the machine looks busy.

Exit status: 0 done; 1 a run diverged (NaN/Inf; in a grid: any run failed, after the others ran);
2 an error in the configuration, the data, ``--out``, ``--config`` or ``--resume`` (one line
``error: ...``); 128 + the signal number after Ctrl-C (130) or SIGTERM, which stop after the current
step and save a checkpoint and the results so far (the printed line says how to continue). Without
a terminal (piped output) a training line with elapsed time and ETA is printed every
``train.log_interval`` steps.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import sys
import textwrap
import time
from pathlib import Path

_T_IMPORT = time.time()

import torch  # noqa: E402

from cemlib.train.registry import (EXPERIMENTS, check_experiment, get_config, model_fields, preset_overrides,
                                   reproduce_command)
from cemlib.train.run import run_config
from cemlib.train.batches import DataMismatchError
from cemlib.train.checkpoint import CheckpointError, load_checkpoint
from cemlib.train.config import ConfigError, ExperimentConfig, check_keys
from cemlib.train.folders import RunFolderError, default_out_dir, resolve_checkpoint
from cemlib.train.grid import grid_size, grid_sweep, plan_grid
from cemlib.train.results import ResultsError, load_results, read_json
from cemlib.train.tasks import TaskDataError
from cemlib.train.estimate import about
from cemlib.train.trainer import TrainingInterrupted


def _process_start() -> tuple[float, str]:
    """``(time.time() at which this process started, what that is)``: from ``/proc`` on Linux
    (so the start-up time includes the imports), else the moment this module was imported."""
    try:
        stat = Path("/proc/self/stat").read_text()
        ticks = int(stat.rsplit(")", 1)[1].split()[19])  # field 22: start time after boot
        uptime = float(Path("/proc/uptime").read_text().split()[0])
        age = uptime - ticks / os.sysconf("SC_CLK_TCK")
        if 0 <= age < 86400:
            return time.time() - age, "process start"
    except (OSError, ValueError, IndexError):
        pass
    return _T_IMPORT, "cemlib.train import"


def _model_fields_help() -> str:
    """The ``model.*`` fields of every experiment, grouped (for ``--help``)."""
    groups: dict[tuple, list[str]] = {}
    for name in sorted(EXPERIMENTS):
        try:
            fields = model_fields(name)
        except ConfigError:
            fields = None
        groups.setdefault(tuple(sorted(fields)) if fields is not None else ("(not listed)",), []).append(name)
    lines = ["model fields (--set model.FIELD=VALUE; other fields are rejected before any data loads):"]
    for fields, names in groups.items():
        lines.append(textwrap.fill(", ".join(names) + ":", 100, initial_indent="  ",
                                   subsequent_indent="  ", break_on_hyphens=False))
        lines.append(textwrap.fill(", ".join(fields), 100, initial_indent="      ",
                                   subsequent_indent="      "))
    return "\n".join(lines)


def _user_errors() -> tuple[type, ...]:
    """Exceptions that mean a wrong input (one line, exit status 2), not a bug in cemlib."""
    from cemlib.data.shakespeare import ChecksumError
    return (ConfigError, TaskDataError, CheckpointError, DataMismatchError, ChecksumError, RunFolderError,
            ResultsError, FileNotFoundError, NotADirectoryError, PermissionError, IsADirectoryError,
            UnicodeDecodeError)


def main(argv: list[str] | None = None, prog: str = "cemlib train") -> int:
    """The command line (see the module docstring); returns the exit status. ``prog`` is the
    command's name in ``--help`` and in the commands it prints."""
    started_at, started_from = _process_start()
    argv = list(sys.argv[1:] if argv is None else argv)
    try:
        return _main(argv, started_at, started_from, prog)
    except _user_errors() as err:
        print(f"error: {_one_line(err)}", file=sys.stderr)
        return 2
    except OSError as err:  # e.g. a full disk while saving: the message names the file
        print(f"error: {_one_line(err)}", file=sys.stderr)
        return 2
    except KeyboardInterrupt as err:
        if isinstance(err, TrainingInterrupted):
            print(f"interrupted: {_whole_commands(str(err), argv)}", file=sys.stderr)
            return 128 + err.signum
        print("interrupted outside a training step (loading data, or writing a file): nothing more was "
              "saved; files already written are intact, and a checkpoint among them can be resumed with "
              "--resume", file=sys.stderr)
        return 128 + signal.SIGINT
    except FloatingPointError as err:  # NonFiniteError: step, parameter and last_good.pt named
        print(f"error: {_one_line(err)}", file=sys.stderr)
        return 1


def _one_line(err: BaseException) -> str:
    return " ".join(str(err).split())


def _whole_commands(message: str, argv: list[str]) -> str:
    """The interrupt message with the commands that continue whole: ``--threads`` added to
    ``cemlib train --resume FOLDER`` where it was given, and a grid's own command spelled out."""
    import shlex
    threads = None
    for i, a in enumerate(argv):
        if a == "--threads" and i + 1 < len(argv):
            threads = argv[i + 1]
        elif a.startswith("--threads="):
            threads = a.split("=", 1)[1]
    if threads is not None:
        message = re.sub(r"(cemlib train --resume (?:'[^']*'|\S+))", rf"\1 --threads {threads}", message)
    return message.replace("the same command continues the grid", f"the same command continues the grid: "
                           f"cemlib train {shlex.join(argv)}")


def _parser(prog: str = "cemlib train") -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog=prog, description=__doc__.split("\n\n", 1)[1],
                                epilog=_model_fields_help(), formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--experiment", action="append", help="experiment name (see --list); repeat for a grid")
    p.add_argument("--preset", help="preset name, e.g. cpu or gpu (default: cpu, or the --config file's)")
    p.add_argument("--config", metavar="FILE", help="start from this JSON config (what --print-config prints)")
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="SECTION.FIELD=VALUE",
                   help="override a config field; may be repeated")
    p.add_argument("--device", help="device override, e.g. cpu or cuda (default: CUDA when available)")
    p.add_argument("--threads", type=int, metavar="N", help="CPU threads for torch (default: torch's, one "
                                                             "per core; 1 is often fastest on a busy CPU)")
    p.add_argument("--out", help="output folder (default: runs/<experiment>-<preset>-<run id>; grids: "
                                 "runs/grid-<preset>)")
    p.add_argument("--overwrite", action="store_true", help="replace the run already in --out (grids: train "
                                                            "every run again)")
    p.add_argument("--resume", metavar="FOLDER_OR_CHECKPOINT",
                   help="continue a run from its folder's newest checkpoint (or the checkpoint given); "
                        "alone, it takes the config from the checkpoint and writes to the same folder")
    p.add_argument("--strategy", choices=("ddp", "fsdp"), default="ddp", help="under torchrun")
    p.add_argument("--log", action="append", choices=("csv", "tensorboard"), default=[],
                   help="metric logs besides the results: csv (always written) or tensorboard")
    p.add_argument("--quiet", action="store_true", help="no progress bar or evaluation lines")
    p.add_argument("--seeds", help="comma-separated train.seed values, e.g. 0,1,2: run a grid")
    p.add_argument("--grid", action="append", default=[], metavar="SECTION.FIELD=V1,V2",
                   help="a grid axis: one run per value; may be repeated")
    p.add_argument("--max-runs", type=int, default=1000, metavar="N",
                   help="refuse a grid of more runs (default: 1000)")
    p.add_argument("--list", action="store_true", help="list experiments and presets (with how long each takes "
                                                       "where a stored run says), then exit")
    p.add_argument("--estimate", action="store_true", help="measure a step of the configuration on this machine, "
                                                           "print how long the run would take, then exit")
    p.add_argument("--print-config", action="store_true", help="print the resolved config (a grid: every "
                                                               "run's), then exit")
    return p


def _parse_seeds(text: str | None) -> list[int] | None:
    if text is None:
        return None
    parts = [s.strip() for s in text.split(",")]
    if not text.strip() or not all(s.isdigit() and s.isascii() for s in parts):
        raise ConfigError(f"--seeds must be comma-separated non-negative integers such as 0,1,2; got {text!r}")
    seeds = [int(s) for s in parts]
    big = [s for s in seeds if s > 2**63 - 1]  # the trainer seeds 64-bit generators with seed + offsets
    if big:
        raise ConfigError(f"--seeds {big[0]} is out of range: a seed is an integer from 0 to 2**63 - 1 (the "
                          f"trainer seeds PyTorch's 64-bit generators with it plus per-step offsets)")
    if len(set(seeds)) != len(seeds):
        raise ConfigError(f"--seeds repeats a seed ({text!r}): each seed is one run")
    return seeds


def _parse_grid(axes: list[str]) -> dict[str, list[str]]:
    grid: dict[str, list[str]] = {}
    for axis in axes:
        key, sep, values = axis.partition("=")
        key = key.strip()
        if not sep or not values.strip() or "." not in key:
            raise ConfigError(f"--grid {axis!r} must look like section.field=v1,v2")
        if key in grid:
            raise ConfigError(f"--grid {key} is given twice; give all its values in one --grid {key}=v1,v2")
        vals = [v.strip() for v in values.split(",")]
        if any(not v for v in vals):
            raise ConfigError(f"--grid {axis!r} has an empty value")
        if len(set(vals)) != len(vals):
            raise ConfigError(f"--grid {axis!r} repeats a value: each value is one run")
        grid[key] = vals
    return grid


def _config_file(path: str, preset: str | None):
    """``(experiment, preset, overrides)`` of a ``--config`` JSON file, validated."""
    d = read_json(Path(path), f"--config {path}", ConfigError)
    check_keys(d, f"--config {path}")
    check_experiment(d["experiment"])
    cfg = ExperimentConfig.from_dict(d)
    if preset is not None and preset != cfg.preset:
        raise ConfigError(f"--config {path} is of preset {cfg.preset!r}; do not give --preset {preset}")
    overrides = preset_overrides(cfg)
    if get_config(cfg.experiment, cfg.preset, overrides) != cfg:  # pragma: no cover - a defensive check
        raise ConfigError(f"--config {path} cannot be expressed as overrides of its preset")
    return cfg.experiment, cfg.preset, overrides


def _from_checkpoint(resume: str):
    """``(experiment, preset, overrides, checkpoint, payload)`` of ``--resume`` given alone."""
    ck = resolve_checkpoint(resume)
    payload = load_checkpoint(ck)
    cfg = ExperimentConfig.from_dict(payload["config"])
    if cfg.experiment not in EXPERIMENTS:
        raise ConfigError(f"--resume {resume}: the checkpoint's experiment {cfg.experiment!r} is not registered; "
                          f"resume it from Python with Trainer.fit(resume=...)")
    return cfg.experiment, cfg.preset, preset_overrides(cfg), ck, payload


def _list() -> None:
    """``--list``: every experiment, its presets, how long each takes and its caveats."""
    from cemlib.train.estimate import stored_estimate
    for name, exp in sorted(EXPERIMENTS.items()):
        print(f"{name:32s} presets: {', '.join(sorted(exp.presets))}  -- {exp.description}")
        for preset, cfg in sorted(exp.presets.items()):
            found = [e.text() for e in (stored_estimate(cfg, "cpu"), stored_estimate(cfg, "cuda")) if e]
            time_text = "; ".join(found) if found else "no stored run (--estimate measures it here)"
            print(f"    {preset}: {time_text}")
            if preset in exp.caveats:
                print(f"    {preset}: note: {exp.caveats[preset]}")


def _main(argv: list[str], started_at: float, started_from: str, prog: str = "cemlib train") -> int:
    p = _parser(prog)
    args = p.parse_args(argv)
    if args.list:
        _list()
        return 0
    if args.resume and args.overwrite:
        raise ConfigError(f"--resume {args.resume} with --overwrite would delete the checkpoint being resumed; "
                          f"drop --overwrite to continue the run, or drop --resume to train it again from the start")
    if args.threads is not None:
        if args.threads < 1:
            raise ConfigError(f"--threads must be a positive integer, got {args.threads}")
        torch.set_num_threads(args.threads)
    seeds, grid = _parse_seeds(args.seeds), _parse_grid(args.grid)
    if "train.seed" in grid:  # honoured as the grid's seeds
        if seeds is not None:
            raise ConfigError("give the seeds once: --seeds or --grid train.seed, not both")
        seeds = _parse_seeds(",".join(grid.pop("train.seed")))
    is_grid = seeds is not None or bool(grid) or len(args.experiment or []) > 1
    user_overrides = list(args.overrides) + ([f"train.device={args.device}"] if args.device else [])
    base: list[str] = []  # overrides from --config or the checkpoint, before the user's --set
    checkpoint, payload = None, None
    experiments = list(args.experiment or [])
    if args.config:
        if experiments:
            raise ConfigError("--config FILE names its experiment; do not give --experiment too")
        exp, preset, base = _config_file(args.config, args.preset)
        experiments = [exp]
    elif args.resume and not experiments:
        if is_grid:
            raise ConfigError("--resume continues one run; to continue a grid, run the same grid command "
                              "again (finished runs are skipped, unfinished ones resume)")
        exp, preset, base, checkpoint, payload = _from_checkpoint(args.resume)
        if args.preset is not None and args.preset != preset:
            raise ConfigError(f"--resume {args.resume}: the checkpoint is of preset {preset!r}, not {args.preset!r}")
        experiments = [exp]
    else:
        preset = args.preset or "cpu"
    if not experiments:
        p.error("--experiment is required (see --list), or --config FILE, or --resume FOLDER")
    overrides = base + user_overrides
    if is_grid:
        return _grid(args, experiments, preset, grid, seeds, overrides)
    return _single(args, experiments[0], preset, overrides, checkpoint, payload, started_at, started_from)


def _grid(args, experiments, preset, grid, seeds, overrides) -> int:
    if args.estimate:
        raise ConfigError("--estimate measures one run; give one --experiment without --seeds or --grid")
    if args.resume:
        raise ConfigError("--resume continues one run; to continue a grid, run the same grid command "
                          "again (finished runs are skipped, unfinished ones resume)")
    if seeds is None:
        seeds = [get_config(experiments[0], preset, overrides).train.seed]
    if args.print_config:
        n = grid_size(experiments, grid, seeds)
        if n > args.max_runs:
            raise ConfigError(f"the grid has {n:,} runs, more than --max-runs {args.max_runs:,}")
        runs = plan_grid(experiments, preset, grid, seeds, overrides)
        print(json.dumps([{"run": r.stem, "config": r.cfg.to_dict()} for r in runs], indent=1))
        return 0
    out = args.out or f"runs/grid-{preset}"
    rows = grid_sweep(experiments, preset, grid, seeds, out, overrides, verbose=not args.quiet,
                      overwrite=args.overwrite, max_runs=args.max_runs, strategy=args.strategy,
                      log=tuple(args.log))
    if int(os.environ.get("RANK", "0")) != 0:
        return 1 if rows.failed else 0
    print(rows.markdown)
    print(f"(this grid's summary is section 'grid {rows.id}' of {Path(out) / 'summary.md'} and summary.json)")
    if rows.failed:
        print(f"error: {len(rows.failed)} of the grid's runs failed (listed in {Path(out) / 'summary.md'})",
              file=sys.stderr)
        return 1
    return 0


def _single(args, experiment, preset, overrides, checkpoint, payload, started_at, started_from) -> int:
    notes: list[str] = []
    cfg = get_config(experiment, preset, overrides, notes)
    if args.print_config:
        for note in dict.fromkeys(notes):
            print(f"note: {note}", file=sys.stderr)
        print(json.dumps(printed_config(cfg), indent=1))
        return 0
    if args.estimate:
        _estimate(cfg)
        return 0
    resume = checkpoint
    if args.resume and resume is None:
        resume = resolve_checkpoint(args.resume)
    run = (payload or {}).get("run") or {}
    if resume is not None:
        out = Path(args.out) if args.out else resume.parent
        if payload is None:
            payload = load_checkpoint(resume)
        step = int(payload["step"])
        stored = Path(os.path.normpath(out / run["results"])) if run.get("results") and not args.out else \
            out / "results.json"
        finished = _finished(payload, cfg, stored)
        if finished:
            if int(os.environ.get("RANK", "0")) == 0:
                print(f"{experiment} ({preset}) in {out} already finished: {finished}; nothing to train (results "
                      f"in {stored}; a longer run is a new run: --set train.max_steps=N without --resume)",
                      file=sys.stderr)
            return 0
        if int(os.environ.get("RANK", "0")) == 0:
            print(f"resuming {experiment} ({preset}) from step {step}/{cfg.train.max_steps} ({resume}) in {out}",
                  file=sys.stderr)
    else:
        out = Path(args.out) if args.out else default_out_dir(cfg)
    results_path = out / run["results"] if run.get("results") and not args.out else None
    world = int(os.environ.get("WORLD_SIZE", "1"))
    command = run.get("command") if run.get("command") and not args.config else None
    if command is None:
        command = reproduce_command(experiment, preset, overrides, world, args.strategy)
    res = run_config(cfg, out, resume=resume, verbose=not args.quiet, strategy=args.strategy,
                     started_at=started_at, started_from=started_from, command=command, notes=notes,
                     overwrite=args.overwrite, results_path=results_path, extra=run.get("extra"),
                     log=tuple(args.log))
    if torch.distributed.is_initialized():
        torch.distributed.destroy_process_group()
    if not args.quiet and int(os.environ.get("RANK", "0")) == 0:
        print(_summary_line(res, out, results_path or out / "results.json"))
    return 0


def printed_config(cfg: ExperimentConfig) -> dict:
    """The config as ``--print-config`` prints it: one warm-up option, the one that is used
    (``optim.warmup_fraction`` is left out where ``optim.warmup_steps`` is set and the fraction is
    at its default, so the printed file reads back as the same config)."""
    d = cfg.to_dict()
    if cfg.optim.warmup_steps is not None and cfg.optim.warmup_fraction == type(cfg.optim)().warmup_fraction:
        d["optim"].pop("warmup_fraction")
    return d


def _finished(payload: dict, cfg: ExperimentConfig, results: Path) -> str | None:
    """Why the run of ``payload`` needs no more training (``None`` if it does): it reached
    ``train.max_steps`` (or stopped early) and its results file (``results``) says complete."""
    stopped = payload.get("stopped_early")
    done = int(payload["step"]) >= cfg.train.max_steps or (
        stopped and stopped.get("patience") == cfg.train.patience)
    if not done:
        return None
    try:
        res = load_results(results)
    except ResultsError:
        return None
    if res.get("status", "complete") != "complete" or res["metrics"].get("steps") != int(payload["step"]):
        return None
    if stopped:
        return f"stopped early at step {payload['step']}/{cfg.train.max_steps} (train.patience={stopped['patience']})"
    return f"step {payload['step']}/{cfg.train.max_steps}"


def _estimate(cfg: ExperimentConfig) -> None:
    """``--estimate``: the stored runs' time where there are some, and a step measured here."""
    from cemlib.train.distributed import resolve_device
    from cemlib.train.estimate import measured_estimate, stored_estimate
    from cemlib.train.registry import build
    device = resolve_device(cfg.train.device)
    for kind in ("cpu", "cuda"):
        found = stored_estimate(cfg, kind)
        if found:
            print(f"stored: {found.text()}")
    model, task = build(cfg)
    est = measured_estimate(model, task, cfg, device)
    print(f"here: {est.text()}")
    if est.first_eval_s is not None:
        print(f"the first evaluation (step 0) alone: {about(est.first_eval_s)}")


def _summary_line(res: dict, out: Path, results_path: Path) -> str:
    """The end-of-run line: the primary metric from first to last evaluation, its best value and
    step (one criterion, the task's), where the best weights are, speed and wall time."""
    m = res["metrics"]
    best, key = m.get("best") or {}, m["primary_metric"]
    ev = res["curves"]["eval"]
    first, last = (ev[0][key], ev[-1][key]) if ev else (float("nan"), float("nan"))
    where = f" ({out / best['checkpoint']})" if best.get("checkpoint") else \
        " (the initial weights)" if best.get("step") == 0 else ""
    mfu = "n/a (no known peak)" if m["mfu"] is None else f"{100 * m['mfu']:.1f} %"
    speed = (f"{m['tokens_per_s']:.0f} tokens/s" if res.get("task", {}).get("kind") == "language_modelling"
             else f"{m['examples_per_s']:.0f} examples/s")
    loss = "" if key == "val_loss" else f"; val loss {m['initial_val_loss']:.4f} -> {m['final_val_loss']:.4f}"
    whole = m.get("final_whole_val") or {}
    if "val_loss" in whole:  # the final model on every example / token of the validation split
        whole_text = ", ".join(f"{k} {v:.4f}" for k, v in whole.items() if k == "val_loss" or k == key)
        loss += f"; whole val split: {whole_text}"
    stopped = m.get("stopped_early")
    stop = f" (stopped early at step {stopped['step']})" if stopped else ""
    return (f"{key} {first:.4f} -> {last:.4f}{stop}, best {best.get('value', float('nan')):.4f} at step "
            f"{best.get('step')}{where}{loss}; {speed}; MFU {mfu}; wall {m['wall_time_s']:.1f} s; "
            f"results in {results_path}")
