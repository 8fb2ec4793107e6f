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

ROOT = Path(__file__).resolve().parent.parent
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
            path = ROOT / "tests" / file
            assert path.exists(), (e.id, t)
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
    assert sum(n["errors"] + n["ambiguities"] + n["choices"] + n["not_errors"] for n in c.values()) == len(ERRATA)
    assert all(n["errors"] == n["proved"] + n["reading"] for n in c.values())
    e = errata.by_id("nrgpt-eq24")
    card = errata.markdown_card(e, proved_here=True)
    assert "`nrgpt-eq24`" in card and "checked in the cell above" in card
    assert "{ref}`erratum <ch07-erratum-ff>`" in card and "test_" not in card     # reader pages name no test files
    table = errata.markdown_table(ERRATA)
    assert table.count("\n") == len(ERRATA) + 1
    with pytest.raises(KeyError):
        errata.by_id("no-such-entry")


def test_ambiguities_and_choices_are_separate_and_say_why():
    others = [e for e in ERRATA if e.status in ("ambiguity", "stated choice")]
    # the four the issue names, at least, are not errors
    assert {"cem-alibi-slopes", "cem-effective-batch", "hs-vmf-relu", "hs-radius"} <= {e.id for e in others}
    assert all(e.why.strip() for e in others)
    table = errata.markdown_reasons(ERRATA)
    assert table.count("\n") == len(others) + 1 and "`hs-radius`" in table and "`nrgpt-eq24`" not in table
    card = errata.markdown_card(errata.by_id("hs-vmf-relu"), proved_here=True)
    assert "*Status:* stated choice" in card and "*Our reading:*" in card
    assert "*Correct:*" in errata.markdown_card(errata.by_id("nrgpt-eq24"), proved_here=True)
    with pytest.raises(ValueError, match="needs its why"):
        errata.Erratum("x-y", "nrgpt2025", "§1", "p", "c", "reading", "h", status="ambiguity")
    with pytest.raises(ValueError, match="status"):
        errata.Erratum("x-y", "nrgpt2025", "§1", "p", "c", "reading", "h", status="typo")


def test_eq37_card_quotes_what_the_paper_prints():
    # the paper prints the right-hand side with its minus sign; the middle expression lacks one
    e = errata.by_id("nrgpt-eq37")
    assert "=-\\dot{\\mathbf x}_A^\\top\\boldsymbol\\eta^{-1}" in e.printed
    assert e.printed.count("-") == e.printed.count("-\\dot") + e.printed.count("^{-1}")   # no other minus
    assert e.correct.startswith("$-\\big(") and "\\eta^{-\\top}" in e.correct
