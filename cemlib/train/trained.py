"""A trained model back from its checkpoint or run folder, with the tokenizer that decodes it.

:func:`load_trained` is what ``cemlib generate`` calls: it finds the checkpoint (a file, or the
newest one in a run folder), rebuilds the model of the recorded experiment and configuration, loads
the weights (``weights_only=True``, checksum verified) and returns it in eval mode with its
tokenizer. Checkpoints written since tokenizers are stored carry the vocabulary
(``payload["task"]["info"]["tokenizer"]``); for an older one it is taken from the ``results.json``
beside it, else rebuilt from the text the run was trained on (the tiny Shakespeare shipped with
cemlib, or the run's ``data.path`` if that file still exists), and a note says so. It reads the
weights a ``cemlib export`` wrote (a ``.safetensors`` file, :mod:`cemlib.train.export`) the same
way: their metadata carry the configuration and the vocabulary.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

import torch
from torch import nn

from cemlib.train.checkpoint import CheckpointError, check_model_state, load_checkpoint
from cemlib.train.config import ConfigError
from cemlib.train.folders import newest_checkpoint
from cemlib.train.registry import EXPERIMENTS
from cemlib.train.weights import is_safetensors, load_weights

__all__ = ["TrainedModel", "find_checkpoint", "load_trained", "stored_tokenizer"]


@dataclass
class TrainedModel:
    """What :func:`load_trained` returns: the model (eval mode, on the requested device), its
    tokenizer (``None`` where the run's data have none), the run's config dict, the task kind and
    info, the step the checkpoint was written at, its path, and notes on how things were found."""

    model: nn.Module
    tokenizer: object | None
    config: dict
    task_kind: str | None
    task_info: dict
    step: int
    checkpoint: Path
    notes: list[str] = field(default_factory=list)


def find_checkpoint(path: str | Path) -> Path:
    """The checkpoint ``path`` names: the file itself (a ``.pt`` checkpoint or an exported
    ``.safetensors``), or in a run folder ``last.pt`` (the finished run) else the newest
    ``ckpt_<step>.pt``, else its ``model.safetensors``; a folder holding one run folder is looked
    into."""
    path = Path(path)
    if path.is_file() and path.suffix == ".json":
        raise CheckpointError(f"{str(path)!r} is a results file, not a checkpoint; give the run folder "
                              f"{str(path.parent)!r} or a checkpoint in it (last.pt, ckpt_<step>.pt)")
    if path.is_file():
        return path
    if not path.is_dir():
        raise CheckpointError(f"{str(path)!r} is neither a checkpoint file nor a run folder")
    found = newest_checkpoint(path)
    if found is not None:
        return found
    if (path / "model.safetensors").is_file():
        return path / "model.safetensors"
    runs = sorted(d for d in path.iterdir() if d.is_dir() and newest_checkpoint(d) is not None)
    if len(runs) == 1:
        return newest_checkpoint(runs[0])
    if runs:
        names = ", ".join(d.name for d in runs[:8]) + (" ..." if len(runs) > 8 else "")
        raise CheckpointError(f"{str(path)!r} holds {len(runs)} runs; give one of them: {names}")
    raise CheckpointError(f"no checkpoint in {str(path)!r} (a run folder holds last.pt or ckpt_<step>.pt)")


def _tokenizer_from(d: dict | None):
    if d is None:
        return None
    from cemlib.data.shakespeare import CharTokenizer
    if d.get("kind") == CharTokenizer.KIND:
        return CharTokenizer.from_dict(d)
    raise CheckpointError(f"unknown stored tokenizer kind {d.get('kind')!r}")


def stored_tokenizer(payload: dict, checkpoint: Path, notes: list[str]):
    """The tokenizer of a language-modelling run: stored in the checkpoint, else in the
    ``results.json`` beside it, else rebuilt from the run's text (a note in ``notes`` says which)."""
    info = (payload.get("task") or {}).get("info") or {}
    if "tokenizer" in info:
        return _tokenizer_from(info["tokenizer"])
    results = checkpoint.parent / "results.json"
    if results.is_file():
        try:
            stored = json.loads(results.read_text())
            same_run = stored.get("config") == json.loads(json.dumps(payload["config"]))
            tok = (stored.get("task") or {}).get("info", {}).get("tokenizer")
        except (OSError, ValueError, AttributeError):
            same_run, tok = False, None
        if same_run and tok is not None:
            notes.append(f"vocabulary read from {results.name} beside the checkpoint (the checkpoint "
                         f"predates stored vocabularies)")
            return _tokenizer_from(tok)
    data = payload["config"].get("data", {})
    if data.get("name") != "shakespeare":
        return None
    from cemlib.data.shakespeare import CharTokenizer, is_shipped, load_text
    path = data.get("path")
    if is_shipped(path):
        notes.append("vocabulary rebuilt from the tiny Shakespeare shipped with cemlib, the text this "
                     "run trained on (the checkpoint predates stored vocabularies)")
        return CharTokenizer(load_text())
    if Path(path).is_file():
        notes.append(f"vocabulary rebuilt from data.path={path!r}, the text this run trained on (the "
                     f"checkpoint predates stored vocabularies); if that file changed since, the "
                     f"decoded text is wrong")
        return CharTokenizer(load_text(path))
    raise CheckpointError(f"the checkpoint predates stored vocabularies and the text it was trained on "
                          f"(data.path={path!r}) is not there to rebuild it")


class _Info:
    """The part of a task a model factory reads: ``info``."""

    def __init__(self, info: dict):
        self.info = info


def load_trained(path: str | Path, device: str | torch.device = "cpu") -> TrainedModel:
    """Rebuild the model of the checkpoint ``path`` (a file or a run folder, see
    :func:`find_checkpoint`) on ``device``, in eval mode, with its tokenizer.

    Raises :class:`~cemlib.train.checkpoint.CheckpointError` (unreadable, corrupted or mismatched
    file) or :class:`~cemlib.train.config.ConfigError` (an experiment this process does not know,
    e.g. one a chapter registered)."""
    ckpt = find_checkpoint(path)
    if is_safetensors(ckpt):
        state, meta = load_weights(ckpt)
        if not isinstance(meta.get("config"), dict):
            raise CheckpointError(f"{ckpt.name!r} holds weights without a run's configuration (not written by "
                                  f"cemlib export); load it into your model with cemlib.train.weights.load_weights")
        payload = {"config": meta["config"], "task": meta.get("task") or {}, "model": state,
                   "step": meta.get("step", 0)}
    else:
        payload = load_checkpoint(ckpt, map_location="cpu")
    cfg = payload["config"]
    notes: list[str] = []
    name = cfg.get("experiment")
    if name not in EXPERIMENTS:
        raise ConfigError(f"checkpoint {ckpt.name!r} is of experiment {name!r}, which this process does not "
                          f"know (registered by a chapter or a script? import it first); known: "
                          f"{len(EXPERIMENTS)} experiments, see --list")
    task = payload.get("task") or {}
    kind, info = task.get("kind"), dict(task.get("info") or {})
    tokenizer = None
    if kind in (None, "language_modelling"):
        tokenizer = stored_tokenizer(payload, ckpt, notes)
    if not info:  # a checkpoint from before the task was stored: a language model's two numbers
        if tokenizer is None:
            raise CheckpointError(f"checkpoint {ckpt.name!r} predates stored task information and its "
                                  f"data ({cfg.get('data', {}).get('name')!r}) are not a text")
        kind = "language_modelling"
        info = {"vocab_size": len(tokenizer.chars), "context_length": cfg["train"]["context_length"]}
    with torch.random.fork_rng(devices=[]):  # building initialises weights: leave the caller's RNG alone
        model = EXPERIMENTS[name].build_model(dict(cfg["model"]), _Info(info))
    check_model_state(payload["model"], model.state_dict(), ckpt.name)
    model.load_state_dict(payload["model"])
    model.to(device).eval()
    return TrainedModel(model, tokenizer, cfg, kind, info, int(payload["step"]), ckpt, notes)
