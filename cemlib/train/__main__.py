"""Command line: ``python -m cemlib.train --experiment shakespeare-llama --preset cpu``.

The same command runs under ``torchrun --standalone --nproc_per_node=N -m cemlib.train ...``
(DDP; ``--strategy fsdp`` to shard). ``--set section.field=value`` overrides any config field,
e.g. ``--set train.max_steps=200 --set model.d_model=128``; ``--list`` prints the experiments and
presets. Results go to ``--out`` (default ``runs/<experiment>-<preset>``) as ``results.json``.

Grids: ``--seeds 0,1,2`` and/or ``--grid task.kernel=rbf,matern`` (repeatable) run every
experiment given (``--experiment`` may be repeated) x grid x seeds, write one results file per run
into ``--out`` and a ``summary.md`` / ``summary.json`` with mean ± std over seeds, e.g.
``python -m cemlib.train --experiment gp-gated --experiment gp-cem-t2 --seeds 0,1,2 --out runs/gp``.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

import torch

from cemlib.train.config import ConfigError
from cemlib.train.experiments import EXPERIMENTS, get_config, run_experiment


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m cemlib.train", description=__doc__.splitlines()[0])
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
    if args.list:
        for name, exp in sorted(EXPERIMENTS.items()):
            print(f"{name:32s} presets: {', '.join(sorted(exp.presets))}  -- {exp.description}")
        return 0
    if not args.experiment:
        p.error("--experiment is required (see --list)")
    overrides = list(args.overrides) + ([f"train.device={args.device}"] if args.device else [])
    try:
        for name in args.experiment:
            cfg = get_config(name, args.preset, overrides)
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
        print(json.dumps(cfg.to_dict(), indent=1))
        return 0
    out = args.out or f"runs/{args.experiment}-{args.preset}"
    res = run_experiment(args.experiment, args.preset, overrides, out, resume=args.resume,
                         verbose=not args.quiet, strategy=args.strategy)
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
