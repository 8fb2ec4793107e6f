"""Command line: ``python -m cemlib.train --experiment shakespeare-llama --preset cpu``.

The same command runs under ``torchrun --standalone --nproc_per_node=N -m cemlib.train ...``
(DDP; ``--strategy fsdp`` to shard). ``--set section.field=value`` overrides any config field,
e.g. ``--set train.max_steps=200 --set model.d_model=128``; ``--list`` prints the experiments and
presets. Results go to ``--out`` (default ``runs/<experiment>-<preset>``) as ``results.json``.

Grids: ``--seeds 0,1,2`` and/or ``--grid task.kernel=rbf,matern`` (repeatable) run every
experiment given (``--experiment`` may be repeated) x grid x seeds, write one results file per run
into ``--out`` and a ``summary.md`` / ``summary.json`` with mean ± std over seeds, e.g.
``python -m cemlib.train --experiment gp-gated --experiment gp-cem-t2 --seeds 0,1,2 --out runs/gp``.

Errors in the configuration, the data, ``--out`` or ``--resume`` print one line ``error: ...`` and
exit with status 2 (a NaN/Inf: status 1). Ctrl-C (SIGINT) or SIGTERM stops after the current step,
saves a checkpoint and the results so far, and exits with status 128 + the signal number (130 for
Ctrl-C). Without a terminal (piped output) a training line is printed every ``train.log_interval``
steps.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import textwrap
import time
from pathlib import Path

_T_IMPORT = time.time()

import torch  # noqa: E402

from cemlib.train.config import ConfigError  # noqa: E402
from cemlib.train.experiments import EXPERIMENTS, get_config, model_fields, run_experiment  # noqa: E402


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
    from cemlib.train.checkpoint import CheckpointError
    from cemlib.train.data import DataMismatchError
    from cemlib.train.tasks import TaskDataError
    return (ConfigError, TaskDataError, CheckpointError, DataMismatchError, ChecksumError,
            FileNotFoundError, NotADirectoryError, PermissionError, IsADirectoryError, UnicodeDecodeError)


def main(argv: list[str] | None = None) -> int:
    started_at, started_from = _process_start()
    try:
        return _main(argv, started_at, started_from)
    except _user_errors() as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    except OSError as err:  # e.g. a full disk while saving: the message names the file
        print(f"error: {err}", file=sys.stderr)
        return 2
    except KeyboardInterrupt as err:
        from cemlib.train.trainer import TrainingInterrupted
        if isinstance(err, TrainingInterrupted):
            print(f"interrupted: {err}", file=sys.stderr)
            return 128 + err.signum
        raise
    except FloatingPointError as err:  # NonFiniteError: step, parameter and last_good.pt named
        print(f"error: {err}", file=sys.stderr)
        return 1


def _main(argv: list[str] | None, started_at: float, started_from: str) -> int:
    p = argparse.ArgumentParser(prog="python -m cemlib.train", description=__doc__.splitlines()[0],
                                epilog=_model_fields_help(),
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--experiment", action="append", help="experiment name (see --list); repeat for a grid")
    p.add_argument("--preset", default="cpu", help="preset name, e.g. cpu or gpu (default: cpu)")
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="SECTION.FIELD=VALUE",
                   help="override a config field; may be repeated")
    p.add_argument("--device", help="device override, e.g. cpu or cuda (default: CUDA when available)")
    p.add_argument("--out", help="output folder for results.json and checkpoints")
    p.add_argument("--resume", help="checkpoint to resume from")
    p.add_argument("--strategy", choices=("ddp", "fsdp"), default="ddp", help="under torchrun")
    p.add_argument("--quiet", action="store_true", help="no progress bar or evaluation lines")
    p.add_argument("--seeds", help="comma-separated train.seed values: run a grid (see above)")
    p.add_argument("--grid", action="append", default=[], metavar="SECTION.FIELD=V1,V2",
                   help="a grid axis: one run per value; may be repeated")
    p.add_argument("--list", action="store_true", help="list experiments and presets, then exit")
    p.add_argument("--print-config", action="store_true", help="print the resolved config, then exit")
    args = p.parse_args(argv)
    if args.list:  # with each gpu preset's estimated minutes on one H100 (cemlib.train.budget)
        from cemlib.train.budget import load_counts, preset_estimate
        store = load_counts()
        for name, exp in sorted(EXPERIMENTS.items()):
            est = preset_estimate(name, "gpu", store=store) if "gpu" in exp.presets else None
            gpu = f"  gpu ~{est.minutes:.1f} H100-min" if est else \
                ("  gpu: no estimate (python -m cemlib.train.budget --update)" if "gpu" in exp.presets else "")
            print(f"{name:32s} presets: {', '.join(sorted(exp.presets))}{gpu}  -- {exp.description}")
        return 0
    if not args.experiment:
        p.error("--experiment is required (see --list)")
    overrides = list(args.overrides) + ([f"train.device={args.device}"] if args.device else [])
    notes: list[str] = []
    try:
        for name in args.experiment:
            cfg = get_config(name, args.preset, overrides, notes)
        grid = {}
        for axis in args.grid:
            key, sep, values = axis.partition("=")
            if not sep or not values:
                raise ConfigError(f"--grid {axis!r} must look like section.field=v1,v2")
            grid[key.strip()] = [v.strip() for v in values.split(",")]
            for v in grid[key.strip()]:  # validate every grid value before any run starts
                get_config(args.experiment[0], args.preset, overrides + [f"{key.strip()}={v}"])
        seeds = [int(s) for s in args.seeds.split(",")] if args.seeds else None
    except (ConfigError, ValueError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    if seeds is not None or grid or len(args.experiment) > 1:
        from cemlib.train.sweep import grid_sweep
        out = args.out or f"runs/grid-{args.preset}"
        rows = grid_sweep(args.experiment, args.preset, grid, seeds or [cfg.train.seed], out, overrides,
                          verbose=not args.quiet)
        print((Path(out) / "summary.md").read_text())
        return 0
    args.experiment = args.experiment[0]
    if args.print_config:
        for note in dict.fromkeys(notes):
            print(f"note: {note}", file=sys.stderr)
        print(json.dumps(cfg.to_dict(), indent=1))
        return 0
    out = args.out or f"runs/{args.experiment}-{args.preset}"
    res = run_experiment(args.experiment, args.preset, overrides, out, resume=args.resume,
                         verbose=not args.quiet, strategy=args.strategy, started_at=started_at,
                         started_from=started_from)
    if torch.distributed.is_initialized():
        torch.distributed.destroy_process_group()
    m = res["metrics"]
    if not args.quiet and int(os.environ.get("RANK", "0")) == 0:
        mfu = "n/a (no known peak)" if m["mfu"] is None else f"{100 * m['mfu']:.1f} %"
        print(f"val loss {m['initial_val_loss']:.4f} -> {m['final_val_loss']:.4f} (best "
              f"{m['best_val_loss']:.4f} at step {m['best_val_step']}); {m['tokens_per_s']:.0f} tokens/s; "
              f"MFU {mfu}; wall {m['wall_time_s']:.1f} s; results in {out}/results.json")
    return 0


if __name__ == "__main__":
    sys.exit(main())
