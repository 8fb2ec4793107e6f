"""The CEM paper's language-model claims, each written once as a :class:`~cemlib.evidence.verdict.Claim`.

The paper :cite:`cem2025,cem2026iclr` reports its language-model results only in figures (section
4, Figs. 2-3), so each claim below is the paper's sentence about a figure, with where it is, and the
test the book fixed before looking at the runs: which difference of validation losses (nats per
character, CEM minus baseline unless said otherwise), on which side of which threshold, and why.

Chapters 2, 3 and 5 test some of the same claims on the same stored runs
(``book/results/shakespeare_blocks_cpu``); taking the claim from here, and the verdict from
:func:`cemlib.evidence.verdict.decide`, gives the same data the same verdict in every chapter.

Claims that exist in two wordings (arXiv and ICLR version) share a ``finding``, so that
:func:`~cemlib.evidence.verdict.tally` counts them once. Parameter-count claims are read on a ratio
that no seed changes (:func:`~cemlib.evidence.verdict.decide_exact`).
"""

from __future__ import annotations

from cemlib.evidence.verdict import Claim

__all__ = ["SMALL", "SMALL_WHY", "LOSS", "ATTN_HALF_PARAMS", "MLP_TWO_THIRDS", "MLP_PM_SAME_COUNT",
           "ATTN_SMALL_COST", "MLP_HIGHER", "MLP_PM_BETTER", "RECURSION_ATTN", "RECURSION_MLP",
           "RECURSIVE_ATTN_BEATS_LLAMA", "RECURSIVE_MLP_BELOW_LLAMA", "REUSE_LLAMA", "REUSE_CEM",
           "RECURSION_BEATS_REUSE", "DIAGONAL_ESSENTIAL", "SHARED_CLOSE_TO_PER_HEAD",
           "PRECOND_DIAG_ARXIV", "PRECOND_DPLR_ARXIV", "PRECOND_DIAG_ICLR", "PRECOND_DPLR_ICLR",
           "T3_NO_GAIN", "OPTIMUM_COMPARABLE", "OPTIMUM_SLIGHTLY_BETTER", "HIGHER_LR_ARXIV",
           "HIGHER_LR_ICLR", "LANGUAGE_MODEL_CLAIMS"]

#: the book's reading of "small", "close", "marginal", "comparable": 0.05 nats per character
SMALL = 0.05
SMALL_WHY = ("'small': 0.05 nats/char, a 5 % change of perplexity (exp(0.05) = 1.051), fixed in "
             "Chapter 2 before its first run")
_SIGN = "a direction: the sign of the difference decides"
LOSS = "validation loss, nats/char"

# ---------------------------------------------------------------- parameter counts (no seed)
ATTN_HALF_PARAMS = Claim(
    "CEM attention uses about half the parameters [of its Llama counterpart]", "section 4.1",
    "equivalent", 0.01, "'about': within 0.01 of 1/2; the shared diagonal and the biases add "
    "(D_h + 2K) / (4 D_h^2)", metric="CEM / Llama attention parameters", target=0.5)
MLP_TWO_THIRDS = Claim(
    "CEM MLPs [use] about two-thirds [of the parameters] of their Llama counterparts", "section 4.1",
    "equivalent", 0.01, "'about': within 0.01 of 2/3", metric="CEM / SwiGLU MLP parameters",
    target=2 / 3)
MLP_PM_SAME_COUNT = Claim(
    "increasing the hidden dimension to match parameter count", "section 4.1, Fig. 2b",
    "equivalent", 0.01, "'match': within 1 % of the SwiGLU count",
    metric="CEM MLP at D_v = 1.5 D_m / SwiGLU MLP parameters", target=1.0)

# ---------------------------------------------------------------- sublayer replacement (Fig. 2a, 2b)
ATTN_SMALL_COST = Claim(
    "Replacing attention with the CEM variant has only a small effect on test perplexity despite "
    "halving the parameter count", "section 4.1, Fig. 2a", "not higher", SMALL, SMALL_WHY,
    metric=f"CEM attention - Llama, {LOSS}")
MLP_HIGHER = Claim(
    "For CEM-MLPs, perplexity is higher due to parameter sharing", "section 4.1, Fig. 2b", "higher",
    0.0, _SIGN, metric=f"CEM MLP - SwiGLU, {LOSS}")
MLP_PM_BETTER = Claim(
    "increasing the hidden dimension to match parameter count yields consistent, albeit modest, "
    "improvements in perplexity", "section 4.1, Fig. 2b", "lower", 0.0, _SIGN,
    metric=f"parameter-matched - dimension-matched CEM MLP, {LOSS}")

# ---------------------------------------------------------------- recursion and preconditioners (Fig. 2c, 2d)
RECURSION_ATTN = Claim(
    "Increasing recursion from T=1 to T=2 consistently improves CEM layers", "section 4.2, Fig. 2c "
    "(attention)", "lower", 0.0, _SIGN, metric=f"CEM attention T=2 - T=1, {LOSS}")
RECURSION_MLP = Claim(
    "Increasing recursion from T=1 to T=2 consistently improves CEM layers", "section 4.2, Fig. 2d "
    "(MLP)", "lower", 0.0, _SIGN, metric=f"CEM MLP T=2 - T=1, {LOSS}")
RECURSIVE_ATTN_BEATS_LLAMA = Claim(
    "for attention, recursive CEM variants can outperform the Llama baseline while using fewer "
    "parameters", "section 4.2, Fig. 2c", "lower", 0.0, _SIGN,
    metric=f"CEM attention T=2 - Llama, {LOSS}")
RECURSIVE_MLP_BELOW_LLAMA = Claim(
    "For MLPs, CEM variants remain below the baseline", "section 4.2, Fig. 2d", "higher", 0.0, _SIGN,
    metric=f"CEM MLP T=2 - SwiGLU, {LOSS}")
PRECOND_DIAG_ARXIV = Claim(
    "Learned preconditioners, by contrast, contribute only marginally", "section 4.2, Figs. 2c, 2d "
    "(arXiv)", "equivalent", SMALL, SMALL_WHY, metric=f"diagonal P - none, full CEM T=2, {LOSS}",
    finding="preconditioner, diagonal")
PRECOND_DPLR_ARXIV = Claim(
    "Learned preconditioners, by contrast, contribute only marginally", "section 4.2, Figs. 2c, 2d "
    "(arXiv)", "equivalent", SMALL, SMALL_WHY, metric=f"DPLR P - none, full CEM T=2, {LOSS}",
    finding="preconditioner, DPLR")
PRECOND_DIAG_ICLR = Claim(
    "Preconditioners have little effect at T = 1 but yield clear improvements at T = 2",
    "section 4.2, Figs. 2c, 2d (ICLR)", "lower", 0.0, _SIGN,
    metric=f"diagonal P - none, full CEM T=2, {LOSS}", finding="preconditioner, diagonal")
PRECOND_DPLR_ICLR = Claim(
    "Preconditioners have little effect at T = 1 but yield clear improvements at T = 2",
    "section 4.2, Figs. 2c, 2d (ICLR)", "lower", 0.0, _SIGN,
    metric=f"DPLR P - none, full CEM T=2, {LOSS}", finding="preconditioner, DPLR")
T3_NO_GAIN = Claim(
    "We did not observe consistent gains for T >= 3", "section 4.2 (arXiv)", "not lower", SMALL,
    SMALL_WHY + "; a gain smaller than that is no gain", metric=f"full CEM T=3 - T=2, {LOSS}")

# ---------------------------------------------------------------- ablations (Figs. 3b, 3c, 4)
DIAGONAL_ESSENTIAL = Claim(
    "Including a diagonal term proves essential for good performance", "section 4.4, Fig. 3b",
    "higher", 0.0, _SIGN, metric=f"no diagonal - shared diagonal, CEM attention, {LOSS}")
SHARED_CLOSE_TO_PER_HEAD = Claim(
    "our shared-diagonal strategy provides performance close to per-head diagonals",
    "section 4.4, Fig. 3b", "equivalent", SMALL, SMALL_WHY,
    metric=f"per-head - shared diagonal, CEM attention, {LOSS}")
REUSE_LLAMA = Claim(
    "Simply reapplying the same residual block yields little or no perplexity gain",
    "section 4.4, Figs. 3c, 4 (Llama)", "not lower", SMALL, SMALL_WHY + "; less gain than that is "
    "'little'", metric=f"Llama reused x2 - once, {LOSS}")
REUSE_CEM = Claim(
    "Simply reapplying the same residual block yields little or no perplexity gain",
    "section 4.4, Figs. 3c, 4 (CEM)", "not lower", SMALL, SMALL_WHY + "; less gain than that is "
    "'little'", metric=f"full CEM reused x2 - once, {LOSS}")
RECURSION_BEATS_REUSE = Claim(
    "In contrast, CEM-based within-layer recursion produces consistent improvements",
    "section 4.4, Figs. 3c, 4", "lower", 0.0, _SIGN,
    metric=f"full CEM recursion T=2 - reuse x2, {LOSS}")

# ---------------------------------------------------------------- the learning-rate sweep (Fig. 3a)
OPTIMUM_COMPARABLE = Claim(
    "End-to-end CEM models train stably and achieve perplexity comparable to the corresponding "
    "Llama baselines", "section 4.3, Fig. 3a (arXiv)", "equivalent", SMALL, SMALL_WHY,
    metric=f"full CEM (T=2, DPLR P) - Llama, each at its Akima optimum, {LOSS}",
    finding="Fig. 3a, loss at the optimum")
OPTIMUM_SLIGHTLY_BETTER = Claim(
    "full CEM Transformer achieves slightly better performance at their optimal learning rate",
    "section 4.3, Fig. 3a (ICLR)", "lower", 0.0, _SIGN,
    metric=f"full CEM (T=2, DPLR P) - Llama, each at its Akima optimum, {LOSS}",
    finding="Fig. 3a, loss at the optimum")
HIGHER_LR_ARXIV = Claim(
    "CEM models may prefer higher learning rates", "section 4.3, Fig. 3a (arXiv)", "higher", 0.5,
    "half a step of the learning-rate grid, which doubles: closer optima are not told apart",
    metric="log2(optimal learning rate), CEM - Llama", finding="Fig. 3a, optimal learning rate")
HIGHER_LR_ICLR = Claim(
    "CEM models tend to favor higher learning rates than their Llama counterparts",
    "section 4.3, Fig. 3a (ICLR)", "higher", 0.5,
    "half a step of the learning-rate grid, which doubles: closer optima are not told apart",
    metric="log2(optimal learning rate), CEM - Llama", finding="Fig. 3a, optimal learning rate")

#: every claim of this module, in the order of the paper
LANGUAGE_MODEL_CLAIMS = (ATTN_HALF_PARAMS, MLP_TWO_THIRDS, MLP_PM_SAME_COUNT, ATTN_SMALL_COST, MLP_HIGHER,
                         MLP_PM_BETTER, RECURSION_ATTN, RECURSION_MLP, RECURSIVE_ATTN_BEATS_LLAMA,
                         RECURSIVE_MLP_BELOW_LLAMA, PRECOND_DIAG_ARXIV, PRECOND_DPLR_ARXIV,
                         PRECOND_DIAG_ICLR, PRECOND_DPLR_ICLR, T3_NO_GAIN, OPTIMUM_COMPARABLE,
                         OPTIMUM_SLIGHTLY_BETTER, HIGHER_LR_ARXIV, HIGHER_LR_ICLR, DIAGONAL_ESSENTIAL,
                         SHARED_CLOSE_TO_PER_HEAD, REUSE_LLAMA, REUSE_CEM, RECURSION_BEATS_REUSE)
