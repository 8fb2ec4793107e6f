"""Command line: ``python -m cemlib.train --experiment shakespeare-llama --preset cpu``.

The same command runs under ``torchrun --standalone --nproc_per_node=N -m cemlib.train ...``
(DDP; ``--strategy fsdp`` to shard). ``--set section.field=value`` overrides any config field,
e.g. ``--set train.max_steps=200 --set model.d_model=128``; ``--config FILE`` starts from a JSON
config (what ``--print-config`` prints); ``--list`` prints the experiments and presets. Every
config section (model, task, data, optim, train) is validated before any data loads.

Output: ``--out`` (default ``runs/<experiment>-<preset>-<run id>``, the run id a hash of the
resolved config, so a changed ``--set`` or ``--preset`` is a new folder) receives ``results.json``,
checkpoints (``ckpt_<step>.pt``, ``last.pt``, ``best.pt`` at the best evaluation), and the metric
logs ``train_log.csv`` / ``eval_log.csv`` (``--log tensorboard`` adds TensorBoard files when the
package is installed). A folder that holds another run is refused (``--overwrite`` replaces it).
``--resume FOLDER_OR_CHECKPOINT`` alone continues a run: the config comes from the checkpoint and
the results go to the same folder.

Grids: ``--seeds 0,1,2`` and/or ``--grid task.kernel=rbf,matern`` (repeatable) run every
experiment given (``--experiment`` may be repeated) x grid x seeds, e.g.
``python -m cemlib.train --experiment gp-gated --experiment gp-cem-t2 --seeds 0,1,2 --out runs/gp``
(default ``--out runs/grid-<preset>``). The grid's size is printed first (more than
``--max-runs``, default 1000, is refused); each run gets its own folder ``<out>/<run>/`` and
results file ``<out>/<run>.json``, named by experiment, grid values, seed, preset and run id; a run
already stored there with the same resolved config is skipped (and said so), an unfinished one
resumes; ``summary.md`` / ``summary.json`` hold mean ± std over seeds. A run that diverges is
recorded as failed and the grid goes on. ``--print-config`` prints every run's config.

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
import signal
import sys
import textwrap
import time
from pathlib import Path

_T_IMPORT = time.time()

import torch  # noqa: E402

from cemlib.train.registry import EXPERIMENTS, get_config, model_fields, preset_overrides, reproduce_command
from cemlib.train.run import run_config
from cemlib.train.batches import DataMismatchError
from cemlib.train.checkpoint import CheckpointError, load_checkpoint
from cemlib.train.config import ConfigError, ExperimentConfig
from cemlib.train.folders import RunFolderError, default_out_dir, resolve_checkpoint
from cemlib.train.grid import grid_size, grid_sweep, plan_grid
from cemlib.train.results import ResultsError, read_json
from cemlib.train.tasks import TaskDataError
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


def main(argv: list[str] | None = None) -> int:
    """The command line (see the module docstring); returns the exit status."""
    started_at, started_from = _process_start()
    try:
        return _main(argv, started_at, started_from)
    except _user_errors() as err:
        print(f"error: {_one_line(err)}", file=sys.stderr)
        return 2
    except OSError as err:  # e.g. a full disk while saving: the message names the file
        print(f"error: {_one_line(err)}", file=sys.stderr)
        return 2
    except KeyboardInterrupt as err:
        if isinstance(err, TrainingInterrupted):
            print(f"interrupted: {err}", file=sys.stderr)
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


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m cemlib.train", description=__doc__.split("\n\n", 1)[1],
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
    p.add_argument("--list", action="store_true", help="list experiments and presets, then exit")
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
    if not isinstance(d, dict):
        raise ConfigError(f"--config {path}: expected a JSON object (what --print-config prints)")
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


def _main(argv: list[str] | None, started_at: float, started_from: str) -> int:
    p = _parser()
    args = p.parse_args(argv)
    if args.list:
        for name, exp in sorted(EXPERIMENTS.items()):
            print(f"{name:32s} presets: {', '.join(sorted(exp.presets))}  -- {exp.description}")
        return 0
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
    print((Path(out) / "summary.md").read_text())
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
        print(json.dumps(cfg.to_dict(), indent=1))
        return 0
    resume = checkpoint
    if args.resume and resume is None:
        resume = resolve_checkpoint(args.resume)
    run = (payload or {}).get("run") or {}
    if resume is not None:
        out = Path(args.out) if args.out else resume.parent
        step = payload["step"] if payload is not None else None
        if step is None:
            step = load_checkpoint(resume)["step"]
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
    return (f"{key} {first:.4f} -> {last:.4f}, best {best.get('value', float('nan')):.4f} at step "
            f"{best.get('step')}{where}{loss}; {speed}; MFU {mfu}; wall {m['wall_time_s']:.1f} s; "
            f"results in {results_path}")
