"""Checkpoints: model, optimiser, scheduler, RNG states and data position in one ``.pt`` file.

Everything stored is a tensor, a number, a string or a container of those, so the file loads with
``torch.load(weights_only=True)`` (no arbitrary pickled code). Files are written to a temporary
name unique to the writer (``.<name>.<pid>.<random>.tmp``) and renamed, so a crash never leaves a
half-written checkpoint under the final name and two writers never share a temporary file; a
full disk (or another write error) removes the temporary file, names the file and the cause ("no
space left on device") and leaves the previous checkpoint intact. Every checkpoint stores a
SHA-256 checksum of its contents (tensors included), verified on load, so a flipped bit is found.
Corrupted, truncated, foreign or mismatched files raise :class:`CheckpointError` with a message
that says what is wrong.
"""

from __future__ import annotations

import errno
import hashlib
import io
import os
import random
import re
import secrets
from pathlib import Path

import numpy as np
import torch

__all__ = ["FORMAT", "RESUMABLE_CHANGES", "CheckpointError", "save_checkpoint", "load_checkpoint", "rng_state",
           "set_rng_state", "check_model_state", "config_differences", "payload_checksum",
           "atomic_write_bytes", "remove_stale_tmp", "tmp_name"]

FORMAT = "cemlib.train.checkpoint/1"
_REQUIRED = ("format", "step", "model", "optimizer", "scheduler", "rng", "data", "config")


class CheckpointError(RuntimeError):
    """A checkpoint file is unreadable, corrupted, or does not match the run that loads it."""


def rng_state() -> dict:
    """Python, NumPy, torch CPU (and CUDA) generator states, as weights-only-safe values."""
    kind, keys, pos, has_gauss, cached = np.random.get_state()
    state = {"python": random.getstate(),
             "numpy": {"kind": kind, "keys": torch.from_numpy(keys.astype(np.int64)), "pos": int(pos),
                       "has_gauss": int(has_gauss), "cached_gaussian": float(cached)},
             "torch": torch.get_rng_state()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict) -> None:
    """Restore what :func:`rng_state` captured."""
    py = state["python"]
    random.setstate((py[0], tuple(py[1]), py[2]))
    n = state["numpy"]
    np.random.set_state((n["kind"], n["keys"].numpy().astype(np.uint32), n["pos"], n["has_gauss"],
                         n["cached_gaussian"]))
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def _feed(h, obj) -> None:
    """Feed ``obj`` (tensors, numbers, strings, containers of those) into the hash ``h``."""
    if isinstance(obj, torch.Tensor):
        t = obj.detach()
        h.update(f"T{t.dtype}{tuple(t.shape)};".encode())
        if t.numel():
            flat = t.to("cpu").contiguous().reshape(-1)
            h.update(flat.view(torch.uint8).numpy())  # the raw bytes, whatever the dtype
    elif isinstance(obj, dict):
        h.update(f"D{len(obj)};".encode())
        for k, v in obj.items():
            _feed(h, k)
            _feed(h, v)
    elif isinstance(obj, (list, tuple)):  # a tuple may come back from torch.load as a list
        h.update(f"L{len(obj)};".encode())
        for v in obj:
            _feed(h, v)
    else:
        h.update(f"{type(obj).__name__}:{obj!r};".encode())


def payload_checksum(payload: dict) -> str:
    """SHA-256 over every entry of a checkpoint payload except ``"checksum"`` itself, tensors by
    their dtype, shape and bytes (so one flipped bit in a weight changes it)."""
    h = hashlib.sha256()
    _feed(h, {k: v for k, v in payload.items() if k != "checksum"})
    return h.hexdigest()


_TMP = re.compile(r"^\.(?P<name>.+)\.(?P<pid>\d+)\.[0-9a-f]{8}\.tmp$")


def tmp_name(path: Path) -> Path:
    """The temporary file :func:`atomic_write_bytes` writes before renaming it to ``path``: hidden,
    and unique to this process and call (``.<name>.<pid>.<8 random hex digits>.tmp``)."""
    return path.with_name(f".{path.name}.{os.getpid()}.{secrets.token_hex(4)}.tmp")


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except (PermissionError, OSError):
        return True
    return True


def remove_stale_tmp(folder: str | Path) -> list[Path]:
    """Delete the temporary files an interrupted write left in ``folder``: those of writers that
    no longer run (the pid in the name), and the ``*.pt.tmp`` / ``*.json.tmp`` of older versions."""
    folder, removed = Path(folder), []
    if folder.is_dir():
        stale = list(folder.glob("*.pt.tmp")) + list(folder.glob("*.json.tmp"))
        for tmp in folder.glob(".*.tmp"):
            m = _TMP.match(tmp.name)
            if m and int(m["pid"]) != os.getpid() and not _alive(int(m["pid"])):
                stale.append(tmp)
        for tmp in sorted(set(stale)):
            try:
                tmp.unlink()
                removed.append(tmp)
            except OSError:
                pass
    return removed


def _write_file(path: Path, data) -> None:
    """Write ``data`` to ``path`` and flush it to disk (the one place bytes reach the disk)."""
    with open(path, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())


def os_error_cause(err: OSError) -> str:
    """The cause of a failed write in words ("no space left on device" for a full disk)."""
    return "no space left on device" if err.errno == errno.ENOSPC else (err.strerror or str(err))


def atomic_write_bytes(path: str | Path, data, what: str = "file") -> Path:
    """Write ``data`` to ``path.tmp`` and rename it to ``path``. On failure the temporary file is
    removed, any previous ``path`` stays as it was, and the error names the file and the cause."""
    path = Path(path)
    tmp = tmp_name(path)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        _write_file(tmp, data)
        os.replace(tmp, path)
    except OSError as err:
        try:
            tmp.unlink()
        except OSError:
            pass
        kept = f"; the previous {path.name} is intact" if path.exists() else ""
        raise OSError(err.errno, f"cannot write the {what} {path}: {os_error_cause(err)}{kept}") from err
    return path


def save_checkpoint(path: str | Path, payload: dict) -> Path:
    """Atomically write ``payload`` (must hold the keys in ``_REQUIRED``) to ``path``, with a
    SHA-256 checksum of its contents under ``"checksum"``. A write error (e.g. a full disk) raises
    ``OSError`` naming the file and leaves the previous checkpoint at ``path`` intact."""
    missing = [k for k in _REQUIRED if k not in payload]
    if missing:
        raise ValueError(f"checkpoint payload lacks {missing}")
    payload = {**payload, "checksum": payload_checksum(payload)}
    buf = io.BytesIO()  # serialise in memory: the disk write then fails with a real errno
    torch.save(payload, buf)
    return atomic_write_bytes(path, buf.getbuffer(), "checkpoint")


def load_checkpoint(path: str | Path, map_location: str | torch.device = "cpu") -> dict:
    """Load with ``weights_only=True``, check the format and the checksum; raise
    :class:`CheckpointError` for anything that is not an intact cemlib.train checkpoint."""
    path = Path(path)
    if path.is_dir():
        raise CheckpointError(f"checkpoint {str(path)!r} is a folder; give a checkpoint file in it "
                              f"(last.pt or ckpt_<step>.pt)")
    if not path.is_file():
        raise CheckpointError(f"checkpoint {path.name!r} does not exist")
    try:
        payload = torch.load(path, map_location=map_location, weights_only=True)
    except Exception as err:  # noqa: BLE001 -- a foreign file can fail in the unpickler in any way
        why = " ".join(str(err).split())[:200]  # one line
        raise CheckpointError(f"checkpoint {path.name!r} is corrupted or truncated, or is not a "
                              f"weights-only torch file ({type(err).__name__}: {why})") from err
    if not isinstance(payload, dict) or payload.get("format") != FORMAT:
        got = payload.get("format") if isinstance(payload, dict) else type(payload).__name__
        raise CheckpointError(f"checkpoint {path.name!r} is not a cemlib.train checkpoint "
                              f"(format {got!r}, expected {FORMAT!r})")
    missing = [k for k in _REQUIRED if k not in payload]
    if missing:
        raise CheckpointError(f"checkpoint {path.name!r} lacks the entries {missing}")
    stored = payload.get("checksum")  # absent only in checkpoints written before checksums existed
    if stored is not None and stored != payload_checksum(payload):
        raise CheckpointError(f"checkpoint {path.name!r} is corrupted: the checksum of its contents does "
                              f"not match the one stored when it was written")
    return payload


def check_model_state(model_state: dict, expected: dict, source: str) -> None:
    """Raise :class:`CheckpointError` naming missing, unexpected or wrongly shaped tensors."""
    missing = [k for k in expected if k not in model_state]
    unexpected = [k for k in model_state if k not in expected]
    shapes = [(k, tuple(model_state[k].shape), tuple(v.shape)) for k, v in expected.items()
              if k in model_state and tuple(model_state[k].shape) != tuple(v.shape)]
    problems = []
    if missing:
        problems.append(f"model tensors absent from the checkpoint {missing[:5]}{' ...' if len(missing) > 5 else ''}")
    if unexpected:
        problems.append(f"checkpoint tensors the model lacks {unexpected[:5]}{' ...' if len(unexpected) > 5 else ''}")
    if shapes:
        k, got, want = shapes[0]
        problems.append(f"{len(shapes)} shape mismatch(es), first {k!r}: checkpoint {got} vs model {want}")
    if problems:
        raise CheckpointError(f"checkpoint {source!r} does not match the model: " + "; ".join(problems))


#: fields a resumed run may change (device, compilation, evaluation, logging, checkpoints, early
#: stopping): they leave the training path up to the step resumed from as it was
RESUMABLE_CHANGES = frozenset({"train.device", "train.compile", "train.compile_mode", "train.checkpoint_interval",
                               "train.final_whole_eval", "train.eval_interval", "train.eval_batches",
                               "train.log_interval", "train.peak_tflops", "train.keep_checkpoints",
                               "train.patience"})


def config_differences(saved: dict, current: dict, prefix: str = "") -> list[str]:
    """Dotted names of the config fields that differ and would change the training path."""
    out = []
    for key in sorted(set(saved) | set(current)):
        name = f"{prefix}{key}"
        a, b = saved.get(key), current.get(key)
        if isinstance(a, dict) and isinstance(b, dict):
            out += config_differences(a, b, name + ".")
        elif a != b and name not in RESUMABLE_CHANGES:
            out.append(f"{name}: checkpoint {a!r} vs now {b!r}")
    return out
