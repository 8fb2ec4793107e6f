"""Results of a run as a small JSON file, a loader that checks it, and a plot helper.

A results file holds: the experiment config, final and best metrics, the loss curves, the
parameter count, the device and its name, library versions, the git commit of the code, and the
exact command that reproduces the run; and, where the run wrote them, ``metrics["final_whole_val"]``
(the final model on the whole validation split), ``metrics["estimates"]`` (what each number is
computed on), ``timing`` (wall-clock start and end, start-up time), ``status`` (complete /
interrupted / partial), ``notes``, ``run_id`` and ``metrics["best"]``. :func:`load_results`
requires only the fields every stored file has (:data:`_REQUIRED`); a ``config`` leaves out the
fields its dataset does not read (``train.context_length`` for ListOps, ``data.path`` for generated
data, ...). :func:`load_runs` reads a folder of runs by experiment or model, and :func:`plot_curves`
draws their validation curves.
"""

from __future__ import annotations

import json
import os
import platform
import subprocess
import sys
from datetime import datetime, timezone
from pathlib import Path

import torch

from cemlib.train.checkpoint import atomic_write_bytes

__all__ = ["SCHEMA", "environment_info", "same_cpu_kernels", "git_commit", "build_info", "save_results", "load_results",
           "plot_curves", "device_name", "ResultsError", "read_json", "SETUP", "setup_differences",
           "load_runs", "curve_labels"]

SCHEMA = "cemlib.train.results/1"
_REQUIRED = ("schema", "experiment", "preset", "config", "metrics", "curves", "num_parameters",
             "device", "versions", "git_commit", "command")


class ResultsError(ValueError):
    """A results file is missing, not JSON, or lacks required fields."""


def build_info() -> dict:
    """What the wheel this cemlib was installed from records about its build (``git_commit``,
    ``built_utc``; written by ``setup.py``), or ``{}`` in a clone or an editable install."""
    path = Path(__file__).resolve().parents[1] / "_build_info.json"
    try:
        info = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return info if isinstance(info, dict) else {}


def git_commit(cwd: str | Path | None = None) -> str | None:
    """The commit of the code: ``HEAD`` of the clone cemlib runs from (``+dirty`` if modified),
    else the commit the installed wheel was built from (:func:`build_info`), else ``None``.

    Where the code runs from a copy without ``.git`` (a GPU machine that receives the working tree
    only, or a stale ``.git``), the environment variable ``CEMLIB_GIT_COMMIT`` names the commit the
    copy was made from; when set it takes precedence. A repository around an installed cemlib (a
    venv inside a project of one's own) is not taken for cemlib's: only one whose top folder holds
    this ``cemlib`` package counts.
    """
    env = os.environ.get("CEMLIB_GIT_COMMIT")
    if env:
        return env
    pkg = Path(__file__).resolve().parents[1]
    cwd = Path(cwd) if cwd is not None else pkg
    try:
        top = subprocess.run(["git", "rev-parse", "--show-toplevel"], cwd=cwd, capture_output=True, text=True,
                             timeout=10)
        if top.returncode == 0 and (cwd != pkg or Path(top.stdout.strip()).resolve() == pkg.parent):
            head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=cwd, capture_output=True, text=True, timeout=10)
            if head.returncode == 0:
                dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=cwd,
                                       capture_output=True, text=True, timeout=10)
                return head.stdout.strip() + ("+dirty" if dirty.stdout.strip() else "")
    except (OSError, subprocess.SubprocessError):
        pass
    return build_info().get("git_commit") if cwd == pkg else None


def _cpu_name() -> str:
    try:  # Linux: the marketing name of the first core
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "cpu"


def environment_info(device: torch.device, world_size: int = 1) -> tuple[dict, dict]:
    """``(device, versions)`` dictionaries for a results file."""
    import numpy
    import cemlib
    if device.type == "cuda":
        name = torch.cuda.get_device_name(device)
    else:
        name = _cpu_name()
    dev = {"type": device.type, "name": name, "count": world_size,
           "label": "GPU" if device.type == "cuda" else device.type.upper()}
    if device.type == "cpu":
        dev["threads"] = torch.get_num_threads()
        # the vector instruction set PyTorch's CPU kernels dispatch to ("AVX512", "AVX2", ...):
        # processors of one name differ in it, and with it in the rounding of a float32 run
        dev["capability"] = torch.backends.cpu.get_cpu_capability()
    versions = {"python": platform.python_version(), "torch": torch.__version__,
                "numpy": numpy.__version__, "cemlib": cemlib.__version__,
                "cuda": torch.version.cuda, "platform": sys.platform}
    built = build_info()
    if built:  # an installed wheel: the commit and time it was built from
        versions["cemlib_build"] = {k: built.get(k) for k in ("git_commit", "built_utc")}
    return dev, versions


def same_cpu_kernels(stored: dict, fresh: dict) -> bool | None:
    """Whether two CPU runs' ``device`` entries (:func:`environment_info`) ran the same kernels, so
    that a float32 run is repeated to the last bit: ``True`` for the same processor name and vector
    capability, ``False`` for another name or capability, ``None`` (cannot say) for the same name
    where either entry predates the recorded capability. The name alone does not decide: processors
    sold under one name ("AMD EPYC") differ in AVX-512."""
    if stored["name"] != fresh["name"]:
        return False
    if stored.get("capability") is None or fresh.get("capability") is None:
        return None
    return stored["capability"] == fresh["capability"]


def save_results(path: str | Path, results: dict) -> Path:
    """Write ``results`` (checked for the required fields) as indented JSON, atomically (a failed
    write raises ``OSError`` naming the file and leaves an earlier file at ``path`` intact)."""
    missing = [k for k in _REQUIRED if k not in results]
    if missing:
        raise ResultsError(f"results lack the fields {missing}")
    out = dict(results)
    out.setdefault("created_utc", datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"))
    text = json.dumps(out, indent=1, sort_keys=False, allow_nan=False) + "\n"
    # written to a temporary name and renamed: a full disk names the file and keeps the old one
    return atomic_write_bytes(path, text.encode(), "results file")


def read_json(path: Path, what: str, error: type[Exception]):
    """The JSON in ``path``; a file that is not JSON, not UTF-8 or nested too deeply for Python
    raises ``error`` with one line naming ``what``."""
    try:
        return json.loads(Path(path).read_text())
    except json.JSONDecodeError as err:
        raise error(f"{what} is not valid JSON: {err}") from None
    except RecursionError:
        raise error(f"{what} is nested too deeply to be read") from None
    except UnicodeDecodeError as err:
        raise error(f"{what} is not UTF-8 text: {err.reason}") from None


def load_results(path: str | Path) -> dict:
    """Read a results file and check its schema; raise :class:`ResultsError` naming the problem."""
    path = Path(path)
    if not path.is_file():
        raise ResultsError(f"results file {path.name!r} does not exist")
    data = read_json(path, f"results file {path.name!r}", ResultsError)
    if not isinstance(data, dict) or data.get("schema") != SCHEMA:
        raise ResultsError(f"results file {path.name!r} has schema "
                           f"{data.get('schema') if isinstance(data, dict) else None!r}, expected {SCHEMA!r}")
    missing = [k for k in _REQUIRED if k not in data]
    if missing:
        raise ResultsError(f"results file {path.name!r} lacks the fields {missing}")
    return data


def load_runs(*folders, by: str = "experiment", complete_only: bool = True) -> dict[str, list[dict]]:
    """The stored runs of one or more folders of results files, ``{key: [results ordered by seed]}``.

    ``by="experiment"`` keys a run by its experiment name followed by its grid overrides, if any
    (``"gp-cem-t2 task.kernel=rbf"``), so two experiments never share a key; ``by="model"`` keys it
    by the last ``-``-separated part of the experiment name (chapter 10's ``bench-listops-cem`` ->
    ``cem``), for a folder holding one experiment per model. ``summary.json`` is skipped, and so
    (``complete_only``) is a run whose ``status`` says it did not finish. Raises
    ``FileNotFoundError`` for a folder without results files."""
    if by not in ("experiment", "model"):
        raise ValueError(f"by must be 'experiment' or 'model', got {by!r}")
    if not folders:
        raise ValueError("name at least one folder of results files")
    out: dict[str, list[dict]] = {}
    for folder in folders:
        files = sorted(p for p in Path(folder).rglob("*.json") if p.name != "summary.json")
        if not files:
            raise FileNotFoundError(f"no results files in {folder}")
        for path in files:
            r = load_results(path)
            if complete_only and r.get("status", "complete") != "complete":
                continue
            if by == "model":
                key = r["experiment"].rsplit("-", 1)[-1]
            else:
                key = " ".join([r["experiment"], *((r.get("sweep") or {}).get("overrides") or [])])
            out.setdefault(key, []).append(r)
    for runs in out.values():
        runs.sort(key=lambda r: r["config"]["train"]["seed"])
    return out


def device_name(res: dict) -> str:
    """Where a result ran, for labels: the GPU's name on CUDA (``"NVIDIA H100 80GB HBM3"``), else
    the device type in capitals (``"CPU"``)."""
    dev = res["device"]
    return dev["name"] if dev["type"] == "cuda" else dev["type"].upper()


#: what two runs must share to be compared as "the same setup, another model": data, seed, length,
#: batch shape and optimiser (the model section is what a comparison varies)
SETUP = {"data": ("name",), "train": ("seed", "max_steps", "batch_size", "context_length"),
         "optim": ("lr", "beta1", "beta2", "weight_decay", "warmup_steps", "min_lr_ratio")}


def setup_differences(a: dict, b: dict) -> dict[str, tuple]:
    """Where two results' configurations differ outside the model (the fields of :data:`SETUP`):
    ``{"section.key": (value in a, value in b)}``; empty when the two runs are the same setup and
    differ only in their models."""
    out = {}
    for sec, keys in SETUP.items():
        for k in keys:
            va, vb = a["config"][sec].get(k), b["config"][sec].get(k)
            if va != vb:
                out[f"{sec}.{k}"] = (va, vb)
    return out


def _label(res: dict) -> str:
    dev = res["device"]
    n = f"{dev['count']}x " if dev.get("count", 1) > 1 else ""
    data = (res.get("config") or {}).get("data") or {}
    on = f" on {Path(str(data['path'])).name}" if data.get("path") else ""
    return f"{res['experiment']}{on} ({res['preset']}, {n}{device_name(res)})"


def _flat(d: dict, prefix: str = "") -> dict:
    out = {}
    for k, v in d.items():
        if isinstance(v, dict):
            out.update(_flat(v, f"{prefix}{k}."))
        else:
            out[f"{prefix}{k}"] = v
    return out


def curve_labels(results: list[dict], limit: int = 3) -> list[str]:
    """One distinct legend label per run: experiment, data file (if one's own), preset and device,
    then, where that leaves two runs alike, the configuration fields in which the runs differ
    (``optim.lr=0.003 train.seed=1``, at most ``limit``), then the run id or the position."""
    labels = [_label(r) for r in results]
    if len(set(labels)) == len(labels):
        return labels
    flats = [_flat(r.get("config") or {}) for r in results]
    keys = sorted({k for f in flats for k in f})
    differ = [k for k in keys if len({json.dumps(f.get(k), sort_keys=True, default=repr) for f in flats}) > 1]
    out = []
    for lab, f in zip(labels, flats):
        if labels.count(lab) > 1 and differ:
            lab += " " + " ".join(f"{k}={f.get(k)}" for k in differ[:limit])
        out.append(lab)
    dup = [i for i, lab in enumerate(out) if out.count(lab) > 1]
    for i in dup:
        rid = results[i].get("run_id")
        unique = rid and sum(r.get("run_id") == rid for r in results) == 1
        out[i] = f"{out[i]} [{rid}]" if unique else f"{out[i]} #{i + 1}"
    return out


def plot_curves(results: list[dict], ax=None, split: str = "val", labels: list[str] | None = None):
    """Plot the ``split`` loss ("val" or "train") against tokens seen, one line per results dict.

    Each line is labelled with experiment, preset and device, so stored GPU results and live CPU
    runs stay distinguishable; runs alike in those are told apart by the fields their
    configurations differ in (:func:`curve_labels`), unless ``labels`` are given. Returns the axes.
    """
    import matplotlib.pyplot as plt
    if split not in ("val", "train"):
        raise ValueError(f"split must be 'val' or 'train', got {split!r}")
    if ax is None:
        _, ax = plt.subplots(figsize=(6, 4))
    if labels is not None and len(labels) != len(results):
        raise ValueError(f"labels has {len(labels)} entries for {len(results)} results")
    labels = list(labels) if labels is not None else curve_labels(results)
    for i, res in enumerate(results):
        tc = res["config"]["train"]  # context_length is left out where the data do not read it
        per_example = res.get("task", {}).get("tokens_per_example") or tc.get("context_length")
        tokens_per_step = tc["batch_size"] * per_example
        ev = res["curves"]["eval"]
        ax.plot([e["step"] * tokens_per_step for e in ev], [e[f"{split}_loss"] for e in ev], marker="o",
                ms=3, label=labels[i])
    ax.set_xlabel("tokens seen")
    ax.set_ylabel(f"{'validation' if split == 'val' else 'training'} loss (nats / token)")
    ax.legend(fontsize="small")
    return ax
