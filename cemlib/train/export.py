"""``cemlib export``: a trained run's weights as safetensors.

A checkpoint (``last.pt``, ``best.pt``, ...) holds everything a run needs to continue: weights,
optimiser state, random-number generators, history. To share or deploy the weights alone, write
them as safetensors (:mod:`cemlib.train.weights`: nothing runs on load, other libraries read it):

    cemlib export RUN_FOLDER                      # -> RUN_FOLDER/model.safetensors
    cemlib export RUN_FOLDER/best.pt --out best.safetensors

:func:`export_safetensors` is the same in Python. The file's metadata holds the run's experiment,
configuration, task information (vocabulary, context length) and step, so
:func:`cemlib.train.trained.load_trained` rebuilds the model from the ``.safetensors`` file alone,
as it does from a checkpoint.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from cemlib.train.checkpoint import CheckpointError, load_checkpoint
from cemlib.train.trained import find_checkpoint
from cemlib.train.weights import is_safetensors, save_weights

__all__ = ["export_safetensors", "main"]


def export_safetensors(source: str | Path, out: str | Path | None = None) -> Path:
    """Write the weights of a checkpoint (or of a run folder's newest checkpoint) as safetensors:
    ``out`` (default: ``model.safetensors`` beside the checkpoint), with the run's experiment,
    configuration, task information and step in the metadata, so that
    :func:`~cemlib.train.trained.load_trained` rebuilds the model from it. Returns the path."""
    ckpt = find_checkpoint(source)
    if is_safetensors(ckpt):
        raise CheckpointError(f"{str(ckpt)!r} is already a safetensors file")
    payload = load_checkpoint(ckpt, map_location="cpu")
    out = Path(out) if out is not None else ckpt.parent / "model.safetensors"
    if out.suffix != ".safetensors":
        raise CheckpointError(f"--out {str(out)!r} must end in .safetensors")
    meta = {"experiment": payload["config"].get("experiment"), "config": payload["config"],
            "task": payload.get("task") or {}, "step": int(payload["step"]), "source": ckpt.name}
    return save_weights(payload["model"], out, meta)


def main(argv: list[str] | None = None, prog: str = "cemlib export") -> int:
    """``cemlib export RUN_FOLDER_OR_CHECKPOINT [--out FILE.safetensors]``; returns the exit status."""
    p = argparse.ArgumentParser(prog=prog, description=__doc__.split("\n\n")[0])
    p.add_argument("source", help="a run folder (its last.pt, else its newest ckpt_<step>.pt) or a checkpoint file")
    p.add_argument("--out", help="the .safetensors file to write (default: model.safetensors beside the checkpoint)")
    args = p.parse_args(argv)
    try:
        path = export_safetensors(args.source, args.out)
    except (CheckpointError, ImportError, OSError) as err:
        print(f"error: {' '.join(str(err).split())}", file=sys.stderr)
        return 2
    size = path.stat().st_size
    size_text = f"{size / 1e6:.1f} MB" if size >= 1e5 else f"{size / 1e3:.0f} kB"
    print(f"wrote {path} ({size_text}; cemlib generate --checkpoint {path} samples from it)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
