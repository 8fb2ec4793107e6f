"""What an experiment is: a model factory and its named presets.

An :class:`Experiment` pairs a model builder (model options + the loaded task -> ``nn.Module``)
with presets, each an :class:`~cemlib.train.config.ExperimentConfig`: ``cpu`` finishes in about a
minute on 2 cores, ``gpu`` trains the mid-size model a chapter is about. The presets themselves
live in :mod:`cemlib.train.presets`, one module per task; :mod:`cemlib.train.registry` looks them
up. This module holds the builders every task shares and two helpers that turn a preset's few
assignments into configs (:func:`cpu_gpu_presets`, :func:`cpu_only_presets`).
"""

from __future__ import annotations

import dataclasses
import inspect
import math
from dataclasses import dataclass, field
from typing import Callable

from torch import nn

from cemlib.train.config import ConfigError, DataConfig, ExperimentConfig, OptimConfig, TrainConfig
from cemlib.train.tasks import Task

__all__ = ["Experiment", "train_config", "cpu_gpu_presets", "cpu_only_presets", "build_lm",
           "build_token_model", "build_regressor", "build_newton", "build_recurrent"]


@dataclass(frozen=True)
class Experiment:
    """A model factory ``build_model(model_kwargs, task) -> nn.Module`` (it reads ``task.info``:
    ``vocab_size``, ``context_length``, ``n_classes``, ``in_dim``, ...) and its presets.

    ``model_fields(model_kwargs)``, if given, returns the names the ``model`` section may hold
    (they may depend on ``model.arch``), so that a misspelt ``model.*`` field fails before any data
    loads; ``None`` (the default) uses the builder's own ``build_model.model_fields`` attribute if
    it has one, else skips that check.

    ``caveats`` maps a preset to one sentence a user must know before running it (e.g. that it
    does not learn at its budget): ``cemlib train --list`` shows it, and the run records it in its
    results' ``notes``."""

    name: str
    description: str
    build_model: Callable[[dict, Task], nn.Module]
    presets: dict = field(default_factory=dict)
    model_fields: Callable[[dict], list[str] | None] | None = None
    caveats: dict = field(default_factory=dict)


# ------------------------------------------------------------------------------ presets from assignments
def train_config(**kw) -> TrainConfig:
    """A preset's :class:`TrainConfig`, with a periodic checkpoint unless one is given: about every
    fifth of the run, rounded up to a multiple of ``eval_interval`` (at most five plus ``last.pt``)."""
    if "checkpoint_interval" not in kw:
        ev = kw.get("eval_interval", TrainConfig.eval_interval)
        kw["checkpoint_interval"] = ev * math.ceil(max(1, kw["max_steps"] // 5) / ev)
    return TrainConfig(**kw)


def _config(name: str, preset: str, data: str, p: dict) -> ExperimentConfig:
    return ExperimentConfig(experiment=name, preset=preset, model=dict(p["model"]),
                            task=dict(p.get("task", {})), data=DataConfig(name=data),
                            optim=OptimConfig(**p["optim"]), train=train_config(**p["train"]))


def cpu_gpu_presets(name: str, data: str, cpu: dict, gpu: dict) -> dict[str, ExperimentConfig]:
    """The ``cpu`` and ``gpu`` presets of ``name`` on dataset ``data``; each is given as
    ``{"model": ..., "task": ..., "optim": OptimConfig fields, "train": TrainConfig fields}``."""
    return {"cpu": _config(name, "cpu", data, cpu), "gpu": _config(name, "gpu", data, gpu)}


def cpu_only_presets(name: str, data: str, cpu: dict) -> dict[str, ExperimentConfig]:
    """Only a ``cpu`` preset: a setting sized for a CPU, with no GPU counterpart."""
    return {"cpu": _config(name, "cpu", data, cpu)}


# ------------------------------------------------------------------------------ model options
def construct(cls, *args, **kwargs) -> nn.Module:
    """``cls(*args, **kwargs)``, with a wrong model option reported as a :class:`ConfigError`."""
    try:
        return cls(*args, **kwargs)
    except TypeError as err:
        raise ConfigError(f"model options {sorted(kwargs)} do not fit {cls.__name__}: {err}") from None


def _signature_fields(cls, exclude=(), inner=None) -> list[str] | None:
    """Keyword names ``cls(...)`` accepts, less ``exclude`` (those the task supplies); a class that
    forwards ``**kwargs`` to ``inner`` accepts ``inner``'s too (None: anything, unchecked)."""
    params = inspect.signature(cls.__init__).parameters
    names = [n for n, q in params.items() if n != "self" and n not in exclude
             and q.kind not in (inspect.Parameter.VAR_POSITIONAL, inspect.Parameter.VAR_KEYWORD)]
    if any(q.kind is inspect.Parameter.VAR_KEYWORD for q in params.values()):
        if inner is None:
            return None
        more = _signature_fields(inner, exclude)
        return None if more is None else sorted(set(names) | set(more))
    return names


def _class_fields(importer: Callable, exclude=()) -> Callable[[dict], list[str] | None]:
    """``model_fields`` for an experiment built from the one class ``importer()`` returns."""
    return lambda model: _signature_fields(importer(), exclude)


def pick_arch(kwargs: dict, classes: dict) -> tuple[type, dict]:
    """The class named by ``kwargs["arch"]`` and the remaining keyword arguments."""
    kw = dict(kwargs)
    arch = kw.pop("arch", None)
    if arch not in classes:
        raise ConfigError(f"model.arch must be one of {sorted(classes)}, got {arch!r}")
    return classes[arch], kw


def _arch_fields(importer: Callable, exclude=()) -> Callable[[dict], list[str] | None]:
    """``model_fields`` for ``model.arch`` picking a class in ``importer()``: ``{arch: cls or
    (cls, inner)}``."""
    def fields(model: dict) -> list[str] | None:
        entry, _ = pick_arch(model, importer())
        cls, inner = entry if isinstance(entry, tuple) else (entry, None)
        names = _signature_fields(cls, exclude, inner)
        return None if names is None else ["arch", *names]
    return fields


# ------------------------------------------------------------------------------ the builders
# Each builder imports its model class when called, so that listing the experiments (and importing
# cemlib.train) does not import every model family.
def build_lm(kwargs: dict, task: Task) -> nn.Module:
    """:class:`~cemlib.models.lm.LanguageModel` (Llama, CEM attention, CEM MLP, full CEM)."""
    from cemlib.models.lm import LanguageModel, LMConfig
    vocab_size, context_length = task.info["vocab_size"], task.info["context_length"]
    names = {f.name for f in dataclasses.fields(LMConfig)}
    unknown = sorted(set(kwargs) - names)
    if unknown:
        raise ConfigError(f"model fields {unknown} are not LMConfig fields; known: {', '.join(sorted(names))}")
    return LanguageModel(LMConfig(vocab_size=vocab_size, context_length=context_length, **kwargs))


def _lm_fields(model: dict) -> list[str]:
    from cemlib.models.lm import LMConfig
    return [f.name for f in dataclasses.fields(LMConfig) if f.name not in ("vocab_size", "context_length")]


build_lm.model_fields = _lm_fields


def _token_model_classes() -> dict:
    from cemlib.layers.nrgpt import NRGPTBlock
    from cemlib.models.nrgpt import GPTModel, NRGPTModel, RecurrentGPTModel
    return {"nrgpt": (NRGPTModel, NRGPTBlock), "rgpt": RecurrentGPTModel, "gpt": GPTModel}


def build_token_model(kwargs: dict, task: Task) -> nn.Module:
    """``model.arch``: ``nrgpt`` (NRGPT), ``rgpt`` (the recurrent parallel GPT) or ``gpt``."""
    classes = {k: v[0] if isinstance(v, tuple) else v for k, v in _token_model_classes().items()}
    cls, kw = pick_arch(kwargs, classes)
    return construct(cls, task.info["vocab_size"], task.info["context_length"], **kw)


build_token_model.model_fields = _arch_fields(_token_model_classes, ("vocab_size", "block_size"))


def _regressor_class():
    from cemlib.models.regression import MLPRegressor
    return MLPRegressor


def build_regressor(kwargs: dict, task: Task) -> nn.Module:
    """:class:`~cemlib.models.regression.MLPRegressor` (plain, gated or CEM residual MLP)."""
    return construct(_regressor_class(), task.info["in_dim"], task.info["out_dim"], **kwargs)


build_regressor.model_fields = _class_fields(_regressor_class, ("in_dim", "out_dim"))


def _newton_class():
    from cemlib.models.newton_transformer import NewtonTransformer
    return NewtonTransformer


def build_newton(kwargs: dict, task: Task) -> nn.Module:
    """:class:`~cemlib.models.newton_transformer.NewtonTransformer` (standard or Newton attention)."""
    return construct(_newton_class(), task.info["vocab_size"], task.info["context_length"], **kwargs)


build_newton.model_fields = _class_fields(_newton_class, ("vocab_size", "block_size"))


def _recurrent_classes() -> dict:
    from cemlib.models.hyperset import HyperSETModel
    from cemlib.models.recurrent_transformer import RecurrentTransformer
    return {"hyperset": HyperSETModel, "transformer": RecurrentTransformer}


def build_recurrent(kwargs: dict, task: Task) -> nn.Module:
    """``model.arch``: ``hyperset`` (Hyper-SET) or ``transformer`` (one standard layer iterated)."""
    cls, kw = pick_arch(kwargs, _recurrent_classes())
    info = task.info
    # an answer task (ListOps) has no class count or positions of its own: logits over the
    # vocabulary at every one of its context_length positions
    io = {"n_classes": info.get("n_classes", info.get("vocab_size")),
          "n_positions": info.get("n_positions", info.get("context_length"))}
    if "vocab_size" in info:
        io["vocab_size"] = info["vocab_size"]
    else:
        io["patch_dim"] = info["patch_dim"]
    return construct(cls, **io, **kw)


build_recurrent.model_fields = _arch_fields(_recurrent_classes,
                                            ("n_classes", "n_positions", "vocab_size", "patch_dim"))
