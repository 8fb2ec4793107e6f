"""The book's evidence layer: how a paper's claim is checked against our runs.

Nothing here trains a layer or a model; it reads the runs the training engine
(:mod:`cemlib.train`) wrote and says what they show:

- :mod:`~cemlib.evidence.stats` -- per-seed intervals (paired by seed, Student's t);
- :mod:`~cemlib.evidence.verdict` -- the book's one rule: a paper's claim (:class:`Claim`), its
  verdict from the interval (:func:`decide`), claims tables and tallies;
- :mod:`~cemlib.evidence.chance` -- what a task's trivial predictor scores (has a model learned?);
- :mod:`~cemlib.evidence.lr_search` -- learning-rate sweeps and their Akima optimum;
- :mod:`~cemlib.evidence.cem_claims` -- the CEM paper's language-model claims, written once;
- :mod:`~cemlib.evidence.stored` -- where the book's stored results are (a clone or the wheel);
- :mod:`~cemlib.evidence.tables` -- a chapter's stored GPU runs beside its CPU runs;
- :mod:`~cemlib.evidence.errata` -- the errata of the four papers, as data.
"""
