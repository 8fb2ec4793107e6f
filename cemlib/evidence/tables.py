"""A chapter's stored mid-size (GPU) results beside its CPU results and the paper's number.

:func:`gpu_results_table` reads the results files of a chapter's GPU folder and of the matching
CPU runs, and returns a :class:`ResultsTable` with one row per model that has a stored GPU run::

    model | params | GPU: final | GPU: best periodic evaluation (step) | CPU: final | paper

Each "final" cell is the mean ± sample standard deviation over the stored seeds of the final
model's metric, on the whole validation split where the file records it
(``metrics["final_whole_val"]``) and else on the periodic evaluation's sample; "best" is the
best *periodic* evaluation of the run by the task's primary metric, read from its curve (mean over
seeds, with the step of seed 0's best). A periodic evaluation averages a fixed number of batches,
not the whole split, so a best value can lie above the final whole-split one; the note says so.
Models without a stored GPU run are left out of the table, and the note gives the command that
trains one. In a notebook the table renders as Markdown.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

__all__ = ["Row", "ResultsTable", "gpu_results_table", "final_metric", "best_evaluation"]

@dataclass(frozen=True)
class Row:
    """One model of the table: its ``label``, the ``experiment`` of its GPU runs, the paper's number
    as text (with where it is printed), and the ``cpu_experiment`` of its CPU runs (default: the
    same experiment)."""

    label: str
    experiment: str
    paper: str = "—"
    cpu_experiment: str | None = None


def final_metric(res: dict, metric: str) -> float:
    """The final model's ``metric`` (e.g. ``val_loss``, ``test_accuracy``): from the whole
    validation split when recorded (``val_*`` only), else from the last periodic evaluation."""
    whole = res["metrics"].get("final_whole_val") or {}
    if metric in whole:
        return float(whole[metric])
    return float(res["metrics"]["final"][metric])


def best_evaluation(res: dict) -> tuple[float, int, str]:
    """``(value, step, metric)`` of the run's best periodic evaluation by its task's primary metric
    (``val_loss`` when the file does not name one)."""
    task = res.get("task") or {}
    metric = f"val_{task.get('primary_metric', 'loss')}"
    pick = max if task.get("primary_mode", "min") == "max" else min
    ev = [e for e in res["curves"]["eval"] if metric in e]
    best = pick(ev, key=lambda e: e[metric])
    return float(best[metric]), int(best["step"]), metric


def _load_folder(folder: Path, preset: str) -> list[dict]:
    from cemlib.train.results import load_results
    if not folder.is_dir():
        return []
    runs = [load_results(p) for p in sorted(folder.glob("*.json")) if p.name != "summary.json"]
    return [r for r in runs if r["preset"] == preset]


def _mean_sd(runs: list[dict], metric: str, digits: int) -> str:
    """``mean ± sd (n seeds)`` of the runs' final ``metric`` ("runs" if two share a seed)."""
    v = np.asarray([final_metric(r, metric) for r in runs], dtype=float)
    seeds = {r["config"]["train"]["seed"] for r in runs}
    what = "seed" if len(seeds) == len(runs) else "run"
    if len(v) == 1:
        return f"{v[0]:.{digits}f} (1 {what})"
    return f"{v.mean():.{digits}f} ± {v.std(ddof=1):.{digits}f} ({len(v)} {what}s)"


@dataclass
class ResultsTable:
    """The table (``header``, ``rows`` of strings), whether any GPU run was found, the GPU's name,
    a ``note`` in words and the ``commands`` that make the GPU runs."""

    header: list[str]
    rows: list[list[str]]
    available: bool
    device: str | None
    note: str
    commands: list[str] = field(default_factory=list)

    def markdown(self) -> str:
        lines = ["| " + " | ".join(self.header) + " |", "|" + "---|" * len(self.header)]
        lines += ["| " + " | ".join(r) + " |" for r in self.rows]
        return "\n".join(lines) + "\n\n" + self.note.replace("\n", "  \n")

    def _repr_markdown_(self) -> str:
        return self.markdown()

    def __repr__(self) -> str:
        widths = [max(len(str(c)) for c in col) for col in zip(self.header, *self.rows)]
        fmt = "  ".join(f"{{:{w}s}}" for w in widths)
        return "\n".join([fmt.format(*self.header), *(fmt.format(*r) for r in self.rows), "", self.note])


def _stored(path) -> Path:
    """``path`` as given if it exists; else a path under the book's ``results/`` found with
    :func:`cemlib.evidence.stored.stored_path` (a chapter opened alone, without the repository beside it,
    reads the copy shipped with cemlib); else ``path`` as given (a folder not made yet)."""
    p = Path(path)
    if p.exists() or p.is_absolute():
        return p
    from cemlib.evidence.stored import stored_path
    rel = p.as_posix()
    rel = rel[2:] if rel.startswith("./") else rel
    for candidate in ((rel,) if rel.startswith("book/") else ("book/" + rel, rel)):
        try:
            return stored_path(candidate)
        except (FileNotFoundError, ValueError):
            continue
    return p


def _cpu_runs(cpu) -> list[dict]:
    """Results of CPU runs from a folder, a file, results dictionaries (a chapter's live runs), or a
    list of any of these."""
    from cemlib.train.results import load_results
    if cpu is None:
        return []
    if isinstance(cpu, dict):
        return [cpu]
    if isinstance(cpu, (list, tuple)):
        return [r for item in cpu for r in _cpu_runs(item)]
    p = _stored(cpu)
    return [load_results(p)] if p.is_file() else _load_folder(p, "cpu")


def gpu_results_table(gpu_folder: str | Path, rows: list[Row], cpu=None, metric: str = "val_loss",
                      digits: int = 3) -> ResultsTable:
    """The table of ``rows`` for the GPU runs in ``gpu_folder`` (e.g. ``results/shakespeare_gpu``)
    and the CPU runs ``cpu`` (a folder of results files, one file, a results dictionary such as a
    chapter's live run, or a list of these); ``metric`` is a key of the runs' final metrics (see
    the module docstring). A relative path that does not exist from the working directory is
    looked up under the book's stored results (:func:`cemlib.evidence.stored.stored_path`), so a chapter
    opened alone finds the files shipped with cemlib."""
    from cemlib.train.results import device_name
    gpu_folder = _stored(gpu_folder)
    gpu = _load_folder(gpu_folder, "gpu")
    cpu = _cpu_runs(cpu)
    devices = sorted({device_name(r) for r in gpu})
    device = ", ".join(devices) if devices else None
    # short headers, so that the table fits a book's column; the device goes into the note
    header = ["model", "params", f"GPU: {metric}", "GPU: best periodic eval (step)", f"CPU: {metric}",
              "paper"]
    table, missing = [], []
    for row in rows:
        g = sorted((r for r in gpu if r["experiment"] == row.experiment), key=lambda r: r["config"]["train"]["seed"])
        c = [r for r in cpu if r["experiment"] == (row.cpu_experiment or row.experiment)]
        if not g:
            missing.append(row.experiment)
            continue
        bests = [best_evaluation(r) for r in g]
        best = f"{np.mean([b[0] for b in bests]):.{digits}f} ({bests[0][2]}, step {bests[0][1]})"
        table.append([row.label, f"{g[0]['num_parameters']:,}", _mean_sd(g, metric, digits), best,
                      _mean_sd(c, metric, digits) if c else "—", row.paper])
    commands = [f"cemlib train --experiment {e} --preset gpu" for e in missing]
    if gpu:
        note = (f"Trained on {device}; each run's command, commit and versions are in its results "
                f"file. The final value is measured on the whole validation split, the best periodic "
                f"evaluation on a fixed number of batches, so the two can differ in either direction.")
    else:
        note = "No GPU run of these models is stored."
    if missing:
        note += (" Train the gpu preset of a model missing here with "
                 + "; ".join(f"`{c}`" for c in commands) + ".")
    return ResultsTable(header, table, bool(gpu), device, note, commands)
