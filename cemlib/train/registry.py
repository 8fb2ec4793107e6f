"""The registry of named experiments: look one up, configure it, build its model.

:data:`EXPERIMENTS` holds every experiment of :mod:`cemlib.train.presets` (and any a user adds with
:func:`register`). :func:`get_config` returns a preset with ``section.field=value`` overrides,
checked before any data loads: ``model.*`` fields against the model's options, the data side
(``data.*``, ``task.*``) by :func:`~cemlib.train.datasets.check_data_config`.
:func:`preset_overrides` turns a config back into overrides of its preset, and
:func:`reproduce_command` into the command line that trains it.
"""

from __future__ import annotations

import difflib
import shlex

from torch import nn

from cemlib.train import presets
from cemlib.train.config import ConfigError, ExperimentConfig, apply_overrides, did_you_mean, format_value
from cemlib.train.datasets import KINDS, check_data_config, make_task
from cemlib.train.experiment import Experiment
from cemlib.train.presets.bench import bench_experiment
from cemlib.train.tasks import Task
from cemlib.utils import seed_everything

__all__ = ["EXPERIMENTS", "register", "check_experiment", "get_config", "model_fields", "preset_overrides", "load_data", "build",
           "reproduce_command", "bench_model"]

EXPERIMENTS: dict[str, Experiment] = {}


def register(exp: Experiment) -> Experiment:
    """Add ``exp`` to :data:`EXPERIMENTS` (a second registration under one name is an error)."""
    if exp.name in EXPERIMENTS:
        raise ValueError(f"experiment {exp.name!r} is already registered")
    for key, cfg in exp.presets.items():
        if cfg.experiment != exp.name or cfg.preset != key:
            raise ValueError(f"preset {key!r} of {exp.name!r} is labelled {cfg.experiment!r}/{cfg.preset!r}")
    EXPERIMENTS[exp.name] = exp
    return exp


def model_fields(experiment: str, model: dict | None = None) -> list[str] | None:
    """The names the ``model`` section of ``experiment`` may hold (for ``model.arch`` as in
    ``model``, default: the first preset's), or ``None`` if the experiment does not say."""
    exp = EXPERIMENTS[experiment]
    fields = exp.model_fields or getattr(exp.build_model, "model_fields", None)
    if fields is None:
        return None
    if model is None:
        model = next(iter(exp.presets.values())).model if exp.presets else {}
    return fields(dict(model))


def check_experiment(experiment: str) -> None:
    """Raise :class:`ConfigError` for a name that is not registered, with the nearest names."""
    if experiment in EXPERIMENTS:
        return
    close = difflib.get_close_matches(str(experiment), list(EXPERIMENTS), n=3, cutoff=0.6)
    hint = f"; did you mean {' or '.join(map(repr, close))}?" if close else ""
    raise ConfigError(f"unknown experiment {experiment!r}{hint} (cemlib train --list shows all "
                      f"{len(EXPERIMENTS)})")


def _check_model_fields(cfg: ExperimentConfig) -> None:
    known = model_fields(cfg.experiment, cfg.model)
    if known is None:
        return
    unknown = sorted(set(cfg.model) - set(known))
    if unknown:
        raise ConfigError(f"model fields {unknown} are not options of {cfg.experiment!r}"
                          f"{did_you_mean(unknown[0], known)}; known: {', '.join(sorted(known))}")


def get_config(experiment: str, preset: str, overrides: list[str] | tuple = (),
               notes: list[str] | None = None) -> ExperimentConfig:
    """The config of ``experiment`` / ``preset`` with ``section.field=value`` overrides.

    Unknown ``model.*`` fields, unknown or out-of-range ``task.*`` options and data fields the
    dataset would ignore are rejected here (before any data loads). When an override of
    ``train.max_steps`` leaves the preset's ``optim.warmup_steps`` no smaller than it (and the
    warm-up is not overridden too), the warm-up is clamped to ``max_steps - 1``; the sentence
    saying so is appended to ``notes`` (if given)."""
    check_experiment(experiment)
    presets = EXPERIMENTS[experiment].presets
    if preset not in presets:
        raise ConfigError(f"unknown preset {preset!r} for experiment {experiment!r}{did_you_mean(preset, presets)}; "
                          f"known: {', '.join(sorted(presets))}")
    base = presets[preset]
    cfg = ExperimentConfig.from_dict(base.to_dict())  # a copy: presets stay untouched
    overrides = list(overrides)
    if overrides:
        w = cfg.optim.warmup_steps
        if w and not any(o.partition("=")[0].strip() == "optim.warmup_steps" for o in overrides):
            d = cfg.to_dict()
            d["optim"]["warmup_steps"] = 0
            max_steps = apply_overrides(ExperimentConfig.from_dict(d), overrides).train.max_steps
            if w >= max_steps:
                clamped = max_steps - 1
                if notes is not None:
                    notes.append(f"the {preset} preset's optim.warmup_steps={w} does not fit "
                                 f"train.max_steps={max_steps}: warm-up clamped to {clamped} steps "
                                 f"(set optim.warmup_steps to choose another)")
                overrides = overrides + [f"optim.warmup_steps={clamped}"]
        cfg = apply_overrides(cfg, overrides)
        given = {o.partition("=")[0].strip() for o in overrides}
        if "optim.warmup_fraction" in given and cfg.optim.warmup_steps is not None:
            raise ConfigError(f"optim.warmup_fraction={cfg.optim.warmup_fraction} is not used: the warm-up is "
                              f"optim.warmup_steps={cfg.optim.warmup_steps}"
                              f"{'' if 'optim.warmup_steps' in given else ' (the preset' + chr(39) + 's)'}, which "
                              f"wins; also give --set optim.warmup_steps=none to use the fraction, or set "
                              f"optim.warmup_steps instead")
        if "optim.min_lr_ratio" in given and cfg.optim.schedule == "constant":
            raise ConfigError(f"optim.min_lr_ratio={cfg.optim.min_lr_ratio} is not used by optim.schedule=constant "
                              f"(the learning rate stays at optim.lr after the warm-up); choose optim.schedule="
                              f"cosine or linear to decay to it")
    _check_model_fields(cfg)
    _check_data_kind(cfg, base)
    check_data_config(cfg, base)
    return cfg


def _check_data_kind(cfg: ExperimentConfig, base: ExperimentConfig) -> None:
    """Refuse a ``data.name`` of another kind of task than the preset's (a language model cannot
    train on regression data), naming the experiments that use that dataset."""
    new, old = cfg.data.name, base.data.name
    if new == old or new not in KINDS or KINDS.get(new) == KINDS.get(old):
        return
    users = sorted(n for n, e in EXPERIMENTS.items() if any(c.data.name == new for c in e.presets.values()))
    hint = f" ({', '.join(users[:4])}{' ...' if len(users) > 4 else ''})" if users else ""
    raise ConfigError(f"data.name={new!r} ({KINDS[new].replace('_', ' ')}) does not fit {cfg.experiment!r}, whose "
                      f"model is built for the {old!r} data ({KINDS.get(old, '?').replace('_', ' ')}): choose an "
                      f"experiment built for the {new!r} data instead{hint}")


def preset_overrides(cfg: ExperimentConfig) -> list[str]:
    """The ``section.field=value`` overrides that turn ``cfg``'s preset into ``cfg`` (so that
    ``get_config(cfg.experiment, cfg.preset, preset_overrides(cfg)) == cfg``): what a ``--config``
    file or a checkpoint changed. Raises :class:`ConfigError` for a preset that is not registered
    or a change ``--set`` cannot express (a removed model field, a string that reads as a number)."""
    base = get_config(cfg.experiment, cfg.preset).to_dict()
    d = cfg.to_dict()
    out = []
    for section in ("model", "task", "data", "optim", "train"):
        removed = sorted(set(base[section]) - set(d[section]))
        if removed:
            raise ConfigError(f"the config leaves out {section}.{removed[0]}, which the {cfg.preset!r} preset "
                              f"of {cfg.experiment!r} sets; --set cannot remove a field")
        for name, value in d[section].items():
            if name not in base[section] or base[section][name] != value or \
                    type(base[section][name]) is not type(value):
                out.append(f"{section}.{name}={format_value(value, f'{section}.{name}')}")
    return out


def load_data(cfg: ExperimentConfig) -> Task:
    """The task (data splits, loss, metrics) of ``cfg``; see :mod:`cemlib.train.datasets`."""
    return make_task(cfg)


def build(cfg: ExperimentConfig, task: Task | None = None) -> tuple[nn.Module, Task]:
    """Load the task, seed with ``cfg.train.seed`` and build the model: ``(model, task)``.

    ``task``: the task of ``cfg`` already loaded (building several models on the same data loads
    it once); by default it is loaded from ``cfg``."""
    check_experiment(cfg.experiment)
    _check_model_fields(cfg)
    task = make_task(cfg) if task is None else task
    seed_everything(cfg.train.seed)
    try:
        model = EXPERIMENTS[cfg.experiment].build_model(dict(cfg.model), task)
    except ConfigError:
        raise
    except KeyError as err:  # the model reads something the task does not provide
        raise ConfigError(f"{cfg.experiment!r} builds its model from {err.args[0]!r}, which the "
                          f"{cfg.data.name!r} data ({task.kind}) do not provide: data.name={cfg.data.name!r} "
                          f"does not fit this experiment") from None
    except (TypeError, ValueError) as err:  # a model option out of range: a config error
        raise ConfigError(f"the model options of {cfg.experiment!r} are invalid: {err}") from err
    return model, task


def reproduce_command(experiment: str, preset: str, overrides=(), world_size: int = 1,
                      strategy: str = "ddp") -> str:
    """The shell command that reruns a configuration (``torchrun`` when world_size > 1)."""
    args = ["--experiment", experiment, "--preset", preset]
    if strategy != "ddp":
        args += ["--strategy", strategy]
    for o in overrides:
        args += ["--set", o]
    launcher = "python -m cemlib.train" if world_size == 1 else \
        f"torchrun --standalone --nproc_per_node={world_size} -m cemlib.train"
    return f"{launcher} {shlex.join(args)}"


for _module in presets.MODULES:
    for _exp in _module.EXPERIMENTS:
        register(_exp)


def bench_model(task_name: str, model: str, width: int | None = None, preset: str = "cpu",
                task: Task | None = None) -> nn.Module:
    """The benchmark's ``model`` for ``task_name`` as its ``preset`` builds it, at ``width``
    (default: the registered width of :data:`cemlib.train.presets.bench.WIDTHS`), initialised with the preset's seed.

    ``task``: an already loaded task of the benchmark (the task options are the same for every model
    of a task), so that building several models or widths loads the data once."""
    experiment = bench_experiment(task_name, model)
    overrides = []
    if width is not None:
        key = "d" if "d" in get_config(experiment, preset).model else "d_model"
        overrides.append(f"model.{key}={width}")
    return build(get_config(experiment, preset, overrides), task)[0]
