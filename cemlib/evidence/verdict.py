"""The book's one rule for reproduction verdicts: paired by seed, whole split, a 95 % interval, a
threshold stated before the run.

Every table in the book that puts a paper's claim next to our measurement takes its verdict from
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
4. **A threshold stated before the run**, recorded with its reason in a :class:`Claim` together with
   the paper's words and where they are. A claim says that the difference lies on one side of a
   bound, or within ``±threshold`` (:data:`KINDS`):

   ==============  ====================================  ======================  =====================
   kind            the claim                             agree when the interval  disagree when it
   ==============  ====================================  ======================  =====================
   ``lower``       ``d < -threshold`` (lower by more)    lies below -threshold    lies above -threshold
   ``higher``      ``d > threshold``                     lies above threshold     lies below threshold
   ``not higher``  ``d < threshold`` ("costs little")    lies below threshold     lies above threshold
   ``not lower``   ``d > -threshold``                    lies above -threshold    lies below -threshold
   ``equivalent``  ``|d| < threshold`` ("comparable")    lies inside ±threshold   lies outside ±threshold
   ==============  ====================================  ======================  =====================

   and **unresolved** otherwise (the interval contains the bound). Each one-sided decision is a
   t-test at level 2.5 %; the equivalence decision is the two one-sided tests (TOST) at the same
   level. ``threshold = 0`` makes a directional claim a plain test of the sign.
5. **Not testable at this budget** when a model compared has not learned the task: its metric does
   not beat the trivial predictor of the task (:mod:`cemlib.evidence.chance`) by at least a tenth of
   the gap to a perfect score, at the interval's lower end (:class:`Chance`).
6. **Seeds.** One seed illustrates, never decides: the rule refuses ``n < 2`` (a spread needs two
   values). A verdict from fewer than :data:`MIN_SEEDS` = 5 seeds is marked *provisional*: with 2-4
   seeds the sample standard deviation is itself uncertain by a factor of two or more, and the
   interval leans entirely on the normality of the differences.

:func:`claims_table` renders verdicts as rows (the paper's words, where, ours with the interval,
the threshold, the verdict) for an HTML or Markdown table, and :func:`tally` counts each claim once.
"""

from __future__ import annotations

import html
import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from cemlib.evidence.stats import LEVEL, MIN_SEEDS, Estimate, _by_seed, paired, t_interval

__all__ = ["KINDS", "VERDICTS", "Claim", "Chance", "Verdict", "decide", "decide_exact",
           "not_testable", "whole_split_value", "seed_values", "ClaimsTable", "claims_table", "tally",
           "hand_made_verdicts"]
KINDS = ("lower", "higher", "not higher", "not lower", "equivalent")
AGREE, DISAGREE, UNRESOLVED, NOT_TESTABLE = "agree", "disagree", "unresolved", "not testable at this budget"
VERDICTS = (AGREE, DISAGREE, UNRESOLVED, NOT_TESTABLE)


# ------------------------------------------------------------------------------ claims and chance
@dataclass(frozen=True)
class Claim:
    """A paper's claim, in its words, and the test we fixed before the run.

    ``words``: the paper's words (a quotation, or what its figure shows, in words); ``where``:
    section / figure / table (and version) where they are; ``kind``: one of :data:`KINDS`, read on
    the quantity ``d - target`` (``d``: the per-seed difference ``a - b`` of :func:`decide`, or the
    computed value of :func:`decide_exact`); ``threshold`` (>= 0; > 0 for ``equivalent``) and
    ``why``: the reason for it; ``metric``: what is compared, with its unit; ``finding``: claims that
    are two wordings of one finding (e.g. the arXiv and ICLR versions of the same figure) share a
    ``finding`` and :func:`tally` counts them once."""

    words: str
    where: str
    kind: str
    threshold: float
    why: str
    metric: str = ""
    target: float = 0.0
    finding: str = ""

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

    @property
    def bound(self) -> str:
        """The claim as an inequality on the difference ``d``."""
        t, c = self.threshold, self.target
        lo, hi = c - t, c + t
        return {"lower": f"d < {lo:.3g}", "higher": f"d > {hi:.3g}", "not higher": f"d < {hi:.3g}",
                "not lower": f"d > {lo:.3g}", "equivalent": f"{lo:.3g} < d < {hi:.3g}"}[self.kind]

    def judge(self, low: float, high: float) -> tuple[str, str]:
        """Verdict and reason for an interval ``[low, high]`` of ``d`` (no chance check)."""
        t, c = self.threshold, self.target
        if self.kind in ("lower", "not higher", "higher", "not lower"):
            m = c - t if self.kind in ("lower", "not lower") else c + t
            below = self.kind in ("lower", "not higher")            # the claim: d < m (or d > m)
            if (high < m) if below else (low > m):
                return AGREE, f"the interval lies {'below' if below else 'above'} {m:.3g}"
            if (low > m) if below else (high < m):
                return DISAGREE, f"the interval lies {'above' if below else 'below'} {m:.3g}"
            return UNRESOLVED, f"the interval contains {m:.3g}"
        lo, hi = c - t, c + t
        if lo < low and high < hi:
            return AGREE, f"the interval lies inside ({lo:.3g}, {hi:.3g})"
        if low > hi or high < lo:
            return DISAGREE, f"the interval lies outside ({lo:.3g}, {hi:.3g})"
        return UNRESOLVED, f"the interval crosses {lo:.3g} or {hi:.3g}"


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
    (``estimate``; ``None`` for a seed-independent value, then ``value`` holds it), the number of
    seeds, the one-line ``reason``, and ``provisional`` (fewer than :data:`MIN_SEEDS` seeds)."""

    claim: Claim
    verdict: str
    estimate: Estimate | None
    value: float
    reason: str
    n: int | None = None

    @property
    def provisional(self) -> bool:
        return self.n is not None and self.n < MIN_SEEDS


def decide(claim: Claim, a, b=None, *, chance: Chance | None = None, models: Mapping | None = None,
           level: float = LEVEL) -> Verdict:
    """The book's verdict on ``claim`` from per-seed values (each a mapping seed -> value).

    With ``b``, the quantity is the per-seed difference ``a[s] - b[s]``; without, ``a`` holds the
    per-seed values of the quantity itself. With ``chance``, a model that has not learned the task
    makes the claim *not testable at this budget* (the interval is still reported); the models
    checked are ``a`` and, if given, ``b``, or ``models`` (name -> per-seed values of the task's
    metric) when the quantity is derived from them, e.g. a ratio ``a[s] / b[s] - 1``."""
    if b is None:
        est = t_interval(list(_by_seed(a, "a").values()) if isinstance(a, Mapping) else a, level)
    else:
        est = paired(a, b, level)
    verdict, reason = claim.judge(est.low, est.high)
    if chance is not None:
        checked = models.items() if models is not None else (("a", a), ("b", b))
        fails = [name for name, v in checked if v is not None and not chance.learned(
            list(v.values()) if isinstance(v, Mapping) else v)]
        if fails:
            verdict = NOT_TESTABLE
            reason = (f"{' and '.join(fails)} has not learned the task: the trivial predictor scores "
                      f"{chance.value:.3g} ({chance.how})")
    return Verdict(claim, verdict, est, est.mean, reason, est.n)


def decide_exact(claim: Claim, value: float) -> Verdict:
    """The verdict on a quantity that no seed changes (a parameter or FLOP count, a ratio of them,
    an exact identity): the interval is the value itself."""
    value = float(value)
    if not math.isfinite(value):
        raise ValueError(f"value must be finite, got {value}")
    verdict, reason = claim.judge(value, value)
    return Verdict(claim, verdict, None, value, reason.replace("the interval lies", "the value lies")
                   .replace("the interval contains", "the value equals").replace("the interval crosses",
                                                                                 "the value equals"), None)


def not_testable(claim: Claim, reason: str) -> Verdict:
    """The verdict when our runs cannot reach the regime a claim is about (its own threshold is never
    reached, the quantity it speaks of does not exist at this budget): *not testable at this
    budget*, with the reason, and no interval."""
    if not reason.strip():
        raise ValueError("say why the claim cannot be tested")
    return Verdict(claim, NOT_TESTABLE, None, math.nan, reason, None)


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


def _row(v: Verdict, digits: int) -> dict[str, str]:
    c = v.claim
    if v.estimate is None and math.isnan(v.value):
        ours = v.reason
    elif v.estimate is None:
        ours = f"{v.value:.{digits}f} (computed)"
    else:
        e = v.estimate
        ours = f"{_fmt(e.mean, digits)} [{_fmt(e.low, digits)}, {_fmt(e.high, digits)}], n = {e.n}"
    verdict = v.verdict + (f" (provisional: n = {v.n} < {MIN_SEEDS})" if v.provisional else "")
    return {"the paper's words": c.words, "where": c.where, "ours": ours + (f" ({c.metric})" if c.metric else ""),
            "threshold": f"{c.bound}; {c.why}", "verdict": verdict}


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
    (mean [low, high], n seeds; or the computed value), the threshold with its reason, the verdict."""
    return ClaimsTable([_row(v, digits) for v in verdicts])


def tally(verdicts: Sequence[Verdict]) -> dict[str, int]:
    """How many claims got each verdict, each claim counted once: the same :class:`Claim` listed
    twice counts once, and claims sharing a ``finding`` (wordings of one result in two versions of a
    paper) count once, under their common verdict or, if the wordings got different verdicts, under
    ``"depends on the version"``."""
    groups: dict[object, set[str]] = {}
    for v in verdicts:
        key = ("finding", v.claim.finding) if v.claim.finding else ("claim", v.claim)
        groups.setdefault(key, set()).add(v.verdict)
    out = {k: 0 for k in VERDICTS}
    for verdicts_of_group in groups.values():
        key = next(iter(verdicts_of_group)) if len(verdicts_of_group) == 1 else "depends on the version"
        out[key] = out.get(key, 0) + 1
    return out


# ------------------------------------------------------------------------------ checking a chapter
_WORDS = r"(agree|agrees|disagree|disagrees|unresolved|not resolvable|resolved|not testable|not yet measured|" \
         r"established|within noise)"
_VERDICT_WORDS = re.compile(rf"^\s*{_WORDS}\b|(->|=>)\s*(the paper's .*)?{_WORDS}\b", re.I)


def hand_made_verdicts(source: str) -> list[tuple[int, str]]:
    """The places in Python ``source`` (a notebook cell; IPython magics are skipped) that write a
    verdict by hand instead of taking it from :func:`decide`: a string constant that *starts* with a
    verdict word ("agree", "disagree (erratum)", "not resolvable at 600 steps", ...) or announces one
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
