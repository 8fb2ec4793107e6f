"""The errata registry (``cemlib.evidence.errata``) and the appendix page that renders and proves it
(``book/errata.ipynb``) agree: every entry is well formed, names a paper of the bibliography, cites
unit tests and chapters that exist, and every entry with computable evidence is proved by a cell of
the appendix (a ``proved("<id>")`` call), so an entry cannot be added without its proof."""

import ast
import re
from pathlib import Path

import nbformat
import pytest

from cemlib.evidence import errata
from cemlib.evidence.errata import ERRATA, EVIDENCE, PAPERS, STATUS

ROOT = Path(__file__).resolve().parents[2]
PAGE = ROOT / "book" / "errata.ipynb"


def _code(nb):
    return [c.source for c in nb.cells if c.cell_type == "code"]


def _calls(sources, name):
    """Every string literal passed to ``name(...)`` in the given code."""
    ids = []
    for src in sources:
        lines = [re.sub(r"^(\s*)%.*", r"\1pass", line) for line in src.splitlines()]   # IPython magics
        tree = ast.parse("\n".join(lines))
        for node in ast.walk(tree):
            if isinstance(node, ast.Call) and getattr(node.func, "id", None) == name:
                ids += [a.value for a in node.args if isinstance(a, ast.Constant) and isinstance(a.value, str)]
    return ids


def test_ids_unique_and_well_formed():
    ids = [e.id for e in ERRATA]
    assert len(ids) == len(set(ids))
    for e in ERRATA:
        assert re.fullmatch(r"(cem|nrgpt|io|hs)-[a-z0-9-]+", e.id), e.id
        assert e.where and e.printed and e.correct and e.how, e.id
        assert e.evidence in EVIDENCE and e.status in STATUS, e.id
        assert e.family in PAPERS
        prefix = {"CEM": "cem", "NRGPT": "nrgpt", "Intrinsic optimizers": "io", "Hyper-SET": "hs"}[e.family]
        assert e.id.startswith(prefix + "-"), e.id
        if e.family == "CEM":
            assert e.version in ("arXiv", "ICLR", "both"), e.id
            assert (e.paper == "cem2026iclr") == (e.version == "ICLR"), e.id
        else:
            assert e.version == "", e.id
        assert not e.label or e.chapter, e.id


def test_paper_keys_are_in_the_bibliography():
    bib = (ROOT / "book" / "references.bib").read_text()
    keys = set(re.findall(r"@\w+\{([^,\s]+),", bib))
    assert {e.paper for e in ERRATA} <= keys
    assert {k for _, ks in PAPERS.values() for k in ks} <= keys


def test_cited_unit_tests_exist():
    for e in ERRATA:
        for t in e.tests:
            file, func = t.split("::")
            found = sorted((ROOT / "tests").rglob(file))
            assert len(found) == 1, (e.id, t, found)   # test file names are unique across tests/
            path = found[0]
            names = {n.name for n in ast.parse(path.read_text()).body if isinstance(n, ast.FunctionDef)}
            assert func in names, (e.id, t)


def test_cited_chapters_and_labels_exist():
    for e in ERRATA:
        if not e.chapter:
            continue
        path = ROOT / "book" / f"{e.chapter}.ipynb"
        assert path.exists(), (e.id, e.chapter)
        if e.label:
            nb = nbformat.read(path, as_version=4)
            text = "\n".join(c.source for c in nb.cells if c.cell_type == "markdown")
            assert re.search(rf"^\({re.escape(e.label)}\)=\s*$", text, re.M), (e.id, e.label)


def test_every_computable_entry_is_proved_on_the_page():
    nb = nbformat.read(PAGE, as_version=4)
    proved, listed = _calls(_code(nb), "proved"), _calls(_code(nb), "listed")
    assert len(proved) == len(set(proved)) and len(listed) == len(set(listed))
    assert set(proved) == {e.id for e in ERRATA if e.computable}
    assert set(listed) == {e.id for e in ERRATA if not e.computable}


def test_page_does_not_point_into_the_test_folder():
    nb = nbformat.read(PAGE, as_version=4)
    text = "\n".join(c.source for c in nb.cells)
    assert "tests/" not in text
    assert all("tests/" not in t for e in ERRATA for t in e.tests)


def test_counts_and_rendering():
    c = errata.counts()
    keys = ("errors", "slips", "ambiguities", "choices", "not_errors")
    assert sum(n[k] for n in c.values() for k in keys) == len(ERRATA)
    assert sum(n["proved"] for n in c.values()) == sum(e.computable for e in ERRATA)
    e = errata.by_id("nrgpt-eq24")
    card = errata.markdown_card(e, proved_here=True)
    assert "`nrgpt-eq24`" in card and "checked in the cell above" in card
    assert "{ref}`erratum <ch07-erratum-ff>`" in card and "test_" not in card     # reader pages name no test files
    table = errata.markdown_table(ERRATA)
    assert table.count("\n") == len(ERRATA) + 1
    with pytest.raises(KeyError):
        errata.by_id("no-such-entry")


def test_three_kinds_are_counted_apart():
    """The page's summary gives substantive errors, typesetting slips and ambiguities or stated
    choices as three counts (and the items that are not errors as a fourth), each from the registry."""
    k = errata.kind_counts()
    assert list(k) == [*errata.KINDS, "not an error"]
    assert sum(k.values()) == len(ERRATA)
    assert k["substantive errors"] == sum(e.status == "error" for e in ERRATA)
    assert k["typesetting slips"] == sum(e.status == "slip" for e in ERRATA)
    assert k["ambiguities and stated choices"] == sum(e.status in ("ambiguity", "stated choice") for e in ERRATA)
    summary = errata.markdown_kinds(ERRATA)
    assert summary.count("\n") == len(PAPERS) + 2
    total = summary.splitlines()[-1]
    assert total == "| **all four** | " + " | ".join(f"**{n}**" for n in k.values()) + \
        f" | **{sum(e.computable for e in ERRATA)}** |"
    # the page glues the counts into its prose instead of typing them
    nb = nbformat.read(PAGE, as_version=4)
    text = "\n".join(c.source for c in nb.cells if c.cell_type == "markdown")
    for key in ("errata-n-errors", "errata-n-slips", "errata-n-ambiguities", "errata-n-not"):
        assert f"{{glue:text}}`{key}`" in text
    assert not re.search(r"\b\d+ errors\b", text)


def test_slips_are_not_substantive_errors():
    """A sign, index or label typo whose intent is clear, and a strict inequality where only the
    non-strict one holds, are slips; their cards still say what is correct."""
    for i in ("cem-alibi-sign", "cem-one-third", "cem-eq15-label", "nrgpt-prop21-strict", "nrgpt-eq19-shape",
              "io-lemma1-log", "io-removing-wv", "hs-table19-sign"):
        e = errata.by_id(i)
        assert e.status == "slip" and e.kind == "typesetting slips", i
        assert "*Correct:*" in errata.markdown_card(e, proved_here=e.computable), i
    assert "\\le0" in errata.by_id("nrgpt-prop21-strict").correct


def test_the_overstated_entries():
    """Issue 55: the per-head preconditioner is a property of the design (no state-independent
    matrix, not "no matrix"); the learned step's free sign is an empirical finding the paper reports;
    the two Jacobian entries of Hyper-SET are one entry with the constraint set, whose proof and
    tests they keep."""
    per_head = errata.by_id("cem-per-head-precond")
    assert per_head.status == "not an error" and per_head.computable
    assert "state-independent" in per_head.correct
    assert not any(re.search(r"for any single matrix|no matrix", e.correct) for e in ERRATA)
    assert errata.by_id("hs-alpha-sign").status == "not an error"
    ids = {e.id for e in ERRATA}
    assert not {"hs-eq9-jacobian", "hs-eq11-jacobian"} & ids
    merged = errata.by_id("hs-no-projection")
    assert merged.status == "error" and "Jacobian" in merged.correct and "9, 11" in merged.where
    assert "test_hyperset.py::test_rmsnorm_update_drops_the_jacobian_exactly" in merged.tests


def test_prop_2_1_has_one_verdict():
    """NRGPT's Proposition 2.1 (every c > 0, a finite-step decrease) is false as printed; its proof
    gives the continuous-time rate; a finite step descends only for a small enough c. The strict
    inequality is a separate slip."""
    e = errata.by_id("nrgpt-prop21-discrete")
    assert e.status == "error"
    assert e.correct.startswith("false as printed") and "small enough $c$" in e.correct
    assert "continuous-time" in e.correct and "every $c>0$" in e.correct
    assert "c\\in\\mathbb R_{>0}" in e.printed
    assert errata.by_id("nrgpt-prop21-strict").status == "slip"


def test_anchors_other_pages_use_exist():
    """Every target of the errata page another page links to ({ref}`errata-...`) is defined on it."""
    nb = nbformat.read(PAGE, as_version=4)
    defined = set(re.findall(r"^\(([\w-]+)\)=\s*$", "\n".join(c.source for c in nb.cells if c.cell_type == "markdown"),
                             re.M))
    used = set()
    for path in sorted((ROOT / "book").glob("*.ipynb")) + sorted((ROOT / "book").glob("*.md")):
        if path == PAGE:
            continue
        if path.suffix == ".ipynb":
            text = "\n".join(c.source for c in nbformat.read(path, as_version=4).cells if c.cell_type == "markdown")
        else:
            text = path.read_text(encoding="utf-8")
        used |= set(re.findall(r"\{ref\}`(?:[^`<]*<)?(errata-[\w-]+)>?`", text))
        used |= set(re.findall(r"\{doc\}`errata#(errata-[\w-]+)`", text))
    assert used and used <= defined, sorted(used - defined)


def test_eq37_card_quotes_what_the_paper_prints():
    # the paper prints the right-hand side with its minus sign; the middle expression lacks one
    e = errata.by_id("nrgpt-eq37")
    assert "=-\\dot{\\mathbf x}_A^\\top\\boldsymbol\\eta^{-1}" in e.printed
    assert e.printed.count("-") == e.printed.count("-\\dot") + e.printed.count("^{-1}")   # no other minus
    assert e.correct.startswith("$-\\big(") and "\\eta^{-\\top}" in e.correct
