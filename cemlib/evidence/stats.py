"""Intervals for per-seed values: the statistics under the book's verdict rule.

Two models compared on a claim are trained with the same seeds, so seed ``s`` fixes the
initialisation and the batch order of both runs and the per-seed differences ``d_s = a_s - b_s``
cancel what the two runs share (:func:`paired`). The interval is Student's t-interval of the mean,
``mean ± t_{(1 + level)/2, n-1} s / sqrt(n)`` (:func:`t_interval`, ``scipy.stats.t``). One seed
illustrates and never decides: every function here refuses fewer than two values.
:func:`compare` reads an interval without a claim (a benchmark table), and
:func:`sampling_margin` is the test set's own sampling noise for an accuracy difference.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np
from scipy import stats

__all__ = ["LEVEL", "MIN_SEEDS", "Estimate", "Comparison", "t_quantile", "t_interval", "paired",
           "compare", "sampling_margin"]

LEVEL = 0.95
#: fewer seeds make a verdict provisional: with 2-4 seeds the sample standard deviation is itself
#: uncertain by a factor of two or more
MIN_SEEDS = 5


def _check_level(level) -> float:
    if isinstance(level, bool) or not isinstance(level, (int, float)) or not 0 < level < 1:
        raise ValueError(f"level must be a probability strictly between 0 and 1 (0.95 for a 95 % "
                         f"interval), got {level!r}")
    return float(level)


def t_quantile(n: int, level: float = LEVEL) -> float:
    """The two-sided Student-t quantile ``t_{(1 + level)/2, n - 1}`` for ``n`` values."""
    level = _check_level(level)
    if n < 2:
        raise ValueError(f"a t quantile needs n >= 2 values (n - 1 >= 1 degrees of freedom), got n = {n}")
    return float(stats.t.ppf(0.5 + level / 2, n - 1))


@dataclass(frozen=True)
class Estimate:
    """Mean, sample standard deviation and two-sided ``level`` t-interval ``[low, high]`` of ``n``
    values (per-seed differences, or per-seed values of one quantity)."""

    mean: float
    std: float
    n: int
    low: float
    high: float
    level: float = LEVEL

    @property
    def half_width(self) -> float:
        return (self.high - self.low) / 2

    def __str__(self) -> str:
        return f"{self.mean:+.3g} [{self.low:+.3g}, {self.high:+.3g}]"


def _one_seed_refusal(n: int) -> ValueError:
    return ValueError(f"got {n} value(s): one seed illustrates, never decides. A verdict needs at least "
                      f"2 seeds per model (a spread to compare the difference with), and the book asks "
                      f"for {MIN_SEEDS}")


def t_interval(values, level: float = LEVEL) -> Estimate:
    """The ``level`` t-interval of the mean of ``values`` (1-D, finite, at least 2)."""
    level = _check_level(level)
    v = np.asarray(values, dtype=float)
    if v.ndim != 1:
        raise ValueError(f"values must be one-dimensional, got shape {v.shape}")
    if len(v) < 2:
        raise _one_seed_refusal(len(v))
    if not np.isfinite(v).all():
        raise ValueError(f"values must be finite (a diverged run is reported, not averaged): {v.tolist()}")
    mean, std = float(v.mean()), float(v.std(ddof=1))
    half = t_quantile(len(v), level) * std / math.sqrt(len(v))
    return Estimate(mean, std, len(v), mean - half, mean + half, level)


def _seed(key, name: str) -> int:
    """A seed key: an integer (Python or NumPy), never a float or a bool that ``int()`` would
    silently round onto another seed."""
    if isinstance(key, (bool, np.bool_)) or not isinstance(key, (int, np.integer)):
        raise ValueError(f"{name}: seeds must be integers, got {key!r} ({type(key).__name__}); "
                         f"seed_values(runs, ...) maps each run's train.seed to its value")
    return int(key)


def _by_seed(values, name: str) -> dict[int, float]:
    if isinstance(values, Mapping):
        if not values:
            raise ValueError(f"{name} holds no seeds")
        return {_seed(k, name): float(v) for k, v in values.items()}
    raise TypeError(f"{name} must map seed -> value (use seed_values(runs, ...)), got {type(values).__name__}")


def paired(a, b, level: float = LEVEL) -> Estimate:
    """The t-interval of the per-seed differences ``a[s] - b[s]``; ``a`` and ``b`` map seed -> value
    and must hold the same seeds (a sequence pair is read as seeds ``0, 1, ...``)."""
    if not isinstance(a, Mapping) and not isinstance(b, Mapping):
        a, b = list(a), list(b)
        if len(a) != len(b):
            raise ValueError(f"unequal numbers of seeds: {len(a)} and {len(b)}; a comparison pairs run s "
                             f"of one model with run s of the other")
        a, b = dict(enumerate(a)), dict(enumerate(b))
    a, b = _by_seed(a, "a"), _by_seed(b, "b")
    if set(a) != set(b):
        raise ValueError(f"unequal seeds: {sorted(a)} and {sorted(b)} (only in the first: "
                         f"{sorted(set(a) - set(b))}, only in the second: {sorted(set(b) - set(a))}); "
                         f"pairing needs the same seeds for both models")
    seeds = sorted(a)
    return t_interval([a[s] - b[s] for s in seeds], level)



@dataclass(frozen=True)
class Comparison:
    """Two models compared without a claim (a benchmark table): the interval of ``a - b`` and what it
    shows at ``threshold``: ``"lower"``, ``"higher"``, ``"within ±threshold"`` or ``"unresolved"``."""

    estimate: Estimate
    threshold: float
    label: str


def compare(a, b, threshold: float, level: float = LEVEL) -> Comparison:
    """The rule without a claim: ``a - b`` lower (interval below ``-threshold``), higher (above
    ``threshold``), within ``±threshold`` (inside, ``threshold > 0``), or unresolved."""
    if not (math.isfinite(threshold) and threshold >= 0):
        raise ValueError(f"threshold must be finite and >= 0, got {threshold!r}")
    est = paired(a, b, level)
    if est.high < -threshold:
        label = "lower"
    elif est.low > threshold:
        label = "higher"
    elif threshold > 0 and -threshold < est.low and est.high < threshold:
        label = f"within ±{threshold:.3g}"
    else:
        label = "unresolved"
    return Comparison(est, threshold, label)


def sampling_margin(n_examples: int, level: float = LEVEL) -> float:
    """The largest ``level`` half-width of the difference of two accuracies measured on the same
    ``n_examples`` test examples, from the test set's own sampling (binomial variance at most 1/4 per
    model, the two errors taken as independent, which over-states it for correlated models). The
    seeds do not see this noise: a claim about accuracies on a small test set can state it as its
    threshold."""
    level = _check_level(level)
    if n_examples < 1:
        raise ValueError(f"n_examples must be >= 1, got {n_examples}")
    return float(stats.norm.ppf(0.5 + level / 2)) * math.sqrt(2 * 0.25 / n_examples)
