"""Save and load weights as safetensors, for a trained run or any model built in Python.

:func:`save_weights` writes a model's ``state_dict`` (or a state dict) as a `safetensors
<https://huggingface.co/docs/safetensors>`_ file, with JSON-safe ``metadata`` (e.g. the options the
model was built with); :func:`load_weights` reads it back, into a model if one is given (names and
shapes checked). Nothing is executed on load (unlike a pickle), and other libraries read the file.
Tensors that share memory (tied embeddings) are stored once and their other names restored on
load. ``cemlib export`` (:mod:`cemlib.train.export`) writes a run's weights this way, and
:func:`cemlib.train.trained.load_trained` reads them back into the run's model.

    model = MyModel(d=64)
    ...                                           # train it your way
    save_weights(model, "my_model.safetensors", metadata={"d": 64})
    state, meta = load_weights("my_model.safetensors", MyModel(**{"d": 64}))
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from torch import nn

from cemlib.train.checkpoint import CheckpointError, check_model_state

__all__ = ["FORMAT", "save_weights", "load_weights", "is_safetensors"]

#: the ``format`` entry of the metadata of a file :func:`save_weights` writes
FORMAT = "cemlib.safetensors/1"


def is_safetensors(path: str | Path) -> bool:
    """Whether ``path`` names a safetensors file (by its suffix)."""
    return Path(path).suffix == ".safetensors"


def _import_safetensors():
    try:
        from safetensors.torch import load_file, save_file  # noqa: F401
        import safetensors.torch as st
    except ImportError:
        raise ImportError("the safetensors package is needed to read or write .safetensors files: "
                          "pip install safetensors") from None
    return st


def save_weights(model: nn.Module | dict, path: str | Path, metadata: dict | None = None) -> Path:
    """Write ``model``'s ``state_dict`` (or a state dict) to ``path`` as safetensors, with
    ``metadata`` (JSON-safe values) under its own keys; tensors sharing memory are stored once.
    Returns the path."""
    st = _import_safetensors()
    state = model.state_dict() if isinstance(model, nn.Module) else dict(model)
    tensors, aliases, seen = {}, {}, {}
    for name, t in state.items():
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"state entry {name!r} is a {type(t).__name__}, not a tensor")
        t = t.detach().to("cpu")
        key = (t.untyped_storage().data_ptr(), t.storage_offset(), tuple(t.shape), tuple(t.stride()), t.dtype) \
            if t.numel() else None
        if key is not None and key in seen:
            aliases[name] = seen[key]
            continue
        if key is not None:
            seen[key] = name
        tensors[name] = t.contiguous().clone() if not t.is_contiguous() else t.clone()
    meta = {"format": FORMAT, "aliases": json.dumps(aliases)}
    for k, v in (metadata or {}).items():
        meta[k] = json.dumps(v)
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    st.save_file(tensors, str(tmp), metadata=meta)
    tmp.replace(path)
    return path


def load_weights(path: str | Path, model: nn.Module | None = None) -> tuple[dict, dict]:
    """Read a safetensors file: ``(state_dict, metadata)``, shared names restored, metadata values
    decoded from JSON. With ``model``, the weights are loaded into it (missing, unexpected or
    misshapen tensors raise :class:`~cemlib.train.checkpoint.CheckpointError` naming them)."""
    st = _import_safetensors()
    path = Path(path)
    if not path.is_file():
        raise CheckpointError(f"weights file {str(path)!r} does not exist")
    try:
        from safetensors import safe_open
        with safe_open(str(path), framework="pt") as f:
            raw_meta = f.metadata() or {}
        state = st.load_file(str(path))
    except Exception as err:  # noqa: BLE001 -- a damaged file fails inside the reader in any way
        why = " ".join(str(err).split())[:200]
        raise CheckpointError(f"{path.name!r} is not a readable safetensors file (truncated, corrupted or "
                              f"another format: {type(err).__name__}: {why})") from None
    meta = {}
    for k, v in raw_meta.items():
        try:
            meta[k] = json.loads(v)
        except ValueError:
            meta[k] = v
    for name, canonical in (meta.pop("aliases", None) or {}).items():
        state[name] = state[canonical]
    if model is not None:
        check_model_state(state, model.state_dict(), path.name)
        model.load_state_dict(state)
    return state, meta
