"""The training engine every chapter uses (``python -m cemlib.train``).

- :func:`run_experiment` -- the one call chapters make: a named experiment and preset (``cpu``: about
  a minute on 2 cores; ``gpu``: the mid-size model) -> a results dictionary; :func:`run_config`
  trains any validated config (a ``--config`` file, a checkpoint's);
- :class:`Trainer` -- trains a model on a :class:`~cemlib.train.tasks.Task` (language modelling,
  answer prediction, regression, per-position and per-example classification; the datasets are
  named in :data:`~cemlib.train.datasets.TASKS`): AdamW, cosine schedule with warm-up, clipping,
  bf16 autocast (fp16 with a gradient scaler on GPUs without bf16) and ``torch.compile`` on CUDA,
  gradient accumulation, periodic evaluation with the task's metrics, exact resume, NaN/Inf
  detection, DDP/FSDP under ``torchrun``;
- :mod:`~cemlib.train.results` -- results JSON (config, curves, device, versions, commit, command),
  loaders (:func:`load_results`, :func:`load_runs`) and a plot helper; :mod:`~cemlib.train.grid`
  -- grids of experiments x overrides x seeds with a mean ± std summary (:func:`grid_sweep`);
  :mod:`~cemlib.train.folders` -- run identity (a hash of the resolved config), run folders that never
  mix two runs, one writer per folder.
"""

from cemlib.train.checkpoint import CheckpointError, load_checkpoint, save_checkpoint
from cemlib.train.config import ConfigError, DataConfig, ExperimentConfig, OptimConfig, TrainConfig
from cemlib.train.batches import TokenBatches
from cemlib.train.distributed import DistInfo, init_distributed
from cemlib.train.registry import EXPERIMENTS, build, get_config, register
from cemlib.train.experiment import Experiment
from cemlib.train.run import run_config, run_experiment
from cemlib.train.flops import measure_peak_flops, mfu, stated_peak_tflops
from cemlib.train.grid import grid_sweep, summarize_runs
from cemlib.train.results import device_name, load_results, load_runs, plot_curves, save_results
from cemlib.train.folders import RunFolderError, run_id
from cemlib.train.datasets import TASKS, make_task
from cemlib.train.tasks import (AnswerTask, ClassificationTask, ExampleBatches, LanguageModelTask, RegressionTask,
                                Task, TaskDataError, TokenClassificationTask)
from cemlib.train.trainer import NonFiniteError, Trainer, TrainingInterrupted, lm_loss

__all__ = ["run_experiment", "run_config", "RunFolderError", "run_id", "get_config", "build", "register", "Experiment", "EXPERIMENTS",
           "ExperimentConfig", "OptimConfig", "TrainConfig", "DataConfig", "ConfigError", "Trainer",
           "NonFiniteError", "TrainingInterrupted", "lm_loss", "TokenBatches", "CheckpointError", "load_checkpoint",
           "save_checkpoint", "load_results", "load_runs", "device_name", "save_results", "plot_curves",
           "mfu", "stated_peak_tflops",
           "measure_peak_flops", "init_distributed", "DistInfo", "grid_sweep", "summarize_runs", "TASKS",
           "make_task", "Task", "TaskDataError", "ExampleBatches", "LanguageModelTask", "AnswerTask",
           "RegressionTask", "TokenClassificationTask", "ClassificationTask"]
