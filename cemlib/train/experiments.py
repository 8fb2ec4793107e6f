"""Named experiments and their presets, and :func:`run_experiment`, the one call chapters make.

An :class:`Experiment` is a model factory (model keyword arguments + vocabulary size + context
length -> ``nn.Module``) and named presets (:class:`~cemlib.train.config.ExperimentConfig`):
``cpu`` finishes in about a minute on 2 cores, ``gpu`` is the mid-size model the chapter is about.
Chapters may :func:`register` their own experiments.

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
import os
import shlex
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from torch import nn

from cemlib.train.config import ConfigError, ExperimentConfig, OptimConfig, TrainConfig, \
    apply_overrides
from cemlib.train.data import TokenBatches
from cemlib.utils import seed_everything

__all__ = ["Experiment", "register", "EXPERIMENTS", "get_config", "load_data", "build", "run_experiment",
           "reproduce_command"]


@dataclass(frozen=True)
class Experiment:
    """A model factory ``build_model(model_kwargs, vocab_size, context_length)`` and its presets."""

    name: str
    description: str
    build_model: Callable[[dict, int, int], nn.Module]
    presets: dict = field(default_factory=dict)


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


def get_config(experiment: str, preset: str, overrides: list[str] | tuple = ()) -> ExperimentConfig:
    """The config of ``experiment`` / ``preset`` with ``section.field=value`` overrides."""
    if experiment not in EXPERIMENTS:
        raise ConfigError(f"unknown experiment {experiment!r}; known: {', '.join(sorted(EXPERIMENTS))}")
    presets = EXPERIMENTS[experiment].presets
    if preset not in presets:
        raise ConfigError(f"unknown preset {preset!r} for experiment {experiment!r}; "
                          f"known: {', '.join(sorted(presets))}")
    cfg = ExperimentConfig.from_dict(presets[preset].to_dict())  # a copy: presets stay untouched
    return apply_overrides(cfg, list(overrides)) if overrides else cfg


def load_data(cfg: ExperimentConfig) -> tuple[TokenBatches, TokenBatches, int]:
    """``(train batches, val batches, vocab size)`` for ``cfg.data``; clear errors if missing."""
    d, tc = cfg.data, cfg.train
    if d.name != "shakespeare":
        raise ConfigError(f"unknown dataset data.name={d.name!r}; known: shakespeare")
    if d.path is not None and not Path(d.path).is_file():
        raise FileNotFoundError(f"data file for data.name={d.name!r} not found: data.path={d.path!r} "
                                f"(leave data.path unset to use the copy shipped with cemlib)")
    from cemlib.data.shakespeare import load_shakespeare
    splits = load_shakespeare(val_fraction=d.val_fraction, path=d.path)
    return (TokenBatches(splits.train, tc.context_length, seed=tc.seed, name="train"),
            TokenBatches(splits.val, tc.context_length, seed=tc.seed + 2, name="val"),
            splits.tokenizer.vocab_size)


def build(cfg: ExperimentConfig) -> tuple[nn.Module, TokenBatches, TokenBatches]:
    """Seed with ``cfg.train.seed``, load the data and build the model."""
    if cfg.experiment not in EXPERIMENTS:
        raise ConfigError(f"unknown experiment {cfg.experiment!r}; known: {', '.join(sorted(EXPERIMENTS))}")
    train, val, vocab = load_data(cfg)
    seed_everything(cfg.train.seed)
    model = EXPERIMENTS[cfg.experiment].build_model(dict(cfg.model), vocab, cfg.train.context_length)
    return model, train, val


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
                   until: int | None = None, verbose: bool = True, strategy: str = "ddp") -> dict:
    """Build and train one preset; return its results dictionary (see :mod:`cemlib.train.results`)."""
    from cemlib.train.trainer import Trainer
    cfg = get_config(experiment, preset, overrides)
    model, train, val = build(cfg)
    cmd = reproduce_command(experiment, preset, overrides, int(os.environ.get("WORLD_SIZE", "1")), strategy)
    trainer = Trainer(model, train, val, cfg, out_dir=out_dir, command=cmd, strategy=strategy,
                      verbose=verbose)
    return trainer.fit(resume=resume, until=until)


# ------------------------------------------------------------------------------ Shakespeare
def _build_lm(kwargs: dict, vocab_size: int, context_length: int) -> nn.Module:
    from cemlib.models.lm import LanguageModel, LMConfig
    names = {f.name for f in dataclasses.fields(LMConfig)}
    unknown = sorted(set(kwargs) - names)
    if unknown:
        raise ConfigError(f"model fields {unknown} are not LMConfig fields; known: {', '.join(sorted(names))}")
    return LanguageModel(LMConfig(vocab_size=vocab_size, context_length=context_length, **kwargs))


def _shakespeare(name: str, attn: str, mlp: str, what: str, cpu_extra=None, gpu_extra=None) -> Experiment:
    arch = {"attn": attn, "mlp": mlp}
    cpu = ExperimentConfig(
        experiment=name, preset="cpu",
        model={"d_model": 128, "n_layers": 2, "n_heads": 4, **arch, **(cpu_extra or {})},
        optim=OptimConfig(lr=3e-3, beta2=0.99, warmup_steps=20, min_lr_ratio=0.1),
        train=TrainConfig(max_steps=600, batch_size=32, context_length=64, eval_interval=50,
                          eval_batches=8, log_interval=10))
    gpu = ExperimentConfig(
        experiment=name, preset="gpu",
        model={"d_model": 384, "n_layers": 6, "n_heads": 6, "dropout": 0.2, "check_finite": False,
               **arch, **(gpu_extra or {})},
        optim=OptimConfig(lr=1e-3, beta2=0.99, warmup_steps=100, min_lr_ratio=0.1),
        train=TrainConfig(max_steps=5000, batch_size=64, context_length=256, eval_interval=500,
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
