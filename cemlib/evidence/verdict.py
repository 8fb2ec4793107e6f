"""The book's one rule for reproduction verdicts: paired by seed, whole split, a 95 % interval, a
band in the paper's own unit; a claim about models or data far from ours is an observation at our
scale, never a verdict.

Every table in the book that puts a paper's claim next to our measurement takes its answer from
:func:`decide` (or, for a quantity that does not depend on a seed, such as a parameter count, from
:func:`decide_exact`). The rule:

1. **Paired by seed.** Two models compared on a claim are trained with the same seeds; seed ``s``
   fixes the initialisation and the batch order of both runs, so the per-seed differences
   ``d_s = a_s - b_s`` cancel what the two runs share. Unequal seed sets are refused.
2. **Whole split.** The metric of every run is measured on the *whole* validation or test split
   (:func:`whole_split_value`): a language-model run's ``metrics["final_whole_val"]`` (every
   next-token target of the validation stream once), the final metrics of a fixed-dataset task
   (ListOps, LIS, GP regression, Sudoku, digits: every example of the split). A sampled estimate
   (the language-model runs' 8 random validation batches) is refused.
3. **A 95 % t-interval** for the mean difference, ``mean ± t_{0.975, n-1} s / sqrt(n)``
   (:func:`t_interval`).
4. **A band in the paper's own unit**, recorded with its reason (and when it was chosen) in a
   :class:`Claim` together with the paper's words and where they are; a band on a per-token
   perplexity is converted to our unit in code, never typed. A claim says that the difference lies
   on one side of a bound, or within ``±threshold`` (:data:`KINDS`):

   ==============  ====================================  ======================  =====================
   kind            the claim                             agree when the interval  disagree when it
   ==============  ====================================  ======================  =====================
   ``lower``       ``d < -threshold`` (lower by more)    lies below -threshold    lies above -threshold
   ``higher``      ``d > threshold``                     lies above threshold     lies below threshold
   ``not higher``  ``d < threshold`` ("costs little")    lies below threshold     lies above threshold
   ``not lower``   ``d > -threshold``                    lies above -threshold    lies below -threshold
   ``equivalent``  ``|d| < threshold`` ("comparable")    lies inside ±threshold   lies outside ±threshold
   ==============  ====================================  ======================  =====================

   **same direction, smaller** (:data:`SMALLER`) when a ``lower`` or ``higher`` claim with a band
   ``threshold > 0`` gets an interval strictly between the target and the band (inside
   ``(0, threshold)`` for ``higher``, inside ``(-threshold, 0)`` for ``lower``): the direction is
   confirmed, the size is not; this is never "disagree". **Unresolved** otherwise (the interval
   contains the bound). Each one-sided decision is a t-test at level 2.5 %; the equivalence decision
   is the two one-sided tests (TOST) at the same level. ``threshold = 0`` makes a directional claim a
   plain test of the sign.
5. **Not testable at this budget** when a model compared has not learned the task: its metric does
   not beat the trivial predictor of the task (:mod:`cemlib.evidence.chance`) by at least a tenth of
   the gap to a perfect score, at the interval's lower end (:class:`Chance`).
6. **Observation at our scale.** A claim about models or data far from what we trained (size,
   data, metric) is an observation at our scale: its interval is computed and shown, with words,
   but it is never tallied as agree or disagree (``Claim(..., scale=why)`` or :func:`observe`).
7. **One claim, one row, counted once.** Sub-cases of one claim (several models, kernels, splits,
   counts) are decided each, then joined into one row by :func:`combine`: *disagree* if any sub-case
   disagrees, else *agree* if every sub-case agrees, else *same direction, smaller* if every
   sub-case agrees or is smaller, else *not testable* if no sub-case is testable, else
   *unresolved*. :func:`tally` counts each claim once and refuses a claim counted twice.
8. **Chance disagreements.** If every claim held exactly at its bound, each one-sided decision would
   still read "disagree" with probability 2.5 %: :func:`false_disagreements` counts the decisions
   of a table (or of the book) and the "disagree"s to expect by chance alone.
9. **Seeds.** One seed illustrates, never decides: the rule refuses ``n < 2`` (a spread needs two
   values). A verdict from fewer than :data:`MIN_SEEDS` = 5 seeds is marked *provisional*: with 2-4
   seeds the sample standard deviation is itself uncertain by a factor of two or more, and the
   interval leans entirely on the normality of the differences.

:func:`claims_table` renders verdicts as rows (the paper's words, where, ours with the interval,
the threshold, the verdict) for an HTML or Markdown table.
"""

from __future__ import annotations

import html
import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from cemlib.evidence.stats import LEVEL, MIN_SEEDS, Estimate, _by_seed, paired, t_interval

__all__ = ["KINDS", "VERDICTS", "AGREE", "SMALLER", "DISAGREE", "UNRESOLVED", "NOT_TESTABLE", "OBSERVED",
           "DEPENDS", "Claim", "Chance", "Verdict", "decide", "decide_exact", "observe", "not_testable",
           "combine", "whole_split_value", "seed_values", "ClaimsTable", "claims_table", "tally",
           "FalseDisagreements", "false_disagreements", "hand_made_verdicts"]
KINDS = ("lower", "higher", "not higher", "not lower", "equivalent")
AGREE, DISAGREE, UNRESOLVED, NOT_TESTABLE = "agree", "disagree", "unresolved", "not testable at this budget"
#: a ``lower``/``higher`` claim whose direction is confirmed with an effect smaller than its band
SMALLER = "same direction, smaller"
#: a claim about models or data far from ours: the interval is shown, never tallied as agree/disagree
OBSERVED = "observation at our scale"
#: two wordings of one finding (two versions of a paper) that got different verdicts, in :func:`tally`
DEPENDS = "depends on the version"
VERDICTS = (AGREE, SMALLER, DISAGREE, UNRESOLVED, NOT_TESTABLE, OBSERVED)
#: the verdicts a decision at our scale can give (an interval read against the claim's bound)
_DECIDED = (AGREE, SMALLER, DISAGREE, UNRESOLVED)
#: how an observation reads the interval, in words (never "agree" / "disagree")
_READING = {AGREE: "as the paper reports for its models", SMALLER: "the paper's direction, by less than its band",
            DISAGREE: "not as the paper reports for its models", UNRESOLVED: "too wide to tell"}


# ------------------------------------------------------------------------------ claims and chance
@dataclass(frozen=True)
class Claim:
    """A paper's claim, in its words, and the test we fixed for it.

    ``words``: the paper's words (a quotation, or what its figure shows, in words); ``where``:
    section / figure / table (and version) where they are; ``kind``: one of :data:`KINDS`, read on
    the quantity ``d - target`` (``d``: the per-seed difference ``a - b`` of :func:`decide`, or the
    computed value of :func:`decide_exact`); ``threshold`` (>= 0; > 0 for ``equivalent``) and
    ``why``: the reason for it, in the paper's unit, and when it was chosen; ``metric``: what is
    compared, with its unit; ``finding``: claims that are two wordings of one finding (e.g. the arXiv
    and ICLR versions of the same figure) share a ``finding`` and :func:`tally` counts them once;
    ``scale``: non-empty when our runs cannot speak to the claim (its models, data or metric are far
    from ours), in one line: why. Every result on such a claim is an observation at our scale
    (:func:`observe`), never a verdict."""

    words: str
    where: str
    kind: str
    threshold: float
    why: str
    metric: str = ""
    target: float = 0.0
    finding: str = ""
    scale: str = ""

    def __post_init__(self):
        if self.kind not in KINDS:
            raise ValueError(f"kind must be one of {KINDS}, got {self.kind!r}")
        if not (math.isfinite(self.threshold) and self.threshold >= 0):
            raise ValueError(f"threshold must be finite and >= 0, got {self.threshold!r}")
        if self.kind == "equivalent" and self.threshold == 0:
            raise ValueError("an equivalence claim needs a threshold > 0 (the size of difference that "
                             "still counts as 'comparable')")
        if not self.words.strip() or not self.where.strip() or not self.why.strip():
            raise ValueError("a claim records the paper's words, where they are, and why the threshold")
        if not isinstance(self.scale, str):
            raise TypeError(f"scale is the one-line reason our runs cannot speak to the claim, got {self.scale!r}")

    @property
    def bound(self) -> str:
        """The claim as an inequality on the difference ``d``."""
        t, c = self.threshold, self.target
        lo, hi = c - t, c + t
        return {"lower": f"d < {lo:.3g}", "higher": f"d > {hi:.3g}", "not higher": f"d < {hi:.3g}",
                "not lower": f"d > {lo:.3g}", "equivalent": f"{lo:.3g} < d < {hi:.3g}"}[self.kind]

    def judge(self, low: float, high: float) -> tuple[str, str]:
        """Verdict and reason for an interval ``[low, high]`` of ``d`` (no chance check, no scale):
        one of :data:`AGREE`, :data:`SMALLER`, :data:`DISAGREE`, :data:`UNRESOLVED`."""
        return _judge(self, low, high, "the interval")


def _judge(claim: Claim, low: float, high: float, subject: str) -> tuple[str, str]:
    t, c = claim.threshold, claim.target
    if claim.kind != "equivalent":
        m = c - t if claim.kind in ("lower", "not lower") else c + t
        below = claim.kind in ("lower", "not higher")            # the claim: d < m (or d > m)
        if (high < m) if below else (low > m):
            return AGREE, f"{subject} lies {'below' if below else 'above'} {m:.3g}"
        if (low > m) if below else (high < m):
            # "lower / higher by more than t": strictly between the target and the band is the
            # claimed direction with a smaller effect, not its opposite
            if t > 0 and claim.kind in ("lower", "higher") and ((high < c) if below else (low > c)):
                return SMALLER, f"{subject} lies between {min(c, m):.3g} and {max(c, m):.3g}"
            return DISAGREE, f"{subject} lies {'above' if below else 'below'} {m:.3g}"
        return UNRESOLVED, (f"{subject} contains {m:.3g}" if low < high else f"{subject} equals {m:.3g}")
    lo, hi = c - t, c + t
    if lo < low and high < hi:
        return AGREE, f"{subject} lies inside ({lo:.3g}, {hi:.3g})"
    if low > hi or high < lo:
        return DISAGREE, f"{subject} lies outside ({lo:.3g}, {hi:.3g})"
    return UNRESOLVED, (f"{subject} crosses {lo:.3g} or {hi:.3g}" if low < high else
                        f"{subject} equals {lo if abs(low - lo) <= abs(low - hi) else hi:.3g}")


@dataclass(frozen=True)
class Chance:
    """What the trivial predictor of a task scores on a metric (:func:`cemlib.evidence.chance.chance_level`),
    and whether a model has *learned* the task: the lower end of the 95 % interval of its gain,
    ``(metric - value) / (perfect - value)``, reaches ``min_gain`` (a tenth of the way from the
    trivial predictor to a perfect score, by default)."""

    value: float
    perfect: float
    how: str
    min_gain: float = 0.1

    def __post_init__(self):
        if self.value == self.perfect:
            raise ValueError("the trivial predictor is already perfect: nothing to learn")
        if not 0 < self.min_gain < 1:
            raise ValueError(f"min_gain must lie in (0, 1), got {self.min_gain}")

    def gain(self, metric: float) -> float:
        """The fraction of the gap between the trivial predictor and a perfect score closed."""
        return (metric - self.value) / (self.perfect - self.value)

    def learned(self, values) -> bool:
        """Whether the per-seed ``values`` (at least 2) show that the model learned the task."""
        v = list(values.values()) if isinstance(values, Mapping) else list(values)
        return t_interval([self.gain(x) for x in v]).low >= self.min_gain


@dataclass(frozen=True)
class Verdict:
    """The rule's answer for one claim: ``verdict`` (one of :data:`VERDICTS`), the interval
    (``estimate``; ``None`` for a seed-independent value, then ``value`` holds it, and for a claim
    joined from sub-cases), the number of seeds, the one-line ``reason``; ``parts``: the sub-cases of
    a claim joined by :func:`combine`, as ``(name, Verdict)`` pairs; ``scale``: for an observation at
    our scale, why our runs cannot speak to the claim."""

    claim: Claim
    verdict: str
    estimate: Estimate | None
    value: float
    reason: str
    n: int | None = None
    parts: tuple = ()
    scale: str = ""

    @property
    def provisional(self) -> bool:
        """Fewer than :data:`MIN_SEEDS` seeds (in this verdict or in one of its sub-cases)."""
        return (self.n is not None and self.n < MIN_SEEDS) or any(v.provisional for _, v in self.parts)

    @property
    def decided(self) -> bool:
        """Whether this is a verdict at our scale (agree, same direction smaller, disagree,
        unresolved), as opposed to an observation or a claim not testable at this budget."""
        return self.verdict in _DECIDED


def _interval(a, b, level: float) -> Estimate:
    if b is None:
        return t_interval(list(_by_seed(a, "a").values()) if isinstance(a, Mapping) else a, level)
    return paired(a, b, level)


def _not_learned(chance: Chance | None, a, b, models: Mapping | None) -> list[str]:
    if chance is None:
        return []
    checked = models.items() if models is not None else (("a", a), ("b", b))
    return [name for name, v in checked if v is not None and not chance.learned(
        list(v.values()) if isinstance(v, Mapping) else v)]


def _not_learned_reason(fails: list[str], chance: Chance) -> str:
    return (f"{' and '.join(fails)} has not learned the task: the trivial predictor scores "
            f"{chance.value:.3g} ({chance.how})")


def decide(claim: Claim, a, b=None, *, chance: Chance | None = None, models: Mapping | None = None,
           level: float = LEVEL) -> Verdict:
    """The book's verdict on ``claim`` from per-seed values (each a mapping seed -> value).

    With ``b``, the quantity is the per-seed difference ``a[s] - b[s]``; without, ``a`` holds the
    per-seed values of the quantity itself. With ``chance``, a model that has not learned the task
    makes the claim *not testable at this budget* (the interval is still reported); the models
    checked are ``a`` and, if given, ``b``, or ``models`` (name -> per-seed values of the task's
    metric) when the quantity is derived from them, e.g. a ratio ``a[s] / b[s] - 1``. A claim with a
    ``scale`` gets an observation at our scale (:func:`observe`), never a verdict."""
    if claim.scale.strip():
        return observe(claim, a, b, chance=chance, models=models, level=level)
    est = _interval(a, b, level)
    verdict, reason = claim.judge(est.low, est.high)
    fails = _not_learned(chance, a, b, models)
    if fails:
        verdict, reason = NOT_TESTABLE, _not_learned_reason(fails, chance)
    return Verdict(claim, verdict, est, est.mean, reason, est.n)


def _is_scalar(a) -> bool:
    """A single value (a number, a 0-d array or tensor), as opposed to per-seed values."""
    return not isinstance(a, (Mapping, str)) and np.ndim(a) == 0


def _exact_value(value) -> float:
    value = float(value)
    if not math.isfinite(value):
        raise ValueError(f"value must be finite, got {value}")
    return value


def decide_exact(claim: Claim, value: float) -> Verdict:
    """The verdict on a quantity that no seed changes (a parameter or FLOP count, a ratio of them,
    an exact identity): the interval is the value itself. A claim with a ``scale`` gets an
    observation at our scale."""
    value = _exact_value(value)
    if claim.scale.strip():
        return observe(claim, value)
    verdict, reason = _judge(claim, value, value, "the value")
    return Verdict(claim, verdict, None, value, reason, None)


def observe(claim: Claim, a, b=None, *, why: str | None = None, chance: Chance | None = None,
            models: Mapping | None = None, level: float = LEVEL) -> Verdict:
    """An *observation at our scale*: the claim is about models or data far from what we trained
    (size, data, metric), so our runs cannot confirm or refute it. The interval (or, for a real
    number ``a`` and no ``b``, the exact value) is computed as :func:`decide` would, and read in words
    against the claim's bound, but the answer is :data:`OBSERVED`, which :func:`tally` never counts as
    agree or disagree. ``why`` (default: the claim's ``scale``) says in one line why our runs cannot
    speak to the claim. A model that has not learned the task (``chance``) still makes it *not
    testable at this budget*."""
    why = (claim.scale if why is None else why).strip()
    if not why:
        raise ValueError("say why our runs cannot speak to the claim (its models, data or metric), "
                         "in why= or in the claim's scale=")
    if b is None and _is_scalar(a):
        value = _exact_value(a)
        est, low, high, n, subject = None, value, value, None, "the value"
    else:
        est = _interval(a, b, level)
        value, low, high, n, subject = est.mean, est.low, est.high, est.n, "the interval"
    outcome, reason = _judge(claim, low, high, subject)
    fails = _not_learned(chance, a, b, models) if est is not None else []
    if fails:
        return Verdict(claim, NOT_TESTABLE, est, value, _not_learned_reason(fails, chance), n, scale=why)
    return Verdict(claim, OBSERVED, est, value, f"{reason} ({_READING[outcome]})", n, scale=why)


def not_testable(claim: Claim, reason: str) -> Verdict:
    """The verdict when our runs cannot reach the regime a claim is about (its own threshold is never
    reached, the quantity it speaks of does not exist at this budget): *not testable at this
    budget*, with the reason, and no interval."""
    if not reason.strip():
        raise ValueError("say why the claim cannot be tested")
    return Verdict(claim, NOT_TESTABLE, None, math.nan, reason, None)


def combine(claim: Claim, parts: Mapping[str, Verdict]) -> Verdict:
    """One claim, one row: the verdict on ``claim`` from its sub-cases (``parts``: name -> the
    :class:`Verdict` of each sub-case, from :func:`decide`, :func:`decide_exact`,
    :func:`not_testable`, usually on ``claim`` itself). A claim that holds for every sub-case
    ("consistently", "for every kernel") is refuted by one and confirmed only by all:

    - *disagree* if any sub-case disagrees;
    - else *agree* if every sub-case agrees;
    - else *same direction, smaller* if every sub-case agrees or is smaller;
    - else *not testable at this budget* if no sub-case is testable;
    - else *unresolved*.

    A claim with a ``scale`` is an observation at our scale whatever its sub-cases say. Each
    sub-case's one-sided decision is a test of its own: :func:`false_disagreements` counts them all."""
    if not isinstance(parts, Mapping) or not parts:
        raise ValueError("combine needs the sub-cases as a non-empty mapping name -> Verdict")
    for name, v in parts.items():
        if not isinstance(name, str) or not name.strip():
            raise ValueError(f"a sub-case needs a name, got {name!r}")
        if not isinstance(v, Verdict):
            raise TypeError(f"sub-case {name!r} must be a Verdict (from decide, decide_exact, ...), got "
                            f"{type(v).__name__}")
    by = {name: v.verdict for name, v in parts.items()}
    which = lambda *vs: ", ".join(n for n, v in by.items() if v in vs)
    scale = claim.scale.strip()
    if scale:
        verdict, reason = OBSERVED, "each sub-case read as an observation"
    elif any(v == OBSERVED for v in by.values()):
        raise ValueError(f"sub-cases {which(OBSERVED)} are observations at our scale but the claim is not: "
                         f"give the claim its scale= reason, or decide the sub-cases at our scale")
    elif any(v == DISAGREE for v in by.values()):
        verdict, reason = DISAGREE, f"{which(DISAGREE)}: disagree"
    elif all(v == AGREE for v in by.values()):
        verdict, reason = AGREE, "every sub-case agrees"
    elif all(v in (AGREE, SMALLER) for v in by.values()):
        verdict, reason = SMALLER, f"{which(SMALLER)}: the claimed direction, by less than the band"
    elif all(v == NOT_TESTABLE for v in by.values()):
        verdict, reason = NOT_TESTABLE, "no sub-case is testable at this budget"
    else:
        verdict, reason = UNRESOLVED, f"{which(UNRESOLVED, NOT_TESTABLE)}: unresolved or not testable"
    return Verdict(claim, verdict, None, math.nan, reason, None, tuple(parts.items()), scale)


# ------------------------------------------------------------------------------ reading stored runs
def _is_whole(res: dict, split: str) -> bool:
    """Whether a fixed-dataset run's final ``split`` metrics cover the whole split (val and test
    always do; train only when its evaluation subset is the whole train split)."""
    if split != "train":
        return True
    text = ((res["metrics"].get("estimates") or {}).get("final")) or ""
    if "train_*" in text:
        m = re.search(r"train_\*: a fixed subset of (\d+) of the (\d+)", text)
        return "train_*: the whole" in text or (m is not None and m.group(1) == m.group(2))
    cfg, splits = res["config"]["train"], (res.get("task") or {}).get("splits", {})
    micro = cfg["batch_size"] // max(1, cfg.get("grad_accum", 1))
    return splits.get("train") is not None and cfg["eval_batches"] * micro >= splits["train"]


def whole_split_value(res: dict, metric: str, split: str = "val") -> float:
    """The final ``metric`` of a stored run on the whole ``split``.

    Language modelling: only the validation split has a whole-split value,
    ``metrics["final_whole_val"]``; its sampled ``final_val_loss`` is refused. Fixed datasets: the
    validation and test metrics cover every example of the split by construction; a train metric is
    accepted only when the run records that it covered the whole train split."""
    m = res["metrics"]
    kind = (res.get("task") or {}).get("kind", "language_modelling")
    key = f"{split}_{metric}"
    if kind == "language_modelling":
        whole = m.get("final_whole_val")
        if split != "val":
            raise ValueError(f"a language-model run has a whole-split value for 'val' only, not {split!r}")
        if not whole or key not in whole:
            raise ValueError(f"{res.get('experiment')} (seed {res['config']['train']['seed']}, commit "
                             f"{str(res.get('git_commit'))[:7]}) has no whole-split {key}: its final_val_loss "
                             f"is a sample of 8 random batches; re-run it from a commit that records "
                             f"final_whole_val")
        return float(whole[key])
    final = m.get("final") or {}
    if key not in final:
        raise KeyError(f"{res.get('experiment')}: no final metric {key!r}; has {sorted(final)}")
    if not _is_whole(res, split):
        size = (res.get("task") or {}).get("splits", {}).get(split)
        raise ValueError(f"{res.get('experiment')}: its {key} is measured on a fixed subset of the {size} "
                         f"{split} examples, not the whole split (raise train.eval_batches)")
    return float(final[key])


def seed_values(runs, metric: str, split: str = "val") -> dict[int, float]:
    """``{seed: whole-split metric}`` of a model's stored runs (a list of results, as
    :func:`cemlib.train.results.load_runs` returns per model); a repeated seed is an error."""
    out: dict[int, float] = {}
    for r in runs:
        s = int(r["config"]["train"]["seed"])
        if s in out:
            raise ValueError(f"seed {s} appears twice among the runs of {r.get('experiment')}")
        out[s] = whole_split_value(r, metric, split)
    return out


# ------------------------------------------------------------------------------ tables
_COLUMNS = ("the paper's words", "where", "ours", "threshold", "verdict")


def _fmt(x: float, digits: int) -> str:
    return f"{x:+.{digits}f}"


def _reading(v: Verdict) -> str:
    """How an observation reads its interval, in words (from the data, never agree/disagree)."""
    low, high = (v.value, v.value) if v.estimate is None else (v.estimate.low, v.estimate.high)
    return _READING[_judge(v.claim, low, high, "")[0]]


def _ours(v: Verdict, digits: int) -> str:
    if v.parts:
        return "; ".join(f"{name}: {_ours(p, digits)} ({_reading(p) if p.verdict == OBSERVED else p.verdict})"
                         for name, p in v.parts)
    if v.estimate is None and math.isnan(v.value):
        return v.reason
    if v.estimate is None:
        return f"{v.value:.{digits}f} (computed)"
    e = v.estimate
    return f"{_fmt(e.mean, digits)} [{_fmt(e.low, digits)}, {_fmt(e.high, digits)}], n = {e.n}"


def _row(v: Verdict, digits: int) -> dict[str, str]:
    c = v.claim
    if v.provisional:
        few = f"n = {v.n}" if v.n is not None else "a sub-case has"
        label = f"{v.verdict} (provisional: {few} < {MIN_SEEDS} seeds)"
    else:
        label = v.verdict
    if v.verdict == OBSERVED:
        label += ("; " if v.parts else f": {v.reason}; ") + f"why not a verdict: {v.scale}"
    elif v.parts:
        label += f" ({v.reason})"
    return {"the paper's words": c.words, "where": c.where,
            "ours": _ours(v, digits) + (f" ({c.metric})" if c.metric else ""),
            "threshold": f"{c.bound}; {c.why}", "verdict": label}


@dataclass
class ClaimsTable:
    """Rows of a claims table (``rows``: one dict per claim, keys :attr:`columns`). Renders as HTML
    in a notebook (``_repr_html_``), as Markdown (:meth:`to_markdown`), or as a pandas DataFrame
    (:meth:`to_dataframe`, when pandas is installed)."""

    rows: list[dict[str, str]]
    columns: tuple[str, ...] = _COLUMNS

    def to_markdown(self) -> str:
        cell = lambda s: str(s).replace("|", "\\|").replace("\n", " ")
        lines = ["| " + " | ".join(self.columns) + " |", "|" + "---|" * len(self.columns)]
        lines += ["| " + " | ".join(cell(r[c]) for c in self.columns) + " |" for r in self.rows]
        return "\n".join(lines) + "\n"

    def _repr_html_(self) -> str:
        head = "".join(f"<th>{html.escape(c)}</th>" for c in self.columns)
        body = "".join("<tr>" + "".join(f"<td>{html.escape(str(r[c]))}</td>" for c in self.columns) + "</tr>"
                       for r in self.rows)
        return f'<table class="claims-table"><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>'

    def to_dataframe(self):
        import pandas as pd  # optional: the book does not need pandas
        return pd.DataFrame(self.rows, columns=list(self.columns))

    def __len__(self) -> int:
        return len(self.rows)


def claims_table(verdicts: Sequence[Verdict], digits: int = 3) -> ClaimsTable:
    """The claims table of a chapter: per verdict, the paper's words, where they are, our interval
    (mean [low, high], n seeds; the computed value; or, for a claim joined by :func:`combine`, each
    sub-case with its answer), the threshold with its reason, and the verdict; an observation at our
    scale reads its interval in words and says why our runs cannot decide it."""
    return ClaimsTable([_row(v, digits) for v in verdicts])


def _same(v: Verdict, w: Verdict) -> bool:
    """The same answer from the same data (a verdict listed twice), NaN values included."""
    value = v.value == w.value or (math.isnan(v.value) and math.isnan(w.value))
    return (v.verdict, v.estimate, v.reason, v.n, v.parts, v.scale) == \
        (w.verdict, w.estimate, w.reason, w.n, w.parts, w.scale) and value


def _sentence(words: str) -> str:
    return " ".join(words.lower().split())


def tally(verdicts: Sequence[Verdict]) -> dict[str, int]:
    """How many claims got each answer (keys :data:`VERDICTS`), each claim counted once.

    Observations at our scale are counted under :data:`OBSERVED` only, never as agree or disagree;
    *same direction, smaller* has its own key. The same :class:`Claim` listed twice with the same
    verdict counts once; claims sharing a ``finding`` (wordings of one result in two versions of a
    paper) count once, under their common verdict or, if the wordings got different verdicts, under
    :data:`DEPENDS`. Refused (``ValueError``): one claim with two different verdicts, or decided twice
    on different data, and one sentence of the paper (the same ``words``) listed as two claims that
    do not share a finding, i.e. sub-cases counted as claims: join them with :func:`combine`."""
    seen: dict[Claim, Verdict] = {}
    sentences: dict[str, Claim] = {}
    groups: dict[object, set[str]] = {}
    for v in verdicts:
        c = v.claim
        if c in seen:
            w = seen[c]
            if w.verdict != v.verdict:
                raise ValueError(f"one claim, two verdicts ({w.verdict!r} and {v.verdict!r}): {c.words!r} "
                                 f"({c.where}). Decide a claim once; join its sub-cases with combine()")
            if not _same(w, v):
                raise ValueError(f"one claim decided twice, on different data: {c.words!r} ({c.where}). "
                                 f"Join its sub-cases into one row with combine()")
            continue
        other = sentences.setdefault(_sentence(c.words), c)
        if other != c and not (c.finding and c.finding == other.finding):
            raise ValueError(f"one claim, one row: the paper's words {c.words!r} are listed as two claims "
                             f"({other.where}: {other.metric or other.bound}; {c.where}: {c.metric or c.bound}). "
                             f"Decide each sub-case and join them into one row with "
                             f"combine(claim, {{name: verdict, ...}})")
        seen[c] = v
        key = ("finding", c.finding) if c.finding else ("claim", c)
        groups.setdefault(key, set()).add(v.verdict)
    out = {k: 0 for k in VERDICTS}
    for verdicts_of_group in groups.values():
        key = next(iter(verdicts_of_group)) if len(verdicts_of_group) == 1 else DEPENDS
        out[key] = out.get(key, 0) + 1
    return out


# ------------------------------------------------------------------------------ chance disagreements
@dataclass(frozen=True)
class FalseDisagreements:
    """How many "disagree"s a table (or the book) should expect by chance alone.

    ``decisions``: one-sided decisions on an interval over seeds (each sub-case of a claim joined by
    :func:`combine` counted; an equivalence claim's two one-sided tests count once, since only the
    one at the nearer bound can fail when the claim holds); ``expected``: the expected number of
    false "disagree"s (or "same direction, smaller") if every claim held exactly at its bound,
    ``(1 - level) / 2`` per decision, 0.025 at the book's 95 %; ``exact``: decisions on a value that no
    seed changes (never wrong by chance); ``observations``: claims observed at our scale (no decision)."""

    decisions: int
    expected: float
    exact: int = 0
    observations: int = 0

    def sentence(self) -> str:
        """The sentence for a claims table's caption."""
        if self.decisions == 0:
            return ("No verdict here rests on an interval over seeds, so none can read \"disagree\" "
                    "by chance.")
        each = self.expected / self.decisions
        many = self.decisions != 1
        return (f"{self.decisions} verdict{'s' if many else ''} here rest{'' if many else 's'} on a "
                f"{100 * (1 - 2 * each):.3g} % interval over seeds, each a one-sided test at "
                f"{100 * each:.3g} %: if every claim held exactly at its bound, about "
                f"{self.expected:.2g} of {'them' if many else 'it'} would still read \"disagree\" "
                f"by chance.")

    def __str__(self) -> str:
        return self.sentence()


def false_disagreements(verdicts: Sequence[Verdict]) -> FalseDisagreements:
    """The decisions made among ``verdicts`` (a chapter's, or the whole book's) and the number of
    "disagree"s to expect by chance if every claim were true at its bound: each one-sided decision
    is a t-test at ``(1 - level) / 2`` (2.5 % at 95 %), TOST at the same level; a verdict listed twice
    counts once; exact values, observations and claims not testable at this budget make no
    decision that chance can turn."""
    decisions, expected, exact, observations = 0, 0.0, 0, 0
    done: set = set()

    def count(v: Verdict) -> None:
        nonlocal decisions, expected, exact, observations
        if v.verdict == OBSERVED:
            observations += 1
        elif v.parts:
            for _, p in v.parts:
                count(p)
        elif v.verdict in _DECIDED:
            if v.estimate is None:
                exact += 1
            else:
                decisions += 1
                expected += (1 - v.estimate.level) / 2

    for v in verdicts:
        if (v.claim, v.verdict) in done:
            continue
        done.add((v.claim, v.verdict))
        count(v)
    return FalseDisagreements(decisions, expected, exact, observations)


# ------------------------------------------------------------------------------ checking a chapter
_WORDS = r"(agree|agrees|disagree|disagrees|unresolved|not resolvable|resolved|not testable|not yet measured|" \
         r"established|within noise|same direction, smaller|observation at our scale)"
_VERDICT_WORDS = re.compile(rf"^\s*{_WORDS}\b|(->|=>)\s*(the paper's .*)?{_WORDS}\b", re.I)


def hand_made_verdicts(source: str) -> list[tuple[int, str]]:
    """The places in Python ``source`` (a notebook cell; IPython magics are skipped) that write a
    verdict by hand instead of taking it from :func:`decide`: a string constant that *starts* with a
    verdict word ("agree", "disagree (erratum)", "not resolvable at 600 steps", "same direction, smaller",
    "observation at our scale", ...) or announces one
    after an arrow ("claim 1: ...  ->  agree"), except where it
    is compared with something or used as a key (``v.verdict == "agree"``, ``tally(vs)["agree"]`` read
    the rule's answer). Returns
    ``(line, text)`` pairs."""
    import ast
    lines = [re.sub(r"^(\s*)[%!].*", r"\1pass", line) for line in source.splitlines()]
    tree = ast.parse("\n".join(lines))
    compared = {id(c) for node in ast.walk(tree) if isinstance(node, ast.Compare)
                for c in [node.left, *node.comparators]}
    compared |= {id(node.slice) for node in ast.walk(tree) if isinstance(node, ast.Subscript)}
    found = []
    for node in ast.walk(tree):
        if (isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in compared
                and _VERDICT_WORDS.search(node.value)):
            found.append((node.lineno, node.value))
    return sorted(found)
