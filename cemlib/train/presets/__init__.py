"""The presets of every chapter's experiments, one module per task (nanoGPT's ``config/`` style).

Each module defines ``EXPERIMENTS``, a list of :class:`~cemlib.train.experiment.Experiment`; a preset
is a few assignments, each with its one-line reason. :mod:`cemlib.train.registry` registers them
all in this order.

- :mod:`.shakespeare` -- character-level tiny Shakespeare: Llama and the CEM models (chapters 2-5);
- :mod:`.nrgpt` -- NRGPT and its baselines on ListOps and Shakespeare (chapter 7);
- :mod:`.gp` -- Gaussian-process regression, CEM Table 3 (chapter 6);
- :mod:`.lis` -- the longest increasing subsequence, Newton attention (chapter 8);
- :mod:`.hyperset` -- Hyper-SET on Sudoku and 8x8 digits (chapter 9);
- :mod:`.bench` -- the parameter-matched benchmark of the four energies (chapter 10).
"""

from cemlib.train.presets import bench, gp, hyperset, lis, nrgpt, shakespeare

MODULES = (shakespeare, nrgpt, gp, lis, hyperset, bench)
