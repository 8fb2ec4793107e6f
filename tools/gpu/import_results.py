"""Import the GPU campaign's results into ``book/results/``, after checking each file.

``python tools/gpu/import_results.py campaign.tar`` (or a folder laid out as ``--out`` of
``campaign.py``) checks every results file against ``campaign.PLAN``
and copies the good ones to ``book/results/<folder>/<name>.json`` with a ``provenance`` entry
(where and when it was imported, the SHA-256 of the file as received, and the campaign log's
record of the run: estimate, measured wall time). A file is refused, with the reason, unless

- it reads as a results file (:func:`cemlib.train.results.load_results`) of a complete run;
- it is a run of the plan, and its recorded command is the plan's command for that run;
- its configuration is the one the preset has now (same fingerprint, same seed), every step ran;
- it ran on a GPU (``device.type == "cuda"``);
- its ``git_commit`` is a clean commit (40 hexadecimal digits, no ``+dirty``) that this repository
  has (``git cat-file``), unless ``--no-git`` (for a repository without history).

Each folder that received files also gets ``summary.json`` / ``summary.md`` (mean ± std over
seeds, as a grid writes them). The command exits with status 1 if any file was refused.

An archive is read as a stream, member by member, and bounded: a results file (or the log) larger
than :data:`MAX_MEMBER_BYTES` is refused unread, more than :data:`MAX_TOTAL_BYTES` of them in all,
or more than :data:`MAX_STREAM_BYTES` of members of any kind or :data:`MAX_MEMBERS` members, stop
the import (a small compressed archive can expand to gigabytes). Links and paths outside the
target (absolute, or with ``..``) are refused by name. A damaged archive (truncated, corrupted,
not a tar) is one line naming the file (status 2), as is an unreadable campaign log.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import re
import subprocess
import sys
import tarfile
import zlib
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path

__all__ = ["Checked", "check_results", "read_campaign", "import_campaign", "ArchiveError", "MAX_MEMBER_BYTES",
           "MAX_TOTAL_BYTES", "MAX_STREAM_BYTES", "MAX_MEMBERS"]

_SHA = re.compile(r"^[0-9a-f]{40}$")
#: the largest results file (or campaign log) read: a GPU run's results are tens of kB
MAX_MEMBER_BYTES = 16 * 2**20
#: the most bytes of results files (and the log) read from one archive
MAX_TOTAL_BYTES = 256 * 2**20
#: the most bytes of members of any kind an archive may declare (skipped members are decompressed too)
MAX_STREAM_BYTES = 4 * 2**30
#: the most members an archive may have
MAX_MEMBERS = 100_000


class ArchiveError(ValueError):
    """A campaign archive or folder cannot be read as one (damaged, too large); the message is one
    line naming the file."""


@dataclass
class Checked:
    """One file of the campaign: its place (``<folder>/<name>.json``), data, raw bytes and the
    reasons it is refused (empty: accepted)."""

    file: str
    data: dict | None
    raw: bytes
    problems: list[str]

    @property
    def ok(self) -> bool:
        return not self.problems


def _commit_known(sha: str, repo: Path) -> bool:
    try:
        r = subprocess.run(["git", "cat-file", "-e", f"{sha}^{{commit}}"], cwd=repo, capture_output=True,
                           timeout=20)
        return r.returncode == 0
    except (OSError, subprocess.SubprocessError):
        return False


def _finite(x) -> bool:
    return isinstance(x, (int, float)) and math.isfinite(x)


def check_results(file: str, raw: bytes, repo: Path | None = None, plan=None) -> Checked:
    """Check one results file (``file`` = ``<folder>/<name>.json`` as the campaign wrote it) and
    return what is wrong with it (see the module docstring); ``repo=None`` skips the git check."""
    from budget import fingerprint
    from campaign import PLAN
    from cemlib.train.config import ConfigError, ExperimentConfig
    from cemlib.train.registry import get_config
    from cemlib.train.results import SCHEMA
    problems: list[str] = []
    try:
        data = json.loads(raw)
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        return Checked(file, None, raw, [f"not JSON: {err}"])
    if not isinstance(data, dict) or data.get("schema") != SCHEMA:
        return Checked(file, None, raw, [f"not a results file (schema {SCHEMA!r} expected)"])
    from cemlib.train.results import _REQUIRED
    missing = [k for k in _REQUIRED if k not in data]
    if missing:
        return Checked(file, data, raw, [f"lacks the fields {missing}"])
    runs = {r.file: r for r in (PLAN if plan is None else plan)}
    run = runs.get(file)
    if run is None:
        problems.append(f"{file} is not a run of the campaign's plan")
    else:
        if data.get("command") != run.command:
            problems.append(f"command {data.get('command')!r} is not the plan's {run.command!r}")
        try:
            cfg = ExperimentConfig.from_dict(data["config"])
            want = get_config(run.experiment, run.preset, run.overrides)
            if fingerprint(cfg) != fingerprint(want):
                problems.append("its configuration differs from the preset's current one (the preset changed "
                                "since it ran: run it again)")
            if cfg.train.seed != run.seed:
                problems.append(f"seed {cfg.train.seed}, the plan says {run.seed}")
        except (ConfigError, KeyError, TypeError) as err:
            problems.append(f"its configuration does not load: {err}")
    status = data.get("status", "complete")
    if status != "complete":
        problems.append(f"status {status!r}, not complete")
    m = data.get("metrics", {})
    max_steps = data.get("config", {}).get("train", {}).get("max_steps")
    if m.get("steps") != max_steps:
        problems.append(f"ran {m.get('steps')} of {max_steps} steps")
    if not all(_finite(m.get(k)) for k in ("final_val_loss", "best_val_loss", "wall_time_s")):
        problems.append("final / best validation loss or wall time missing or not finite")
    dev = data.get("device", {})
    if dev.get("type") != "cuda":
        problems.append(f"ran on {dev.get('type')!r} ({dev.get('name')}), not on a GPU")
    commit = str(data.get("git_commit") or "")
    if not _SHA.match(commit):
        problems.append(f"git_commit {commit!r} is not a clean commit (40 hex digits, no +dirty)")
    elif repo is not None and not _commit_known(commit, repo):
        problems.append(f"git_commit {commit} is not in this repository")
    return Checked(file, data, raw, problems)


def _wanted(name: str) -> bool:
    parts = Path(name).parts
    return name == "campaign.json" or (len(parts) == 2 and parts[1].endswith(".json"))


def _log(raw: bytes, where: str) -> dict:
    try:
        log = json.loads(raw)
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        raise ArchiveError(f"{where}: the campaign log campaign.json is not JSON ({err})") from None
    if not isinstance(log, dict):
        raise ArchiveError(f"{where}: the campaign log campaign.json is not a JSON object")
    return log


def read_campaign(source: str | Path, max_member: int = MAX_MEMBER_BYTES,
                  max_total: int = MAX_TOTAL_BYTES) -> tuple[dict[str, bytes], dict, dict[str, str]]:
    """``({"<folder>/<name>.json": bytes}, campaign log, {member: why refused})`` from a campaign
    tar or output folder, read within the bounds of the module docstring; raises
    :class:`ArchiveError` (one line naming ``source``) for a damaged or oversized archive."""
    source = Path(source)
    files: dict[str, bytes] = {}
    refused: dict[str, str] = {}
    log: dict = {}
    if source.is_dir():
        total = 0
        for p in sorted(source.glob("*/*.json")) + ([source / "campaign.json"] if (source / "campaign.json").is_file()
                                                     else []):
            name = p.relative_to(source).as_posix()
            if p.is_symlink():
                refused[name] = "a link (only plain files are read)"
                continue
            size = p.stat().st_size
            if size > max_member:
                refused[name] = f"{size:,} bytes, more than the {max_member:,} a results file may have; not read"
                continue
            total += size
            if total > max_total:
                raise ArchiveError(f"{source}: its results files hold more than {max_total:,} bytes in all; "
                                   f"not a campaign's output")
            if name == "campaign.json":
                log = _log(p.read_bytes(), str(source))
            else:
                files[name] = p.read_bytes()
        return files, log, refused
    if not source.is_file():
        raise ArchiveError(f"{source} does not exist (give the campaign's tar or its output folder)")
    total = stream = count = 0
    try:
        with tarfile.open(source, mode="r:*") as tar:
            for member in tar:  # one header at a time: nothing is read that is not asked for
                count += 1
                stream += max(0, member.size)
                if count > MAX_MEMBERS or stream > MAX_STREAM_BYTES:
                    raise ArchiveError(f"{source.name}: more than {MAX_MEMBERS:,} members or {MAX_STREAM_BYTES:,} "
                                       f"bytes; not a campaign export")
                name = member.name
                parts = Path(name).parts
                if member.issym() or member.islnk():
                    refused[name] = f"a link (to {member.linkname!r}); only plain files are read"
                    continue
                if name.startswith("/") or ".." in parts:
                    refused[name] = "a path outside the import's target (absolute or with ..)"
                    continue
                if not member.isfile() or not _wanted(name):
                    continue
                if member.size > max_member:
                    refused[name] = (f"{member.size:,} bytes, more than the {max_member:,} a results file may "
                                     f"have; not read")
                    continue
                total += member.size
                if total > max_total:
                    raise ArchiveError(f"{source.name}: its results files hold more than {max_total:,} bytes in "
                                       f"all; not a campaign export")
                raw = tar.extractfile(member).read(max_member + 1)
                if name == "campaign.json":
                    log = _log(raw, source.name)
                else:
                    files[name] = raw
    except ArchiveError:
        raise
    except (tarfile.TarError, EOFError, zlib.error, OSError) as err:
        why = " ".join(str(err).split()) or type(err).__name__
        raise ArchiveError(f"{source.name} is not a readable tar archive: truncated or corrupted ({why})") from None
    return files, log, refused


def _log_entry(log: dict, file: str) -> dict | None:
    """The campaign log's record of the run that produced ``file`` (the last one)."""
    found = None
    for call in log.get("calls", []):
        for e in call.get("ran", []):
            if e.get("run") == file:
                found = {**e, "call_started_utc": call.get("started_utc")}
    return found


def import_campaign(source: str | Path, dest: str | Path = "book/results", repo: str | Path | None = ".",
                    check_only: bool = False, plan=None) -> list[Checked]:
    """Check every results file of ``source`` and copy the accepted ones into ``dest/<folder>/``
    (unless ``check_only``); returns every file's :class:`Checked`."""
    from cemlib.train.results import load_results
    from cemlib.train.grid import write_summary
    files, log, refused = read_campaign(source)
    checked = [check_results(f, raw, None if repo is None else Path(repo), plan) for f, raw in files.items()]
    checked += [Checked(name, None, b"", [why]) for name, why in refused.items()]
    if check_only:
        return checked
    dest = Path(dest)
    folders = set()
    for c in checked:
        if not c.ok:
            continue
        data = dict(c.data)
        data["provenance"] = {
            "imported_utc": datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
            "source": Path(source).name, "sha256_as_received": hashlib.sha256(c.raw).hexdigest(),
            "campaign": _log_entry(log, c.file)}
        target = dest / c.file
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(json.dumps(data, indent=1, allow_nan=False) + "\n")
        folders.add(target.parent)
    for folder in folders:
        results = [load_results(p) for p in sorted(folder.glob("*.json")) if p.name != "summary.json"]
        write_summary(folder, results, grid={
            "experiments": sorted({r["experiment"] for r in results}),
            "preset": ", ".join(sorted({r["preset"] for r in results})),
            "seeds": sorted({r["config"]["train"]["seed"] for r in results}), "overrides": []})
    return checked


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python tools/gpu/import_results.py", description=__doc__.splitlines()[0])
    p.add_argument("source", help="the campaign's tar (--export) or its output folder (--out)")
    p.add_argument("--dest", default="book/results", help="where the results go (default book/results)")
    p.add_argument("--check-only", action="store_true", help="check, copy nothing")
    p.add_argument("--no-git", action="store_true", help="do not look the commit up in this repository")
    args = p.parse_args(argv)
    try:
        checked = import_campaign(args.source, args.dest, None if args.no_git else ".", args.check_only)
    except ArchiveError as err:
        print(f"error: {' '.join(str(err).split())}", file=sys.stderr)
        return 2
    if not checked:
        print(f"error: no results files in {args.source}", file=sys.stderr)
        return 1
    for c in checked:
        verb = ("ok      " if args.check_only else "imported") if c.ok else "REFUSED "
        print(f"{verb} {c.file}" + ("" if c.ok else ": " + "; ".join(c.problems)))
    bad = sum(not c.ok for c in checked)
    print(f"{len(checked) - bad} accepted, {bad} refused")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
