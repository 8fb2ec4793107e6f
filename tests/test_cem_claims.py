"""The CEM paper's language-model claims (cemlib.evidence.cem_claims) and the setup check of two runs
(cemlib.train.results.setup_differences) that chapters 2, 3 and 5 use."""

import copy
from pathlib import Path

import pytest

from cemlib.evidence import cem_claims as cc
from cemlib.train.results import load_results, setup_differences
from cemlib.evidence.verdict import (AGREE, DISAGREE, UNRESOLVED, decide, decide_exact,
                                     seed_values, tally)
from cemlib.evidence.stats import MIN_SEEDS
from cemlib.train.results import load_runs

BLOCKS = Path(__file__).resolve().parent.parent / "book" / "results" / "shakespeare_blocks_cpu"


def test_claims_are_distinct_and_versions_share_a_finding():
    claims = cc.LANGUAGE_MODEL_CLAIMS
    assert len(set(claims)) == len(claims)
    assert len({(c.words, c.where, c.metric) for c in claims}) == len(claims)
    by_finding = {}
    for c in claims:
        if c.finding:
            by_finding.setdefault(c.finding, []).append(c)
    # a finding is one result in the two versions of the paper: exactly two wordings, one per version
    for finding, group in by_finding.items():
        assert len(group) == 2, finding
        assert {"(arXiv)" in c.where for c in group} == {True, False}, finding
        assert {"(ICLR)" in c.where for c in group} == {True, False}, finding
    # and no claim of one version only is left without its finding, except T >= 3 (ICLR says "unstable")
    assert all(c.finding or "(ICLR)" not in c.where for c in claims)


def test_small_cost_and_direction_claims_flip_with_the_data():
    base = {s: 1.8 + 0.01 * s for s in range(5)}
    shifted = lambda d, wiggle=0.002: {s: v + d + wiggle * (-1) ** s for s, v in base.items()}
    assert decide(cc.ATTN_SMALL_COST, shifted(0.01), base).verdict == AGREE
    assert decide(cc.ATTN_SMALL_COST, shifted(0.10), base).verdict == DISAGREE
    assert decide(cc.ATTN_SMALL_COST, shifted(0.05, 0.02), base).verdict == UNRESOLVED
    assert decide(cc.MLP_HIGHER, shifted(0.02), base).verdict == AGREE
    assert decide(cc.MLP_HIGHER, shifted(-0.02), base).verdict == DISAGREE
    assert decide(cc.SHARED_CLOSE_TO_PER_HEAD, shifted(-0.01), base).verdict == AGREE
    assert decide(cc.SHARED_CLOSE_TO_PER_HEAD, shifted(-0.2), base).verdict == DISAGREE
    # two wordings of the preconditioner finding that disagree count once, as "depends on the version"
    vs = [decide(cc.PRECOND_DIAG_ARXIV, shifted(0.01), base), decide(cc.PRECOND_DIAG_ICLR, shifted(0.01), base)]
    assert [v.verdict for v in vs] == [AGREE, DISAGREE]
    assert tally(vs)["depends on the version"] == 1 and sum(tally(vs).values()) == 1


def test_parameter_ratio_claims():
    assert decide_exact(cc.ATTN_HALF_PARAMS, 0.5021).verdict == AGREE
    assert decide_exact(cc.ATTN_HALF_PARAMS, 0.52).verdict == DISAGREE
    assert decide_exact(cc.MLP_TWO_THIRDS, 2 / 3).verdict == AGREE
    assert decide_exact(cc.MLP_TWO_THIRDS, 1 / 3).verdict == DISAGREE          # the ICLR caption's typo
    assert decide_exact(cc.MLP_PM_SAME_COUNT, 1.0).verdict == AGREE


@pytest.mark.skipif(not BLOCKS.is_dir(), reason="the stored sweep is not in this checkout")
def test_the_stored_blocks_sweep_decides_with_whole_split_values():
    runs = load_runs(BLOCKS)
    vals = {k: seed_values(v, "loss") for k, v in runs.items()}
    assert all(len(v) >= MIN_SEEDS for v in vals.values())
    for claim, a, b in ((cc.ATTN_SMALL_COST, "shakespeare-cem-attn", "shakespeare-llama"),
                        (cc.MLP_HIGHER, "shakespeare-cem-mlp", "shakespeare-llama"),
                        (cc.MLP_PM_BETTER, "shakespeare-cem-mlp-pm", "shakespeare-cem-mlp")):
        v = decide(claim, vals[a], vals[b])
        assert v.n == len(vals[a]) and not v.provisional
        # the sampled final_val_loss is not what decides
        assert v.estimate.mean != pytest.approx(
            sum(r["metrics"]["final_val_loss"] for r in runs[a]) / len(runs[a])
            - sum(r["metrics"]["final_val_loss"] for r in runs[b]) / len(runs[b]), abs=1e-9)


def test_setup_differences_names_what_differs_outside_the_model():
    a = {"config": {"data": {"name": "shakespeare"}, "model": {"attn": "cem"},
                    "train": {"seed": 0, "max_steps": 600, "batch_size": 32, "context_length": 64},
                    "optim": {"lr": 3e-3, "beta1": 0.9, "beta2": 0.95, "weight_decay": 0.1,
                              "warmup_steps": 60, "min_lr_ratio": 0.1}}}
    b = copy.deepcopy(a)
    b["config"]["model"]["attn"] = "llama"
    assert setup_differences(a, b) == {}
    b["config"]["train"]["max_steps"] = 5000
    b["config"]["optim"]["lr"] = 1e-3
    assert setup_differences(a, b) == {"train.max_steps": (600, 5000), "optim.lr": (3e-3, 1e-3)}


@pytest.mark.skipif(not (BLOCKS.parent / "shakespeare_llama_gpu.json").is_file(), reason="not stored")
def test_the_stored_gpu_llama_run_is_another_setup_than_the_gpu_preset():
    """The one stored GPU run is a 5,000-step run; the gpu preset now stops at 900 steps, so a
    chapter that trains the preset live must not compare the two as one setup."""
    from cemlib.train import get_config
    stored = load_results(BLOCKS.parent / "shakespeare_llama_gpu.json")
    live = {"config": get_config("shakespeare-cem-attn", "gpu").to_dict()}
    assert "train.max_steps" in setup_differences(live, stored)
