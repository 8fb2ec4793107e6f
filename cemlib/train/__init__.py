"""The training engine every chapter uses (``cemlib train``, or ``python -m cemlib.train``).

- :func:`run_experiment` -- the one call chapters make: a named experiment and preset (``cpu``: about
  a minute on 2 cores; ``gpu``: the mid-size model) -> a results dictionary; :func:`run_config`
  trains any validated config (a ``--config`` file, a checkpoint's);
- :class:`Trainer` -- trains a model on a :class:`~cemlib.train.tasks.Task` (language modelling,
  answer prediction, regression, per-position and per-example classification; the datasets are
  named in :data:`~cemlib.train.datasets.TASKS`): AdamW, a cosine, linear or constant schedule
  with warm-up, clipping, bf16 autocast (fp16 with a gradient scaler on GPUs without bf16) and
  ``torch.compile`` on CUDA, gradient accumulation, periodic evaluation with the task's metrics,
  early stopping, exact resume (refused on other data), NaN/Inf detection, DDP/FSDP under
  ``torchrun``;
- :mod:`~cemlib.train.weights` and :mod:`~cemlib.train.export` -- weights as safetensors
  (:func:`save_weights`, :func:`load_weights`, :func:`export_safetensors`, ``cemlib export``);
  :func:`~cemlib.train.batches.text_batches` -- a text file as train and validation batches for a
  model built in Python; :mod:`~cemlib.train.estimate` -- how long a run takes here;
- :mod:`~cemlib.train.results` -- results JSON (config, curves, device, versions, commit, command),
  loaders (:func:`load_results`, :func:`load_runs`) and a plot helper; :mod:`~cemlib.train.grid`
  -- grids of experiments x overrides x seeds with a mean ± std summary (:func:`grid_sweep`);
  :mod:`~cemlib.train.folders` -- run identity (a hash of the resolved config), run folders that never
  mix two runs, one writer per folder.
"""

from cemlib.train.checkpoint import CheckpointError, load_checkpoint, save_checkpoint
from cemlib.train.config import ConfigError, DataConfig, ExperimentConfig, OptimConfig, TrainConfig
from cemlib.train.batches import TextBatches, TokenBatches, text_batches
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
from cemlib.train.weights import load_weights, save_weights
from cemlib.train.export import export_safetensors

__all__ = ["run_experiment", "run_config", "RunFolderError", "run_id", "get_config", "build", "register", "Experiment", "EXPERIMENTS",
           "ExperimentConfig", "OptimConfig", "TrainConfig", "DataConfig", "ConfigError", "Trainer",
           "NonFiniteError", "TrainingInterrupted", "lm_loss", "TokenBatches", "CheckpointError", "load_checkpoint",
           "save_checkpoint", "load_results", "load_runs", "device_name", "save_results", "plot_curves",
           "mfu", "stated_peak_tflops",
           "measure_peak_flops", "init_distributed", "DistInfo", "grid_sweep", "summarize_runs", "TASKS",
           "make_task", "Task", "TaskDataError", "ExampleBatches", "LanguageModelTask", "AnswerTask",
           "RegressionTask", "TokenClassificationTask", "ClassificationTask", "TextBatches", "text_batches",
           "save_weights", "load_weights", "export_safetensors"]
