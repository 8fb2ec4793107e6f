"""Experiment configuration as plain dataclasses: optimiser, schedule, budget, data, model.

Defaults follow the CEM paper's shared Llama/CEM setting ([ICLR] Table 2; the table is missing
from the [arXiv] extract): AdamW with lr 2e-3, beta = (0.9, 0.95), eps = 1e-9, weight decay 0.1,
gradient clipping 1.0, cosine schedule with 5 % warm-up and a final LR factor of 0.1. The
character-level Shakespeare presets override beta_2 = 0.99 and a 100-step warm-up, as in NRGPT
App. F.4 and nanoGPT's ``train_shakespeare_char``.

Every config serialises to a JSON-compatible dict (``to_dict``) and back (``from_dict``), so a
results file or a checkpoint carries the exact configuration of its run. :func:`check_keys`
refuses a dict (a ``--config`` file) with a key no config has, at any level, naming the known ones
and the nearest (:func:`did_you_mean`).
"""

from __future__ import annotations

import difflib
import math
from dataclasses import asdict, dataclass, field, fields

__all__ = ["OptimConfig", "TrainConfig", "DataConfig", "ExperimentConfig", "ConfigError",
           "micro_batch_size", "apply_overrides", "resolve_precision", "PRECISIONS", "COMPILE_MODES",
           "uses_cuda_graphs", "format_value", "SCHEDULES", "did_you_mean", "check_keys", "SECTIONS"]


class ConfigError(ValueError):
    """A configuration value is invalid or inconsistent; the message names it."""


def did_you_mean(name: str, known) -> str:
    """``" (did you mean 'x'?)"`` for the closest of ``known`` to a mistyped ``name`` (difflib),
    or ``""`` when none is close."""
    close = difflib.get_close_matches(str(name), [str(k) for k in known], n=1, cutoff=0.6)
    return f" (did you mean {close[0]!r}?)" if close else ""


def _pos_int(value, name: str) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ConfigError(f"{name} must be a positive integer, got {value!r}")


def _nonneg_int(value, name: str) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ConfigError(f"{name} must be a non-negative integer, got {value!r}")


def _pos_float(value, name: str) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) \
            or value <= 0:
        raise ConfigError(f"{name} must be a positive finite number, got {value!r}")


@dataclass
class OptimConfig:
    """AdamW and its learning-rate schedule ([ICLR] Table 2 defaults).

    The warm-up is ``warmup_steps`` when it is set (then ``warmup_fraction`` is not used), else
    ``round(warmup_fraction * max_steps)``. After it, ``schedule`` (:data:`SCHEDULES`) takes the
    learning rate from ``lr`` to ``min_lr_ratio * lr`` at the last step: ``"cosine"`` (a half
    cosine, the default), ``"linear"``, or ``"constant"`` (``lr`` throughout; ``min_lr_ratio`` is
    not used). ``grad_clip=0`` disables clipping (the gradient norm is still measured).
    """

    lr: float = 2e-3
    beta1: float = 0.9
    beta2: float = 0.95
    eps: float = 1e-9
    weight_decay: float = 0.1
    grad_clip: float = 1.0
    warmup_steps: int | None = None
    warmup_fraction: float = 0.05
    min_lr_ratio: float = 0.1
    schedule: str = "cosine"

    def __post_init__(self):
        if self.schedule not in SCHEDULES:
            raise ConfigError(f"optim.schedule must be one of {', '.join(SCHEDULES)}, got {self.schedule!r}"
                              f"{did_you_mean(self.schedule, SCHEDULES)}")
        _pos_float(self.lr, "optim.lr")
        _pos_float(self.eps, "optim.eps")
        for name in ("beta1", "beta2"):
            b = getattr(self, name)
            if not isinstance(b, (int, float)) or not 0.0 <= b < 1.0:
                raise ConfigError(f"optim.{name} must lie in [0, 1), got {b!r}")
        if not isinstance(self.weight_decay, (int, float)) or self.weight_decay < 0:
            raise ConfigError(f"optim.weight_decay must be >= 0, got {self.weight_decay!r}")
        if not isinstance(self.grad_clip, (int, float)) or self.grad_clip < 0:
            raise ConfigError(f"optim.grad_clip must be >= 0 (0 = no clipping), got {self.grad_clip!r}")
        if self.warmup_steps is not None:
            _nonneg_int(self.warmup_steps, "optim.warmup_steps")
        if not 0.0 <= self.warmup_fraction < 1.0:
            raise ConfigError(f"optim.warmup_fraction must lie in [0, 1), got {self.warmup_fraction!r}")
        if not 0.0 <= self.min_lr_ratio <= 1.0:
            raise ConfigError(f"optim.min_lr_ratio must lie in [0, 1], got {self.min_lr_ratio!r}")

    def warmup(self, max_steps: int) -> int:
        """Number of warm-up steps for a run of ``max_steps`` optimiser steps."""
        w = self.warmup_steps if self.warmup_steps is not None else round(self.warmup_fraction * max_steps)
        if w >= max_steps:
            raise ConfigError(f"optim.warmup_steps={w} must be smaller than train.max_steps={max_steps}")
        return w

    def warmup_source(self) -> str:
        """Which option sets the warm-up, in words (``"optim.warmup_steps=50"``)."""
        if self.warmup_steps is not None:
            return f"optim.warmup_steps={self.warmup_steps}"
        return f"optim.warmup_fraction={self.warmup_fraction}"


#: the learning-rate schedules after the warm-up (``optim.schedule``, :class:`OptimConfig`)
SCHEDULES = ("cosine", "linear", "constant")


@dataclass
class TrainConfig:
    """Budget, batching, evaluation, precision and device.

    ``batch_size`` is the *global* number of sequences per optimiser step. It is split into
    ``grad_accum`` micro-steps on each of the ``world_size`` processes, so it must be divisible by
    ``grad_accum * world_size`` (see :func:`micro_batch_size`). ``precision`` (see
    :func:`resolve_precision`): ``auto`` is bf16 autocast on a CUDA GPU with bf16, fp16 autocast
    with a gradient scaler on one without (Colab's T4), float32 elsewhere. ``compile`` applies ``torch.compile`` on CUDA only,
    with ``compile_mode`` (:data:`COMPILE_MODES`, ``torch.compile``'s ``mode``): ``"reduce-overhead"`` (and
    ``"max-autotune"``) also replay each step from CUDA graphs, which takes the host's launch work out of the step: a
    model whose step is host-bound (many small kernels, or kernels launched from Python, as cemlib's fused CEM layers are)
    runs at the speed of its GPU kernels. The trainer then marks every forward as a new step for PyTorch's graph trees.
    Single GPU or DDP; not with FSDP.
    ``peak_tflops`` overrides the peak used for MFU (else a table of known GPUs; CPU has none).
    ``final_whole_eval`` evaluates the final model once more on the whole validation split
    (``metrics["final_whole_val"]``); turn it off where a forward pass is expensive (the Triton
    interpreter on a CPU, for instance).
    ``keep_checkpoints``: how many periodic ``ckpt_<step>.pt`` a run keeps, the newest (``0``: all);
    ``last.pt`` and ``best.pt`` are kept besides. ``patience``: early stopping; the run stops
    when ``patience`` evaluations in a row have not improved the task's primary metric on the
    validation split (``0``, the default: off).
    """

    max_steps: int = 1000
    batch_size: int = 32
    grad_accum: int = 1
    context_length: int = 128
    eval_interval: int = 100
    eval_batches: int = 10
    log_interval: int = 10
    checkpoint_interval: int = 0
    seed: int = 1337
    precision: str = "auto"
    compile: bool = False
    compile_mode: str = "default"
    device: str | None = None
    peak_tflops: float | None = None
    final_whole_eval: bool = True
    keep_checkpoints: int = 2
    patience: int = 0

    def __post_init__(self):
        _nonneg_int(self.keep_checkpoints, "train.keep_checkpoints")
        _nonneg_int(self.patience, "train.patience")
        if not isinstance(self.final_whole_eval, bool):
            raise ConfigError(f"train.final_whole_eval must be true or false, got {self.final_whole_eval!r}")
        for name in ("max_steps", "batch_size", "grad_accum", "context_length", "eval_interval",
                     "eval_batches", "log_interval"):
            _pos_int(getattr(self, name), f"train.{name}")
        _nonneg_int(self.checkpoint_interval, "train.checkpoint_interval")
        _nonneg_int(self.seed, "train.seed")
        if self.compile_mode not in COMPILE_MODES:
            raise ConfigError(f"train.compile_mode must be one of {', '.join(COMPILE_MODES)}, got {self.compile_mode!r}")
        if self.precision not in PRECISIONS:
            raise ConfigError(f"train.precision must be one of {', '.join(PRECISIONS)}, got {self.precision!r}")
        if self.peak_tflops is not None:
            _pos_float(self.peak_tflops, "train.peak_tflops")
        micro_batch_size(self, 1)

    @property
    def tokens_per_step(self) -> int:
        return self.batch_size * self.context_length


PRECISIONS = ("auto", "fp32", "bf16", "fp16")
#: ``torch.compile``'s modes (``"default"``: its default, no ``mode`` given)
COMPILE_MODES = ("default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs")


def uses_cuda_graphs(compile_mode: str) -> bool:
    """Whether ``torch.compile`` in ``compile_mode`` replays the compiled graphs from CUDA graphs
    (Inductor's ``triton.cudagraphs`` option of that mode)."""
    if compile_mode == "default":
        return False
    from torch._inductor import list_mode_options
    return bool(list_mode_options(compile_mode).get("triton.cudagraphs", False))


def resolve_precision(precision: str, device_type: str, bf16_supported: bool) -> str:
    """The arithmetic a run uses: ``"bf16"``, ``"fp16"`` (autocast with a gradient scaler) or
    ``"fp32"``. ``auto``: bf16 on a CUDA GPU that supports it, fp16 on one that does not (e.g. a
    T4 or V100), fp32 on CPU/MPS. Asking for bf16 on a GPU without it is an error, not a silent
    fallback; fp16 is for CUDA only."""
    if precision not in PRECISIONS:
        raise ConfigError(f"train.precision must be one of {', '.join(PRECISIONS)}, got {precision!r}")
    if precision == "auto":
        if device_type != "cuda":
            return "fp32"
        return "bf16" if bf16_supported else "fp16"
    if precision == "bf16" and device_type == "cuda" and not bf16_supported:
        raise ConfigError("train.precision='bf16' but this GPU has no bf16 support; use "
                          "train.precision=fp16 (gradient scaling) or auto")
    if precision == "fp16" and device_type != "cuda":
        raise ConfigError(f"train.precision='fp16' needs a CUDA GPU (device is {device_type}); "
                          f"use fp32 or auto")
    return precision


def micro_batch_size(train: TrainConfig, world_size: int) -> int:
    """Sequences per forward pass on one process; raises if the global batch cannot be split."""
    per_step = train.grad_accum * world_size
    if train.batch_size % per_step != 0:
        raise ConfigError(
            f"impossible batch split: train.batch_size={train.batch_size} must be divisible by "
            f"train.grad_accum ({train.grad_accum}) x world_size ({world_size}) = {per_step}; "
            f"choose a batch_size that is a multiple of {per_step} or change grad_accum")
    return train.batch_size // per_step


@dataclass
class DataConfig:
    """Which dataset (:data:`cemlib.train.datasets.TASKS`); ``path=None`` uses the copy shipped
    with cemlib (or generated data); ``val_fraction`` is Shakespeare's held-out tail."""

    name: str = "shakespeare"
    path: str | None = None
    val_fraction: float = 0.1


@dataclass
class ExperimentConfig:
    """One run: experiment and preset names, model keyword arguments, data, optimiser, budget.

    ``task`` holds the keyword arguments of the dataset ``data.name`` (see
    :mod:`cemlib.train.datasets`), e.g. ``{"kernel": "matern"}`` for ``gp``."""

    experiment: str
    preset: str
    model: dict = field(default_factory=dict)
    task: dict = field(default_factory=dict)
    data: DataConfig = field(default_factory=DataConfig)
    optim: OptimConfig = field(default_factory=OptimConfig)
    train: TrainConfig = field(default_factory=TrainConfig)

    def __post_init__(self):
        self.optim.warmup(self.train.max_steps)

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> "ExperimentConfig":
        """The config a dict describes (a results file's may lack fields: they take their
        defaults); a key no section has raises :class:`ConfigError` naming the known ones."""
        if not isinstance(d, dict):
            raise ConfigError(f"not a valid experiment config dict: {type(d).__name__}")
        for section, cls_ in _SECTION_CLASSES.items():
            value = d.get(section, {})
            if not isinstance(value, dict):
                raise ConfigError(f"config section {section!r} must be an object of fields, got {value!r:.60}")
            _check_fields(section, value, cls_)
        try:
            return cls(experiment=d["experiment"], preset=d["preset"], model=dict(d.get("model", {})),
                       task=dict(d.get("task", {})),
                       data=DataConfig(**d.get("data", {})), optim=OptimConfig(**d.get("optim", {})),
                       train=TrainConfig(**d.get("train", {})))
        except (KeyError, TypeError) as err:
            raise ConfigError(f"not a valid experiment config dict: {err}") from None


#: the sections of a config and what each holds (``model`` and ``task`` are free-form here: the
#: experiment's model and the dataset check their names, see :mod:`cemlib.train.registry`)
SECTIONS = ("experiment", "preset", "model", "task", "data", "optim", "train")
_SECTION_CLASSES = {"data": DataConfig, "optim": OptimConfig, "train": TrainConfig}


def _check_fields(section: str, value: dict, cls) -> None:
    known = [f.name for f in fields(cls)]
    for key in value:
        if key not in known:
            raise ConfigError(f"{section} has no field {key!r}{did_you_mean(key, known)}; known fields: "
                              f"{', '.join(sorted(known))}")


def check_keys(d: dict, what: str = "the config") -> None:
    """Refuse a config dict with a key no config has, at any level: top-level keys other than
    :data:`SECTIONS`, and fields the ``data``, ``optim`` and ``train`` sections do not have
    (:class:`ConfigError` naming the key, the nearest known one and all known ones). ``model``
    and ``task`` fields are checked against the experiment and dataset by
    :func:`~cemlib.train.registry.get_config`."""
    if not isinstance(d, dict):
        raise ConfigError(f"{what} must be a JSON object (what --print-config prints), got {type(d).__name__}")
    for key in d:
        if key not in SECTIONS:
            raise ConfigError(f"{what} has an unknown key {key!r}{did_you_mean(key, SECTIONS)}; known keys: "
                              f"{', '.join(SECTIONS)}")
    for key in ("experiment", "preset"):
        if key not in d:
            raise ConfigError(f"{what} lacks {key!r} (a config names its experiment and preset)")
    for section in ("model", "task"):
        if not isinstance(d.get(section, {}), dict):
            raise ConfigError(f"{what}: {section!r} must be an object of fields, got {d[section]!r:.60}")
    for section, cls in _SECTION_CLASSES.items():
        value = d.get(section, {})
        if not isinstance(value, dict):
            raise ConfigError(f"{what}: {section!r} must be an object of fields, got {value!r:.60}")
        try:
            _check_fields(section, value, cls)
        except ConfigError as err:
            raise ConfigError(f"{what}: {err}") from None


def _parse_value(text: str):
    low = text.lower()
    if low in ("none", "null"):
        return None
    if low in ("true", "false"):
        return low == "true"
    for conv in (int, float):
        try:
            return conv(text)
        except ValueError:
            pass
    return text


def format_value(value, name: str = "value") -> str:
    """``value`` as the text of a ``--set name=TEXT`` override that reads back as ``value``
    (``none``, ``true``/``false``, a number, or a string that does not read as one of those)."""
    if value is None:
        text = "none"
    elif isinstance(value, bool):
        text = "true" if value else "false"
    elif isinstance(value, (int, float)):
        text = repr(value)
    elif isinstance(value, str):
        text = value
    else:
        raise ConfigError(f"{name}={value!r} cannot be given as --set {name}=VALUE (numbers, strings, "
                          f"true/false and none only)")
    back = _parse_value(text.strip())
    if not (back == value and type(back) is type(value)):
        raise ConfigError(f"{name}={value!r} cannot be given as --set {name}=VALUE: {text!r} reads back "
                          f"as {back!r}")
    return text


def apply_overrides(cfg: ExperimentConfig, overrides: list[str]) -> ExperimentConfig:
    """Return a copy of ``cfg`` with ``section.field=value`` overrides applied and re-validated.

    Sections are ``model``, ``task``, ``data``, ``optim`` and ``train`` (``model`` and ``task`` are
    free-form: their builders reject unknown names); e.g. ``train.max_steps=200`` or
    ``model.d_model=128``. Unknown sections or fields raise :class:`ConfigError` naming them.
    """
    d = cfg.to_dict()
    for item in overrides:
        key, sep, raw = item.partition("=")
        section, dot, name = key.strip().partition(".")
        if not sep or not dot or not name:
            raise ConfigError(f"override {item!r} must look like section.field=value")
        if section not in ("model", "task", "data", "optim", "train"):
            raise ConfigError(f"override {item!r}: unknown section {section!r}"
                              f"{did_you_mean(section, ('model', 'task', 'data', 'optim', 'train'))} "
                              f"(expected model, task, data, optim or train)")
        if section not in ("model", "task"):
            known = {f.name for f in fields(_SECTION_CLASSES[section])}
            if name not in known:
                raise ConfigError(f"override {item!r}: {section} has no field {name!r}"
                                  f"{did_you_mean(name, known)}; known fields: {', '.join(sorted(known))}")
        value = _parse_value(raw.strip())
        if section == "optim" and name in ("lr", "eps", "weight_decay", "grad_clip", "beta1",
                                           "beta2", "warmup_fraction", "min_lr_ratio") \
                and isinstance(value, int) and not isinstance(value, bool):
            value = float(value)
        d[section][name] = value
    return ExperimentConfig.from_dict(d)
