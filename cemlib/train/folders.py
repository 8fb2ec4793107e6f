"""What a run is called, where it writes, and who may write there.

*Identity.* A run is identified by its resolved configuration (experiment, preset and every field
after ``--set``): :func:`run_id` is the first 8 hexadecimal digits of the SHA-256 of
:func:`identity_config`, the config without the fields that change neither the training nor the
metrics (``train.checkpoint_interval``, ``train.log_interval``, ``train.peak_tflops``) and without
those the dataset does not use (``train.context_length`` for ListOps, ``data.path`` for generated
data, ...; :func:`~cemlib.train.datasets.unused_fields`). A single run's default folder is
``runs/<experiment>-<preset>-<run id>`` (:func:`default_out_dir`); a grid run's files are named
:func:`grid_stem`, e.g. ``gp_cem_t2__task.kernel-matern__seed1__cpu-3f09a1c2``. Two runs are the
same run when their identity configs are equal (:func:`identity_differences`), whatever their
files are called, so results stored under older names are recognised.

*Folders.* A run folder holds ``results.json``, checkpoints (``ckpt_<step>.pt``, ``last.pt``,
``best.pt``, ``last_good.pt``) and the metric logs (``train_log.csv``, ``eval_log.csv``).
:func:`check_run_folder` refuses to mix two runs in one folder (it names what the folder holds and
how to go on: ``--resume``, ``--overwrite`` or another ``--out``); :func:`newest_checkpoint` is
what ``--resume FOLDER`` continues from.

*Writers.* :func:`out_dir_lock` makes a process the only writer of a folder: a second process that
tries is refused with a message naming the holder (pid, host, command). The lock is ``filelock``'s
OS file lock on ``.cemlib-lock`` in the folder, released when the process ends, however it ends.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import socket
import sys
import time
from pathlib import Path

from cemlib.train.checkpoint import RESUMABLE_CHANGES, CheckpointError, load_checkpoint
from cemlib.train.config import ConfigError, ExperimentConfig
from cemlib.train.datasets import unused_fields
from cemlib.train.results import ResultsError, load_results

__all__ = ["RunFolderError", "NON_IDENTITY_FIELDS", "LATER_FIELDS", "drop_later_defaults", "identity_config", "identity_differences", "identity_key",
           "run_id",
           "default_out_dir", "run_name", "grid_stem", "run_artifacts", "newest_checkpoint", "resolve_checkpoint",
           "folder_run", "check_run_folder", "out_dir_lock", "LOCK_NAME", "name_max"]

#: fields that change neither what a run trains nor what it measures
NON_IDENTITY_FIELDS = ("train.checkpoint_interval", "train.log_interval", "train.peak_tflops",
                       "train.keep_checkpoints")
#: fields added after runs were stored, with the value those runs had: at that value a field is
#: left out of the identity, so that a run stored before it existed keeps its id and its folder
#: (and resumes); any other value makes another run
LATER_FIELDS = {"train.compile_mode": "default", "optim.schedule": "cosine", "train.patience": 0}
LOCK_NAME = ".cemlib-lock"
HOLDER_NAME = ".cemlib-lock.holder"
_CKPT = re.compile(r"^ckpt_(\d+)\.pt$")


class RunFolderError(RuntimeError):
    """An output folder cannot be used as asked (it holds another run, or another process writes
    there); the message says what it holds and how to go on."""


# ------------------------------------------------------------------------------ identity
def _as_dict(cfg) -> dict:
    """A config (``ExperimentConfig`` or its dict, possibly from an older results file) as the
    dict of the current ``ExperimentConfig``, every field present."""
    if isinstance(cfg, dict):
        cfg = ExperimentConfig.from_dict(cfg)
    return cfg.to_dict()


def identity_config(cfg) -> dict:
    """The part of a config that makes a run what it is (see the module docstring)."""
    d = _as_dict(cfg)
    for dotted in (*NON_IDENTITY_FIELDS, *unused_fields(d["data"]["name"])):
        section, name = dotted.split(".")
        d[section].pop(name, None)
    drop_later_defaults(d)
    return json.loads(json.dumps(d, default=repr))  # tuples as lists, as a results file has them


def drop_later_defaults(d: dict) -> dict:
    """Remove from the config dictionary ``d`` (in place; also returned) every field of
    :data:`LATER_FIELDS` that holds the value runs had before it existed."""
    for dotted, earlier in LATER_FIELDS.items():
        section, name = dotted.split(".")
        if d[section].get(name, earlier) == earlier:
            d[section].pop(name, None)
    return d


def _flat(d: dict) -> dict:
    """``{"optim": {"lr": x}}`` -> ``{"optim.lr": x}`` (one level: the config's sections)."""
    out = {}
    for k, v in d.items():
        if isinstance(v, dict):
            out.update({f"{k}.{f}": x for f, x in v.items()})
        else:
            out[k] = v
    return out


def _numbers_as_floats(v):
    if isinstance(v, dict):
        return {k: _numbers_as_floats(x) for k, x in v.items()}
    if isinstance(v, list):
        return [_numbers_as_floats(x) for x in v]
    return float(v) if isinstance(v, int) and not isinstance(v, bool) else v


def identity_key(cfg) -> str:
    """A string equal for two configs exactly when :func:`identity_differences` finds none (numbers
    compared by value: ``8`` and ``8.0`` are the same)."""
    return json.dumps(_numbers_as_floats(identity_config(cfg)), sort_keys=True, default=repr)


def identity_differences(a, b) -> list[str]:
    """``["optim.lr: 0.003 vs 0.001", ...]``: where the identity configs of ``a`` and ``b`` differ
    (empty: the same run)."""
    fa, fb = _flat(identity_config(a)), _flat(identity_config(b))
    return [f"{k}: {fa.get(k, '(unset)')!r} vs {fb.get(k, '(unset)')!r}" for k in sorted(set(fa) | set(fb))
            if fa.get(k, "(unset)") != fb.get(k, "(unset)")]


def run_id(cfg) -> str:
    """8 hexadecimal digits naming the run of ``cfg`` (equal configs, equal ids)."""
    text = json.dumps(identity_config(cfg), sort_keys=True, separators=(",", ":"), default=repr)
    return hashlib.sha256(text.encode()).hexdigest()[:8]


def default_out_dir(cfg) -> Path:
    """``runs/<experiment>-<preset>-<run id>``: a changed ``--set`` or ``--preset`` is a new folder.
    A run on a file of one's own (``data.path``) carries the file's name too:
    ``runs/shakespeare-llama-cpu-my_text-<run id>``."""
    d = _as_dict(cfg)
    data = ""
    if d["data"].get("path"):
        stem = re.sub(r"[^A-Za-z0-9_.-]+", "_", Path(str(d["data"]["path"])).name.split(".")[0] or "data")
        data = f"-{stem[:40]}"
    return Path("runs") / f"{d['experiment']}-{d['preset']}{data}-{run_id(cfg)}"


def name_max(folder: str | Path) -> int:
    """The longest file name ``folder``'s file system accepts (255 where it does not say)."""
    try:
        return int(os.pathconf(folder, "PC_NAME_MAX"))
    except (OSError, ValueError, AttributeError):
        return 255


def run_name(experiment: str, overrides, seed: int) -> str:
    """File-name stem of one grid run: ``gp_cem_t2__task.kernel-matern__seed1``."""
    parts = [experiment.replace("-", "_")]
    parts += [o.replace("=", "-").replace("/", "_") for o in overrides]
    return "__".join(parts + [f"seed{seed}"])



def grid_stem(experiment: str, preset: str, overrides, seed: int, cfg, limit: int = 200) -> str:
    """File stem of a grid run: :func:`run_name` (experiment, grid values, seed), then
    ``__<preset>-<run id>``. If that is longer than ``limit`` characters, the grid values are
    shortened (ending in ``~``); the run id still tells runs apart."""
    tail = f"__{preset}-{run_id(cfg)}"
    stem = run_name(experiment, overrides, seed) + tail
    if len(stem.encode()) <= limit:
        return stem
    head = experiment.replace("-", "_")
    middle = run_name(experiment, overrides, seed)[len(head):-len(f"__seed{seed}")]
    room = limit - len((head + f"__seed{seed}" + tail + "~").encode())
    if room < 0:
        raise RunFolderError(f"the run name of experiment {experiment!r} with preset {preset!r} does not "
                             f"fit in {limit} characters")
    middle = middle.encode()[:room].decode(errors="ignore") + "~"
    return f"{head}{middle}__seed{seed}{tail}"


# ------------------------------------------------------------------------------ folders
def run_artifacts(folder: str | Path) -> list[Path]:
    """The files of a run in ``folder`` (results, checkpoints, metric logs), sorted."""
    folder = Path(folder)
    if not folder.is_dir():
        return []
    names = {"results.json", "last.pt", "best.pt", "last_good.pt", "train_log.csv", "eval_log.csv",
             "failure.txt"}
    return sorted(p for p in folder.iterdir() if p.is_file() and (
        p.name in names or _CKPT.match(p.name) or p.name.startswith("events.out.tfevents.")))


def _step_of(path: Path) -> int | None:
    m = _CKPT.match(path.name)
    return int(m.group(1)) if m else None


def newest_checkpoint(folder: str | Path) -> Path | None:
    """The checkpoint a run in ``folder`` continues from: ``last.pt`` if present (the run reached
    ``max_steps``), else the ``ckpt_<step>.pt`` with the largest step; ``None`` if there is none.
    (``last_good.pt`` and ``best.pt`` are not resume points of their own: name them explicitly.)"""
    folder = Path(folder)
    if (folder / "last.pt").is_file():
        return folder / "last.pt"
    steps = [(s, p) for p in folder.glob("ckpt_*.pt") if (s := _step_of(p)) is not None and p.is_file()]
    return max(steps)[1] if steps else None


def resolve_checkpoint(path: str | Path) -> Path:
    """``--resume`` accepts a checkpoint file or a run folder (its :func:`newest_checkpoint`)."""
    path = Path(path)
    if path.is_dir():
        found = newest_checkpoint(path)
        if found is None:
            raise CheckpointError(f"--resume {path}: the folder holds no checkpoint (last.pt or "
                                  f"ckpt_<step>.pt){'; it holds last_good.pt, which you may name' if (path / 'last_good.pt').is_file() else ''}")
        return found
    if not path.exists():
        raise CheckpointError(f"checkpoint {str(path)!r} does not exist")
    return path


def folder_run(folder: str | Path) -> dict | None:
    """What a run folder holds: ``{"config", "status", "step", "source"}`` from its
    ``results.json`` (else from its newest checkpoint, else from ``last_good.pt`` or ``best.pt``),
    or ``None`` if none of them can be read."""
    folder = Path(folder)
    res = folder / "results.json"
    if res.is_file():
        try:
            r = load_results(res)
            return {"config": r["config"], "status": r.get("status", "complete"),
                    "step": r["metrics"].get("steps"), "source": res}
        except (ResultsError, KeyError, TypeError):
            pass
    for ck in (newest_checkpoint(folder), folder / "last_good.pt", folder / "best.pt"):
        if ck is not None and ck.is_file():
            try:
                p = load_checkpoint(ck)
                return {"config": p["config"], "status": "checkpoint", "step": int(p["step"]), "source": ck}
            except CheckpointError:
                pass
    return None


def check_run_folder(folder: str | Path, cfg, *, resuming: bool = False, overwrite: bool = False,
                     extra: tuple[Path, ...] = (), resume_from: str | Path | None = None) -> list[Path]:
    """Make sure ``folder`` receives the run of ``cfg`` and nothing else is mixed in.

    An empty (or absent) folder, or one without run files, is fine. When ``resuming``, the folder
    may hold the same run, up to the fields a resumed run may change
    (:data:`~cemlib.train.checkpoint.RESUMABLE_CHANGES`), and nothing else; where the folder's
    results and checkpoints cannot be read, the checkpoint resumed from (``resume_from``) says
    what it holds. Otherwise a folder that holds a run is
    refused with :class:`RunFolderError`, unless ``overwrite``: then the run files (and ``extra``,
    e.g. a grid run's results file) are deleted, and returned. ``resuming`` with ``overwrite`` is
    refused before anything is deleted (it would delete the checkpoint being resumed)."""
    folder = Path(folder)
    if resuming and overwrite:
        raise RunFolderError(f"--resume and --overwrite together would delete the checkpoint being resumed "
                             f"in {folder}; drop --overwrite to continue the run, or drop --resume to "
                             f"train it again from the start")
    found = run_artifacts(folder)
    if not found:
        return []
    held = folder_run(folder)
    if held is None and resuming and resume_from is not None:
        with contextlib.suppress(CheckpointError):
            p = load_checkpoint(resume_from)
            held = {"config": p["config"], "status": "checkpoint", "step": int(p["step"]),
                    "source": Path(resume_from)}
    try:
        diffs = identity_differences(held["config"], cfg) if held else None
    except ConfigError:
        diffs = ["(the stored config is not readable by this version)"]
    if overwrite:
        removed = []
        for p in (*found, *extra):
            with contextlib.suppress(FileNotFoundError):
                p.unlink()
                removed.append(p)
        return removed
    names = ", ".join(p.name for p in found[:6]) + (" ..." if len(found) > 6 else "")
    if resuming:
        if diffs is not None:
            diffs = [d for d in diffs if d.split(":", 1)[0] not in RESUMABLE_CHANGES]
        if diffs == []:
            return []
        if held is None:
            raise RunFolderError(f"out_dir {folder} holds files of a run ({names}) whose configuration cannot "
                                 f"be read, and so cannot be checked against the checkpoint resumed; resume "
                                 f"into another --out")
        shown = "; ".join(diffs[:3]) + (f"; and {len(diffs) - 3} more" if len(diffs) > 3 else "")
        raise RunFolderError(f"out_dir {folder} holds a run of another configuration than the one resumed "
                             f"({shown}; the first value is the stored one); a resumed run may change only "
                             f"{', '.join(sorted(RESUMABLE_CHANGES))}; leave out the --set that changes the rest, or "
                             f"resume into another --out")
    if held is None:
        raise RunFolderError(f"out_dir {folder} holds files of an earlier run ({names}) whose configuration "
                             f"cannot be read; choose another --out, or --overwrite to replace them")
    if diffs:
        shown = "; ".join(diffs[:3]) + (f"; and {len(diffs) - 3} more" if len(diffs) > 3 else "")
        raise RunFolderError(f"out_dir {folder} holds a run of another configuration ({shown}; the first "
                             f"value is the stored one); choose another --out, or --overwrite to replace it")
    if held["status"] == "complete":
        raise RunFolderError(f"out_dir {folder} already holds this run, complete ({held['source'].name}); "
                             f"--overwrite trains it again, or choose another --out")
    raise RunFolderError(f"out_dir {folder} holds this run, stopped at step {held['step']} "
                         f"({held['source'].name}): continue it with --resume {folder}, or start again "
                         f"with --overwrite")


# ------------------------------------------------------------------------------ one writer per folder
_HELD: dict[str, list] = {}  # resolved folder -> [FileLock, count]: nested holds in this process


def _describe_self() -> str:
    cmd = " ".join(sys.argv)[:300]
    return (f"pid {os.getpid()} on {socket.gethostname()} since "
            f"{time.strftime('%Y-%m-%d %H:%M:%S')}: {cmd}")


@contextlib.contextmanager
def out_dir_lock(folder: str | Path):
    """Hold ``folder`` as its only writer while the block runs (re-entrant in one process).

    The lock is ``filelock``'s (an OS file lock on ``.cemlib-lock``, released when the process
    ends, however it ends); the holder writes who it is to ``.cemlib-lock.holder``, so a second
    writer is refused with a :class:`RunFolderError` naming it (pid, host, command)."""
    from filelock import FileLock, Timeout
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    key = str(folder.resolve())
    if key in _HELD:
        _HELD[key][1] += 1
        try:
            yield
        finally:
            _HELD[key][1] -= 1
        return
    lock, holder = FileLock(folder / LOCK_NAME, timeout=0), folder / HOLDER_NAME
    try:
        lock.acquire()
    except Timeout:
        try:
            who = holder.read_text(errors="replace").strip() or "another process"
        except OSError:
            who = "another process"
        raise RunFolderError(f"out_dir {folder} is in use by another writer ({who}); wait until it "
                             f"ends, or choose another --out") from None
    try:
        holder.write_text(_describe_self() + "\n")
        _HELD[key] = [lock, 1]
        yield
    finally:
        _HELD.pop(key, None)
        with contextlib.suppress(OSError):
            holder.unlink()
        lock.release()
