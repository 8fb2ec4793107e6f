"""The appendix "How this book checks claims" (book/claims_protocol.md) is a markdown page: its
numbers are typed, so this test recomputes each of them with cemlib and finds it on the page."""

import re
from pathlib import Path

import pytest
from scipy import stats

from cemlib.evidence import cem_claims as cc
from cemlib.evidence.stats import paired, t_quantile
from cemlib.evidence.verdict import OBSERVED, decide, seed_values
from cemlib.models.params import TABLE1
from cemlib.train.results import load_runs

ROOT = Path(__file__).resolve().parents[2]
PAGE = ROOT / "book" / "claims_protocol.md"
BLOCKS = ROOT / "book" / "results" / "shakespeare_blocks_cpu"


def _page() -> str:
    return " ".join(PAGE.read_text(encoding="utf-8").split())      # line breaks read as spaces


def _minus(x: float, digits: int = 4) -> str:
    return f"{x:.{digits}f}".replace("-", "\u2212")


def test_the_bands_on_the_page_are_the_librarys():
    page = _page()
    lo, hi = sorted(nominal for *_, nominal in TABLE1.values())[::3]
    for text in (f"$\\ln {cc.SMALL_PERPLEXITY} = {cc.SMALL_PER_TOKEN:.4f}$ nats per token",
                 f"about {cc.BYTES_PER_TOKEN:.2f} bytes per token",
                 f"${cc.SMALL_PER_TOKEN:.4f} / {cc.BYTES_PER_TOKEN:.2f} = {cc.SMALL:.4f}$ nats per character",
                 f"| $\\times {cc.SMALL_PERPLEXITY}$ | {cc.SMALL_PER_TOKEN:.4f} | {cc.SMALL:.4f} |",
                 f"| $\\times {cc.perplexity_ratio(0.05):.3f}$ | {0.05 * cc.BYTES_PER_TOKEN:.3f} | 0.05 |",
                 f"a {100 * (cc.perplexity_ratio(0.05) - 1):.0f} % change of the paper's perplexity",
                 f"{lo / 1e6:.0f}–{hi / 1e6:.0f} million parameters",
                 f"{cc.LLAMA_TRAINING_TOKENS / 1e12:.1f} trillion training tokens"):
        assert text in page, text


@pytest.mark.skipif(not BLOCKS.is_dir(), reason="the recorded runs are not in this checkout")
def test_the_worked_example_is_recomputed():
    page = _page()
    runs = load_runs(BLOCKS)
    pm, m = (seed_values(runs[k], "loss") for k in ("shakespeare-cem-mlp-pm", "shakespeare-cem-mlp"))
    for s in sorted(pm):
        row = f"| {s} | {pm[s]:.4f} | {m[s]:.4f} | {_minus(pm[s] - m[s])} |"
        assert row in page, row
    e = paired(pm, m)
    assert e.n == 5 and f"$t = {t_quantile(e.n):.3f}$" in page and f"$n - 1 = {e.n - 1}$" in page
    assert (f"{e.mean:.4f} \\pm {t_quantile(e.n):.3f} \\times {e.std:.4f}/\\sqrt {e.n} = "
            f"[{e.low:.4f},\\ {e.high:.4f}]") in page
    welch = stats.ttest_ind(list(pm.values()), list(m.values()), equal_var=False).confidence_interval()
    half = (welch.high - welch.low) / 2
    assert f"$\\pm {half:.4f}$ instead of $\\pm {e.half_width:.4f}$" in page and half > 2 * e.half_width
    assert f"the difference moves by only {e.std:.4f}" in page
    spread = [stats.tstd(list(v.values())) for v in (pm, m)]
    assert all(abs(x - 0.017) < 0.0015 for x in spread) and "about 0.017 from seed to seed" in page
    for k, name in (("shakespeare-cem-mlp-pm", "parameter-matched"), ("shakespeare-cem-mlp", "dimension-matched")):
        assert f"{runs[k][0]['num_parameters']:,} parameters" in page
        assert {r["config"]["train"]["max_steps"] for r in runs[k]} == {600} and "for 600 steps" in page
        assert {r["device"]["label"] for r in runs[k]} == {"CPU"} and "Our CPU runs" in page
    # the claim's words are the module's, and its answer is the one the page gives
    assert cc.MLP_PM_BETTER.words in page
    v = decide(cc.MLP_PM_BETTER, pm, m)
    assert v.verdict == OBSERVED and "below 0" in v.reason and "as the paper reports for its models" in v.reason
    assert "interval lies below zero" in page and "*observation at our scale*, not *agree*" in page


def test_the_page_shows_no_process_and_holds_the_rules_label():
    text = PAGE.read_text(encoding="utf-8")
    for word in ("campaign", "session", "STORED", "stored sweep", "not yet run"):
        assert word.lower() not in text.lower(), word
    assert not re.search(r"\b[0-9a-f]{7,40}\b", text)
    assert not re.search(r"\b[CH]\d{1,2}\b", text)                 # internal claim IDs
    assert text.startswith("(verdict-rule)=\n# ")
    intro = (ROOT / "book" / "intro.md").read_text(encoding="utf-8")
    assert "(verdict-rule)=" not in intro and "{doc}`claims_protocol`" in intro
    assert "before the runs are made" not in intro and "before the runs are made" not in text
    assert "book/claims_protocol" in (ROOT / "_toc.yml").read_text()
