"""Grids of experiments x overrides x seeds, with a mean ± std summary (:func:`grid_sweep`).

A grid is planned and checked before its first run trains (:func:`plan_grid`: every config valid,
experiments, grid keys, grid values and seeds unique, no two runs the same, the size below
``max_runs``; the output folder writable and the file names short enough). Each run is a complete
run: its own folder ``<out>/<stem>/`` (checkpoints, ``best.pt``, metric logs) and its results file
``<out>/<stem>.json`` (:func:`~cemlib.train.folders.grid_stem`: experiment, grid values, seed,
preset and the run id). A run already in the folder with the same resolved config (whatever its
file is called) is skipped and said so; an unfinished one resumes from its newest checkpoint; a
run that diverges is recorded as failed (``<stem>/failure.txt`` and the summary) and the grid goes
on. Ctrl-C saves the current run's checkpoint; the same command continues the grid.
"""

from __future__ import annotations

import contextlib
import math
import signal
import sys
from dataclasses import dataclass

import numpy as np

from cemlib.train.config import ConfigError
from cemlib.train.distributed import resolve_device
from cemlib.train.folders import (folder_run, grid_stem, identity_differences, identity_key, name_max,
                                  newest_checkpoint, out_dir_lock)
from cemlib.train.registry import get_config, reproduce_command
from cemlib.train.results import ResultsError, load_results
from cemlib.train.run import run_config
from cemlib.train.tasks import TaskDataError
from cemlib.train.trainer import NonFiniteError, TrainingInterrupted, prepare_out_dir

__all__ = ["grid_runs", "grid_size", "plan_grid", "GridRun", "GridRows", "grid_sweep",
           "summarize_runs", "summary_markdown"]

def grid_runs(experiments, grid: dict | None = None, seeds=(0,)) -> list[tuple[str, list[str], int]]:
    """Every ``(experiment, overrides, seed)`` of ``experiments x product(grid) x seeds``.

    ``grid`` maps an override key to its values, e.g. ``{"task.kernel": ["rbf", "matern"]}``.
    """
    import itertools
    grid = dict(grid or {})
    keys = list(grid)
    combos = list(itertools.product(*(grid[k] for k in keys))) if keys else [()]
    return [(e, [f"{k}={v}" for k, v in zip(keys, combo)], int(s))
            for e in experiments for combo in combos for s in seeds]


def _mean_std(values: list[float]) -> tuple[float, float]:
    v = np.asarray(values, dtype=float)
    return float(v.mean()), float(v.std(ddof=1)) if len(v) > 1 else 0.0


def summarize_runs(results: list[dict], metrics=None) -> list[dict]:
    """Group results by ``(experiment, overrides without the seed)``; mean and sample std over seeds
    of every ``metrics["final"]`` entry (or of ``metrics`` if given), plus parameters and seeds."""
    groups: dict[tuple, list[dict]] = {}
    for r in results:
        key = (r["experiment"], r["preset"], tuple(r.get("sweep", {}).get("overrides", [])))
        groups.setdefault(key, []).append(r)
    rows = []
    for (exp, preset, overrides), rs in groups.items():
        names = metrics or sorted(rs[0]["metrics"]["final"])
        row = {"experiment": exp, "preset": preset, "overrides": list(overrides),
               "seeds": [r["config"]["train"]["seed"] for r in rs], "num_parameters": rs[0]["num_parameters"],
               "device": rs[0]["device"]["label"], "wall_time_s": _mean_std([r["metrics"]["wall_time_s"] for r in rs])[0]}
        for m in names:
            row[m] = _mean_std([r["metrics"]["final"][m] for r in rs])
        rows.append(row)
    return rows


def summary_markdown(rows: list[dict], metrics) -> str:
    """A Markdown table: experiment, overrides, params, seeds, ``mean ± std`` per metric."""
    head = ["experiment", "overrides", "params", "seeds", *metrics]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in rows:
        cells = [r["experiment"], " ".join(r["overrides"]) or "-", f"{r['num_parameters']:,}",
                 str(len(r["seeds"]))]
        cells += [f"{r[m][0]:.4g} ± {r[m][1]:.2g}" for m in metrics]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def grid_size(experiments, grid: dict | None = None, seeds=(0,)) -> int:
    """The number of runs of ``experiments x product(grid) x seeds``."""
    return len(list(experiments)) * math.prod(len(v) for v in (grid or {}).values()) * len(list(seeds))


@dataclass
class GridRun:
    """One planned run of a grid: its experiment, grid overrides, seed, resolved config, the notes
    :func:`~cemlib.train.registry.get_config` made, and the stem of its files."""

    experiment: str
    overrides: list[str]
    seed: int
    cfg: object
    notes: list[str]
    stem: str


class GridRows(list):
    """:func:`grid_sweep`'s summary rows (:func:`summarize_runs`), with ``failed``: the runs that
    stopped (``{"run", "experiment", "overrides", "seed", "error"}``), and ``skipped``: the names of
    the runs found complete in the output folder."""

    failed: list
    skipped: list


def _unique(values, what: str) -> None:
    seen = set()
    for v in values:
        if v in seen:
            raise ConfigError(f"{what} repeats {v!r}: a run would be counted twice")
        seen.add(v)


def plan_grid(experiments, preset: str = "cpu", grid: dict | None = None, seeds=(0,), overrides=(),
              name_limit: int = 200) -> list[GridRun]:
    """Resolve and check every run of the grid before any trains (see the module docstring);
    raise :class:`~cemlib.train.config.ConfigError` naming the problem."""
    experiments, seeds, grid = list(experiments), list(seeds), dict(grid or {})
    _unique(experiments, "--experiment")
    for s in seeds:
        if isinstance(s, bool) or not isinstance(s, int) or s < 0:
            raise ConfigError(f"seeds must be non-negative integers, got {s!r}")
    _unique(seeds, "--seeds")
    if "train.seed" in grid:
        raise ConfigError("train.seed is a grid axis of its own: give its values as seeds (--seeds), "
                          "not as --grid train.seed")
    if any(o.partition("=")[0].strip() == "train.seed" for o in overrides):
        raise ConfigError("--set train.seed and a grid's seeds (--seeds) contradict each other; give "
                          "the seeds with --seeds only")
    for key, values in grid.items():
        if not values:
            raise ConfigError(f"grid axis {key} has no values")
        _unique([str(v) for v in values], f"grid axis {key}")
    runs, seen = [], {}
    for exp, ovr, seed in grid_runs(experiments, grid, seeds):
        notes: list[str] = []
        cfg = get_config(exp, preset, [*overrides, *ovr, f"train.seed={seed}"], notes)
        run = GridRun(exp, ovr, seed, cfg, notes, grid_stem(exp, preset, ovr, seed, cfg, name_limit))
        other = seen.setdefault(identity_key(cfg), run)
        if other is not run:
            raise ConfigError(f"two runs of the grid are the same run ({other.stem} and {run.stem}): a "
                              f"grid value repeats another (e.g. 8 and 8.0)")
        runs.append(run)
    return runs


def _stored_runs(folder) -> dict:
    """``{(experiment, preset, seed): [(path, results)]}``: the complete results files in ``folder``
    (``summary.json`` and unreadable files left out, the latter with a note)."""
    from pathlib import Path

    index: dict = {}
    for p in sorted(Path(folder).glob("*.json")):
        if p.name == "summary.json":
            continue
        try:
            res = load_results(p)
            key = (res["experiment"], res["preset"], res["config"]["train"]["seed"])
        except (ResultsError, KeyError, TypeError) as err:
            print(f"note: {p.name} is not a results file that can be compared ({err}); left alone",
                  file=sys.stderr)
            continue
        if res.get("status", "complete") == "complete":
            index.setdefault(key, []).append((p, res))
    return index


def _find_identical(index: dict, run: GridRun):
    """A stored complete run with ``run``'s identity config: ``(path, results)`` or ``None``."""
    for path, res in index.get((run.experiment, run.cfg.preset, run.seed), []):
        try:
            if not identity_differences(res["config"], run.cfg):
                return path, res
        except ConfigError:  # a stored config this version cannot read: not the same run
            continue
    return None


def _write_summary(out, results: list[dict], failed: list[dict], metrics) -> list[dict]:
    import json
    rows = summarize_runs(results, metrics) if results else []
    names = metrics or (sorted(results[0]["metrics"]["final"]) if results else [])
    (out / "summary.json").write_text(json.dumps(
        rows + [{"status": "failed", **f} for f in failed], indent=1, default=list))
    md = summary_markdown(rows, names) if rows else "no run of this grid completed\n"
    if failed:
        md += "\nFailed runs (not in the means above):\n\n" + "".join(
            f"- `{f['run']}`: {f['error']}\n" for f in failed)
    (out / "summary.md").write_text(md)
    return rows


def grid_sweep(experiments, preset: str = "cpu", grid: dict | None = None, seeds=(0,), out_dir=None,
               overrides=(), metrics=None, verbose: bool = False, skip_existing: bool = True, *,
               overwrite: bool = False, max_runs: int = 1000, strategy: str = "ddp", log=()) -> GridRows:
    """Run ``experiments x grid x seeds`` (``train.seed`` = each seed; ``overrides`` apply to all)
    and return the summary rows (:func:`summarize_runs`, mean ± std over seeds) as
    :class:`GridRows` (with the failed and skipped runs).

    With ``out_dir``: the layout, skipping and resuming of the module docstring, and
    ``summary.json`` / ``summary.md`` (failed runs listed below the table); ``skip_existing=False``
    or ``overwrite=True`` train every run again (``overwrite`` deletes its earlier files). A grid of
    more than ``max_runs`` runs is refused before anything is planned. The plan and each run's
    fate are printed to stderr."""
    import os
    from pathlib import Path

    main = int(os.environ.get("RANK", "0")) == 0  # under torchrun: rank 0 writes and reports

    def say(*args, **kwargs):
        if main:
            print(*args, **kwargs)
    n = grid_size(experiments, grid, seeds)
    if n > max_runs:
        raise ConfigError(f"the grid has {n:,} runs, more than max_runs={max_runs:,} (--max-runs): check "
                          f"--grid and --seeds, or raise the limit to run it")
    out = Path(out_dir) if out_dir is not None else None
    limit = 200
    if out is not None:
        prepare_out_dir(out)  # writable, before the first run trains
        limit = max(40, min(200, name_max(out) - 40))  # room for ".json" and temporary-file suffixes
    runs = plan_grid(experiments, preset, grid, seeds, overrides, name_limit=limit)
    for device in {r.cfg.train.device for r in runs}:  # a device this machine lacks: refused once, first
        resolve_device(device)
    held = out_dir_lock(out) if out is not None and main else contextlib.nullcontext()
    with held:
        index = _stored_runs(out) if out is not None else {}
        stored = {i: hit for i, r in enumerate(runs) if (hit := _find_identical(index, r)) is not None}
        done = stored if skip_existing and not overwrite else {}
        if out is not None:
            path_max = _path_max(out)
            longest = max(len(str(out.resolve() / r.stem / "ckpt_000000.pt.12345678.tmp")) for r in runs)
            if longest > path_max:
                raise ConfigError(f"the grid's file paths in {out} reach {longest} characters, more than "
                                  f"the {path_max} this file system allows; choose a shorter --out")
        points = math.prod(len(v) for v in (grid or {}).values())
        where = f" into {out}; {len(done)} already complete there" if out is not None else ""
        say(f"grid: {n} run{'s' * (n != 1)} = {len(list(experiments))} experiment(s) x {points} grid "
            f"point(s) x {len(list(seeds))} seed(s){where}", file=sys.stderr)
        results, failed, skipped = [], [], []
        for i, run in enumerate(runs):
            tag = f"[{i + 1}/{n}] {run.stem}"
            if i in done:
                path, res = done[i]
                say(f"{tag}: skipped, the same run is stored in {path.name}", file=sys.stderr)
                results.append(res)
                skipped.append(run.stem)
                continue
            run_dir = out / run.stem if out is not None else None
            failure = run_dir / "failure.txt" if run_dir is not None else None
            if failure is not None and failure.is_file() and not overwrite:
                error = failure.read_text().strip()
                say(f"{tag}: failed before ({error[:200]}); --overwrite tries it again", file=sys.stderr)
                failed.append({"run": run.stem, "experiment": run.experiment, "overrides": run.overrides,
                               "seed": run.seed, "error": error})
                continue
            resume = None
            if run_dir is not None and not overwrite:
                ck = newest_checkpoint(run_dir)
                held_run = folder_run(run_dir) if ck is not None else None
                if held_run is not None and held_run["source"] == ck:
                    resume = ck
            say(f"{tag}: " + (f"resuming from {resume.name}" if resume else "training"), file=sys.stderr)
            cmd = reproduce_command(run.experiment, preset, [*overrides, *run.overrides, f"train.seed={run.seed}"],
                                    int(os.environ.get("WORLD_SIZE", "1")), strategy)
            try:
                res = run_config(run.cfg, run_dir, resume=resume, verbose=verbose, strategy=strategy,
                                 command=cmd, notes=run.notes, overwrite=resume is None,
                                 results_path=_results_path(out, run, stored.get(i)),
                                 extra={"sweep": {"overrides": list(run.overrides), "seed": run.seed}}, log=log)
            except (NonFiniteError, ConfigError, TaskDataError) as err:
                error = " ".join(str(err).split())
                say(f"{tag}: FAILED: {error}", file=sys.stderr)
                failed.append({"run": run.stem, "experiment": run.experiment, "overrides": run.overrides,
                               "seed": run.seed, "error": error})
                if failure is not None and main:
                    failure.write_text(error + "\n")
                continue
            except TrainingInterrupted as err:
                if out is not None and main and (results or failed):
                    _write_summary(out, results, failed, metrics)
                raise TrainingInterrupted(f"grid stopped in run {i + 1}/{n} ({run.stem}): {err}; the same "
                                          f"command continues the grid (finished runs are skipped, this one "
                                          f"resumes)", err.signum, err.step, err.checkpoint, err.results) from None
            except KeyboardInterrupt:  # before the run's first step (data loading): nothing to save
                if out is not None and main and (results or failed):
                    _write_summary(out, results, failed, metrics)
                raise TrainingInterrupted(f"grid stopped before run {i + 1}/{n} ({run.stem}) trained; the same "
                                          f"command continues the grid", int(signal.SIGINT), 0, None,
                                          None) from None
            results.append(res)
        if out is not None and main:
            rows = _write_summary(out, results, failed, metrics)
        else:
            rows = summarize_runs(results, metrics) if results else []
    out_rows = GridRows(rows)
    out_rows.failed, out_rows.skipped = failed, skipped
    return out_rows


def _results_path(out, run: GridRun, stored):
    """Where a grid run's results go: ``<out>/<stem>.json``, or the file that already holds the same
    run under another name (a results file stored before run ids existed keeps its name)."""
    if out is None:
        return None
    return stored[0] if stored is not None else out / f"{run.stem}.json"


def _path_max(folder) -> int:
    import os
    try:
        return int(os.pathconf(folder, "PC_PATH_MAX"))
    except (OSError, ValueError, AttributeError):
        return 4096
