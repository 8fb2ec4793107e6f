"""The GPU campaign: the mid-size (``gpu`` preset) runs the book needs, in priority order, run in
chunks that fit one call on a lent GPU machine, each results file written the moment its run ends.

GPU time comes rarely and briefly (about 30 minutes, 10 minutes per command, a copy of the working
tree without ``.git`` and without network). :data:`PLAN` lists every run as a recorded
``python -m cemlib.train`` command, with the ``book/results/<folder>`` it belongs to, its plan
(1: the first ≤ 25 GPU-minutes, 2: after it) and why it is there. One device call::

    CEMLIB_GIT_COMMIT=<the commit of the copied tree> python tools/gpu/campaign.py run --plan 1 \\
        --budget-s 540 --out runs/campaign --export "$OUT/campaign.tar"

runs the plan's runs in order, each as its own process: a run whose results already exist (in
``--out``, or already imported into ``book/results``) is skipped, so the next call continues;
before it starts a run it checks the run's estimate (``budget.py``) against the time
left, and a run still going when the budget ends is stopped with SIGTERM (the trainer then saves
its checkpoint and partial results) and is left for the next call. After every run, ``--export``
is rewritten: one tar of every finished results file, the campaign log (``campaign.json``: each
run's command, estimate, measured wall time, exit status) and each run's output, since the device
returns few files. It prints what it ran, skipped and what is left. On the repository's machine,
``python tools/gpu/import_results.py campaign.tar`` checks the files and copies them into
``book/results/<folder>/``. ``--jobs 2`` lets two runs share the GPU (the small models here leave
it mostly idle; the estimate check then assumes neither goes faster, and the tokens/s those runs
record are not clean measurements: the log says which ran together).

``--dry-run`` runs the same loop on the CPU with :func:`dry_overrides` (3 steps, batch 2, short
contexts, small datasets): the tests run it, and every ``gpu`` preset trains 3 steps that way.
"""

from __future__ import annotations

import argparse
import io
import json
import os
import signal
import subprocess
import sys
import tarfile
import time
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Callable

__all__ = ["Run", "PLAN", "plan_runs", "dry_overrides", "run_campaign", "export_archive", "folder_commands",
           "RESULTS_ROOT"]

#: Where imported results live, relative to the repository root.
RESULTS_ROOT = Path("book") / "results"


@dataclass(frozen=True)
class Run:
    """One run of the campaign: ``experiment`` / ``preset`` with ``train.seed = seed``, stored as
    ``book/results/<folder>/<name>.json``; ``plan`` 1 or 2; ``why`` says what the book needs it for."""

    experiment: str
    seed: int
    folder: str
    plan: int
    why: str
    preset: str = "gpu"

    @property
    def overrides(self) -> list[str]:
        return [f"train.seed={self.seed}"]

    @property
    def name(self) -> str:
        """The file-name stem, as :func:`cemlib.train.folders.run_name` names a grid's runs."""
        from cemlib.train.folders import run_name
        return run_name(self.experiment, [], self.seed)

    @property
    def file(self) -> str:
        return f"{self.folder}/{self.name}.json"

    @property
    def command(self) -> str:
        """The recorded command (what the results file's ``command`` must say)."""
        from cemlib.train.registry import reproduce_command
        return reproduce_command(self.experiment, self.preset, self.overrides)

    def argv(self, out_dir: Path, extra=()) -> list[str]:
        """The command line that runs it (``extra`` overrides after the recorded ones, dry runs only)."""
        args = [sys.executable, "-m", "cemlib.train", "--experiment", self.experiment, "--preset", self.preset]
        for o in [*self.overrides, *extra]:
            args += ["--set", o]
        return args + ["--out", str(out_dir)]


def _seeds(experiments, seeds, folder, plan, why) -> list[Run]:
    return [Run(e, s, folder, plan, why) for s in seeds for e in experiments]


_CENTRAL = ("shakespeare-llama", "shakespeare-cem", "shakespeare-cem-attn", "shakespeare-cem-mlp",
            "shakespeare-cem-t2")

#: Every run, in priority order (plan 1 first). See the README's "Running on a GPU workstation"
#: section and each preset's comment in :mod:`cemlib.train.experiments` for the sizes.
PLAN: list[Run] = [
    # The book's central claim (ch02, ch03, ch05): CEM attention, the CEM MLP and full CEM (T = 1, 2)
    # against Llama at nanoGPT's size; the verdict is paired by seed, so 3 seeds each.
    Run("shakespeare-llama", 0, "shakespeare_gpu", 1, "ch02/ch03/ch05 central comparison at the mid size, "
        "seed 0 (and the re-run that can replace the over-fitted shakespeare_llama_gpu.json)"),
    *_seeds(_CENTRAL[1:], (0,), "shakespeare_gpu", 1, "ch02/ch03/ch05 central comparison at the mid size, seed 0"),
    *_seeds(_CENTRAL, (1,), "shakespeare_gpu", 1, "ch02/ch03/ch05: seed 1, for the paired-by-seed verdict"),
    *_seeds(_CENTRAL, (2,), "shakespeare_gpu", 2, "ch02/ch03/ch05: seed 2, for the paired-by-seed verdict"),
    # One run per other training chapter: the mid-size result each chapter shows.
    Run("listops-nrgpt", 0, "listops_gpu", 2, "ch07: NRGPT on ListOps at the mid size"),
    Run("listops-gpt", 0, "listops_gpu", 2, "ch07: its deep GPT baseline"),
    Run("lis-mha2nd1st", 0, "lis_gpu", 2, "ch08: Newton attention (MHA2nd1st) on LIS L = 20 (App. A.9)"),
    Run("lis-mha", 0, "lis_gpu", 2, "ch08: the standard-attention baseline"),
    Run("sudoku-hyperset-authors", 0, "sudoku_gpu", 2, "ch09: Hyper-SET on hard Sudoku at the mid size"),
    Run("sudoku-transformer-authors", 0, "sudoku_gpu", 2, "ch09: the recurrent Transformer baseline"),
    Run("shakespeare-nrgpt", 0, "nrgpt_shakespeare_gpu", 2, "ch07: NRGPT on Shakespeare (Table 4's size)"),
    *_seeds(("bench-listops-cem", "bench-listops-llama", "bench-listops-nrgpt", "bench-listops-newton",
             "bench-listops-hyperset", "bench-listops-gpt"), (0,), "bench_listops_gpu", 2,
            "ch10: the parameter-matched ListOps benchmark at the mid size"),
    *_seeds(("bench-shakespeare-cem", "bench-shakespeare-llama", "bench-shakespeare-nrgpt",
             "bench-shakespeare-newton", "bench-shakespeare-gpt"), (0,), "bench_shakespeare_gpu", 2,
            "ch10: the parameter-matched Shakespeare benchmark at the mid size"),
]


def plan_runs(plan: int | None = None, folder: str | None = None, plan_list: list[Run] | None = None) -> list[Run]:
    """The runs of ``plan`` (1, 2, or all) and/or ``folder``, in priority order."""
    runs = PLAN if plan_list is None else plan_list
    return [r for r in runs if (plan is None or r.plan == plan) and (folder is None or r.folder == folder)]


def folder_commands(folder: str) -> list[str]:
    """The recorded commands of the runs stored in ``book/results/<folder>`` (for a chapter to print)."""
    return [r.command for r in plan_runs(folder=folder)]


# ------------------------------------------------------------------------------ dry runs
#: Task options that make each dataset small for a dry run (the model keeps its gpu size).
_DRY_TASK = {
    "listops": ["task.n_train=64", "task.n_test=2", "task.val_fraction=0.05"],
    "lis": ["task.n_train=64", "task.n_test=2", "task.val_fraction=0.05"],
    "gp": ["task.n_train=64", "task.n_val=2", "task.n_test=2"],
    "sudoku": ["task.n_train=16", "task.n_test=2", "task.val_fraction=0.0002"],
    "digits": ["task.val_fraction=0.01", "task.test_fraction=0.01"],
}


def dry_overrides(experiment: str, preset: str = "gpu", steps: int = 3) -> list[str]:
    """Overrides that run ``experiment``/``preset`` for ``steps`` steps on the CPU in seconds: batch 2,
    context 32 for language models, evaluations at the start and the end only (one batch of the
    train split, validation and test splits of a few examples), no whole-split evaluation. The
    model keeps the preset's size."""
    from cemlib.train.registry import get_config
    cfg = get_config(experiment, preset)
    out = [f"train.max_steps={steps}", f"train.eval_interval={steps}", "train.eval_batches=1",
           "train.batch_size=2", "train.grad_accum=1", "train.final_whole_eval=false", "train.log_interval=1",
           "train.checkpoint_interval=0", "train.device=cpu"]
    if cfg.data.name == "shakespeare":
        out.append("train.context_length=32")
    return out + _DRY_TASK.get(cfg.data.name, [])


# ------------------------------------------------------------------------------ running
def _utc() -> str:
    return datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def _complete(path: Path) -> bool:
    """Is ``path`` a finished run's results file (readable, status complete)?"""
    from cemlib.train.results import ResultsError, load_results
    try:
        return load_results(path).get("status", "complete") == "complete"
    except (ResultsError, OSError, ValueError):
        return False


def export_archive(out_dir: Path, archive: Path) -> Path:
    """Write ``archive`` (a tar, atomically): every finished ``<folder>/<name>.json`` in ``out_dir``,
    ``campaign.json`` and the runs' output in ``logs/``."""
    members = sorted(p for p in out_dir.glob("*/*.json") if _complete(p) and p.parent.name != "logs")
    log = out_dir / "campaign.json"
    members += ([log] if log.is_file() else []) + sorted((out_dir / "logs").glob("*.log"))
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        for p in members:
            tar.add(p, arcname=str(p.relative_to(out_dir)))
    archive = Path(archive)
    archive.parent.mkdir(parents=True, exist_ok=True)
    tmp = archive.with_name(archive.name + ".tmp")
    tmp.write_bytes(buf.getvalue())
    os.replace(tmp, archive)
    return archive


def _default_estimate(run: Run) -> float | None:
    from budget import preset_estimate
    e = preset_estimate(run.experiment, run.preset, run.overrides)
    return None if e is None else e.total_s


@dataclass
class _Active:
    run: Run
    proc: subprocess.Popen
    log: object
    started: float
    estimate_s: float
    extra: list
    stopped: bool = False
    kill_at: float | None = None
    shared_with: set = field(default_factory=set)


def run_campaign(runs: list[Run], out_dir: str | Path, budget_s: float, export: str | Path | None = None,
                 dry_run: bool = False, results_root: str | Path = RESULTS_ROOT, margin: float = 1.1,
                 estimate_s: Callable[[Run], float | None] | None = None, dry_estimate_s: float = 10.0,
                 jobs: int = 1, grace_s: float = 30.0, verbose: bool = True) -> dict:
    """Run ``runs`` in order within ``budget_s`` seconds (see the module docstring); return the log
    ``{"ran": [...], "skipped": [...], "left": [...], ...}``, also written to ``out_dir/campaign.json``.

    A run is skipped when ``out_dir/<folder>/<name>.json`` or ``results_root/<folder>/<name>.json``
    holds a finished run. A run starts only when ``margin`` x its estimate x the number of runs then
    going (``jobs`` at a time share one GPU; none of them is assumed to go faster for it) fits the
    time that remains. A run that would fit alone but not beside the runs going waits, in order,
    until one of them ends (the first H200 call dropped such runs and left the GPU idle for five of
    its nine minutes); one that does not fit even alone, or has no estimate, is left for the next
    call. At the end of the budget every run still going gets SIGTERM (the trainer saves a
    checkpoint and partial results), SIGKILL ``grace_s`` later, and is left. ``dry_run`` adds
    :func:`dry_overrides` and assumes every run takes ``dry_estimate_s``; ``estimate_s(run)``
    replaces the estimates."""
    t0 = time.monotonic()
    deadline = t0 + budget_s
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    if estimate_s is None:
        estimate_s = (lambda run: dry_estimate_s) if dry_run else _default_estimate
    say = (lambda msg: print(msg, flush=True)) if verbose else (lambda msg: None)
    log_path = out / "campaign.json"
    history = json.loads(log_path.read_text()).get("calls", []) if log_path.is_file() else []
    call = {"started_utc": _utc(), "budget_s": budget_s, "jobs": jobs, "dry_run": dry_run,
            "git_commit_env": os.environ.get("CEMLIB_GIT_COMMIT"), "ran": [], "skipped": [], "left": []}
    history.append(call)

    def save_log():
        log_path.write_text(json.dumps({"schema": "cemlib.train.campaign/1", "calls": history}, indent=1) + "\n")
        if export is not None:
            export_archive(out, Path(export))

    pending: list[Run] = []
    for run in runs:
        if _complete(out / run.file) or _complete(Path(results_root) / run.file):
            call["skipped"].append({"run": run.file, "why": "results exist"})
            say(f"skip  {run.file}: results exist")
        else:
            pending.append(run)
    active: list[_Active] = []

    def start(run: Run, est: float) -> None:
        run_dir = out / run.folder / run.name
        if run_dir.exists():  # an earlier, unfinished attempt: kept aside, never mixed with this one
            k = 1
            while run_dir.with_name(f"{run.name}.attempt{k}").exists():
                k += 1
            run_dir.rename(run_dir.with_name(f"{run.name}.attempt{k}"))
        extra = dry_overrides(run.experiment, run.preset) if dry_run else []
        (out / "logs").mkdir(parents=True, exist_ok=True)
        log = open(out / "logs" / f"{run.name}.log", "w")
        proc = subprocess.Popen(run.argv(run_dir, extra), stdout=log, stderr=subprocess.STDOUT)
        active.append(_Active(run, proc, log, time.monotonic(), est, extra))
        say(f"run   {run.file} (estimate {est / 60:.1f} min): {run.command}")

    def finish(a: _Active, rc: int) -> None:
        a.log.close()
        wall = time.monotonic() - a.started
        entry = {"run": a.run.file, "command": a.run.command, "extra_overrides": a.extra,
                 "estimate_s": a.estimate_s, "wall_s": round(wall, 1), "exit_status": rc,
                 "stopped_at_budget": a.stopped, "shared_gpu_with": sorted(a.shared_with), "ended_utc": _utc()}
        produced = out / a.run.folder / a.run.name / "results.json"
        if rc == 0 and _complete(produced):
            final = out / a.run.file
            final.parent.mkdir(parents=True, exist_ok=True)
            final.write_bytes(produced.read_bytes())
            call["ran"].append(entry)
            say(f"done  {a.run.file} in {wall / 60:.1f} min (estimate {a.estimate_s / 60:.1f})")
        else:
            entry["why"] = "stopped at the end of the budget" if a.stopped else f"exit status {rc}"
            call["left"].append(entry)
            say(f"{'STOP' if a.stopped else 'FAIL'}  {a.run.file}: {entry['why']}; log in "
                f"{out / 'logs' / (a.run.name + '.log')}")
        save_log()

    while pending or active:
        while pending and len(active) < jobs:
            run = pending[0]
            est = estimate_s(run)
            left_s = deadline - time.monotonic()
            if est is None or margin * est > left_s:   # does not fit even alone: left for the next call
                pending.pop(0)
                why = "no current estimate (python tools/gpu/budget.py --update)" if est is None else \
                    f"needs ~{est / 60:.1f} min, {max(0.0, left_s) / 60:.1f} min left"
                call["left"].append({"run": run.file, "estimate_s": est, "why": why})
                say(f"left  {run.file}: {why}")
                continue
            if margin * est * (len(active) + 1) > left_s:
                break                                   # fits alone: wait until a running one ends
            pending.pop(0)
            start(run, est)
        for a in active:
            a.shared_with |= {b.run.file for b in active if b is not a}
        for a in list(active):
            rc = a.proc.poll()
            if rc is not None:
                active.remove(a)
                finish(a, rc)
            elif time.monotonic() >= deadline and not a.stopped:
                a.proc.send_signal(signal.SIGTERM)
                a.stopped, a.kill_at = True, time.monotonic() + grace_s
            elif a.stopped and time.monotonic() >= a.kill_at:
                a.proc.kill()
        if active:
            time.sleep(0.5)
    call["elapsed_s"] = round(time.monotonic() - t0, 1)
    save_log()
    say(f"\nran {len(call['ran'])}, skipped {len(call['skipped'])}, left {len(call['left'])} "
        f"in {call['elapsed_s'] / 60:.1f} min")
    if call["left"]:
        known = [e["estimate_s"] for e in call["left"] if e.get("estimate_s")]
        say(f"left for the next call: ~{sum(known) / 60:.1f} min of estimates: "
            + ", ".join(e["run"] for e in call["left"]))
    return call


def _print_plan(runs: list[Run]) -> None:
    from budget import load_counts, preset_estimate
    store = load_counts()
    total = 0.0
    for r in runs:
        e = preset_estimate(r.experiment, r.preset, r.overrides, store)
        total += e.minutes if e else 0.0
        est = f"{e.minutes:5.1f}" if e else "    ?"
        print(f"plan {r.plan}  {est} min  {r.file:60s} {r.why}")
    print(f"{len(runs)} runs, {total:.1f} estimated H100-minutes")


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python tools/gpu/campaign.py", description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    pl = sub.add_parser("plan", help="list the runs with their estimated H100 minutes")
    rn = sub.add_parser("run", help="run the plan's runs that fit the budget")
    for q in (pl, rn):
        q.add_argument("--plan", type=int, choices=(1, 2), help="plan 1 or 2 (default: all, in order)")
        q.add_argument("--folder", help="only the runs stored in book/results/<folder>")
    rn.add_argument("--budget-s", type=float, default=540.0,
                    help="seconds this call may use (default 540: with --grace-s, under a 10-minute command)")
    rn.add_argument("--grace-s", type=float, default=30.0,
                    help="after SIGTERM at the end of the budget, seconds before SIGKILL (default 30)")
    rn.add_argument("--out", default="runs/campaign", help="output folder (kept between calls on one machine)")
    rn.add_argument("--export", help="tar to rewrite after every run (e.g. $OUT/campaign.tar)")
    rn.add_argument("--dry-run", action="store_true", help="3 tiny steps per run on the CPU (a test)")
    rn.add_argument("--limit", type=int, help="only the first LIMIT runs of the selection")
    rn.add_argument("--jobs", type=int, default=1, help="runs at a time on the one GPU (default 1; small "
                    "models leave it mostly idle, but tokens/s of runs that shared it are not clean)")
    rn.add_argument("--dry-estimate-s", type=float, default=10.0, help="with --dry-run: each run's assumed time")
    args = p.parse_args(argv)
    runs = plan_runs(args.plan, args.folder)
    if getattr(args, "limit", None):
        runs = runs[: args.limit]
    if args.cmd == "plan":
        _print_plan(runs)
        return 0
    if not args.dry_run:
        import torch
        if not torch.cuda.is_available():
            print("error: no CUDA GPU here (use --dry-run to try the campaign on the CPU)", file=sys.stderr)
            return 2
        if not os.environ.get("CEMLIB_GIT_COMMIT"):
            print("error: set CEMLIB_GIT_COMMIT to the commit the working tree was copied from (the "
                  "device copy has no .git, and the results must name a clean commit)", file=sys.stderr)
            return 2
    call = run_campaign(runs, args.out, args.budget_s, args.export, dry_run=args.dry_run,
                        dry_estimate_s=args.dry_estimate_s, jobs=args.jobs, grace_s=args.grace_s)
    failed = [e for e in call["left"] if "exit_status" in e and not e.get("stopped_at_budget")]
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
