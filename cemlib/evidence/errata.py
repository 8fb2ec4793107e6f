"""The errata of the four papers the book follows, as data.

One registry, one page: the book's appendix "Errata of the four papers" (``book/errata.ipynb``)
renders these entries as its tables and proves every entry whose evidence is computable in a cell
of its own; that cell calls ``cemlib`` and fails if the correction were wrong. This module holds no proof: only where each error is, what is printed, what is correct, how we
know, and where else the book and the unit tests show it.

Fields of :class:`Erratum`:

- ``id``: a short unique slug, ``<paper>-<what>``; the appendix cell that proves the entry calls
  ``proved("<id>")``.
- ``paper``: the key of the paper in ``book/references.bib`` (the CEM paper has two versions,
  ``cem2025`` (arXiv) and ``cem2026iclr`` (ICLR submission); an error in both is filed under
  ``cem2025`` with ``version="both"``).
- ``version``: for CEM, ``"arXiv"``, ``"ICLR"`` or ``"both"``; empty for the single-version papers.
- ``where``: section, equation, page element, as the paper numbers them.
- ``printed`` / ``correct``: what the paper says and what is right (MyST markdown, math allowed).
- ``evidence``: how we know, one of :data:`EVIDENCE`.
- ``how``: one line on the proof.
- ``chapter`` / ``label``: the book chapter that discusses it (file name without suffix) and the
  MyST target of its erratum there (both empty when no chapter does).
- ``tests``: ids of ``cemlib`` unit tests that also show it, ``"test_file.py::test_function"``.
- ``status``: one of :data:`STATUS`, which the page groups in three kinds (:data:`KINDS`) and the
  items that are no errors:

  - ``"error"``, a **substantive error**: a printed statement (a formula, a claim, a proof step) is
    false, and a reader who followed it would compute or believe something wrong;
  - ``"slip"``, a **typesetting slip**: a sign, index, label, symbol or factor typo, a reporting slip
    in a table, or a strict inequality where only the non-strict one holds, whose intended meaning
    is clear from the paper itself (another equation, the other version, the code it describes);
  - ``"ambiguity"`` (the text admits more than one reading, changes its notation, or leaves out what
    a reader needs to reproduce it, without printing anything false) and ``"stated choice"`` (the
    authors say it is a choice: a surrogate, an example, a convention; we record what it implies),
    together the **ambiguities and stated choices**;
  - ``"not an error"``: an item that looks like an error, or that an earlier reading of ours
    overstated (a property of a design, a finding the paper reports as one), with the reason.
- ``why``: for an ambiguity or a stated choice, why it is not an error (the page shows it).
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

PAPERS = {  # family -> (title on the page, bib keys)
    "CEM": ("Causal Energy Minimization (CEM), arXiv and ICLR versions", ("cem2025", "cem2026iclr")),
    "NRGPT": ("NRGPT", ("nrgpt2025",)),
    "Intrinsic optimizers": ("Transformers as intrinsic optimizers (Helmholtz / Newton attention)",
                             ("intrinsic2025",)),
    "Hyper-SET": ("Hyper-SET", ("hyperset2025",)),
}

EVIDENCE = {
    "symbolic": "an exact identity (SymPy, or exact algebra checked in float64)",
    "counterexample": "a concrete instance where the printed statement fails",
    "measured": "a number computed from the model or from the paper's own numbers",
    "reading": "nothing to compute: notation, wording, typesetting or reporting",
}

STATUS = ("error", "slip", "ambiguity", "stated choice", "not an error")
#: what each status means, as the page says it
STATUS_TEXT = {
    "error": "a printed statement is false, and following it gives a wrong result",
    "slip": "a sign, index, label or factor typo, a table slip, or a strict inequality where only the "
            "non-strict one holds, whose intended meaning is clear from the paper itself",
    "ambiguity": "the text admits more than one reading, changes its notation, or leaves out what a reader "
                 "needs to reproduce it, without printing anything false",
    "stated choice": "the authors say it is a choice (a surrogate, an example, a convention); we record what "
                     "the choice implies",
    "not an error": "it looks like an error, or an earlier reading of ours called it one, and it is not",
}
#: the three kinds of the page (and the statuses each one groups), in the order the page counts them
KINDS = {
    "substantive errors": ("error",),
    "typesetting slips": ("slip",),
    "ambiguities and stated choices": ("ambiguity", "stated choice"),
}


@dataclass(frozen=True)
class Erratum:
    id: str
    paper: str
    where: str
    printed: str
    correct: str
    evidence: str
    how: str
    version: str = ""
    chapter: str = ""
    label: str = ""
    tests: tuple[str, ...] = ()
    status: str = "error"
    why: str = ""

    def __post_init__(self):
        if self.status not in STATUS:
            raise ValueError(f"{self.id}: status must be one of {STATUS}, got {self.status!r}")
        if self.status in ("ambiguity", "stated choice") and not self.why.strip():
            raise ValueError(f"{self.id}: an {self.status} needs its why (why it is not an error)")

    @property
    def family(self) -> str:
        """The paper family (a key of :data:`PAPERS`)."""
        return next(f for f, (_, keys) in PAPERS.items() if self.paper in keys)

    @property
    def kind(self) -> str:
        """The page's kind of the entry (a key of :data:`KINDS`), or ``"not an error"``."""
        return next((k for k, sts in KINDS.items() if self.status in sts), "not an error")

    @property
    def computable(self) -> bool:
        """True when the appendix must prove the entry in a cell."""
        return self.evidence != "reading"


def _e(*args, **kw) -> Erratum:
    return Erratum(*args, **kw)


_CEM, _CEMI = "cem2025", "cem2026iclr"
_NR, _IO, _HS = "nrgpt2025", "intrinsic2025", "hyperset2025"

ERRATA: tuple[Erratum, ...] = (
    # ------------------------------------------------------------------ CEM (both versions)
    _e("cem-lse-convex", _CEM, "App. C",
       r"$-\tau\log\sum_j\exp(\frac1\tau\mathbf h_j^\top\mathbf x)$ is “convex in $\mathbf x$”, and its "
       r"CCCP updates give $\mathbf x'=\sum_j\mathrm{softmax}_j(\cdot)\,\mathbf h_j$",
       r"it is **concave** (Hessian $=-\frac1\tau\mathrm{Cov}\preceq0$); the quoted update is CCCP on "
       r"Ramsauer et al.'s energy, which adds $\frac12\lVert\mathbf x\rVert^2$",
       "symbolic", "SymPy Hessian of the log-sum-exp term is minus a covariance; float64 eigenvalues",
       version="both", chapter="ch02_attention_gradient_step", label="ch02-erratum-lse-concave",
       tests=("test_cem_energies.py::test_interaction_energy_is_concave_so_every_step_descends",
              "test_cem_energies.py::test_hopfield_quadratic_term_removes_the_residual")),
    _e("cem-sign-variant-convex", _CEM, "App. C",
       r"the sign-corrected element-wise energy $-|\boldsymbol\gamma|^\top\phi(\mathrm{diag}(\mathrm{sign}\,"
       r"\boldsymbol\gamma)\mathbf V\mathbf x)$ is convex for convex $\phi$",
       r"it is **concave** for convex $\phi$ (a non-negative combination of $-\phi$), so CCCP does not apply",
       "symbolic", "Hessian $-\\mathbf V^\\top\\mathrm{diag}(|\\gamma|\\phi'')\\mathbf V$; eigenvalues with $\\phi$ = ∫ReLU",
       version="both", chapter="ch03_gated_mlp_gradient_step", label="ch03-erratum-sign-variant",
       tests=("test_cem_energies.py::test_appendix_c_sign_variant_is_concave_not_convex",)),
    _e("cem-attention-scale", _CEM, "eq. 1, eq. 5 vs App. A.1",
       r"arXiv: $1/\sqrt{D_r}$ in eq. 1 and $\tau=\sqrt{D_r}$ in eq. 5, but $1/\sqrt{D_h}$ in App. A.1",
       r"one scale throughout (the ICLR version uses $\sqrt{D_h}$ everywhere); the two give different "
       r"layers for the same weights",
       "counterexample", "the same weights read with the other $\\tau$ change the update",
       version="arXiv", chapter="ch02_attention_gradient_step", label="ch02-erratum-attention-scale",
       status="ambiguity",
       why=r"two scales are printed for one layer ($\sqrt{D_r}$ in eqs. 1 and 5, $\sqrt{D_h}$ in App. A.1; the ICLR "
           r"version prints $\sqrt{D_h}$ throughout); each is a consistent layer, and which one the "
           r"experiments used cannot be told from the paper"),
    _e("cem-alibi-sign", _CEMI, "App. B",
       r"$b_{ijk}=+m_k|i-j|$ (and $+m_k|i-j|+b_{i=j}+b_{i\neq j}$)",
       r"$b_{ijk}=-m_k|i-j|$, as in ALiBi and the arXiv version",
       "counterexample", "with the printed sign the weights grow with distance",
       version="ICLR", chapter="ch02_attention_gradient_step", label="ch02-erratum-alibi-sign",
       tests=("test_cem_energies.py::test_alibi_sign_arxiv_prefers_near_tokens",),
       status="slip"),
    _e("cem-alibi-slopes", _CEM, "App. B",
       r"slopes “geometric, e.g. $m_k=2^{-k}$”",
       r"ALiBi's rule is $m_k=2^{-8k/K}$; it equals $2^{-k}$ only for $K=8$ (the paper's models have $K=12$)",
       "measured", "the two rules compared for $K=4,6,8,12$",
       version="both", chapter="ch02_attention_gradient_step", label="ch02-erratum-alibi-slopes",
       tests=("test_attention_gradient_step.py::test_geometric_slopes_are_two_to_minus_8k_over_K_for_every_K",),
       status="ambiguity",
       why="the paper gives $2^{-k}$ as an example (“e.g.”) of a geometric sequence, not as its rule; the "
           "example and ALiBi's rule differ for its $K=12$ models, and the paper does not say which slopes "
           "it used"),
    _e("cem-rope-memory", _CEM, "App. B",
       r"with RoPE “the value projection effectively becomes query-dependent”, which “substantially "
       r"increases memory costs”",
       r"the aggregated values are the rotated keys $\mathbf R(j)\mathbf k_j$, independent of $i$: one "
       r"cache per token, as without RoPE; the query rotation $\mathbf R(i)^\top$ acts after the sum",
       "symbolic", "gradient from a cache of rotated keys equals autograd of the RoPE energy",
       version="both", chapter="ch02_attention_gradient_step", label="ch02-erratum-rope-cache",
       tests=("test_cem_energies.py::test_rope_interaction_gradient_values_are_rotated_keys",)),
    _e("cem-diag-value-path", _CEM, "eq. 12, Algorithm 1",
       r"with $\mathbf A_k=\mathrm{diag}(\mathbf d_k)+\mathbf W_k^{Q\top}\mathbf W^K_k$, Algorithm 1 puts "
       r"the diagonal only into the logits",
       r"the gradient has a second term $\mathrm{diag}(\mathbf d_k)\sum_j\alpha^k_{ij}\mathbf h_j$; without "
       r"it the layer is not a gradient step on its energy",
       "symbolic", "exact layer equals autograd; Algorithm 1's layer does not",
       version="both", chapter="ch04_beyond_one_step", label="ch04-erratum-diag-value",
       tests=("test_cem_energies.py::test_algorithm1_diag_form_is_not_the_gradient",
              "test_cem_attention.py::test_paper_diag_form_differs_by_the_diagonal_value_path")),
    _e("cem-one-third", _CEMI, "captions of Fig. 3a and Fig. 5",
       "CEM models have “one-third the MLP parameters”",
       "two thirds ($2D_hD_v/3D_hD_m$ at $D_v=D_m$), as the ICLR text and the arXiv caption say",
       "measured", "MLP parameter ratio of the four Table 1 models",
       version="ICLR", chapter="ch03_gated_mlp_gradient_step", label="ch03-erratum-one-third",
       tests=("test_cem_models.py::test_half_attention_two_thirds_mlp",),
       status="slip"),
    _e("cem-eq15-label", _CEMI, "eq. 15",
       r"the preconditioned MLP update is written $\Delta\mathbf x^{\epsilon}_i$ (the attention symbol)",
       r"$\Delta\mathbf x^{\xi}_i$, as in the arXiv version",
       "reading", "a label typo",
       version="ICLR", chapter="ch04_beyond_one_step", label="ch04-erratum-eq15-label",
       status="slip"),
    _e("cem-precond-pd", _CEMI, "§2.3",
       r"$\mathbf P=\mathrm{diag}(\mathrm{softplus}(\mathbf d))+\mathbf U\mathbf V^\top+\mathbf V\mathbf U^\top$ "
       r"is “low-rank positive-definite”; softplus “guarantees $\mathbf P\succ0$”",
       r"$\mathbf U\mathbf V^\top+\mathbf V\mathbf U^\top$ has eigenvalues $\mathbf u^\top\mathbf v\pm"
       r"\lVert\mathbf u\rVert\lVert\mathbf v\rVert$: $\mathbf P$ can be indefinite (the arXiv version drops the claim)",
       "counterexample", "$\\mathbf v=-\\mathbf u$, $\\lVert\\mathbf u\\rVert=1$ gives $\\lambda_{\\min}=\\mathrm{softplus}(1)-2<0$",
       version="ICLR", chapter="ch04_beyond_one_step", label="ch04-erratum-precond-pd",
       tests=("test_preconditioner.py::test_counterexample_p_is_not_positive_definite",
              "test_preconditioner.py::test_rank1_spectrum_formula")),
    _e("cem-per-head-precond", _CEM, "eq. 14",
       r"one preconditioner per head, $\Delta\mathbf x=\sum_k\mathbf P_k\nabla\mathcal E_k$, trained “to provide "
       r"lightweight curvature information”",
       r"not an error but a property of the design, which the paper does not discuss: the update is "
       r"$\mathbf P\nabla\mathcal E$ for no state-independent matrix $\mathbf P$ (unless all $\mathbf P_k$ are "
       r"equal), and the cross terms $\nabla\mathcal E_l^\top\mathbf P_k\nabla\mathcal E_k$, $k\neq l$, can make it "
       r"an ascent direction even when every $\mathbf P_k\succ0$. The paper promises no descent",
       "counterexample", "positive diagonal $\\mathbf P_k$ found whose step raises a token's energy",
       version="both", chapter="ch04_beyond_one_step", label="ch04-erratum-per-head-precond",
       tests=("test_preconditioner.py::test_per_head_preconditioning_is_not_a_descent_direction",),
       status="not an error"),
    _e("cem-eq16-index", _CEM, "eqs. 16–17",
       r"$\mathbf x^{(t+1)}_i=\mathbf x^{(t)}_i-\eta\,\Delta\mathbf x_i(\mathbf x_i\mid\mathbf h_{1:i})$, with "
       r"$\Delta\mathbf x$ defined at $\mathbf x_i=\mathbf h_i$",
       r"the update is evaluated at the current iterate $\mathbf x^{(t)}_i$",
       "reading", "a missing iteration index",
       version="both", chapter="ch04_beyond_one_step", label="ch04-erratum-eq16-index",
       status="slip"),
    _e("cem-rmsnorm-not-gradient", _CEM, "Algorithm 1",
       r"the recursion is presented as gradient descent on the energy",
       r"the gradient is taken at $\mathrm{RMSNorm}(\mathbf x^{(t)})$ and applied to $\mathbf x^{(t)}$; the "
       r"gradient of $\mathcal E(\mathrm{RMSNorm}(\mathbf x))$ has the Jacobian $\mathbf J^\top$ in front",
       "measured", "median gap between the update and the true gradient, with autograd as oracle",
       version="both", chapter="ch04_beyond_one_step", label="ch04-erratum-rmsnorm-gradient",
       tests=("test_cem_attention.py::test_query_norm_update_drops_the_rmsnorm_jacobian",
              "test_cem_mlp.py::test_query_norm_update_drops_the_rmsnorm_jacobian")),
    _e("cem-alg1-residual", _CEMI, "Algorithm 1",
       r"the box overwrites $\mathbf h_{1:i}$ with $\mathrm{RMSNorm}(\mathbf h_{1:i})$ and starts the loop at "
       r"$\mathbf x_i=\mathbf h_i$, so the residual stream is renormalised by every sublayer",
       r"the pre-norm reading: the residual starts at the raw $\mathbf h_i$, and $T=1$ is then exactly a tied "
       r"pre-norm Llama layer, the block the experiments replace",
       "counterexample", "the literal reading gives a different layer",
       version="ICLR", chapter="ch05_cem_transformer", label="ch05-erratum-alg1-residual", tests=("test_cem_attention.py::test_t1_is_pre_norm_tied_attention",),
       status="ambiguity",
       why="Algorithm 1 is pseudo-code with two readings: literally its first line overwrites the residual stream "
           "with its normalised copy; in the pre-norm reading it does not, and $T=1$ is then the tied Llama "
           "block the experiments replace. The paper does not say which one was run"),
    _e("cem-table3-flops", _CEMI, "Table 3 caption",
       "FLOPs are reported “per forward pass”",
       "per forward pass of **100 inputs**: one input costs about 1/100 of the printed numbers",
       "measured", "Table 3's slope in $T$ divided by one CEM step of one input is 100",
       version="ICLR", chapter="ch06_recursion_regression", label="ch06-erratum-flops-batch",
       status="ambiguity",
       why="“per forward pass” is true of a pass over a batch; the caption leaves out the batch size (100), "
           "which the numbers imply"),
    _e("cem-effective-batch", _CEMI, "Table 2 and App. D",
       "8 sequences per GPU, gradient accumulation 4, 8 A100 GPUs, effective batch 128",
       "$8\\times4\\times8=256$; an effective batch of 128 needs 4 GPUs per run (or another per-GPU batch)",
       "measured", "the product of the paper's own numbers",
       version="ICLR", chapter="ch05_cem_transformer", label="ch05-erratum-effective-batch",
       status="ambiguity",
       why="App. D says the experiments ran on “a cluster of 8 A100 GPUs”, not that each run used all eight;"
           " with 4 GPUs per run the three numbers agree. The GPUs per run are not stated"),
    _e("cem-fig4-settings", _CEMI, "Fig. 4 caption",
       "“under three settings”, then lists two",
       "two settings (the arXiv caption)",
       "reading", "a caption typo", version="ICLR", chapter="ch05_cem_transformer",
       label="ch05-note-versions",
       status="slip"),
    _e("cem-eta-notation", _CEM, "§2.1, after eq. 5",
       r"“$\eta^\epsilon=1$”", r"$\eta_\epsilon=1$ (the step size of eq. 4)",
       "reading", "a notation slip", version="both",
       status="slip"),
    # CEM: not errors
    _e("cem-self-cross-bias", _CEM, "App. B (self/cross biases)",
       r"two learnable biases $b_{i=j}$ and $b_{i\neq j}$",
       r"correct, but only $b_{i=j}-b_{i\neq j}$ matters (softmax is shift invariant): one parameter is redundant",
       "symbolic", "shifting both biases by a constant leaves the layer unchanged",
       version="both", chapter="ch02_attention_gradient_step", status="not an error",
       tests=("test_cem_energies.py::test_self_cross_bias_only_difference_matters",)),
    _e("cem-branch-naming", _CEM, "eq. 6",
       "the nonlinearity sits on the branch called *up*, the linear branch is the *gate*",
       "not an error: Llama names them the other way round (`gate_proj` carries SiLU); the CEM tying is "
       "`down_proj` $=$ `gate_proj`$^\\top$ in Llama's names",
       "reading", "a naming difference between papers",
       version="both", chapter="ch03_gated_mlp_gradient_step", label="ch03-note-branch-naming",
       status="not an error"),
    _e("cem-t3-unstable", _CEMI, "§4.2",
       "“$T\\ge3$ has unstable performance and leads to OOM”",
       "not checkable at our scale and not an error; the arXiv version softens it, and on the regression "
       "task of Table 3 the recursion is stable up to $T=8$",
       "reading", "a version difference", version="ICLR",
       chapter="ch06_recursion_regression", label="ch06-note-t3", status="not an error"),
    # ------------------------------------------------------------------ NRGPT
    _e("nrgpt-rows-columns", _NR, "§1 vs §2",
       r"$\mathbf x$ is $N\times D$ in §1 and $D\times N$ in §2", "one convention (cemlib: rows)",
       "reading", "notation only",
       status="ambiguity",
       why="a change of convention between sections; each section is consistent in itself"),
    _e("nrgpt-beta-clash", _NR, "eq. 26, App. E.2",
       r"the normalisation gain/bias is called $\beta$, like the inverse temperature",
       "two symbols (cemlib: `gain`/`bias` and `beta`)", "reading", "notation only",
       status="ambiguity",
       why="one symbol for two quantities, told apart by their context; nothing printed is false"),
    _e("nrgpt-eq4-residual", _NR, "§2, eq. 4",
       r"$\mathbf x^{(t+1)}=\mathbf x^{(t)}+\mathrm{FF}[\mathrm{LN}(\mathbf x^{(t)}+\mathrm{AT}(\mathrm{LN}\,\mathbf x^{(t)}))]$",
       r"$\mathbf x'=\mathbf x+\mathrm{AT}(\mathrm{LN}_1\mathbf x)$, $\mathbf x''=\mathbf x'+\mathrm{FF}(\mathrm{LN}_2\mathbf x')$: "
       "the printed form drops the attention residual",
       "symbolic", "GPT block minus the printed form is exactly the attention output",
       chapter="ch07_nrgpt", label="ch07-erratum-eq4",
       tests=("test_nrgpt_paper_errors.py::test_eq4_as_printed_drops_the_attention_residual",)),
    _e("nrgpt-eq3-alpha", _NR, "§2 eq. 3 vs §2.1 eq. 11",
       r"eq. 3 has no head weights $\alpha_h$, eq. 11 has", r"eq. 3 is eq. 11 at $\alpha_h=1$",
       "reading", "a notational inconsistency", chapter="ch07_nrgpt", label="ch07-erratum-eq3",
       status="ambiguity",
       why=r"eq. 3 is the special case $\alpha_h=1$ of eq. 11: the notation changes between sections, nothing"
           r" printed is false"),
    _e("nrgpt-eq3-ff-sum", _NR, "§2, eq. 3",
       r"the per-token $E_A$ contains $\sum_B$ of the feed-forward energy over all tokens",
       r"the term $B=A$ only: same gradient with respect to $\mathbf g_A$, different value of $E_A$",
       "counterexample", "equal own-token gradients, different energies",
       chapter="ch07_nrgpt", label="ch07-erratum-eq3",
       tests=("test_nrgpt_energies.py::test_eq3_ff_sum_over_all_tokens_changes_value_not_gradient",)),
    _e("nrgpt-first-token", _NR, "§2, eq. 3",
       r"strict mask $B<A$: for $A=1$ the sum is empty, $E^{\rm AT}_1=-\frac1\beta\log0=+\infty$",
       r"a convention is needed; cemlib (and the authors' code) set $E^{\rm AT}_1=0$",
       "counterexample", "the literal energy is infinite, cemlib's is 0 and finite elsewhere",
       chapter="ch07_nrgpt", label="ch07-erratum-eq3",
       tests=("test_paper_errors_nrgpt.py::test_eq3_strict_mask_literal_first_token_energy_is_infinite",),
       status="ambiguity",
       why=r"the strict mask leaves the first token's energy undefined ($-\frac1\beta\log0$); the paper "
           r"states no convention for it, and any finite value leaves every gradient unchanged"),
    _e("nrgpt-param-shapes", _NR, "§2.1 eq. 8 vs App. D",
       r"eq. 8 defines $\mathbf J_h=\mathbf W^{K\top}_h\mathbf W^Q_h$ (rank $\le Y$); App. D uses a full $D\times D$ "
       r"$\mathbf J_h$ per head",
       r"with full $\mathbf J_h$ the attention weights are $H(D^2+1)$ and grow with the number of heads (GPT's do "
       r"not); the authors' code also has no $\alpha_h$ and no $1/\sqrt Y$",
       "measured", "parameter counts for 1 and 4 heads",
       tests=("test_nrgpt_models.py::test_num_parameters_and_nrgpt_growth_with_heads",),
       status="stated choice",
       why=r"App. D says that its implementation uses a full $D\times D$ $\mathbf J_h$ per head, “a "
           r"convention that can be easily adapted” to narrow heads; the entry records the parameter counts "
           r"that choice implies"),
    _e("nrgpt-ff1-gelu", _NR, "§3 (model variants), App. D",
       "FF1 is “eq. 14 with GELU”",
       r"FF1 $=-\lVert\sigma(\mathbf W\mathbf g)\rVert^2$ induces the activation $2\sigma\sigma'$, not $\sigma$",
       "counterexample", "FF1's update differs from eq. 14's and equals the $2\\sigma\\sigma'$ form",
       chapter="ch07_nrgpt", label="ch07-erratum-ff", tests=("test_nrgpt_energies.py::test_ff1_is_not_eq14_with_gelu",)),
    _e("nrgpt-ff1-sign", _NR, "App. D",
       r"$E^{\rm FF}=+\lVert\sigma(\mathbf W\mathbf g)\rVert^2$", r"$-\lVert\sigma(\mathbf W\mathbf g)\rVert^2$ (as in §3)",
       "symbolic", "the printed sign gives the opposite update",
       chapter="ch07_nrgpt", label="ch07-erratum-ff",
       tests=("test_paper_errors_nrgpt.py::test_app_d_ff1_energy_without_minus_flips_the_update",),
       status="slip"),
    _e("nrgpt-eq24", _NR, "App. D, eq. 24",
       r"$\mathrm{FF}=-\boldsymbol\eta(\mathbf W^2\sigma(\mathbf c)+\sigma'(\mathbf c)^\top\odot\mathbf W^{1\top}"
       r"\sigma(\mathbf W^2\mathbf g))$, $\mathbf c=\mathbf W^1\mathbf g$",
       r"$+\boldsymbol\eta(\mathbf W^2\sigma(\mathbf c)+\mathbf W^{1\top}[\sigma'(\mathbf c)\odot\mathbf W^{2\top}\mathbf g])$",
       "symbolic", "the printed form is the gradient of neither sign of the energy",
       chapter="ch07_nrgpt", label="ch07-erratum-ff",
       tests=("test_nrgpt_energies.py::test_ff2w_paper_eq24_is_wrong", "test_nrgpt_block.py::test_ff2w_paper_form_switch")),
    _e("nrgpt-eq28-one-over-d", _NR, "§2.2, App. E, eq. 28",
       r"$\partial\mathbf g/\partial\mathbf x=\boldsymbol\Gamma\frac1r(\mathbf I-\mathbf y\mathbf y^\top)$ with "
       r"$\lVert\mathbf y\rVert=1$",
       r"$\lVert\mathbf y\rVert=\sqrt D$, so $\mathbf I-\mathbf y\mathbf y^\top/D$; the printed $\mathbf P$ has the "
       r"eigenvalue $1-D$",
       "symbolic", "exact Jacobian minus the printed one is the missing term; eigenvalue $1-D$",
       chapter="ch07_nrgpt", label="ch07-erratum-norm-jacobian",
       tests=("test_nrgpt_block.py::test_norm_jacobian_exact_vs_paper_eq28",)),
    _e("nrgpt-layernorm-centring", _NR, "§2.2, App. E, eqs. 28–31",
       r"LayerNorm's Jacobian without the centring term; rank $D-1$",
       r"the term $-\frac1D\mathbf 1\mathbf 1^\top$ is needed; the exact projector has rank $D-2$",
       "symbolic", "ranks of the exact and printed Jacobians",
       chapter="ch07_nrgpt", label="ch07-erratum-norm-jacobian",
       tests=("test_nrgpt_block.py::test_norm_jacobian_ranks_at_eps_zero",)),
    _e("nrgpt-transpose-32-35", _NR, "App. E, eqs. 32–35",
       r"the descent condition uses $\boldsymbol\Gamma\mathbf P\boldsymbol\eta^\top$",
       r"the chain rule gives $\boldsymbol\Gamma\mathbf P\boldsymbol\eta$; only it is PSD for the paper's "
       r"$\boldsymbol\eta=\mathbf M\mathbf P\boldsymbol\Gamma$",
       "counterexample", "eigenvalues of both symmetric parts",
       chapter="ch07_nrgpt", label="ch07-erratum-descent-proof",
       tests=("test_nrgpt_paper_errors.py::test_transpose_in_eqs_32_35_matters_for_x_dependent_eta",)),
    _e("nrgpt-eq37", _NR, "App. E.1, eq. 37",
       r"$\dot E_A=\big(\frac{\partial E_A}{\partial\mathbf g_A}\big)^\top\mathbf P_A\boldsymbol\eta\,"
       r"\frac{\partial E_A}{\partial\mathbf g_A}=-\dot{\mathbf x}_A^\top\boldsymbol\eta^{-1}\mathbf P_A\dot{\mathbf x}_A$",
       r"$-\big(\frac{\partial E_A}{\partial\mathbf g_A}\big)^\top\mathbf P_A\boldsymbol\eta\,"
       r"\frac{\partial E_A}{\partial\mathbf g_A}=-\dot{\mathbf x}_A^\top\boldsymbol\eta^{-\top}\mathbf P_A\dot{\mathbf x}_A$: "
       r"the middle expression needs the minus sign the right-hand side has, and $\boldsymbol\eta^{-1}$ must be "
       r"$\boldsymbol\eta^{-\top}$ (the same only for a symmetric $\boldsymbol\eta$)",
       "counterexample", "both sides for a non-symmetric $\\boldsymbol\\eta$",
       chapter="ch07_nrgpt", label="ch07-erratum-descent-proof",
       tests=("test_nrgpt_paper_errors.py::test_eq37_needs_a_minus_sign_and_eta_inverse_transpose",),
       status="slip"),
    _e("nrgpt-prop21-discrete", _NR, "§2.3, Prop. 2.1; App. E",
       r"the update (6) gives “asymptotically decreasing energy, $\dot E_A=E_A^{(t+1)}-E_A^{(t)}<0$, if the "
       r"inference rate is $\boldsymbol\eta=c\,\mathrm{diag}(\boldsymbol\gamma)$ with $c\in\mathbb R_{>0}$”, after a "
       r"transient while the earlier tokens converge",
       r"false as printed: a finite step lowers $E_A$ only for a small enough $c$. The proof is first order, so "
       r"it proves the continuous-time statement: with the earlier tokens frozen, "
       r"$dE_A/dt=-\frac c{r_A}(\boldsymbol\Gamma\mathbf v_A)^\top\mathbf P_A(\boldsymbol\Gamma\mathbf v_A)\le0$ for "
       r"every $c>0$ ($\mathbf v_A=\partial E_A/\partial\mathbf g_A$). The update (6) takes finite steps, and a "
       r"step lowers $E_A$ only for $c$ below a bound set by the state and the weights (the descent lemma); "
       r"the first token, which has no transient, rises for large $c$",
       "counterexample",
       "update (6) transcribed for a first token: small $c$ descends at every step, $c=2$ raises $E_1$",
       chapter="ch07_nrgpt", label="ch07-erratum-convergence",
       tests=("test_nrgpt_paper_errors.py::test_prop_2_1_is_continuous_time_large_steps_break_descent",)),
    _e("nrgpt-prop21-strict", _NR, "§2.3, Prop. 2.1; App. E, eqs. 34, 38",
       r"$\dot E_A<0$",
       r"$\dot E_A\le0$: the rate is zero when $\boldsymbol\Gamma\mathbf v_A$ lies in the null space of "
       r"$\mathbf P_A$ (along $\mathbf x_A$ for RMSNorm, along $\mathbf 1$ for LayerNorm); the paper's own eqs. "
       r"22–23 write $\le0$",
       "counterexample", "the rate vanishes on the null vectors",
       chapter="ch07_nrgpt", label="ch07-erratum-convergence",
       tests=("test_paper_errors_nrgpt.py::test_prop_2_1_rate_is_zero_not_negative_in_the_jacobian_null_space",),
       status="slip"),
    _e("nrgpt-eta-identity", _NR, "§2.3, §3.1",
       r"“$\boldsymbol\eta=\mathbf I$ forces energy decrease”",
       r"only with a uniform gain $\boldsymbol\gamma\propto\mathbf 1$ (Prop. 2.1 needs $\boldsymbol\eta=c\,\boldsymbol\Gamma$)",
       "counterexample", "with a non-uniform gain some token's energy rises at first order",
       chapter="ch07_nrgpt", label="ch07-erratum-eta-identity",
       tests=("test_nrgpt_block.py::test_prop_2_1_eta_c_gamma_descends_and_eta_identity_can_ascend",)),
    _e("nrgpt-absorb-gamma", _NR, "§2.3, App. E",
       r"$\boldsymbol\gamma$ can be absorbed into $\mathbf J$ and the FF weights",
       r"absorbing changes the variable of the gradient: $\boldsymbol\eta=\mathbf I$ after absorbing is "
       r"$\boldsymbol\eta=\boldsymbol\Gamma$ before",
       "symbolic", "equal energies, gradients differing by $\\boldsymbol\\Gamma$",
       chapter="ch07_nrgpt", label="ch07-erratum-eta-identity",
       tests=("test_paper_errors_nrgpt.py::test_absorbing_gamma_into_J_turns_eta_identity_into_eta_gamma",)),
    _e("nrgpt-null-drift", _NR, "§2.3",
       r"$\mathbf g$ converges, so the state settles",
       r"$\mathbf x$ can drift in the Jacobian's null space while $\mathbf g$ is frozen",
       "counterexample", "the mean component of a LayerNorm block's step moves $\\mathbf x$, not $\\mathbf g$",
       chapter="ch07_nrgpt", label="ch07-erratum-convergence",
       tests=("test_nrgpt_paper_errors.py::test_x_drifts_in_the_null_space_while_g_does_not_move",)),
    _e("nrgpt-convergence-logic", _NR, "§2.3",
       "“decreasing and bounded, so it converges to a point”",
       "LaSalle gives a set of critical points; predecessors are assumed to settle in finite time; cross "
       "terms have unknown sign",
       "reading", "gaps in a limit argument; no finite computation shows them",
       chapter="ch07_nrgpt", label="ch07-erratum-convergence"),
    _e("nrgpt-norm-g", _NR, "App. E.2, eq. 41",
       r"$\lVert\mathbf g\rVert^2=1+2\boldsymbol\delta\cdot\hat{\mathbf y}$",
       r"$1+2\boldsymbol\delta\cdot\hat{\mathbf y}+\lVert\boldsymbol\delta\rVert^2$",
       "counterexample", "$\\hat{\\mathbf y}\\parallel\\boldsymbol\\delta$, $\\lVert\\boldsymbol\\delta\\rVert=0.5$: $2.25>2$",
       chapter="ch07_nrgpt", label="ch07-erratum-energy-bounds",
       tests=("test_paper_errors_nrgpt.py::test_app_e2_norm_of_g_keeps_the_delta_squared_term",)),
    _e("nrgpt-score-bound", _NR, "App. E.2",
       r"$|\mathbf g_A^\top\mathbf J\mathbf g_B|\le(1+2\lVert\boldsymbol\delta\rVert)\lVert\mathbf J\rVert_2$",
       r"$\le\lVert\mathbf J\rVert_2(1+\lVert\boldsymbol\delta\rVert)^2$",
       "counterexample", "the printed bound fails for $\\mathbf J=\\mathbf I$, $\\hat{\\mathbf y}\\parallel\\boldsymbol\\delta$",
       chapter="ch07_nrgpt", label="ch07-erratum-energy-bounds",
       tests=("test_nrgpt_paper_errors.py::test_app_e2_attention_bound_corrected",)),
    _e("nrgpt-eq42-prefactor", _NR, "App. E.2, eq. 42",
       r"$E^{\rm AT}_A=\log\sum\exp(\cdot)$", r"$-\frac1\beta\log\sum\exp(\beta\,\cdot)$ (eq. 11): the bounds flip sign",
       "counterexample", "for aligned tokens (11) is negative, (42) positive",
       chapter="ch07_nrgpt", label="ch07-erratum-energy-bounds",
       tests=("test_paper_errors_nrgpt.py::test_app_e2_eq42_drops_the_minus_one_over_beta_prefactor",)),
    _e("nrgpt-eq48-upper", _NR, "App. E.2, eq. 48",
       r"an upper bound on $E^{\rm FF}$ equal to the lower bound",
       r"$E^{\rm FF}\in[-(L\lVert\mathbf W\rVert_2(1+\lVert\boldsymbol\delta\rVert))^2,\,0]$ for $\sigma(0)=0$",
       "counterexample", "random samples violate the printed upper bound, satisfy the corrected interval",
       chapter="ch07_nrgpt", label="ch07-erratum-energy-bounds",
       tests=("test_paper_errors_nrgpt.py::test_app_e2_eq48_ff_upper_bound",)),
    _e("nrgpt-eq19-shape", _NR, "§2.3, Prop. 2.2, eq. 19",
       r"$\mathbf U\in\mathbb R^{D\times D'}$", r"$\mathbf U\in\mathbb R^{D'\times D}$, so that $\mathbf U^\top\mathbf U$ is $D\times D$",
       "symbolic", "shape and quadratic form of cemlib's rate matrix",
       chapter="ch07_nrgpt", label="ch07-erratum-descent-proof", tests=("test_nrgpt_block.py::test_rate_matrices",),
       status="slip"),
    _e("nrgpt-unbounded", _NR, "§2.2, Prop. 2.2",
       r"without normalisation, “to get $\dot E<0$”, the symmetric part of the rate must be positive "
       r"semi-definite (eq. 19)",
       r"true as stated (a first-order condition). What it does not give is convergence: without a "
       r"normalisation the energy is unbounded below ($E(s\mathbf x)\to-\infty$), so descent can go on for "
       r"ever",
       "counterexample", "$E(s\\,\\mathbf x)\\to-\\infty$ without norm, constant with LayerNorm",
       chapter="ch07_nrgpt",
       tests=("test_nrgpt_paper_errors.py::test_no_normalisation_energy_is_unbounded_below",
              "test_nrgpt_block.py::test_prop_2_2_psd_plus_skew_rate_gives_descent_without_norm"),
       status="not an error"),
    _e("nrgpt-untied-head", _NR, "Tables 1, 2, 8 vs App. F.1",
       "85M / 90M parameters with an unembedding “shared” with the embedding",
       "the counts need an untied output head (the authors' code has one)",
       "measured", "parameter counts at width 768, tied and untied",
       chapter="ch07_nrgpt", label="ch07-erratum-untied-head",
       tests=("test_nrgpt_models.py::test_paper_parameter_counts_tables_1_and_5",)),
    _e("nrgpt-listops-modulus", _NR, "§3.2, App. F.3",
       "ListOps SUM modulo 20 over the digits 0–19", "the authors' released data use modulo 10",
       "reading", "a data-description discrepancy", chapter="ch07_nrgpt", label="ch07-note-listops-modulus",
       tests=("test_data_listops.py::test_answers_match_independent_evaluator",),
       status="ambiguity",
       why="the paper and the authors' released data disagree; which one the reported runs used cannot be "
           "told from the paper"),
    _e("nrgpt-m-transpose", _NR, "§2.1",
       r"“$\mathbf M=\mathbf W^2$”", r"$\mathbf W^{2\top}$ (eq. 15 itself is consistent)", "reading", "a typo",
       status="slip"),
    _e("nrgpt-table-slips", _NR, "Tables 4, 5, 7; App. F.4",
       "Table 4's bold on d-1; GPT / RGPT-P learning rates outside the F.4 grid; Table 5's unbolded 74; "
       "n_embed 1740 missing from Table 7",
       "bold on each table's best result (in Table 4 not on d-1, in Table 5 on the 74); the GPT / RGPT-P "
       "learning rates and App. F.4's grid made to agree; n_embed 1740 in Table 7", "reading",
       "the tables read against each other and against the grid of App. F.4",
       status="slip"),
    # NRGPT: not errors
    _e("nrgpt-eq12-partial", _NR, "§2.1, eq. 12",
       r"the attention update $-\boldsymbol\eta\,\partial E_A/\partial\mathbf g_A$: each token descends its own energy",
       r"as intended, not the gradient of $\sum_AE_A$ (the key-side term is dropped): the tokens follow coupled "
       r"descents, with no single function of the whole sequence",
       "counterexample", "query partial + key partial = global gradient; the key part is not small",
       chapter="ch07_nrgpt", status="not an error",
       tests=("test_nrgpt_energies.py::test_global_gradient_adds_the_key_side_term",
              "test_nrgpt_block.py::test_update_is_neither_the_global_nor_the_x_gradient")),
    _e("nrgpt-log-a", _NR, "App. E.2, eqs. 42–43",
       r"$\log A$ in the bound on $E^{\rm AT}_A$",
       r"valid but loose: with the strict mask token $A$ has $A-1$ keys and $\log(A-1)$ is the attained bound",
       "symbolic", "equal scores attain $\\max+\\log(A-1)$, below $\\max+\\log A$",
       chapter="ch07_nrgpt", label="ch07-erratum-energy-bounds", status="not an error",
       tests=("test_paper_errors_nrgpt.py::test_eqs_42_43_the_log_count_is_log_A_minus_1",)),
    _e("nrgpt-eq43-vacuous", _NR, "App. E.2, eq. 43",
       "an absolute value bounded below by a negative number", "true, but vacuous; the two-sided bound is "
       "the one of `nrgpt-score-bound`", "reading", "a negative lower bound on an absolute value holds trivially",
       chapter="ch07_nrgpt", label="ch07-erratum-energy-bounds", status="not an error"),
    # ------------------------------------------------------------------ intrinsic optimizers
    _e("io-e-two-roles", _IO, "§2, §2.2", r"$E$ is both the classification head and the energy",
       "two symbols", "reading", "notation only",
       status="ambiguity",
       why="one symbol for two quantities, told apart by their context; nothing printed is false"),
    _e("io-lemma1-log", _IO, "App. A.2, eq. 12 (Lemma 1 / Lemma 3)",
       r"$F^*=-T\log Z=-T\sum_ie^{-E_i/T}$", r"$F^*=-T\log\sum_ie^{-E_i/T}$",
       "counterexample", "the printed value is not the minimum of $F$; with the log it is",
       chapter="ch08_free_energy_newton", label="ch08-erratum-lemma1-log",
       tests=("test_helmholtz.py::test_lemma1_boltzmann_minimises_helmholtz",),
       status="slip"),
    _e("io-theorem1-temperature", _IO, "§2.1, Theorem 1",
       r"$\mathbf W_V=\eta T\mathbf W$", r"$\mathbf W_V=\eta\mathbf W$: the printed step is $T$ times too long",
       "symbolic", "the paper's tying moves exactly $T$ times the gradient step",
       chapter="ch08_free_energy_newton", label="ch08-erratum-theorem1",
       tests=("test_helmholtz.py::test_paper_tying_is_off_by_T",
              "test_helmholtz.py::test_attention_is_gd_on_inner_free_energy_with_corrected_tying")),
    _e("io-theorem2-temperature", _IO, "§4, Theorem 2",
       r"$\mathbf W_{O,h}\mathbf W_{V,h}=\frac{\eta T}{H}\mathbf W_{1,h}^\top\mathbf W_{2,h}$", r"$\frac{\eta}{H}$",
       "symbolic", "MHA with $\\eta/H$ is one gradient step; $\\eta T/H$ is $T$ steps' length",
       chapter="ch08_free_energy_newton", label="ch08-erratum-theorem1",
       tests=("test_helmholtz.py::test_theorem2_multihead_attention_is_gd_with_eta_over_H_not_eta_T_over_H",)),
    _e("io-theorem1-sphere", _IO, "§2.1, proof of Theorem 1",
       r"on the sphere $\nabla F^*=\nabla\tilde F^*$",
       r"they differ by $\mathbf z$; attention is a step on $\tilde F^*$; gradient descent on $F^*$ is eq. 8 (mean shift)",
       "symbolic", "gradient difference equals $\\mathbf z$ on the sphere",
       chapter="ch08_free_energy_newton", label="ch08-erratum-theorem1",
       tests=("test_helmholtz.py::test_theorem1_on_the_sphere_gradients_differ_by_z",
              "test_helmholtz.py::test_mean_shift_step_is_eq8_and_descends_for_eta_up_to_2")),
    _e("io-inner-concave", _IO, "§2.1, Theorem 1",
       r"attention minimises $\tilde F^*$",
       r"$\tilde F^*$ is concave and unbounded below: iterating without renormalising grows $\lVert\mathbf z\rVert$",
       "counterexample", "Hessian eigenvalues $\\le0$; $\\lVert\\mathbf z\\rVert$ grows over 50 steps",
       chapter="ch08_free_energy_newton",
       tests=("test_helmholtz.py::test_residual_attention_iterated_without_normalisation_grows",
              "test_helmholtz.py::test_inner_free_energy_is_concave_and_elastic_convex_at_high_T")),
    _e("io-footnote3", _IO, "§2.1, footnote 3",
       r"$F^*$ through random features $\sum_i\phi(\mathbf z)^\top\phi(\mathbf h_i)$",
       r"exact only in expectation, and the kernel needs $\mathbf z/\sqrt T$ and $\mathbf W\mathbf h_i/\sqrt T$",
       "counterexample", "few features: error; the footnote's kernel without $\\mathbf W$, $T$: wrong value",
       tests=("test_paper_errors_intrinsic.py::test_footnote3_random_features_are_approximate_and_need_W_and_T",)),
    _e("io-eq14-sum", _IO, "App. A.3, eq. 14", r"the second expression lacks $\sum_i$", r"with $\sum_i$",
       "reading", "typesetting", tests=("test_helmholtz.py::test_linear_attention_is_gd_on_quadratic_energy",),
       status="slip"),
    _e("io-theorem3-temperature", _IO, "App. A.3, proof of Theorem 3",
       "the gradient of the quadratic energy without the factor $T$", "with the factor $T$ (the update that follows is right)",
       "symbolic", "autograd gradient equals $T$ times the printed one",
       tests=("test_helmholtz.py::test_linear_attention_is_gd_on_quadratic_energy",),
       status="slip"),
    _e("io-algorithms-backprop", _IO, "§2.2, App. A.4, Algorithms 1/3",
       "training presented as backpropagation",
       "the task loss never reaches $\\mathbf W$, $\\mathbf z$ persists across epochs, one $\\eta$ serves two "
       "roles, Alg. 3 has undefined indices",
       "reading", "a description of a procedure, not a formula"),
    _e("io-alg2-sum", _IO, "App. A.4, Algorithm 2, eq. 15",
       r"the looped Transformer minimises $\sum_iF^*_i$",
       r"with $\mathbf H\leftarrow\mathbf Z$ every landscape moves; $\sum_iF^*$ can rise",
       "counterexample", "each token descends its frozen landscape, the sum rises",
       tests=("test_paper_errors_intrinsic.py::test_alg2_sum_of_free_energies_need_not_decrease_when_H_is_overwritten",)),
    _e("io-eq7-underbrace", _IO, "§3, eq. 7",
       r"the bracket is labelled $\preceq0$", r"it is a covariance, $\succeq0$; $-\frac1T[\cdot]\preceq0$ (the appendix is right)",
       "symbolic", "bracket equals $\\mathrm{Cov}_p(\\mathbf W\\mathbf h)$",
       chapter="ch08_free_energy_newton", label="ch08-erratum-lemma2",
       tests=("test_paper_errors_intrinsic.py::test_eq7_bracket_is_a_covariance_so_psd",),
       status="slip"),
    _e("io-lemma2-nonconvex", _IO, "§3, Lemma 2",
       r"$F^*$ is non-convex", r"convex everywhere for $T\ge\rho^2$; non-convex only at low $T$; never concave",
       "counterexample", "smallest Hessian eigenvalue $\\ge1-\\rho^2/T$; far away Hess $\\to\\mathbf I$",
       chapter="ch08_free_energy_newton", label="ch08-erratum-lemma2",
       tests=("test_helmholtz.py::test_inner_free_energy_is_concave_and_elastic_convex_at_high_T",
              "test_paper_errors_intrinsic.py::test_elastic_free_energy_is_never_concave")),
    _e("io-eq8-momentum", _IO, "§3, eq. 8", "“first-order update with momentum”",
       "no momentum: $\\mathbf z_{k+1}$ depends on $\\mathbf z_k$ only (relaxed mean shift = plain gradient descent)",
       "counterexample", "two histories through the same $\\mathbf z_k$ give the same $\\mathbf z_{k+1}$",
       tests=("test_paper_errors_intrinsic.py::test_eq8_has_no_momentum",)),
    _e("io-untied-att2nd", _IO, "§3, eq. 10",
       r"Att2nd with untied $\mathbf W_Q,\mathbf W_K,\mathbf W_V$ as a Newton step",
       "untied, its “gradient” has a non-symmetric Jacobian: no Newton step on any energy",
       "counterexample", "Jacobian asymmetry and mismatch with the preconditioner",
       tests=("test_paper_errors_intrinsic.py::test_untied_att2nd_is_not_a_newton_step",)),
    _e("io-newton-descent", _IO, "§3 (Att2nd, Att2nd1st)",
       "Newton attention accelerates convergence",
       "Newton is an ascent direction where the Hessian is indefinite, and the Neumann series diverges "
       "iff $\\lambda_{\\max}(\\mathrm{Cov})\\ge T$; the first-order layer always descends",
       "counterexample", "two particles at $\\pm a\\mathbf e_1$, $a^2>T$",
       chapter="ch08_free_energy_newton", label="ch08-erratum-newton-descent",
       tests=("test_newton.py::test_att2nd1st_always_descends_while_newton_can_ascend",
              "test_newton.py::test_att2nd1st_is_first_order_neumann_and_truncation_is_second_order")),
    _e("io-theorem2-exponent", _IO, "§4, Theorem 2 (App. A.6)",
       r"$\tilde F^*=-\frac1H\sum_hT\log\sum_i\exp(-\mathbf z^\top\mathbf W_{1,h}^\top\mathbf W_{2,h}\mathbf h_i/T)$",
       r"$\exp(+\dots/T)$, the sign the theorem's own conclusion (MHA as one gradient step) needs",
       "counterexample", "only the $+$ sign gives MHA as a gradient step",
       tests=("test_paper_errors_intrinsic.py::test_theorem2_printed_exponent_sign_is_wrong",),
       status="slip"),
    _e("io-eq20-type", _IO, "App. A.6, eq. 20",
       r"$\mathbf W_{1,h}\mathbf h_i$ (a $d_h$-vector)", r"$\mathbf W_{1,h}^\top\mathbf W_{2,h}\mathbf h_i$",
       "reading", "the printed term does not type-check",
       status="slip"),
    _e("io-lemma5-constraint", _IO, "App. A.7, Lemma 5",
       r"constraint on $\lVert\mathbf W_{1,h}\mathbf z\rVert$, boundary stated as $\lVert\mathbf z\rVert=\rho$",
       r"one constraint set, the one on $\lVert\mathbf W_{1,h}\mathbf z\rVert$: its boundary is "
       r"$\lVert\mathbf W_{1,h}\mathbf z\rVert=\rho$", "reading", "wording",
       status="slip"),
    _e("io-lemma5-stationarity", _IO, "App. A.7, Lemma 5",
       r"stationarity $\sum_h\mathbf v_h=0$",
       r"$\sum_h\mathbf W_{1,h}^\top\mathbf v_h=0$: the Lemma's own constraints are on $\lVert\mathbf W_{1,h}\mathbf z\rVert$, "
       r"so their gradients carry $\mathbf W_{1,h}^\top$",
       "counterexample", "the printed condition is neither sufficient nor necessary",
       tests=("test_paper_errors_intrinsic.py::test_lemma5_stationarity_needs_W1_transpose",),
       status="slip"),
    _e("io-lemma5-underbraces", _IO, "App. A.7, Lemma 5", "under-braces of the derivation", "readable labels",
       "reading", "typesetting",
       status="slip"),
    _e("io-eq25", _IO, "App. A.8, eq. 25",
       r"“$F_h^*=-T\log\sum_iZ_h$” and “$F^*=\frac1HF_h^*$”",
       r"$F_h^*=-T\log\sum_i\exp(\cdot)$, $F^*=\frac1H\sum_hF_h^*$",
       "reading", "typesetting", tests=("test_newton.py::test_multihead_energy_grad_and_head_hessians",),
       status="slip"),
    _e("io-footnote9", _IO, "App. A.8, footnote 9",
       r"$(\mathbf W^\top\mathbf C\mathbf W)^\dagger=\mathbf W^\top(\mathbf W\mathbf W^\top)^{-1}\mathbf C^{-1}\mathbf W$",
       r"$\mathbf W^\top\mathbf G\mathbf C^{-1}\mathbf G\mathbf W$, $\mathbf G=(\mathbf W\mathbf W^\top)^{-1}$; "
       r"the printed form holds only for orthonormal rows",
       "counterexample", "Moore–Penrose pseudo-inverse of a random full-row-rank case",
       chapter="ch08_free_energy_newton", label="ch08-erratum-pinv-sign",
       tests=("test_newton.py::test_footnote9_pseudo_inverse_needs_orthonormal_rows",
              "test_newton.py::test_mha2nd_corrected_equals_pseudo_inverse_newton")),
    _e("io-eq28-31-sign", _IO, "App. A.8, eqs. 28–31",
       r"MHA2nd / MHA2nd1st as $\mathbf z+\dots$", r"$\mathbf z-\dots$ (a descent step)",
       "counterexample", "with tied weights the printed sign raises the energy",
       chapter="ch08_free_energy_newton", label="ch08-erratum-pinv-sign",
       tests=("test_newton.py::test_mha2nd_paper_form_has_wrong_sign",
              "test_newton.py::test_mha2nd1st_paper_form_eq30_31_and_its_sign"),
       status="slip"),
    _e("io-removing-wv", _IO, "§4",
       r"“keeps $\mathbf W_Q,\mathbf W_V,\mathbf W_O$ while removing $\mathbf W_V$”",
       r"keeps $\mathbf W_Q,\mathbf W_K,\mathbf W_O$: $3d^2+H$ parameters",
       "measured", "parameter count of the layer",
       chapter="ch08_free_energy_newton", label="ch08-erratum-pinv-sign",
       tests=("test_newton.py::test_mha2nd1st_parameters_and_learnable_temperature",),
       status="slip"),
    _e("io-small-typos", _IO, "eq. 1, eq. 18",
       r"eq. 1's middle expression omits $1/T$; eq. 18 has $v_i$ and a missing $\nabla$",
       r"eq. 1's middle expression with its $1/T$; eq. 18 with its $\nabla$", "reading",
       "eq. 1's expressions read against each other, eq. 18 against the text around it",
       status="slip"),
    # intrinsic optimizers: not errors
    _e("io-rbf-softmax", _IO, "§4 (MHA2nd1st)",
       "an RBF softmax where a dot-product softmax is meant (or vice versa)",
       "not an error: the RBF softmax is the dot-product softmax with a key-norm bias $-\\frac12\\lVert\\mathbf m_i\\rVert^2$",
       "symbolic", "the two weight vectors agree exactly", status="not an error",
       tests=("test_helmholtz.py::test_rbf_softmax_is_dot_product_softmax_with_key_norm_bias",)),
    _e("io-sphere-restrictive", _IO, "§4, Theorem 2",
       "the sphere assumption in every head at once", "an assessment (very restrictive), not an error",
       "reading", "a judgement about an assumption, not a formula", status="not an error"),
    _e("io-no-closed-form", _IO, "App. A.7, Lemma 5",
       "“we still cannot obtain a closed-form convergence solution”",
       "the paper's own statement of a limitation, not an error", "reading", "the paper's own words",
       status="not an error"),
    # ------------------------------------------------------------------ Hyper-SET
    _e("hs-vmf-relu", _HS, "App. A, eq. 15 vs eq. 5",
       r"the vMF mixture gives the $-\frac12\mathrm{ReLU}^2$ feed-forward energy",
       "it gives a log-sum-exp: the softmax feed-forward energy (Table 20), whose gradient is not the ReLU one",
       "symbolic", "the mixture's negative log-likelihood equals the softmax FF energy plus a constant",
       tests=("test_paper_errors_hyperset.py::test_vmf_mixture_alignment_is_the_softmax_ff_not_relu_squared",),
       chapter="ch09_hyperset", label="ch09-erratum-vmf",
       status="stated choice",
       why=r"the paper calls $E_{\rm FF}$ “one surrogate function” for the alignment term; it does not claim "
           r"that the vMF mixture gives it. The entry records what the mixture itself gives: the softmax "
           r"feed-forward energy, whose gradient is not the ReLU one"),
    _e("hs-radius", _HS, "Assumption 2 (App. A) vs eq. 4 (§4.1)",
       r"tokens on $S^{p-1}$ (Assumption 2) and on the sphere of radius $\sqrt p$ (eq. 4)",
       r"one radius; the radius is a temperature change: on the unit sphere the same energy has $\beta=\sqrt p$, not $1/\sqrt p$",
       "symbolic", "$E(\\mathbf z;\\beta)=p\\,E(\\mathbf u;\\beta p)$ and the softmax weights",
       tests=("test_paper_errors_hyperset.py::test_radius_sqrt_p_is_a_temperature_change_not_only_a_scale",),
       chapter="ch09_hyperset", label="ch09-erratum-radius",
       status="ambiguity",
       why=r"the constraint is stated twice, on the unit sphere (Assumption 2) and on the sphere of radius "
           r"$\sqrt p$ (eq. 4); the two readings are reconciled by a change of temperature, which the paper "
           r"does not state"),
    _e("hs-no-projection", _HS, "§4.1, eq. 6; §4.2, eqs. 8, 9, 11",
       r"eqs. 9 and 11 follow “by discretizing” the gradient flows (7) and (10) “and maintaining the "
       r"constraint” of eq. 8: descent on the energy of eq. 6 under its norm constraints",
       r"the updates evaluate the gradient formula at the RMS-normalised projections. They drop the RMSNorm "
       r"Jacobian (for attention and feed-forward alike, the update differs from the gradient of the "
       r"normalised energy by exactly the Jacobian term $\sum_h\mathbf W_h(\mathbf J_h^\top-\mathbf I)\mathbf g_h$), "
       r"they are not Riemannian steps, and nothing projects $\mathbf X$: the tokens leave the constraint set "
       r"of eq. 6",
       "counterexample",
       "update + exact gradient equals the Jacobian term (both sublayers); radial part of the step and "
       "head norms after one step",
       tests=("test_hyperset.py::test_what_rmsnorm_preserves_and_what_it_does_not",
              "test_hyperset.py::test_rmsnorm_update_drops_the_jacobian_exactly"),
       chapter="ch09_hyperset", label="ch09-erratum-eq9-jacobian"),
    _e("hs-c1-softmax", _HS, "App. C.1, last line",
       "one softmax over all heads", "one softmax per head, summed over heads, as in the paper's eq. 7",
       "counterexample", "the single softmax differs from the head sum",
       tests=("test_hyperset.py::test_appendix_c1_single_softmax_over_all_heads_is_not_the_head_sum",),
       chapter="ch09_hyperset", label="ch09-erratum-c1-head-sum",
       status="slip"),
    _e("hs-alpha-sign", _HS, "§4.2.1 (eq. 9), §4.3, §5.4 (Fig. 5)",
       r"the energy decreases over the iterations “even without sign constraints on step sizes”",
       r"not an error: a finding about the trained models, reported as one. It is not a property of the "
       r"update: $\alpha_t$ has a free sign, and to first order a step changes the energy by "
       r"$-\sum_c\alpha_cg_c^2$, so a step with negative channels can raise it",
       "counterexample", "a mixed-sign step raises the energy, a positive one lowers it",
       tests=("test_paper_errors_hyperset.py::test_sign_unconstrained_channel_steps_can_ascend",),
       chapter="ch09_hyperset", label="ch09-erratum-step-sign", status="not an error"),
    _e("hs-eq11-state", _HS, "§4.2.2, eq. 11",
       r"the feed-forward step acts on $\mathbf X_t$", r"alternating minimisation acts on $\mathbf X_{t+1/2}$",
       "symbolic", "the layer equals attention then feed-forward on the post-attention state",
       tests=("test_hyperset.py::test_layer_is_attention_then_feedforward_on_post_attention_state",),
       chapter="ch09_hyperset", label="ch09-erratum-eq9-jacobian",
       status="slip"),
    _e("hs-gated-g", _HS, "App. G.1, eq. 20",
       r"$g$ non-decreasing; the gated FF has $g(s)=\frac12s^2$",
       r"$\frac12s^2$ is not non-decreasing; descent is saved only by $\Phi=$ sigmoid $>0$",
       "counterexample", "with an odd $\\Phi$ (tanh) descent lowers $s<0$ further",
       tests=("test_paper_errors_hyperset.py::test_gated_ff_g_is_not_non_decreasing_only_positive_phi_saves_it",),
       chapter="ch09_hyperset", label="ch09-erratum-gated-g",
       status="slip"),
    _e("hs-table19-sign", _HS, "App. G.1, Table 19",
       r"the “$-\nabla E_{\rm ATTN}$” column for the sigmoid and linear rows", r"it is $+\nabla$",
       "counterexample", "following the printed column raises the energy",
       tests=("test_hyperset_variants.py::test_table19_minus_grad_column_is_plus_grad",),
       chapter="ch09_hyperset", label="ch09-erratum-table19-sign",
       status="slip"),
    _e("hs-shared-qkv", _HS, "§5.4, App. F.3 (Figs. 13–14)",
       "reversing the update direction of attention in a shared-QKV Transformer “leads to a decline in "
       "both rank and angle”",
       r"not an error: a result of the authors' runs. What the entry adds: that model keeps an untied "
       r"$\mathbf W^O$, which absorbs the sign flip, so the two are one model family and the difference comes "
       r"from initialisation or training, not from the structure",
       "symbolic", "$\\mathbf x-A(\\mathbf x)\\mathbf W_O=\\mathbf x+A(\\mathbf x)(-\\mathbf W_O)$",
       tests=("test_paper_errors_hyperset.py::test_shared_qkv_output_matrix_absorbs_the_sign_flip",),
       chapter="ch09_hyperset", label="ch09-erratum-shared-qkv", status="not an error"),
    _e("hs-kl-term", _HS, "App. A", r"$E_{\rm ATTN}$ represents the KL term",
       "no argument is given; the measurable effect (tokens spread in each subspace) holds",
       "reading", "a missing argument",
       tests=("test_metrics.py::test_energy_per_iteration_and_subspace_separation_under_gradient_flow",),
       status="stated choice",
       why=r"the paper calls $E_{\rm ATTN}$ “a surrogate of the uniformity measure”, not the KL term itself"),
    _e("hs-h-symbol", _HS, "App. G.1", "$h$ is a head index and a scalar function", "two symbols",
       "reading", "notation only",
       status="ambiguity",
       why="one symbol for two quantities, told apart by their context; nothing printed is false"),
    _e("hs-cifar10", _HS, "§5.5, Table 4", "25.81% (CIFAR-10) beside 57.92% (CIFAR-100)",
       "only the authors' run can confirm or correct it (a typo or a diverged run)", "reading",
       "a reported training result",
       status="ambiguity",
       why="an unexplained reported number, not a demonstrated error: only the authors' run can settle it"),
    _e("hs-relu-gelu", _HS, "§5.5", "the “Ours” row uses ReLU", "the code uses GELU (cemlib follows the paper)",
       "reading", "a paper/code discrepancy",
       status="ambiguity",
       why="the paper and the released code disagree; which one the reported runs used cannot be told from "
           "the paper"),
    # Hyper-SET: not errors
    _e("hs-elbo", _HS, "eq. 1, App. A, eq. 14", "the factorisation of eq. 14",
       "neither MLE nor an ELBO, but a modelling choice; the KL algebra, the only computation, is correct",
       "reading", "the factorisation read as a modelling choice", status="not an error"),
    _e("hs-dam-half", _HS, "App. B", r"the dense associative memory with a factor $\frac12$",
       "twice Krotov–Hopfield's convention; harmless (same update, same minimisers)",
       "symbolic", "the energy is the classical one; the update is unchanged", status="not an error",
       tests=("test_paper_errors_hyperset.py::test_dam_half_is_the_classical_energy_krotov_has_twice_it",)),
    _e("hs-infeasible", _HS, "§4.1, eq. 6", "the $H+1$ norm constraints per token (which can look infeasible)",
       "overstated: for random bases with $d>H+1$ a feasible point exists; infeasibility needs special "
       "structure such as $\\mathbf W_2=2\\mathbf W_1$",
       "counterexample", "a feasible point to $10^{-12}$; the special case is infeasible", status="not an error",
       tests=("test_paper_errors_hyperset.py::test_eq6_constraints_can_be_infeasible_but_generic_bases_are_feasible",)),
    _e("hs-beta-prefactor", _HS, "§4.2.1, eq. 7", r"$\beta$ inside the exponent and $\beta^{-1}$ as a prefactor",
       "consistent: the bi-softmax update is the exact gradient (query and key side)",
       "symbolic", "update equals minus the autograd gradient", status="not an error",
       tests=("test_hyperset.py::test_bisoftmax_is_the_full_gradient_query_and_key_side",
              "test_hyperset.py::test_energy_grads_match_autograd")),
    _e("hs-x0-xt", _HS, "eq. 12", r"the step sizes condition on $\mathbf x(0)$, classification uses $\mathbf X_t$",
       "two options, both implemented (`HyperSETLayer(condition=“x0” / “xt”)`)", "reading", "a choice",
       status="not an error"),
)


def by_id(entry_id: str) -> Erratum:
    """The entry with this id (KeyError if there is none)."""
    for e in ERRATA:
        if e.id == entry_id:
            return e
    raise KeyError(entry_id)


def counts() -> dict[str, dict[str, int]]:
    """Per paper family, the entries of each kind: ``errors`` (substantive), ``slips``,
    ``ambiguities``, ``choices`` (stated choices), ``not_errors``; and ``proved``, how many of all
    the family's entries have computable evidence (each is proved in a cell of the appendix)."""
    out = {}
    for fam in PAPERS:
        es = [e for e in ERRATA if e.family == fam]
        out[fam] = {"errors": sum(e.status == "error" for e in es),
                    "slips": sum(e.status == "slip" for e in es),
                    "ambiguities": sum(e.status == "ambiguity" for e in es),
                    "choices": sum(e.status == "stated choice" for e in es),
                    "not_errors": sum(e.status == "not an error" for e in es),
                    "proved": sum(e.computable for e in es)}
    return out


def kind_counts() -> dict[str, int]:
    """How many entries of each kind (:data:`KINDS`, then ``"not an error"``), over all papers."""
    c = Counter(e.kind for e in ERRATA)
    return {k: c[k] for k in (*KINDS, "not an error")}


def evidence_counts(status: str = "error") -> Counter:
    """How the entries of one status are known (:data:`EVIDENCE`): substantive errors by default."""
    return Counter(e.evidence for e in ERRATA if e.status == status)


# ---------------------------------------------------------------------- rendering (MyST markdown)

def _paper_label(e: Erratum) -> str:
    return f"{e.family} ({e.version})" if e.version else e.family


def where_discussed(e: Erratum) -> str:
    """MyST cross-reference to the chapter that discusses the entry ("" if none)."""
    if not e.chapter:
        return ""
    doc = f"{{doc}}`{e.chapter}`"
    what = "erratum" if e.status in ("error", "slip") else "the box"   # an ambiguity or a choice is no erratum
    return f"{doc} ({{ref}}`{what} <{e.label}>`)" if e.label else doc


def markdown_card(e: Erratum, proved_here: bool) -> str:
    """One entry as a short MyST markdown block."""
    head = f"**`{e.id}`** · {_paper_label(e)} · {e.where} · evidence: *{e.evidence}*"
    head += f" · *{e.status}*"
    correct = "Correct" if e.status in ("error", "slip") else "Our reading"
    lines = [head, f"*Printed:* {e.printed}", f"*{correct}:* {e.correct}"]
    how = f"*How we know:* {e.how}"
    if proved_here:
        how += " (checked in the cell above)."
    elif not e.computable:
        how += " (nothing to compute)."
    lines.append(how)
    if e.why:
        lines.append(f"*Why it is not an error:* {e.why}.")
    extra = []
    if e.chapter:
        extra.append(f"Discussed in {where_discussed(e)}.")
    if extra:
        lines.append(" ".join(extra))
    return "  \n".join(lines)


def markdown_reasons(entries) -> str:
    """The ambiguities and stated choices among ``entries`` as a table: id, paper, where, status, and
    why it is not an error."""
    rows = ["| id | paper | where | status | why it is not an error |", "|---|---|---|---|---|"]
    for e in entries:
        if e.status in ("ambiguity", "stated choice"):
            rows.append(f"| `{e.id}` | {_paper_label(e)} | {e.where} | {e.status} | {e.why} |")
    return "\n".join(rows)


def markdown_not_errors(entries) -> str:
    """The items among ``entries`` that are not errors, as a table: id, paper, where, and our reading
    (why it is not an error)."""
    rows = ["| id | paper | where | our reading |", "|---|---|---|---|"]
    for e in entries:
        if e.status == "not an error":
            rows.append(f"| `{e.id}` | {_paper_label(e)} | {e.where} | {e.correct} |")
    return "\n".join(rows)


def markdown_kinds(entries) -> str:
    """The count of each kind per paper family as a table (the page's summary), with the number of
    entries proved in a cell of the page; a last row sums the four papers."""
    cols = [*KINDS, "not an error"]
    rows = ["| paper | " + " | ".join([*KINDS, "not errors"]) + " | proved in a cell here |",
            "|---|" + "---|" * (len(cols) + 1)]
    total = Counter()
    for fam, (title, keys) in PAPERS.items():
        es = [e for e in entries if e.family == fam]
        n = Counter(e.kind for e in es)
        n["proved"] = sum(e.computable for e in es)
        total.update(n)
        cite = ",".join(keys)
        rows.append(f"| {title} {{cite:p}}`{cite}` | " + " | ".join(str(n[c]) for c in cols) + f" | {n['proved']} |")
    rows.append("| **all four** | " + " | ".join(f"**{total[c]}**" for c in cols) + f" | **{total['proved']}** |")
    return "\n".join(rows)


def markdown_table(entries) -> str:
    """The static table of entries: id, paper, where, evidence, status, chapter."""
    rows = ["| id | paper | where | evidence | kind | discussed in |", "|---|---|---|---|---|---|"]
    for e in entries:
        rows.append(f"| `{e.id}` | {_paper_label(e)} | {e.where} | {e.evidence} | {e.status} | "
                    f"{where_discussed(e) or '—'} |")
    return "\n".join(rows)
