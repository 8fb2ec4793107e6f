"""The book's verdict rule (cemlib.evidence.verdict): every branch, and each branch flips when the data flip."""

import math
from pathlib import Path

import numpy as np
import pytest

from cemlib.evidence.verdict import (AGREE, DEPENDS, DISAGREE, NOT_TESTABLE, OBSERVED, SMALLER,
                                     UNRESOLVED, VERDICTS, Chance, Claim, FalseDisagreements,
                                     claims_table, combine, decide, decide_exact,
                                     false_disagreements, not_testable, observe, seed_values,
                                     tally, whole_split_value)
from cemlib.evidence.stats import (MIN_SEEDS, compare, paired, sampling_margin,
                                   t_interval, t_quantile)
from cemlib.evidence.lr_search import per_seed_optimum

WHY = "the test's band"


def claim(kind, threshold=0.0, **kw):
    return Claim("the paper's words", "section 1", kind, threshold, WHY, **kw)


def seeds(values):
    return dict(enumerate(values))


# ------------------------------------------------------------------------------ the interval
@pytest.mark.parametrize("n, table", [(2, 12.706), (3, 4.303), (4, 3.182), (5, 2.776), (10, 2.262), (30, 2.045)])
def test_t_quantile_matches_the_printed_t_table(n, table):
    # Student's t table, two-sided 95 %, df = n - 1 (three decimals)
    assert t_quantile(n) == pytest.approx(table, abs=5e-4)
    assert t_quantile(n) > 1.959964  # never the normal quantile


def test_t_interval_covers_the_mean_95_percent_of_the_time():
    rng = np.random.default_rng(0)
    for n in (3, 5):
        draws = rng.normal(1.0, 2.0, size=(20000, n))
        hits = sum(e.low <= 1.0 <= e.high for e in (t_interval(d) for d in draws[:4000]))
        assert abs(hits / 4000 - 0.95) < 0.015, (n, hits / 4000)
        # the normal quantile in place of t would cover visibly less at n = 3
        if n == 3:
            z = 1.959964 * draws.std(1, ddof=1) / math.sqrt(n)
            assert abs(draws.mean(1) - 1.0).__lt__(z).mean() < 0.90


def test_t_interval_values_and_refusals():
    e = t_interval([1.0, 2.0, 3.0])
    assert e.mean == 2.0 and e.std == 1.0 and e.n == 3
    assert e.high - e.mean == pytest.approx(4.302653 / math.sqrt(3), rel=1e-6)
    with pytest.raises(ValueError, match="one seed illustrates, never decides"):
        t_interval([1.0])
    with pytest.raises(ValueError, match="finite"):
        t_interval([1.0, float("nan")])
    with pytest.raises(ValueError, match="one-dimensional"):
        t_interval([[1.0, 2.0]])


def test_paired_differences_and_seed_checks():
    e = paired({0: 3.0, 1: 5.0, 2: 4.0}, {2: 1.0, 0: 1.0, 1: 2.0})      # seed order does not matter
    assert e.mean == pytest.approx((2 + 3 + 3) / 3)
    assert paired([3.0, 5.0, 4.0], [1.0, 2.0, 1.0]).mean == pytest.approx(e.mean)
    with pytest.raises(ValueError, match=r"unequal seeds.*only in the first: \[3\]"):
        paired({0: 1.0, 1: 2.0, 3: 0.0}, {0: 1.0, 1: 2.0, 2: 0.0})
    with pytest.raises(ValueError, match="unequal numbers of seeds"):
        paired([1.0, 2.0, 3.0], [1.0, 2.0])
    with pytest.raises(ValueError, match="one seed illustrates"):
        paired({0: 1.0}, {0: 2.0})


# ------------------------------------------------------------------------------ the branches
B = seeds([1.0, 1.1, 0.9, 1.05, 0.95])
LOWER = seeds([0.7, 0.82, 0.58, 0.74, 0.66])          # a - b about -0.3, tight
HIGHER = {s: 2 * B[s] - v for s, v in LOWER.items()}  # the mirror image: a - b about +0.3
NOISY = seeds([0.5, 1.6, 0.4, 1.7, 0.6])               # a - b about -0.08, wide


@pytest.mark.parametrize("kind, threshold, data, expected", [
    ("lower", 0.0, LOWER, AGREE), ("lower", 0.0, HIGHER, DISAGREE), ("lower", 0.0, NOISY, UNRESOLVED),
    ("lower", 0.5, LOWER, SMALLER),           # lower, but by less than the 0.5 the claim needs
    ("lower", 0.2, LOWER, AGREE), ("lower", 0.3, LOWER, UNRESOLVED), ("lower", 0.5, HIGHER, DISAGREE),
    ("higher", 0.0, HIGHER, AGREE), ("higher", 0.0, LOWER, DISAGREE), ("higher", 0.0, NOISY, UNRESOLVED),
    ("higher", 0.5, HIGHER, SMALLER), ("higher", 0.2, HIGHER, AGREE), ("higher", 0.3, HIGHER, UNRESOLVED),
    ("higher", 0.5, LOWER, DISAGREE), ("higher", 0.5, NOISY, UNRESOLVED),
    ("not higher", 0.05, LOWER, AGREE), ("not higher", 0.05, HIGHER, DISAGREE),
    ("not higher", 0.3, HIGHER, UNRESOLVED),   # the interval straddles 0.3
    ("not lower", 0.05, HIGHER, AGREE), ("not lower", 0.05, LOWER, DISAGREE),
])
def test_directional_branches_flip_with_the_data(kind, threshold, data, expected):
    v = decide(claim(kind, threshold), data, B)
    assert v.verdict == expected, (v.verdict, v.reason, v.estimate)
    assert v.n == 5 and not v.provisional


def test_equivalence_is_tost_at_the_same_level():
    small = {s: B[s] + d for s, d in zip(B, (0.01, -0.02, 0.015, 0.0, -0.005))}
    eq = claim("equivalent", 0.05)
    assert decide(eq, small, B).verdict == AGREE
    shifted = {s: v + 0.3 for s, v in small.items()}       # the same spread, 0.3 away
    assert decide(eq, shifted, B).verdict == DISAGREE
    assert decide(eq, NOISY, B).verdict == UNRESOLVED       # too wide to tell
    # the boundary: agree exactly when both one-sided t-tests at 2.5 % reject |d| >= threshold
    e = paired(small, B)
    assert e.high < 0.05 and e.low > -0.05
    narrow = claim("equivalent", max(abs(e.low), abs(e.high)) * 0.99)
    assert decide(narrow, small, B).verdict == UNRESOLVED


def test_target_shifts_the_bound():
    ratio = seeds([0.98, 1.01, 0.99, 1.0, 1.02])          # per-seed ratios, no second model
    assert decide(claim("equivalent", 0.05, target=1.0), ratio).verdict == AGREE
    assert decide(claim("equivalent", 0.05, target=0.5), ratio).verdict == DISAGREE
    assert decide(claim("lower", 0.0, target=1.1), ratio).verdict == AGREE
    assert decide(claim("lower", 0.0, target=0.9), ratio).verdict == DISAGREE


def test_not_testable_when_a_model_has_not_learned():
    chance = Chance(value=1 / 9, perfect=1.0, how="uniform over 9 digits")
    at_chance = seeds([0.123, 0.122, 0.121, 0.125, 0.120])    # 1 % of the gap: not learned
    learned = seeds([0.62, 0.60, 0.64, 0.61, 0.63])
    learned_too = seeds([0.52, 0.49, 0.55, 0.50, 0.51])
    c = claim("higher", 0.0)
    v = decide(c, at_chance, learned, chance=chance)
    assert v.verdict == NOT_TESTABLE and "a has not learned" in v.reason
    assert v.estimate is not None and v.estimate.mean < 0                 # the interval is still there
    assert decide(c, learned, learned_too, chance=chance).verdict == AGREE  # both learned: the rule
    assert decide(c, learned_too, learned, chance=chance).verdict == DISAGREE
    assert not chance.learned(at_chance.values()) and chance.learned(learned_too.values())
    # the gain fraction, for a loss (lower is better, perfect = 0)
    lm = Chance(value=3.3, perfect=0.0, how="unigram")
    assert lm.gain(1.65) == pytest.approx(0.5) and lm.learned([1.8, 1.9, 1.85])
    assert not lm.learned([3.25, 3.2, 3.3])
    # a quantity derived from two models (a ratio): the chance check reads the models, by name
    ratio = {s: learned[s] / at_chance[s] - 1 for s in learned}
    v = decide(claim("higher", 0.0), ratio, chance=chance, models={"T2": learned, "T1": at_chance})
    assert v.verdict == NOT_TESTABLE and "T1 has not learned" in v.reason and v.estimate.mean > 0
    both = {s: learned[s] / learned_too[s] - 1 for s in learned}
    assert decide(claim("higher", 0.0), both, chance=chance,
                  models={"T2": learned, "T1": learned_too}).verdict == AGREE


def test_few_seeds_are_provisional_and_one_seed_refused():
    v = decide(claim("lower"), {0: 0.7, 1: 0.8, 2: 0.6}, {0: 1.0, 1: 1.1, 2: 0.9})
    assert v.verdict == AGREE and v.provisional and v.n == 3 < MIN_SEEDS
    with pytest.raises(ValueError, match="one seed illustrates"):
        decide(claim("lower"), {0: 0.7}, {0: 1.0})


def test_exact_values():
    half = claim("equivalent", 0.01, target=0.5)
    assert decide_exact(half, 0.5021).verdict == AGREE
    assert decide_exact(half, 0.52).verdict == DISAGREE
    v = decide_exact(claim("higher"), 0.0)
    assert v.verdict == UNRESOLVED and v.estimate is None and v.n is None and not v.provisional
    with pytest.raises(ValueError):
        decide_exact(half, float("inf"))


def test_not_testable_by_reason():
    v = not_testable(claim("higher"), "no model reaches the 80 % that defines the transition")
    assert v.verdict == NOT_TESTABLE and v.estimate is None and math.isnan(v.value)
    assert claims_table([v]).rows[0]["ours"].startswith("no model reaches")
    with pytest.raises(ValueError):
        not_testable(claim("higher"), " ")


def test_claim_validation():
    with pytest.raises(ValueError, match="kind"):
        claim("better")
    with pytest.raises(ValueError, match="threshold"):
        claim("lower", -0.1)
    with pytest.raises(ValueError, match="equivalence"):
        claim("equivalent", 0.0)
    with pytest.raises(ValueError, match="why"):
        Claim("words", "where", "lower", 0.0, " ")
    assert claim("not higher", 0.05).bound == "d < 0.05"


def test_compare_without_a_claim():
    assert compare(LOWER, B, 0.0).label == "lower"
    assert compare(HIGHER, B, 0.0).label == "higher"
    assert compare(NOISY, B, 0.0).label == "unresolved"
    small = {s: B[s] + d for s, d in zip(B, (0.01, -0.02, 0.015, 0.0, -0.005))}
    assert compare(small, B, 0.05).label == "within ±0.05"
    assert compare(small, B, 0.0).label == "unresolved"


def test_sampling_margin():
    assert sampling_margin(500) == pytest.approx(1.959964 * math.sqrt(0.5 / 500), rel=1e-6)
    assert sampling_margin(2000) < sampling_margin(500)


# ------------------------------------------------------------------------------ same direction, smaller
GRID = np.linspace(-1.5, 1.5, 31)


@pytest.mark.parametrize("t, c", [(0.5, 0.0), (0.3, 1.0), (1e-3, -0.2)])
def test_a_confirmed_direction_of_smaller_size_is_never_disagree(t, c):
    """Every interval strictly between the target and the band of a "higher" claim (d > c + t) is
    "same direction, smaller", and the mirror image for "lower"; an interval that reaches the target
    or the other side below the band is "disagree"; nothing else moves."""
    hi, lo = claim("higher", t, target=c), claim("lower", t, target=c)
    for a in c + t * GRID:
        for b in c + t * GRID:
            if not a < b:
                continue
            up, down = hi.judge(a, b)[0], lo.judge(2 * c - b, 2 * c - a)[0]      # mirror images
            assert up == down, (a, b, up, down)
            if c < a and b < c + t:
                assert up == SMALLER, (a, b, up)
            elif b < c + t:                                  # reaches the target or below it
                assert up == DISAGREE, (a, b, up)
            elif a > c + t:
                assert up == AGREE
            else:
                assert up == UNRESOLVED
    # the other kinds never say "smaller", and a band of 0 (a test of the sign) cannot
    for kind in ("not higher", "not lower", "equivalent"):
        k = claim(kind, t, target=c)
        assert all(k.judge(a, b)[0] != SMALLER for a in c + t * GRID for b in c + t * GRID if a < b)
    assert all(claim("higher", 0.0).judge(a, b)[0] != SMALLER for a in GRID for b in GRID if a < b)


def test_smaller_for_exact_values_and_in_the_table():
    v = decide_exact(claim("higher", 0.5), 0.3)
    assert v.verdict == SMALLER and v.reason == "the value lies between 0 and 0.5"
    assert decide_exact(claim("higher", 0.5), -0.1).verdict == DISAGREE
    assert decide_exact(claim("lower", 0.5), -0.3).verdict == SMALLER
    row = claims_table([decide(claim("lower", 0.5), LOWER, B)]).rows[0]
    assert row["verdict"] == SMALLER == "same direction, smaller"
    assert tally([decide(claim("lower", 0.5), LOWER, B)]) == {**{k: 0 for k in VERDICTS}, SMALLER: 1}


# ------------------------------------------------------------------------------ observations at our scale
FAR = "the paper's models: 100M parameters, web text; ours: 0.2M, characters"


def test_an_observation_shows_the_interval_and_is_never_a_verdict():
    for kind, t in (("lower", 0.0), ("lower", 0.5), ("higher", 0.0), ("not higher", 0.05),
                    ("not lower", 0.05), ("equivalent", 0.05), ("equivalent", 0.5)):
        for data in (LOWER, HIGHER, NOISY):
            at_scale = decide(claim(kind, t), data, B)
            far = decide(claim(kind, t, scale=FAR), data, B)
            assert far.verdict == OBSERVED and not far.decided and at_scale.decided
            assert far.estimate == at_scale.estimate and far.n == 5 and far.scale == FAR
            # the words read the same interval against the same bound, in other words
            assert far.reason.startswith(at_scale.reason + " (")
            row = claims_table([far]).rows[0]
            assert row["ours"] == claims_table([at_scale]).rows[0]["ours"]
            assert row["verdict"].startswith(OBSERVED + ": ") and FAR in row["verdict"]
            assert "agree" not in row["verdict"] and "smaller" not in row["verdict"].split(":")[0]
    # observe() with a reason given, and the exact form
    v = observe(claim("lower"), LOWER, B, why=FAR)
    assert v.verdict == OBSERVED and "below 0" in v.reason and "as the paper reports" in v.reason
    v = observe(claim("higher", 0.5), 0.3, why=FAR)
    assert v.verdict == OBSERVED and v.estimate is None and v.value == 0.3 and "between 0 and 0.5" in v.reason
    assert decide_exact(claim("equivalent", 0.01, target=0.5, scale=FAR), 0.52).verdict == OBSERVED
    with pytest.raises(ValueError, match="say why"):
        observe(claim("lower"), LOWER, B)
    with pytest.raises(ValueError, match="say why"):
        observe(claim("lower", scale=" "), LOWER, B)


def test_an_observation_whose_model_has_not_learned_is_not_testable():
    chance = Chance(value=1 / 9, perfect=1.0, how="uniform over 9 digits")
    at_chance = seeds([0.123, 0.122, 0.121, 0.125, 0.120])
    learned = seeds([0.62, 0.60, 0.64, 0.61, 0.63])
    v = decide(claim("higher", scale=FAR), at_chance, learned, chance=chance)
    assert v.verdict == NOT_TESTABLE and "a has not learned" in v.reason and v.estimate is not None
    learned_too = {s: x + 0.4 for s, x in at_chance.items()}
    assert decide(claim("higher", scale=FAR), learned, learned_too, chance=chance).verdict == OBSERVED


def test_tally_never_counts_an_observation_as_agree_or_disagree():
    vs = [decide(claim("lower"), LOWER, B), decide(claim("higher"), LOWER, B),
          decide(Claim("w3", "s3", "lower", 0.0, WHY, scale=FAR), LOWER, B),
          decide(Claim("w4", "s4", "higher", 0.0, WHY, scale=FAR), LOWER, B),
          decide(Claim("w5", "s5", "lower", 0.5, WHY, scale=FAR), LOWER, B)]
    vs[1] = decide(Claim("w2", "s2", "higher", 0.0, WHY), LOWER, B)
    counts = tally(vs)
    assert counts[AGREE] == 1 and counts[DISAGREE] == 1 and counts[OBSERVED] == 3
    assert counts[SMALLER] == 0 and sum(counts.values()) == 5


# ------------------------------------------------------------------------------ one claim, one row
def _kernels(results):
    """Sub-cases of one claim: ``results`` is per sub-case LOWER, HIGHER or NOISY (a - b vs B)."""
    c = claim("lower", 0.0)
    return c, {f"kernel {i}": decide(c, data, B) for i, data in enumerate(results)}


@pytest.mark.parametrize("results, expected", [
    ((LOWER, LOWER, LOWER), AGREE),
    ((LOWER, HIGHER, LOWER), DISAGREE),       # one counter-example refutes "for every kernel"
    ((LOWER, NOISY, HIGHER), DISAGREE),
    ((LOWER, NOISY, LOWER), UNRESOLVED),
])
def test_combine_decides_one_claim_from_its_sub_cases(results, expected):
    c, parts = _kernels(results)
    v = combine(c, parts)
    assert v.verdict == expected and len(v.parts) == len(results) and v.estimate is None
    row = claims_table([v]).rows[0]
    for name, p in parts.items():
        assert f"{name}: " in row["ours"] and f"({p.verdict})" in row["ours"]
    assert row["verdict"].startswith(expected + " (")
    assert sum(tally([v]).values()) == 1 and tally([v])[expected] == 1


def test_combine_smaller_not_testable_observed_and_refusals():
    c = claim("lower", 0.5)
    agree_or_smaller = {"a": decide(claim("lower", 0.1), LOWER, B), "b": decide(c, LOWER, B)}
    assert [p.verdict for p in agree_or_smaller.values()] == [AGREE, SMALLER]
    assert combine(c, agree_or_smaller).verdict == SMALLER
    untested = {"a": not_testable(c, "no run"), "b": not_testable(c, "no run either")}
    assert combine(c, untested).verdict == NOT_TESTABLE
    assert combine(c, {"a": decide(claim("lower", 0.1), LOWER, B), "b": not_testable(c, "no run")}).verdict \
        == UNRESOLVED
    far = claim("lower", scale=FAR)
    v = combine(far, {"attention": decide(far, LOWER, B), "MLP": decide(far, HIGHER, B)})
    assert v.verdict == OBSERVED and v.scale == FAR and not v.decided
    row = claims_table([v]).rows[0]
    assert "attention: " in row["ours"] and "(as the paper reports for its models)" in row["ours"]
    assert "(not as the paper reports for its models)" in row["ours"] and FAR in row["verdict"]
    with pytest.raises(ValueError, match="observations at our scale but the claim is not"):
        combine(claim("lower"), {"a": decide(far, LOWER, B)})
    with pytest.raises(ValueError, match="non-empty"):
        combine(c, {})
    with pytest.raises(TypeError, match="must be a Verdict"):
        combine(c, {"a": 0.3})
    # a sub-case with few seeds makes the joined verdict provisional
    few = combine(c, {"a": decide(c, {0: 0.7, 1: 0.8, 2: 0.6}, {0: 1.0, 1: 1.1, 2: 0.9}),
                      "b": decide(c, LOWER, B)})
    assert few.provisional and "provisional" in claims_table([few]).rows[0]["verdict"]


def test_tally_refuses_a_claim_counted_twice():
    c = claim("lower")
    with pytest.raises(ValueError, match="one claim, two verdicts"):
        tally([decide(c, LOWER, B), decide(c, HIGHER, B)])
    # the same claim decided on two sub-cases that both agree is still two rows: refused
    lower_too = {s: x - 0.1 for s, x in LOWER.items()}
    assert decide(c, lower_too, B).verdict == AGREE
    with pytest.raises(ValueError, match="decided twice, on different data"):
        tally([decide(c, LOWER, B), decide(c, lower_too, B)])
    assert tally([not_testable(c, "no run"), not_testable(c, "no run")])[NOT_TESTABLE] == 1
    # the same sentence split into rows (5 kernels as 5 claims) is refused; combine() is the way
    rows = [decide(Claim("T = 2 beats T = 1 on every kernel", "Table 3", "lower", 0.0, WHY, metric=k), LOWER, B)
            for k in ("RBF", "Matern")]
    with pytest.raises(ValueError, match="one claim, one row.*combine"):
        tally(rows)
    # the same claim listed twice with the same verdict counts once; the joined row counts once
    assert tally([rows[0], rows[0]])[AGREE] == 1
    joined = combine(rows[0].claim, {"RBF": rows[0], "Matern": rows[1]})
    assert tally([joined])[AGREE] == 1
    with pytest.raises(ValueError, match="one claim, two verdicts"):
        tally([joined, decide(rows[0].claim, HIGHER, B)])
    # two versions of one finding in the same words are one claim, counted once
    arxiv = Claim("the same words", "§4 (arXiv)", "lower", 0.0, WHY, finding="f")
    iclr = Claim("the same words", "§4 (ICLR)", "lower", 0.0, WHY, finding="f")
    assert sum(tally([decide(arxiv, LOWER, B), decide(iclr, LOWER, B)]).values()) == 1


# ------------------------------------------------------------------------------ chance disagreements
def test_false_disagreements_is_a_fortieth_of_the_one_sided_decisions():
    eq, far = claim("equivalent", 0.05), claim("lower", scale=FAR)
    vs = [decide(Claim(f"w{i}", "s", kind, t, WHY), data, B)
          for i, (kind, t, data) in enumerate((("lower", 0.0, LOWER), ("higher", 0.0, LOWER),
                                               ("lower", 0.5, LOWER), ("not higher", 0.3, HIGHER),
                                               ("equivalent", 0.05, NOISY)))]
    assert [v.verdict for v in vs] == [AGREE, DISAGREE, SMALLER, UNRESOLVED, UNRESOLVED]
    f = false_disagreements(vs)
    assert f == FalseDisagreements(5, pytest.approx(0.025 * 5), 0, 0)
    # exact values, observations and claims not testable make no decision chance can turn
    more = vs + [decide_exact(eq, 0.01), decide(far, LOWER, B), not_testable(claim("lower"), "no run"),
                 vs[0]]                                                        # a repeat counts once
    f = false_disagreements(more)
    assert (f.decisions, f.exact, f.observations) == (5, 1, 1) and f.expected == pytest.approx(0.125)
    # a claim joined from 3 sub-cases made 3 decisions; joined as an observation it made none
    c, parts = _kernels((LOWER, HIGHER, NOISY))
    assert false_disagreements([combine(c, parts)]).decisions == 3
    assert false_disagreements([combine(far, {k: decide(far, LOWER, B) for k in "abc"})]).decisions == 0
    # another level, another rate: a 90 % interval is a one-sided test at 5 %
    assert false_disagreements([decide(claim("lower"), LOWER, B, level=0.9)]).expected == pytest.approx(0.05)
    text = false_disagreements(vs).sentence()
    assert text.startswith("5 verdicts here rest on a 95 % interval") and "2.5 %" in text
    assert "about 0.13 of them" in text
    assert str(false_disagreements(vs)) == text
    assert "1 verdict here rests" in false_disagreements(vs[:1]).sentence()
    assert "none can read" in false_disagreements([decide_exact(eq, 0.01)]).sentence()


@pytest.mark.parametrize("kind, t", [("higher", 0.0), ("higher", 0.2), ("not higher", 0.05), ("lower", 0.1),
                                     ("equivalent", 0.05)])
def test_a_claim_true_at_its_bound_reads_disagree_2_5_percent_of_the_time(kind, t):
    """Simulated seeds whose true difference sits exactly on the claim's bound (the worst case for a
    true claim): "disagree" (with "same direction, smaller") comes out at the 2.5 % of
    false_disagreements, for every kind, at n = 5."""
    bound = {"higher": t, "not higher": t, "lower": -t, "equivalent": t}[kind]
    rng = np.random.default_rng(1)
    c = claim(kind, t)
    draws = rng.normal(bound, 0.05, size=(6000, 5))
    wrong = sum(decide(c, seeds(d)).verdict in (DISAGREE, SMALLER) for d in draws) / len(draws)
    assert abs(wrong - 0.025) < 0.008, wrong
    assert false_disagreements([decide(c, seeds(draws[0]))]).expected == pytest.approx(0.025)


def test_hand_made_new_words_are_found():
    from cemlib.evidence.verdict import hand_made_verdicts
    found = hand_made_verdicts('rows = [("w", "same direction, smaller"), ("v", "observation at our scale")]\n')
    assert sorted(t for _, t in found) == ["observation at our scale", "same direction, smaller"]


# ------------------------------------------------------------------------------ stored runs
def _lm_run(seed, whole=None, sample=1.9):
    m = {"final_val_loss": sample, "final": {"val_loss": sample}}
    if whole is not None:
        m["final_whole_val"] = {"val_loss": whole}
    return {"experiment": "shakespeare-x", "config": {"train": {"seed": seed}}, "git_commit": "0" * 40,
            "task": {"kind": "language_modelling"}, "metrics": m}


def _fixed_run(seed, final, estimates=None, train=None):
    m = {"final": final}
    if estimates is not None:
        m["estimates"] = {"final": estimates}
    cfg = {"seed": seed, "batch_size": 100, "eval_batches": 10, "grad_accum": 1}
    return {"experiment": "gp-x", "config": {"train": cfg}, "metrics": m,
            "task": {"kind": "regression", "splits": {"train": train or 1000, "val": 200, "test": 200}}}


def test_whole_split_values_and_refusals():
    assert whole_split_value(_lm_run(0, whole=1.85), "loss") == 1.85
    with pytest.raises(ValueError, match="sample of 8 random batches"):
        whole_split_value(_lm_run(0), "loss")
    with pytest.raises(ValueError, match="'val' only"):
        whole_split_value(_lm_run(0, whole=1.85), "loss", "test")
    r = _fixed_run(0, {"test_rmse": 0.03, "train_rmse": 0.01})
    assert whole_split_value(r, "rmse", "test") == 0.03
    assert whole_split_value(r, "rmse", "train") == 0.01                  # 10 batches of 100 = all 1000
    big = _fixed_run(0, {"train_rmse": 0.01}, train=4000)
    with pytest.raises(ValueError, match="fixed subset"):
        whole_split_value(big, "rmse", "train")
    recorded = _fixed_run(0, {"train_rmse": 0.01}, "val_*: the whole val split (200 examples); train_*: a fixed "
                          "subset of 1000 of the 4000 train examples", train=4000)
    with pytest.raises(ValueError, match="fixed subset"):
        whole_split_value(recorded, "rmse", "train")
    full = _fixed_run(0, {"train_rmse": 0.01}, "val_*: the whole val split (200 examples); train_*: a fixed "
                      "subset of 4000 of the 4000 train examples", train=4000)
    assert whole_split_value(full, "rmse", "train") == 0.01
    with pytest.raises(KeyError):
        whole_split_value(r, "accuracy", "test")


def test_seed_values_keys_by_seed_and_refuses_repeats():
    runs = [_lm_run(2, 1.8), _lm_run(0, 1.9)]
    assert seed_values(runs, "loss") == {2: 1.8, 0: 1.9}
    with pytest.raises(ValueError, match="seed 0 appears twice"):
        seed_values(runs + [_lm_run(0, 1.7)], "loss")


def test_per_seed_optimum_finds_each_seeds_minimum():
    lrs = [0.00075, 0.0015, 0.003, 0.006]
    best = {0: 0.002, 1: 0.004}
    losses = {lr: {s: (math.log2(lr) - math.log2(b)) ** 2 for s, b in best.items()} for lr in lrs}
    out = per_seed_optimum(losses)
    for s, b in best.items():
        assert out[s][0] == pytest.approx(b, rel=0.05) and out[s][1] < 0.01
    with pytest.raises(ValueError, match="needs 3"):
        per_seed_optimum({0.001: {0: 1.0}, 0.002: {0: 0.9}})


# ------------------------------------------------------------------------------ tables
def test_claims_table_rows_markdown_html_and_tally():
    arxiv = Claim("preconditioners “contribute only marginally”", "arXiv §4.2", "equivalent", 0.05, WHY,
                  finding="preconditioners at T = 2")
    iclr = Claim("“clear improvements at T = 2”", "ICLR §4.2", "lower", 0.0, WHY, finding="preconditioners at T = 2")
    other = Claim("T = 2 is better than T = 1", "Fig. 2c <b>", "lower", 0.0, WHY)
    small = {s: B[s] + d for s, d in zip(B, (0.01, -0.02, 0.015, 0.0, -0.005))}
    vs = [decide(arxiv, small, B), decide(iclr, small, B), decide(other, LOWER, B), decide(other, LOWER, B)]
    assert [v.verdict for v in vs] == [AGREE, UNRESOLVED, AGREE, AGREE]
    t = claims_table(vs)
    assert len(t) == 4 and t.rows[2]["verdict"] == AGREE and "n = 5" in t.rows[2]["ours"]
    assert t.rows[0]["threshold"].startswith("-0.05 < d < 0.05")
    assert "&lt;b&gt;" in t._repr_html_() and "<b>" not in t._repr_html_()
    assert t.to_markdown().count("\n") == 6
    counts = tally(vs)
    # one finding in two wordings with different verdicts, and one claim listed twice: two claims
    assert counts["depends on the version"] == 1 and counts[AGREE] == 1 and sum(counts.values()) == 2
    assert tally([vs[0], vs[0]])[AGREE] == 1


def test_load_runs_keys_experiments_and_grid_points_apart(tmp_path):
    from cemlib.train.results import save_results
    from cemlib.train.results import load_runs

    def res(exp, seed, ovr=()):
        r = _lm_run(seed, 1.8 + seed / 10)
        r.update(experiment=exp, schema="cemlib.train.results/1", preset="cpu", curves={}, num_parameters=1,
                 device={"label": "CPU"}, versions={}, command="python -m cemlib.train", sweep={"overrides": list(ovr)})
        r["metrics"]["wall_time_s"] = 1.0
        return r
    # two experiments whose names end alike (load_sweep would merge them), one with two grid points
    for exp, ovr in (("shakespeare-cem-t2", ()), ("shakespeare-cem-mlp-t2", ()),
                     ("shakespeare-llama", ("optim.lr=0.0015",)), ("shakespeare-llama", ("optim.lr=0.003",))):
        for seed in (1, 0):
            save_results(tmp_path / f"{exp}{''.join(ovr)}_{seed}.json", res(exp, seed, ovr))
    runs = load_runs(tmp_path)
    assert sorted(runs) == ["shakespeare-cem-mlp-t2", "shakespeare-cem-t2", "shakespeare-llama optim.lr=0.0015",
                            "shakespeare-llama optim.lr=0.003"]
    assert [r["config"]["train"]["seed"] for r in runs["shakespeare-cem-t2"]] == [0, 1]
    assert seed_values(runs["shakespeare-cem-t2"], "loss") == pytest.approx({0: 1.8, 1: 1.9})
    with pytest.raises(FileNotFoundError):
        load_runs(tmp_path / "empty")


def test_hand_made_verdicts_are_found_and_the_rules_are_not():
    from cemlib.evidence.verdict import hand_made_verdicts
    bad = """
verdict = "agree" if delta <= small else "disagree"
print(f"{'agree' if ok else 'disagree'}")
rows = [("claim 9", "ours", "Fig. 3", "not resolvable (600 steps)")]
%matplotlib inline
print("claim 1 (Lemma 1): the Boltzmann distribution minimises F  ->  agree")
"""
    found = hand_made_verdicts(bad)
    assert [text for _, text in found] == ["agree", "disagree", "agree", "disagree", "not resolvable (600 steps)",
                                           "claim 1 (Lemma 1): the Boltzmann distribution minimises F  ->  agree"]
    assert [line for line, _ in found] == [2, 2, 3, 3, 4, 6]
    good = """
v = decide(claim, a, b)
assert v.verdict == "agree" and tally([v])["agree"] == 1
print("live and stored agree to within 1e-3")
"""
    assert hand_made_verdicts(good) == []


BOOK = Path(__file__).resolve().parents[2] / "book"


@pytest.mark.parametrize("path", sorted(BOOK.glob("*.ipynb")), ids=lambda p: p.name)
def test_no_chapter_writes_a_verdict_by_hand(path):
    """Every verdict in the book comes from the one rule (issue 33): no code cell of a chapter types
    "agree", "disagree", "not resolvable", ... itself (:func:`hand_made_verdicts`)."""
    import nbformat

    from cemlib.evidence.verdict import hand_made_verdicts
    nb = nbformat.read(path, as_version=4)
    found = [(i, line, text) for i, cell in enumerate(nb.cells) if cell.cell_type == "code"
             for line, text in hand_made_verdicts(cell.source)]
    assert not found, f"{path.name}: verdicts typed by hand (cell, line, text): {found}"
