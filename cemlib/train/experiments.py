"""Named experiments and their presets, and :func:`run_experiment`, the one call chapters make.

An :class:`Experiment` is a model factory (model keyword arguments + vocabulary size + context
length -> ``nn.Module``) and named presets (:class:`~cemlib.train.config.ExperimentConfig`):
``cpu`` finishes in about a minute on 2 cores, ``gpu`` is the mid-size model the chapter is about.
Chapters may :func:`register` their own experiments. Every built-in preset writes a periodic
checkpoint (``train.checkpoint_interval``: about a fifth of the run, a multiple of the evaluation
interval) when it has an output folder; ``model.*`` fields are checked against the model's
options in :func:`get_config`, before any data loads.

Registered here: character-level tiny Shakespeare with the Llama baseline (``shakespeare-llama``)
and full CEM, attention and MLP both replaced (``shakespeare-cem``), both from
:mod:`cemlib.models.lm`. The ``gpu`` presets use nanoGPT's ``train_shakespeare_char`` size (6
layers, 6 heads, width 384, context 256, batch 64, lr 1e-3 -> 1e-4, 100 warm-up steps, beta_2 =
0.99, 5000 steps), which is also NRGPT App. F.4's setting (context 256, batch 64, beta_2 = 0.99,
100 warm-up updates), with nanoGPT's dropout 0.2 (``LMConfig.dropout``: on the embeddings and on each
sublayer's total update, so CEM layers stay exact gradient steps). The gpu presets turn off the model's own finite-value checks (``check_finite``), which synchronise the GPU; the
trainer checks loss and gradients every step anyway.
"""

from __future__ import annotations

import dataclasses
import inspect
import math
import os
import shlex
import sys
import time
from dataclasses import dataclass, field
from typing import Callable

from torch import nn

from cemlib.train.config import ConfigError, DataConfig, ExperimentConfig, OptimConfig, TrainConfig, \
    apply_overrides
from cemlib.train.task_data import make_task
from cemlib.train.tasks import Task
from cemlib.utils import seed_everything

__all__ = ["Experiment", "register", "EXPERIMENTS", "get_config", "load_data", "build", "run_experiment",
           "reproduce_command", "model_fields", "bench_experiment", "bench_model"]


@dataclass(frozen=True)
class Experiment:
    """A model factory ``build_model(model_kwargs, task) -> nn.Module`` (it reads ``task.info``:
    ``vocab_size``, ``context_length``, ``n_classes``, ``in_dim``, ...) and its presets.

    ``model_fields(model_kwargs)``, if given, returns the names the ``model`` section may hold
    (they may depend on ``model.arch``), so that a misspelt ``model.*`` field fails in
    :func:`get_config`, before any data loads; ``None`` (the default) uses the builder's own
    ``build_model.model_fields`` attribute if it has one, else skips that check."""

    name: str
    description: str
    build_model: Callable[[dict, int, int], nn.Module]
    presets: dict = field(default_factory=dict)
    model_fields: Callable[[dict], list[str] | None] | None = None


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


def _check_model_fields(cfg: ExperimentConfig) -> None:
    known = model_fields(cfg.experiment, cfg.model)
    if known is None:
        return
    unknown = sorted(set(cfg.model) - set(known))
    if unknown:
        raise ConfigError(f"model fields {unknown} are not options of {cfg.experiment!r}; known: "
                          f"{', '.join(sorted(known))}")


def get_config(experiment: str, preset: str, overrides: list[str] | tuple = (),
               notes: list[str] | None = None) -> ExperimentConfig:
    """The config of ``experiment`` / ``preset`` with ``section.field=value`` overrides.

    Unknown ``model.*`` fields are rejected here (before any data loads). When an override of
    ``train.max_steps`` leaves the preset's ``optim.warmup_steps`` no smaller than it (and the
    warm-up is not overridden too), the warm-up is clamped to ``max_steps - 1``; the sentence
    saying so is appended to ``notes`` (if given)."""
    if experiment not in EXPERIMENTS:
        raise ConfigError(f"unknown experiment {experiment!r}; known: {', '.join(sorted(EXPERIMENTS))}")
    presets = EXPERIMENTS[experiment].presets
    if preset not in presets:
        raise ConfigError(f"unknown preset {preset!r} for experiment {experiment!r}; "
                          f"known: {', '.join(sorted(presets))}")
    cfg = ExperimentConfig.from_dict(presets[preset].to_dict())  # a copy: presets stay untouched
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
    _check_model_fields(cfg)
    return cfg


def load_data(cfg: ExperimentConfig) -> Task:
    """The task (data splits, loss, metrics) of ``cfg``; see :mod:`cemlib.train.task_data`."""
    return make_task(cfg)


def build(cfg: ExperimentConfig, task: Task | None = None) -> tuple[nn.Module, Task]:
    """Load the task, seed with ``cfg.train.seed`` and build the model: ``(model, task)``.

    ``task``: the task of ``cfg`` already loaded (building several models on the same data loads
    it once); by default it is loaded from ``cfg``."""
    if cfg.experiment not in EXPERIMENTS:
        raise ConfigError(f"unknown experiment {cfg.experiment!r}; known: {', '.join(sorted(EXPERIMENTS))}")
    _check_model_fields(cfg)
    task = make_task(cfg) if task is None else task
    seed_everything(cfg.train.seed)
    try:
        model = EXPERIMENTS[cfg.experiment].build_model(dict(cfg.model), task)
    except ConfigError:
        raise
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


def run_experiment(experiment: str, preset: str = "cpu", overrides=(), out_dir=None, *, resume=None,
                   until: int | None = None, verbose: bool = True, strategy: str = "ddp",
                   started_at: float | None = None, started_from: str = "caller's start time") -> dict:
    """Build and train one preset; return its results dictionary (see :mod:`cemlib.train.results`).

    ``out_dir`` is checked (created, written to) before the data load; ``started_at``
    (``time.time()``, default: this call) is when the run began, for the start-up time in the
    results (``started_from`` names that moment, e.g. "process start")."""
    from cemlib.train.trainer import Trainer, prepare_out_dir
    t0 = time.time() if started_at is None else started_at
    notes: list[str] = []
    cfg = get_config(experiment, preset, overrides, notes)
    if verbose and int(os.environ.get("RANK", "0")) == 0:
        for note in notes:
            print(f"note: {note}", file=sys.stderr)
    if out_dir is not None and int(os.environ.get("RANK", "0")) == 0:
        prepare_out_dir(out_dir)
    model, task = build(cfg)
    cmd = reproduce_command(experiment, preset, overrides, int(os.environ.get("WORLD_SIZE", "1")), strategy)
    trainer = Trainer(model, task, cfg, out_dir=out_dir, command=cmd, strategy=strategy, verbose=verbose,
                      started_at=t0, notes=notes)
    trainer.started_from = started_from if started_at is not None else "run_experiment call"
    return trainer.fit(resume=resume, until=until)


# ------------------------------------------------------------------------------ helpers for the registrations
def _construct(cls, *args, **kwargs) -> nn.Module:
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


def _fields(importer: Callable, exclude=()) -> Callable[[dict], list[str] | None]:
    """``model_fields`` for an experiment built from the one class ``importer()`` returns."""
    return lambda model: _signature_fields(importer(), exclude)


def _arch_fields(importer: Callable, exclude=()) -> Callable[[dict], list[str] | None]:
    """``model_fields`` for ``model.arch`` picking a class in ``importer()``: ``{arch: cls or
    (cls, inner)}``."""
    def fields(model: dict) -> list[str] | None:
        classes = importer()
        entry, _ = _pick_arch(model, classes)
        cls, inner = entry if isinstance(entry, tuple) else (entry, None)
        names = _signature_fields(cls, exclude, inner)
        return None if names is None else ["arch", *names]
    return fields


def _pick_arch(kwargs: dict, classes: dict) -> tuple[type, dict]:
    """The class named by ``kwargs["arch"]`` and the remaining keyword arguments."""
    kw = dict(kwargs)
    arch = kw.pop("arch", None)
    if arch not in classes:
        raise ConfigError(f"model.arch must be one of {sorted(classes)}, got {arch!r}")
    return classes[arch], kw


def _train(**kw) -> TrainConfig:
    """A preset's :class:`TrainConfig` with a periodic checkpoint (unless given): about every fifth
    of the run, rounded up to a multiple of ``eval_interval`` (at most five plus ``last.pt``)."""
    if "checkpoint_interval" not in kw:
        ev = kw.get("eval_interval", TrainConfig.eval_interval)
        kw["checkpoint_interval"] = ev * math.ceil(max(1, kw["max_steps"] // 5) / ev)
    return TrainConfig(**kw)


def _presets(name: str, data: str, cpu: dict, gpu: dict) -> dict:
    """The ``cpu`` and ``gpu`` :class:`ExperimentConfig` of ``name`` on dataset ``data``; each
    preset is ``{"model": ..., "task": ..., "optim": OptimConfig kwargs, "train": TrainConfig kwargs}``."""
    return {key: ExperimentConfig(experiment=name, preset=key, model=dict(p["model"]),
                                  task=dict(p.get("task", {})), data=DataConfig(name=data),
                                  optim=OptimConfig(**p["optim"]), train=_train(**p["train"]))
            for key, p in (("cpu", cpu), ("gpu", gpu))}


# ------------------------------------------------------------------------------ Shakespeare
def _build_lm(kwargs: dict, task: Task) -> nn.Module:
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


_build_lm.model_fields = _lm_fields


def _shakespeare(name: str, attn: str, mlp: str, what: str, cpu_extra=None, gpu_extra=None) -> Experiment:
    arch = {"attn": attn, "mlp": mlp}
    cpu = ExperimentConfig(
        experiment=name, preset="cpu",
        model={"d_model": 128, "n_layers": 2, "n_heads": 4, **arch, **(cpu_extra or {})},
        optim=OptimConfig(lr=3e-3, beta2=0.99, warmup_steps=20, min_lr_ratio=0.1),
        train=_train(max_steps=600, batch_size=32, context_length=64, eval_interval=50,
                     eval_batches=8, log_interval=10))
    gpu = ExperimentConfig(
        experiment=name, preset="gpu",
        model={"d_model": 384, "n_layers": 6, "n_heads": 6, "dropout": 0.2, "check_finite": False,
               **arch, **(gpu_extra or {})},
        optim=OptimConfig(lr=1e-3, beta2=0.99, warmup_steps=100, min_lr_ratio=0.1),
        train=_train(max_steps=5000, batch_size=64, context_length=256, eval_interval=500,
                     eval_batches=200, log_interval=10, compile=True))
    return Experiment(name, f"character-level tiny Shakespeare: {what}", _build_lm,
                      {"cpu": cpu, "gpu": gpu})


def _pm_width(d_model: int) -> dict:
    """CEM MLP width ``d_v = 1.5 d_ff``: the tied MLP's 2 d d_v weights match SwiGLU's 3 d d_ff."""
    from cemlib.models.lm import default_d_ff
    return {"d_v": 3 * default_d_ff(d_model) // 2}


register(_shakespeare("shakespeare-llama", "llama", "llama", "Llama baseline (RoPE attention, SwiGLU)"))
register(_shakespeare("shakespeare-cem", "cem", "cem", "full CEM: CEM attention and CEM MLP, T = 1"))
register(_shakespeare("shakespeare-cem-attn", "cem", "llama",
                      "CEM attention (tied, T = 1) with the SwiGLU MLP (CEM Fig. 2a)"))
register(_shakespeare("shakespeare-cem-mlp", "llama", "cem",
                      "Llama attention with the CEM MLP, dimension-matched d_v = d_ff (CEM Fig. 2b)"))
register(_shakespeare("shakespeare-cem-mlp-pm", "llama", "cem",
                      "Llama attention with the CEM MLP, parameter-matched d_v = 1.5 d_ff (CEM Fig. 2b)",
                      _pm_width(128), _pm_width(384)))


# CEM ablations (CEM §4, Figs. 2-4): each one config change away from a registered model
for _name, _base, _what, _model in (
        ("shakespeare-cem-t2", ("cem", "cem"), "full CEM with T = 2 recursive steps in every layer "
         "(eqs. 16-17)", {"T_attn": 2, "T_mlp": 2}),
        ("shakespeare-cem-t3", ("cem", "cem"), "full CEM with T = 3 (the paper reports it unstable)",
         {"T_attn": 3, "T_mlp": 3}),
        ("shakespeare-cem-attn-t2", ("cem", "llama"), "CEM attention with T = 2, SwiGLU MLP (Fig. 2c)",
         {"T_attn": 2}),
        ("shakespeare-cem-mlp-t2", ("llama", "cem"), "Llama attention, CEM MLP with T = 2 (Fig. 2d)",
         {"T_mlp": 2}),
        ("shakespeare-cem-attn-diag-none", ("cem", "llama"), "CEM attention without the KQ diagonal "
         "(Fig. 3b)", {"diag": "none"}),
        ("shakespeare-cem-attn-diag-head", ("cem", "llama"), "CEM attention with a per-head KQ "
         "diagonal (Fig. 3b)", {"diag": "per_head"}),
        ("shakespeare-cem-precond-diag", ("cem", "cem"), "full CEM, T = 2, diagonal preconditioners "
         "(§2.8, Fig. 2c-d)", {"T_attn": 2, "T_mlp": 2, "precond_attn": "diag", "precond_mlp": "diag"}),
        ("shakespeare-cem-precond-dplr", ("cem", "cem"), "full CEM, T = 2, diagonal-plus-low-rank "
         "preconditioners (eq. 13, Fig. 2c-d)",
         {"T_attn": 2, "T_mlp": 2, "precond_attn": "dplr", "precond_mlp": "dplr"}),
        ("shakespeare-llama-reuse2", ("llama", "llama"), "Llama with plain layer reuse: every "
         "residual sublayer applied twice (the Fig. 3c/4 baseline)", {"reuse_attn": 2, "reuse_mlp": 2}),
        ("shakespeare-cem-reuse2", ("cem", "cem"), "full CEM (T = 1) with plain layer reuse x2, "
         "against CEM's T = 2 recursion", {"reuse_attn": 2, "reuse_mlp": 2})):
    register(_shakespeare(_name, *_base, _what, _model, _model))


# ------------------------------------------------------------------------------ NRGPT (ListOps, Shakespeare)
def _build_token_model(kwargs: dict, task: Task) -> nn.Module:
    """``kwargs["arch"]``: ``nrgpt`` / ``rgpt`` (GPT_Rec_parallel) / ``gpt``; the rest go to the class."""
    from cemlib.models.nrgpt import GPTModel, NRGPTModel, RecurrentGPTModel
    cls, kw = _pick_arch(kwargs, {"nrgpt": NRGPTModel, "rgpt": RecurrentGPTModel, "gpt": GPTModel})
    return _construct(cls, task.info["vocab_size"], task.info["context_length"], **kw)


def _token_model_classes() -> dict:
    from cemlib.layers.nrgpt import NRGPTBlock
    from cemlib.models.nrgpt import GPTModel, NRGPTModel, RecurrentGPTModel
    return {"nrgpt": (NRGPTModel, NRGPTBlock), "rgpt": RecurrentGPTModel, "gpt": GPTModel}


_build_token_model.model_fields = _arch_fields(_token_model_classes, ("vocab_size", "block_size"))


def _nrgpt_family(prefix: str, data: str, task: dict, cpu_model: dict, gpu_model: dict, cpu_train: dict,
                  gpu_train: dict, cpu_optim: dict, gpu_optim: dict, what: str) -> None:
    archs = {"nrgpt": ({"arch": "nrgpt", "ff": "ff2w"}, "NRGPT (FF2W energy, learned rate matrix)"),
             "rgpt": ({"arch": "rgpt"}, "recurrent parallel GPT (GPT_Rec_parallel)"),
             "gpt": ({"arch": "gpt"}, "standard deep GPT-2")}
    for arch, (extra, label) in archs.items():
        name = f"{prefix}-{arch}"
        depth = "n_layers" if arch == "gpt" else "n_steps"

        def model(m: dict) -> dict:
            return {**extra, **{k: v for k, v in m.items() if k != "depth"}, depth: m["depth"]}
        presets = _presets(name, data,
                           {"model": model(cpu_model), "task": task.get("cpu", {}), "optim": cpu_optim,
                            "train": cpu_train},
                           {"model": model(gpu_model), "task": task.get("gpu", {}), "optim": gpu_optim,
                            "train": gpu_train})
        register(Experiment(name, f"{what}: {label}", _build_token_model, presets))


# ListOps (NRGPT §3.2, App. F.3; the authors' LOPS00 sweep: 5 recurrent steps, lr 5e-4 -> 2e-5,
# batch 64, AdamW, clipping 1.0, dropout 0, no warm-up given). Loss and accuracy on the answer.
_nrgpt_family(
    "listops", "listops",
    {"cpu": {"n_train": 10_000, "n_test": 500, "val_fraction": 0.05}, "gpu": {"n_train": 50_000, "n_test": 2_000}},
    cpu_model={"d_model": 32, "n_heads": 1, "depth": 3}, gpu_model={"d_model": 128, "n_heads": 4, "depth": 5},
    cpu_train={"max_steps": 300, "batch_size": 32, "eval_interval": 100, "eval_batches": 4,
               "log_interval": 10},
    gpu_train={"max_steps": 20_000, "batch_size": 64, "eval_interval": 1000, "eval_batches": 50,
               "log_interval": 50, "compile": True},
    cpu_optim={"lr": 3e-3, "beta2": 0.99, "weight_decay": 0.1, "warmup_steps": 30, "min_lr_ratio": 0.04},
    gpu_optim={"lr": 1e-3, "beta2": 0.99, "weight_decay": 0.1, "warmup_steps": 200, "min_lr_ratio": 0.04},
    what="ListOps (MAX, MEDIAN, SUM mod 20), answer prediction")

# Character-level Shakespeare (NRGPT §3.3, App. F.4: context 256, batch 64, beta_2 = 0.99, dropout 0.1,
# 100 warm-up updates; Table 4's NRGPT_H_FF2W: 8 steps, 1 head, width 128).
_nrgpt_family(
    "shakespeare", "shakespeare", {},
    cpu_model={"d_model": 64, "n_heads": 2, "depth": 3}, gpu_model={"d_model": 128, "n_heads": 1,
                                                                      "depth": 8, "dropout": 0.1},
    cpu_train={"max_steps": 300, "batch_size": 16, "context_length": 64, "eval_interval": 50,
               "eval_batches": 4, "log_interval": 10},
    gpu_train={"max_steps": 5000, "batch_size": 64, "context_length": 256, "eval_interval": 500,
               "eval_batches": 100, "log_interval": 10, "compile": True},
    cpu_optim={"lr": 3e-3, "beta2": 0.99, "warmup_steps": 20, "min_lr_ratio": 0.1},
    gpu_optim={"lr": 1e-3, "beta2": 0.99, "warmup_steps": 100, "min_lr_ratio": 0.1},
    what="character-level tiny Shakespeare (NRGPT §3.3)")


# ------------------------------------------------------------------------------ GP regression (CEM Table 3)
def _build_regressor(kwargs: dict, task: Task) -> nn.Module:
    from cemlib.models.regression import MLPRegressor
    return _construct(MLPRegressor, task.info["in_dim"], task.info["out_dim"], **kwargs)


def _regressor_class():
    from cemlib.models.regression import MLPRegressor
    return MLPRegressor


_build_regressor.model_fields = _fields(_regressor_class, ("in_dim", "out_dim"))


# Widths (ours; the paper gives none): D_h = 64, one residual block. Gated (SwiGLU) d_ff = 172 and
# CEM d_v = 172 give 3 x 64 x 172 = 33,024 and 2 x 64 x 172 = 22,016 block weights (Table 3: 33.94K
# vs 22.66K in all); Plain d_ff = 258 ~ 1.5 x 172 (with biases) matches Gated's count.
for _name, _model, _what in (
        ("gp-plain", {"mlp": "plain", "d_ff": 258}, "plain residual MLP"),
        ("gp-gated", {"mlp": "gated", "d_ff": 172}, "gated (SwiGLU) residual MLP"),
        ("gp-cem-t1", {"mlp": "cem", "d_ff": 172, "T": 1}, "CEM MLP, T = 1"),
        ("gp-cem-t2", {"mlp": "cem", "d_ff": 172, "T": 2}, "CEM MLP, T = 2"),
        ("gp-cem-t4", {"mlp": "cem", "d_ff": 172, "T": 4}, "CEM MLP, T = 4"),
        ("gp-cem-t8", {"mlp": "cem", "d_ff": 172, "T": 8}, "CEM MLP, T = 8")):
    _m = {"d_model": 64, **_model}
    register(Experiment(
        _name, f"GP regression on 10-D inputs (CEM Table 3; kernel: task.kernel): {_what}", _build_regressor,
        _presets(_name, "gp",
                 {"model": _m, "task": {"kernel": "rbf", "n_train": 1000},
                  "optim": dict(lr=3e-3, beta2=0.99, weight_decay=0.0, warmup_steps=50, min_lr_ratio=0.01),
                  "train": dict(max_steps=1500, batch_size=100, eval_interval=250, eval_batches=10,
                                log_interval=25)},
                 {"model": _m, "task": {"kernel": "rbf", "n_train": 4000},
                  "optim": dict(lr=3e-3, beta2=0.99, weight_decay=0.0, warmup_steps=200, min_lr_ratio=0.01),
                  "train": dict(max_steps=20_000, batch_size=100, eval_interval=1000, eval_batches=40,
                                log_interval=100)})))


# ------------------------------------------------------------------------------ LIS (Newton attention)
def _build_newton(kwargs: dict, task: Task) -> nn.Module:
    from cemlib.models.newton_transformer import NewtonTransformer
    return _construct(NewtonTransformer, task.info["vocab_size"], task.info["context_length"], **kwargs)


def _newton_class():
    from cemlib.models.newton_transformer import NewtonTransformer
    return NewtonTransformer


_build_newton.model_fields = _fields(_newton_class, ("vocab_size", "block_size"))


# App. A.9: 3 layers, sinusoidal positions, dropout 0.1, AdamW(0.9, 0.999), lr 1e-4, weight decay
# 0.01, batch 128, 300 epochs. The cpu preset uses L = 10 with fewer examples and a larger lr.
for _name, _model, _what in (
        ("lis-mha", {"attn": "mha"}, "standard multi-head attention with FFN"),
        ("lis-mha2nd1st", {"attn": "mha2nd1st"}, "first-order Newton attention MHA2nd1st with FFN"),
        ("lis-mha-only", {"attn": "mha", "ffn": False}, "standard attention only (no FFN)"),
        ("lis-mha2nd1st-only", {"attn": "mha2nd1st", "ffn": False}, "MHA2nd1st only (no FFN)")):
    register(Experiment(
        _name, f"LIS with the DP chain (intrinsic optimizers §5): {_what}", _build_newton,
        _presets(_name, "lis",
                 {"model": {"d_model": 64, "n_layers": 3, "n_heads": 4, **_model},
                  "task": {"L": 10, "n_train": 8000, "n_test": 300, "val_fraction": 0.05},
                  "optim": dict(lr=1e-3, beta2=0.999, weight_decay=0.01, warmup_steps=30, min_lr_ratio=0.1),
                  "train": dict(max_steps=600, batch_size=64, eval_interval=200, eval_batches=4,
                                log_interval=10)},
                 {"model": {"d_model": 256, "n_layers": 3, "n_heads": 4, **_model}, "task": {"L": 20},
                  "optim": dict(lr=1e-4, beta2=0.999, weight_decay=0.01, warmup_steps=200, min_lr_ratio=0.1),
                  "train": dict(max_steps=20_000, batch_size=128, eval_interval=2000, eval_batches=20,
                                log_interval=50)})))


# The same four models where greedy decoding learns on a CPU (the hard settings above stay for the
# gpu presets): L = 5 and 1200 steps at lr 3e-3. With the lis-* cpu preset (L = 10, 600 steps) the
# models predict the answer after the true chain but generate dp_i = i, below the trivial
# predictor's 29 % (the most frequent answer, cemlib.train.chance); here they pass it after a few
# hundred steps. cpu preset only.
def _cpu_only(name: str, data: str, cpu: dict) -> dict:
    """Only a ``cpu`` preset (a setting sized for a CPU, with no GPU counterpart)."""
    return {"cpu": _presets(name, data, cpu, cpu)["cpu"]}


for _name, _model, _what in (
        ("lis5-mha", {"attn": "mha"}, "standard multi-head attention with FFN"),
        ("lis5-mha2nd1st", {"attn": "mha2nd1st"}, "first-order Newton attention MHA2nd1st with FFN"),
        ("lis5-mha-only", {"attn": "mha", "ffn": False}, "standard attention only (no FFN)"),
        ("lis5-mha2nd1st-only", {"attn": "mha2nd1st", "ffn": False}, "MHA2nd1st only (no FFN)")):
    register(Experiment(
        _name, f"LIS with the DP chain at L = 5, a CPU setting where greedy decoding learns: {_what}",
        _build_newton,
        _cpu_only(_name, "lis",
                  {"model": {"d_model": 64, "n_layers": 3, "n_heads": 4, **_model},
                   "task": {"L": 5, "n_train": 8000, "n_test": 300, "val_fraction": 0.05},
                   "optim": dict(lr=3e-3, beta2=0.999, weight_decay=0.01, warmup_steps=30, min_lr_ratio=0.1),
                   "train": dict(max_steps=1200, batch_size=64, eval_interval=200, eval_batches=4,
                                 log_interval=10)})))


# ------------------------------------------------------------------------------ Hyper-SET (Sudoku, digits)
def _build_recurrent(kwargs: dict, task: Task) -> nn.Module:
    from cemlib.models.hyperset import HyperSETModel
    from cemlib.models.recurrent_transformer import RecurrentTransformer
    cls, kw = _pick_arch(kwargs, {"hyperset": HyperSETModel, "transformer": RecurrentTransformer})
    info = task.info
    # an answer task (ListOps) has no class count or positions of its own: logits over the
    # vocabulary at every one of its context_length positions
    io = {"n_classes": info.get("n_classes", info.get("vocab_size")),
          "n_positions": info.get("n_positions", info.get("context_length"))}
    if "vocab_size" in info:
        io["vocab_size"] = info["vocab_size"]
    else:
        io["patch_dim"] = info["patch_dim"]
    return _construct(cls, **io, **kw)


def _recurrent_classes() -> dict:
    from cemlib.models.hyperset import HyperSETModel
    from cemlib.models.recurrent_transformer import RecurrentTransformer
    return {"hyperset": HyperSETModel, "transformer": RecurrentTransformer}


_build_recurrent.model_fields = _arch_fields(_recurrent_classes,
                                             ("n_classes", "n_positions", "vocab_size", "patch_dim"))


for _arch, _label in (("hyperset", "Hyper-SET (bi-softmax attention, tied ReLU FF, learned step "
                                   "sizes), one layer iterated"),
                      ("transformer", "recurrent Transformer: one standard layer iterated")):
    _n = f"sudoku-{_arch}"
    register(Experiment(
        _n, f"hard Sudoku, a digit per blank (Hyper-SET §5.1): {_label}", _build_recurrent,
        _presets(_n, "sudoku",
                 {"model": {"arch": _arch, "d": 32, "n_heads": 4, "n_iter": 4},
                  "task": {"n_train": 2000, "n_test": 200, "val_fraction": 0.02},
                  "optim": dict(lr=2e-3, beta2=0.99, weight_decay=0.1, warmup_steps=20),
                  "train": dict(max_steps=200, batch_size=32, eval_interval=100, eval_batches=4, log_interval=10)},
                 {"model": {"arch": _arch, "d": 256, "n_heads": 8, "n_iter": 16},
                  "optim": dict(lr=5e-4, beta2=0.99, weight_decay=0.1, warmup_steps=200),
                  "train": dict(max_steps=8000, batch_size=64, eval_interval=1000, eval_batches=20,
                                log_interval=50)})))
    _n = f"digits-{_arch}"
    register(Experiment(
        _n, f"8x8 digits as 2x2 patches, the offline stand-in for CIFAR (Hyper-SET §5.2): {_label}",
        _build_recurrent,
        _presets(_n, "digits",
                 {"model": {"arch": _arch, "d": 64, "n_heads": 4, "n_iter": 6, "pool": "cls"},
                  "optim": dict(lr=2e-3, beta2=0.99, weight_decay=0.05, warmup_steps=30),
                  "train": dict(max_steps=500, batch_size=64, eval_interval=100, eval_batches=8, log_interval=10)},
                 {"model": {"arch": _arch, "d": 192, "n_heads": 6, "n_iter": 12, "pool": "cls"},
                  "optim": dict(lr=1e-3, beta2=0.99, weight_decay=0.05, warmup_steps=100),
                  "train": dict(max_steps=4000, batch_size=128, eval_interval=500, eval_batches=10,
                                log_interval=50)})))


# ------------------------------------------------------------------------------ Hyper-SET, the authors' setup
# The options that reproduce the released code (github.com/huyunzhe/hyper-set; choices stated in
# cemlib/README_helmholtz_hyperset.md). Sudoku (its sudoku/models.py, configs/task/sudoku.yaml):
# one RMSNorm with a learnable gain shared by Q, K, V; a learnable gain on the FF hidden RMSNorm;
# M = 4d; step sizes from their time embedding (t = 1..L) plus the raw x(0), TimeMLP zero-initialised;
# RMSNorm -> Linear head; N(0, 0.02^2) weights; loss on the blanks; AdamW(0.9, 0.95), weight decay
# 0.1, clipping 1. Its baseline: pre-RMSNorm layer without biases, same head and initialisation.
# Images (its ic/models.py, Tables 9-10): separate Q/K/V gains, FF gain, M = d, step sizes
# conditioned on x(t), LayerNorm -> Linear -> LayerNorm patch embedding, sinusoidal positions, CLS
# token; Adam with weight decay 5e-5, lr to 1% of its peak. Its baseline: pre-LayerNorm, no biases.
_SUDOKU_AUTHORS = {"hyperset": dict(qkv_gain="shared", ff_gain=True, time_embedding="authors",
                                    step_cond_norm=False, step_zero_time_mlp=True, head="rmsnorm",
                                    init_std=0.02, condition="x0", positional="learned"),
                   "transformer": dict(norm="rmsnorm", bias=False, head="rmsnorm", init_std=0.02,
                                       positional="learned")}
_DIGITS_AUTHORS = {"hyperset": dict(qkv_gain="separate", ff_gain=True, time_embedding="authors",
                                    step_zero_time_mlp=True, patch_embed="ln_linear_ln", condition="xt",
                                    positional="sinusoidal", pool="cls"),
                   "transformer": dict(norm="layernorm", bias=False, positional="sinusoidal", pool="cls")}
for _arch in ("hyperset", "transformer"):
    _n = f"sudoku-{_arch}-authors"
    register(Experiment(
        _n, f"hard Sudoku (Hyper-SET §5.1), the authors' released setup: {_arch}", _build_recurrent,
        _presets(_n, "sudoku",
                 {"model": {"arch": _arch, "d": 32, "n_heads": 4, "n_iter": 4, "ff_dim": 4 * 32,
                            **_SUDOKU_AUTHORS[_arch]},
                  "task": {"n_train": 2000, "n_test": 200, "val_fraction": 0.02, "loss_on": "mask"},
                  "optim": dict(lr=2e-3, beta2=0.95, weight_decay=0.1, warmup_steps=50),
                  "train": dict(max_steps=1000, batch_size=32, eval_interval=250, eval_batches=4, log_interval=10)},
                 {"model": {"arch": _arch, "d": 256, "n_heads": 8, "n_iter": 16, "ff_dim": 4 * 256,
                            **_SUDOKU_AUTHORS[_arch]},
                  "task": {"loss_on": "mask"},
                  "optim": dict(lr=5e-4, beta2=0.95, weight_decay=0.1, warmup_steps=200),
                  "train": dict(max_steps=8000, batch_size=64, eval_interval=1000, eval_batches=20,
                                log_interval=50)})))
    _n = f"digits-{_arch}-authors"
    _M = {"hyperset": 1, "transformer": 4}[_arch]
    register(Experiment(
        _n, f"8x8 digits as 2x2 patches (Hyper-SET §5.2 stand-in), the authors' released setup: {_arch}",
        _build_recurrent,
        _presets(_n, "digits",
                 {"model": {"arch": _arch, "d": 64, "n_heads": 4, "n_iter": 6, "ff_dim": _M * 64,
                            **_DIGITS_AUTHORS[_arch]},
                  "optim": dict(lr=2e-3, beta2=0.999, weight_decay=5e-5, warmup_steps=30, min_lr_ratio=0.01),
                  "train": dict(max_steps=500, batch_size=64, eval_interval=100, eval_batches=8, log_interval=10)},
                 {"model": {"arch": _arch, "d": 192, "n_heads": 6, "n_iter": 12, "ff_dim": _M * 192,
                            **_DIGITS_AUTHORS[_arch]},
                  "optim": dict(lr=1e-3, beta2=0.999, weight_decay=5e-5, warmup_steps=100, min_lr_ratio=0.01),
                  "train": dict(max_steps=4000, batch_size=128, eval_interval=500, eval_batches=10,
                                log_interval=50)})))


# Sudoku that a CPU run learns (the hard set stays for the gpu presets): the shipped puzzles with only
# 20 blank cells each (task.blanks; the same unique solutions), the authors' setup otherwise, 1000
# steps; the Transformer widened to d = 52 (MLP width 128) to match Hyper-SET's parameter count, as
# in chapter 9's stored comparison. cpu preset only.
for _arch, _d in (("hyperset", 32), ("transformer", 52)):
    _n = f"sudoku-easy-{_arch}-authors"
    register(Experiment(
        _n, f"Sudoku with 20 blank cells per puzzle (Hyper-SET §5.1's task, made easier for a CPU), the "
            f"authors' released setup: {_arch}", _build_recurrent,
        _cpu_only(_n, "sudoku",
                  {"model": {"arch": _arch, "d": _d, "n_heads": 4, "n_iter": 4, "ff_dim": 128, **_SUDOKU_AUTHORS[_arch]},
                   "task": {"n_train": 2000, "n_test": 200, "val_fraction": 0.02, "loss_on": "mask", "blanks": 20},
                   "optim": dict(lr=2e-3, beta2=0.95, weight_decay=0.1, warmup_steps=50),
                   "train": dict(max_steps=1000, batch_size=32, eval_interval=250, eval_batches=4, log_interval=10)})))


# ------------------------------------------------------------------------------ chapter 10: one benchmark
# CEM, NRGPT, Newton attention (MHA2nd1st) and Hyper-SET next to the Llama and GPT baselines, one
# protocol per task: the same data, optimiser, schedule, batch and steps (so the same training
# tokens), the same depth (cpu: 4 layers or 4 recurrent steps, 2 heads; gpu: 6 and 4 heads),
# dropout 0 and no torch.compile for all; otherwise each model's own defaults. Widths are chosen so
# that the trainable-parameter counts of one task agree within BENCH_PARAM_TOLERANCE (largest /
# smallest - 1; tests/test_bench_experiments.py computes them from the built models). Hyper-SET's
# bi-softmax energy couples every pair of tokens both ways and has no causal form, so it runs on
# ListOps only, where ``task.hide_answer`` takes the answer out of every model's inputs (a causal
# model's predictions do not change).
BENCH_PARAM_TOLERANCE = 0.05
#: model -> (label, builder, its model kwargs at width d, depth L and h heads)
BENCH_MODELS = {
    "cem": ("full CEM (CEM attention and CEM MLP, T = 1)", _build_lm,
            lambda d, L, h: {"attn": "cem", "mlp": "cem", "d_model": d, "n_layers": L, "n_heads": h}),
    "nrgpt": ("NRGPT (FF2W energy, learned rate matrix), one block iterated", _build_token_model,
              lambda d, L, h: {"arch": "nrgpt", "ff": "ff2w", "d_model": d, "n_heads": h, "n_steps": L}),
    "newton": ("Newton attention MHA2nd1st with a ReLU FFN", _build_newton,
               lambda d, L, h: {"attn": "mha2nd1st", "d_model": d, "n_layers": L, "n_heads": h,
                                "dropout": 0.0}),
    "hyperset": ("Hyper-SET (bi-softmax attention, tied ReLU FF, learned step sizes), one layer "
                 "iterated", _build_recurrent, lambda d, L, h: {"arch": "hyperset", "d": d, "n_heads": h,
                                                               "n_iter": L}),
    "llama": ("Llama baseline (RoPE attention, SwiGLU)", _build_lm,
              lambda d, L, h: {"attn": "llama", "mlp": "llama", "d_model": d, "n_layers": L, "n_heads": h}),
    "gpt": ("GPT-2 baseline", _build_token_model,
            lambda d, L, h: {"arch": "gpt", "d_model": d, "n_heads": h, "n_layers": L}),
}
#: task -> model -> (cpu width, gpu width): parameter-matched (see the tolerance above)
BENCH_WIDTHS = {
    "shakespeare": {"cem": (82, 328), "nrgpt": (130, 592), "newton": (68, 268), "llama": (64, 256),
                    "gpt": (64, 256)},
    "listops": {"cem": (62, 176), "nrgpt": (98, 320), "newton": (50, 144), "hyperset": (104, 464),
                "llama": (48, 136), "gpt": (48, 136)},
}
BENCH_STEPS = {"shakespeare": 1000, "listops": 1500}  # cpu presets; see the chapter's budget


_BENCH_TASKS = {
    "shakespeare": ("character-level tiny Shakespeare", {
        "cpu": {"task": {}, "optim": dict(lr=3e-3, beta2=0.99, warmup_steps=50, min_lr_ratio=0.1),
                "train": dict(max_steps=BENCH_STEPS["shakespeare"], batch_size=16, context_length=64,
                              eval_interval=100, eval_batches=8, log_interval=10)},
        "gpu": {"task": {}, "optim": dict(lr=1e-3, beta2=0.99, warmup_steps=100, min_lr_ratio=0.1),
                "train": dict(max_steps=5000, batch_size=64, context_length=256, eval_interval=500,
                              eval_batches=100, log_interval=10)}}),
    "listops": ("ListOps (MAX, MEDIAN, SUM mod 20), the answer after '=' hidden from the inputs", {
        "cpu": {"task": {"n_train": 10_000, "n_test": 500, "val_fraction": 0.05, "hide_answer": True},
                "optim": dict(lr=3e-3, beta2=0.99, weight_decay=0.1, warmup_steps=50, min_lr_ratio=0.04),
                "train": dict(max_steps=BENCH_STEPS["listops"], batch_size=32, eval_interval=250,
                              eval_batches=4, log_interval=10)},
        "gpu": {"task": {"n_train": 50_000, "n_test": 2_000, "hide_answer": True},
                "optim": dict(lr=1e-3, beta2=0.99, weight_decay=0.1, warmup_steps=200, min_lr_ratio=0.04),
                "train": dict(max_steps=10_000, batch_size=64, eval_interval=1000, eval_batches=50,
                              log_interval=50)}}),
}


def bench_experiment(task_name: str, model: str) -> str:
    """The registered name of the benchmark's ``model`` on ``task_name``: ``bench-<task>-<model>``."""
    if task_name not in BENCH_WIDTHS or model not in BENCH_WIDTHS[task_name]:
        raise ConfigError(f"no benchmark model {model!r} for task {task_name!r}; known: "
                          + ", ".join(f"{t}/{m}" for t, ms in BENCH_WIDTHS.items() for m in ms))
    return f"bench-{task_name}-{model}"


for _task, (_what, _p) in _BENCH_TASKS.items():
    for _model, (_d_cpu, _d_gpu) in BENCH_WIDTHS[_task].items():
        _label, _builder, _kwargs = BENCH_MODELS[_model]
        _n = bench_experiment(_task, _model)
        _gpu_model = _kwargs(_d_gpu, 6, 4)
        if _builder is _build_lm:
            _gpu_model["check_finite"] = False  # the trainer checks loss and gradients every step
        register(Experiment(
            _n, f"chapter 10 benchmark, {_what}: {_label}", _builder,
            _presets(_n, _task, {**_p["cpu"], "model": _kwargs(_d_cpu, 4, 2)},
                     {**_p["gpu"], "model": _gpu_model})))


def bench_model(task_name: str, model: str, width: int | None = None, preset: str = "cpu",
                task: Task | None = None) -> nn.Module:
    """The benchmark's ``model`` for ``task_name`` as its ``preset`` builds it, at ``width``
    (default: the registered width of ``BENCH_WIDTHS``), initialised with the preset's seed.

    ``task``: an already loaded task of the benchmark (the task options are the same for every model
    of a task), so that building several models or widths loads the data once."""
    experiment = bench_experiment(task_name, model)
    overrides = []
    if width is not None:
        key = "d" if "d" in get_config(experiment, preset).model else "d_model"
        overrides.append(f"model.{key}={width}")
    return build(get_config(experiment, preset, overrides), task)[0]
