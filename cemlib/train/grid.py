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
from cemlib.train.folders import (RunFolderError, folder_run, grid_stem, identity_differences, identity_key,
                                  name_max, newest_checkpoint, out_dir_lock)
from cemlib.train.registry import get_config, reproduce_command
from cemlib.train.results import ResultsError, load_results
from cemlib.train.run import run_config
from cemlib.train.tasks import TaskDataError
from cemlib.train.trainer import NonFiniteError, TrainingInterrupted, prepare_out_dir

__all__ = ["grid_runs", "grid_size", "plan_grid", "GridRun", "GridRows", "grid_sweep",
           "summarize_runs", "summary_markdown", "write_summary", "grid_id", "Spread", "metric_order",
           "SUMMARY_SCHEMA"]

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


class Spread(tuple):
    """``(mean, std)`` over seeds, unpacked as a pair; ``std`` is the sample standard deviation
    (``ddof=1``; ``None`` for one seed, where it is not defined), ``n`` the number of seeds and
    ``values`` ``{seed: value}``."""

    def __new__(cls, values: dict):
        v = np.asarray(list(values.values()), dtype=float)
        mean = float(v.mean()) if len(v) else math.nan
        std = float(v.std(ddof=1)) if len(v) > 1 else None
        out = super().__new__(cls, (mean, std))
        out.n, out.values = len(v), dict(values)
        return out

    @property
    def mean(self) -> float:
        return self[0]

    @property
    def std(self) -> float:
        return self[1]

    def to_dict(self) -> dict:
        return {"mean": self.mean, "std": self.std, "n": self.n,
                "per_seed": {str(k): v for k, v in self.values.items()}}


def _mean_std(values: list[float]) -> tuple[float, float]:
    return tuple(Spread(dict(enumerate(values))))


def primary_of(results: list[dict]) -> tuple[str | None, str]:
    """``(primary metric, "min" or "max")`` of a list of results (``metrics["best"]``)."""
    for r in results:
        best = r["metrics"].get("best") or {}
        if best.get("metric"):
            return best["metric"], best.get("mode", "min")
        if r["metrics"].get("primary_metric"):
            return r["metrics"]["primary_metric"], "min"
    return None, "min"


def metric_order(names, primary: str | None) -> list[str]:
    """``names`` with the primary metric first, then the same metric on the other splits, then
    the rest in alphabetical order."""
    names = list(dict.fromkeys(names))
    if primary is None or primary not in names:
        return sorted(names)
    base = primary.split("_", 1)[1] if "_" in primary else primary
    same = sorted(n for n in names if n != primary and n.split("_", 1)[-1] == base)
    return [primary, *same, *sorted(n for n in names if n != primary and n not in same)]


def summarize_runs(results: list[dict], metrics=None) -> list[dict]:
    """Group results by ``(experiment, preset, grid overrides)``; over the seeds of each group, the
    :class:`Spread` (mean, sample std, n, per-seed values) of every ``metrics["final"]`` entry (or
    of ``metrics`` if given), and under ``"best"`` that of the best evaluation's primary metric,
    besides parameters, seeds, device and wall time. Rows keep the order of first appearance."""
    groups: dict[tuple, list[dict]] = {}
    for r in results:
        key = (r["experiment"], r["preset"], tuple(r.get("sweep", {}).get("overrides", [])))
        groups.setdefault(key, []).append(r)
    rows = []
    for (exp, preset, overrides), rs in groups.items():
        primary, mode = primary_of(rs)
        names = metric_order(metrics or rs[0]["metrics"]["final"], primary)
        seeds = [r["config"]["train"]["seed"] for r in rs]
        row = {"experiment": exp, "preset": preset, "overrides": list(overrides), "seeds": seeds,
               "num_parameters": rs[0]["num_parameters"], "device": rs[0]["device"]["label"],
               "wall_time_s": _mean_std([r["metrics"]["wall_time_s"] for r in rs])[0],
               "primary_metric": primary, "primary_mode": mode, "metrics": names}
        for m in names:
            row[m] = Spread({s: r["metrics"]["final"][m] for s, r in zip(seeds, rs)})
        bests = {s: (r["metrics"].get("best") or {}) for s, r in zip(seeds, rs)}
        if primary and all(b.get("value") is not None for b in bests.values()):
            row["best"] = Spread({s: b["value"] for s, b in bests.items()})
            row["best_steps"] = {str(s): b.get("step") for s, b in bests.items()}
        rows.append(row)
    return rows


_STAT = ("mean ± sample standard deviation (ddof = 1) over the n seeds (one seed: its value); final: the "
         "last evaluation; best: the best evaluation by the primary metric")


def summary_markdown(rows: list[dict], metrics=None) -> str:
    """A Markdown table: experiment, grid values, params, n (seeds), the primary metric first and
    marked (★, final and best), then the other metrics (final), each ``mean ± std``."""
    if not rows:
        return "no run of this grid completed\n"
    primary = rows[0].get("primary_metric")
    names = metric_order(metrics or rows[0].get("metrics") or [], primary)
    has_best = all("best" in r for r in rows) and primary is not None
    head = ["experiment", "grid values", "params", "n"]
    cells_for = []
    for m in names:
        if m == primary:
            head.append(f"★ {m} (final)")
            if has_best:
                head.append(f"★ {m} (best)")
        else:
            head.append(f"{m} (final)")
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in rows:
        cells = [r["experiment"], " ".join(r["overrides"]) or "-", f"{r['num_parameters']:,}", str(len(r["seeds"]))]
        for m in names:
            cells.append(_cell(r[m]))
            if m == primary and has_best:
                cells.append(_cell(r["best"]))
        lines.append("| " + " | ".join(cells) + " |")
    del cells_for
    mode = rows[0].get("primary_mode", "min")
    note = (f"\n★ primary metric: {primary} ({'lower' if mode == 'min' else 'higher'} is better). "
            if primary else "\n")
    return "\n".join(lines) + "\n" + note + _STAT + ".\n"


def _cell(spread) -> str:
    """``mean ± std``, or the value alone for one seed (no spread to state)."""
    mean, std = spread
    return f"{mean:.4g}" if std is None else f"{mean:.4g} ± {std:.2g}"


def _row_json(row: dict) -> dict:
    out = {k: row[k] for k in ("experiment", "preset", "overrides", "seeds", "num_parameters", "device",
                              "wall_time_s", "primary_metric", "primary_mode")}
    out["final"] = {m: row[m].to_dict() for m in row["metrics"]}
    if "best" in row:
        out["best"] = {row["primary_metric"]: {**row["best"].to_dict(), "step_per_seed": row["best_steps"]}}
    return out


SUMMARY_SCHEMA = "cemlib.train.grid-summary/2"


def grid_id(experiments, preset, grid, seeds, overrides) -> str:
    """8 hexadecimal digits naming a grid configuration (experiments, preset, axes, seeds and the
    common overrides): one summary section per grid configuration."""
    import hashlib
    import json
    text = json.dumps({"experiments": list(experiments), "preset": preset, "grid": {k: list(map(str, v)) for k, v in
                       (grid or {}).items()}, "seeds": list(seeds), "overrides": list(overrides)}, sort_keys=True)
    return hashlib.sha256(text.encode()).hexdigest()[:8]


def write_summary(out, results: list[dict], failed: list[dict] = (), metrics=None, *, grid: dict | None = None,
                  gid: str | None = None) -> tuple[list[dict], str]:
    """Write this grid's summary into ``out/summary.json`` and ``out/summary.md`` beside the other
    grid configurations' summaries in that folder (one section each, keyed by :func:`grid_id`;
    rerunning a grid replaces its own section only). ``grid`` describes the grid (experiments,
    preset, axes, seeds, common overrides), shown above its table. Returns ``(rows, markdown of
    this grid's section)``."""
    import json
    from pathlib import Path
    out = Path(out)
    grid = dict(grid or {})
    gid = gid or grid_id(grid.get("experiments", []), grid.get("preset"), grid.get("grid"), grid.get("seeds", []),
                         grid.get("overrides", []))
    rows = summarize_runs(results, metrics) if results else []
    path_json, path_md = out / "summary.json", out / "summary.md"
    sections: dict = {}
    try:
        old = json.loads(path_json.read_text()) if path_json.is_file() else None
    except (OSError, ValueError):
        old = None
    if isinstance(old, dict) and old.get("schema") == SUMMARY_SCHEMA:
        sections = dict(old.get("grids", {}))
    elif old is not None:  # a summary written before grid ids: kept as it was
        earlier_md = path_md.read_text() if path_md.is_file() else ""
        sections["earlier"] = {"note": "written before summaries were kept per grid", "rows": old,
                               "markdown": earlier_md}
    title = _grid_title(grid, gid)
    md = f"## {title}\n\n" + summary_markdown(rows, metrics)
    if failed:
        md += "\nFailed runs (not in the means above):\n\n" + "".join(f"- `{f['run']}`: {f['error']}\n" for f in failed)
    sections[gid] = {**{k: grid.get(k) for k in ("experiments", "preset", "grid", "seeds", "overrides")},
                     "statistic": _STAT, "rows": [_row_json(r) for r in rows],
                     "failed": [{"status": "failed", **f} for f in failed], "markdown": md}
    path_json.write_text(json.dumps({"schema": SUMMARY_SCHEMA, "grids": sections}, indent=1, default=list) + "\n")
    path_md.write_text("# Grid summaries\n\nOne section per grid configuration run into this folder.\n\n"
                       + "\n".join(sec["markdown"] for sec in sections.values()))
    return rows, md


def _grid_title(grid: dict, gid: str) -> str:
    parts = [f"grid {gid}"]
    if grid.get("experiments"):
        parts.append("experiments " + ", ".join(grid["experiments"]))
    if grid.get("preset"):
        parts.append(f"preset {grid['preset']}")
    if grid.get("grid"):
        parts.append("axes " + "; ".join(f"{k} = {', '.join(map(str, v))}" for k, v in grid["grid"].items()))
    if grid.get("seeds") is not None:
        parts.append("seeds " + ", ".join(map(str, grid["seeds"])))
    common = grid.get("overrides") or []
    parts.append("common --set " + " ".join(common) if common else "no common --set")
    return "; ".join(parts)


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
    stopped (``{"run", "experiment", "overrides", "seed", "error"}``), ``skipped``: the names of
    the runs found complete in the output folder, ``markdown``: this grid's summary section and
    ``id``: the grid configuration's :func:`grid_id`."""

    failed: list
    skipped: list
    markdown: str
    id: str


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


def _stored_runs(folder) -> tuple[dict, dict]:
    """``({(experiment, preset, seed): [(path, results)]}, {path: why})``: the complete results
    files in ``folder``, and the ``.json`` files that are not results files (``summary.json`` left
    out)."""
    from pathlib import Path

    index: dict = {}
    foreign: dict = {}
    for p in sorted(Path(folder).glob("*.json")):
        if p.name == "summary.json":
            continue
        try:
            res = load_results(p)
            key = (res["experiment"], res["preset"], res["config"]["train"]["seed"])
        except (ResultsError, KeyError, TypeError) as err:
            foreign[p] = " ".join(str(err).split())
            continue
        if res.get("status", "complete") == "complete":
            index.setdefault(key, []).append((p, res))
    return index, foreign


def _find_identical(index: dict, run: GridRun):
    """A stored complete run with ``run``'s identity config: ``(path, results)`` or ``None``."""
    for path, res in index.get((run.experiment, run.cfg.preset, run.seed), []):
        try:
            if not identity_differences(res["config"], run.cfg):
                return path, res
        except ConfigError:  # a stored config this version cannot read: not the same run
            continue
    return None


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
    described = {"experiments": list(experiments), "preset": preset, "grid": dict(grid or {}), "seeds": list(seeds),
                 "overrides": list(overrides)}
    for device in {r.cfg.train.device for r in runs}:  # a device this machine lacks: refused once, first
        resolve_device(device)
    held = out_dir_lock(out) if out is not None and main else contextlib.nullcontext()
    with held:
        index, foreign = _stored_runs(out) if out is not None else ({}, {})
        stored = {i: hit for i, r in enumerate(runs) if (hit := _find_identical(index, r)) is not None}
        done = stored if skip_existing and not overwrite else {}
        written = {_results_path(out, r, stored.get(i)): r for i, r in enumerate(runs) if i not in done}
        for path, why in foreign.items():
            if path in written and not overwrite:
                raise RunFolderError(f"grid run {written[path].stem} writes its results to {path.name}, which is not "
                                     f"a results file ({why}); move that file away, or --overwrite to replace it")
            say(f"note: {path.name} is not a results file ({why}); "
                + ("replaced by this grid's run (--overwrite)" if path in written else
                   "left alone (no run of this grid writes it)"), file=sys.stderr)
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
                    write_summary(out, results, failed, metrics, grid=described)
                raise TrainingInterrupted(f"grid stopped in run {i + 1}/{n} ({run.stem}): {err}; the same "
                                          f"command continues the grid (finished runs are skipped, this one "
                                          f"resumes)", err.signum, err.step, err.checkpoint, err.results) from None
            except KeyboardInterrupt:  # before the run's first step (data loading): nothing to save
                if out is not None and main and (results or failed):
                    write_summary(out, results, failed, metrics, grid=described)
                raise TrainingInterrupted(f"grid stopped before run {i + 1}/{n} ({run.stem}) trained; the same "
                                          f"command continues the grid", int(signal.SIGINT), 0, None,
                                          None) from None
            results.append(res)
        markdown = None
        if out is not None and main:
            rows, markdown = write_summary(out, results, failed, metrics, grid=described)
        else:
            rows = summarize_runs(results, metrics) if results else []
    out_rows = GridRows(rows)
    out_rows.failed, out_rows.skipped = failed, skipped
    out_rows.markdown = markdown if markdown is not None else summary_markdown(rows, metrics)
    out_rows.id = grid_id(**{k: described[k] for k in ("experiments", "preset", "grid", "seeds", "overrides")})
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
