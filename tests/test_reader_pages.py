"""What a reader sees on a page: no control characters, no pointers into the repository's internals,
no claim labels used before they are defined.

Reader pages are the pages of ``_toc.yml``: the chapter notebooks (markdown cells and the text of
code-cell outputs) and the markdown pages. What counts:

- **Control characters** (except newline; and TAB outside code) in any notebook cell's source or
  text output, or a markdown page. In markdown they are the traces of a lost backslash: ``\\a`` of
  ``\\approx`` became BEL, ``\\t`` of ``\\tau`` became TAB, and the formula breaks.
- **Internal file references**: a web or Colab reader cannot follow a pointer into the test suite
  (``tests/``, ``test_*.py``, ``conftest.py``), to the repository's README files (``README*.md``),
  or to repository files outside the library and its benchmark scripts (``book/*.py``, ``.ci/``,
  ``setup.py``). Library sources (``cemlib/...py``) and benchmark scripts (``benchmarks/...py``,
  shipped with the package) may be named.
- **Wrapping outputs**: a code cell tagged ``wrap-output`` has its long output lines wrapped at the
  column edge on the website (``book/_static/reader.css``); that is right for sentences (the result
  of a check) and wrong for an aligned table, whose columns it would garble. A tagged cell may print
  no aligned line (two words separated by three or more spaces).
- **Claim labels** (``claim 10``, ``C11``, ``identity 12``) must be defined on the page before
  they are used. A label is defined where it heads a row of a table (a markdown table's first
  cell, or the start of a line of a printed table or list), or where it is introduced in bold
  (``**C11**``, ``**claim 10**``).

``KNOWN`` lists accepted violations (none at present); the test fails on any other one, and on a
listed one that has gone (remove it from the list).
"""

import re
from pathlib import Path

import nbformat
import pytest

ROOT = Path(__file__).resolve().parent.parent
TOC_FILES = re.findall(r"file:\s*(\S+)", (ROOT / "_toc.yml").read_text()) + \
    re.findall(r"root:\s*(\S+)", (ROOT / "_toc.yml").read_text())
PAGES = sorted(p for f in TOC_FILES for p in (ROOT / f"{f}.ipynb", ROOT / f"{f}.md") if p.exists())

CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f]")        # TAB (\x09) allowed only where code allows it
CONTROL_NO_TAB = re.compile(r"[\x00-\x09\x0b-\x1f\x7f]")

INTERNAL = [
    ("the test suite", re.compile(r"(?<![\w.-])tests/|\btest_\w+\.py\b|\bconftest\.py\b")),
    ("a README file", re.compile(r"\bREADME\w*\.md\b")),
    ("a repository script outside cemlib/ and benchmarks/",
     re.compile(r"(?<![\w/.-])(?!cemlib/|benchmarks/|\.\./cemlib/)(?:[\w.-]+/)+[\w-]+\.py\b|\bsetup\.py\b|(?<![\w/])\.ci/")),
]

LABEL = re.compile(r"\b(?:[Cc]laims? (?:C)?\d+|C\d{1,2}|[Ii]dentit(?:y|ies) \d+)\b")
_LABEL_KEY = re.compile(r"(\d+)")

# Accepted violations (page, kind, detail): none; a new one fails the test.
KNOWN: set[tuple[str, str, str]] = set()     # every reader page is clean now; add here only with a reason


def reader_texts(path: Path) -> list[tuple[str, str]]:
    """``(where, text)`` of everything a reader sees on the page, in page order: markdown cells and
    the text outputs of code cells (``stream``, ``text/plain``, ``text/markdown``, ``text/latex``)."""
    if path.suffix == ".md":
        return [("page", path.read_text(encoding="utf-8"))]
    out = []
    for i, cell in enumerate(nbformat.read(path, as_version=4).cells):
        if cell.cell_type == "markdown":
            out.append((f"cell {i} (markdown)", cell.source))
        for o in cell.get("outputs", []):
            if o.get("output_type") == "stream":
                out.append((f"cell {i} (output)", o.get("text", "")))
            for mime in ("text/plain", "text/markdown", "text/latex"):
                if mime in o.get("data", {}):
                    out.append((f"cell {i} ({mime})", o["data"][mime]))
    return out


def control_characters(path: Path) -> list[str]:
    """Control characters in any source or text output (TAB allowed in code sources only)."""
    found = []
    if path.suffix == ".md":
        cells = [("page", path.read_text(encoding="utf-8"), CONTROL_NO_TAB)]
    else:
        nb = nbformat.read(path, as_version=4)
        cells = [(f"cell {i} ({c.cell_type} source)", c.source, CONTROL if c.cell_type == "code" else CONTROL_NO_TAB)
                 for i, c in enumerate(nb.cells)]
        cells += [(where, text, CONTROL_NO_TAB) for where, text in reader_texts(path) if "markdown" not in where]
    for where, text, pat in cells:
        for m in pat.finditer(text):
            found.append(f"{where}: {m.group(0)!r} in ...{text[max(0, m.start() - 30):m.end() + 20]!r}")
    return found


def internal_references(texts) -> list[tuple[str, str, str]]:
    """``(kind, where, line)`` of every pointer to a file a reader cannot follow."""
    hits = []
    for where, text in texts:
        for line in text.splitlines():
            if line.lstrip().startswith(("```{literalinclude}", ":::{literalinclude}")):
                continue
            for kind, pat in INTERNAL:
                if pat.search(line):
                    hits.append((kind, where, line.strip()[:160]))
                    break
    return hits


def _norm(label: str) -> str:
    """``claim 10`` / ``Claim 10`` / ``claims 10`` -> ``claim 10``; ``C11``, ``claim C11`` -> ``C11``."""
    label = re.sub(r"^[Cc]laims? (?=C)", "", label)
    label = re.sub(r"^[Cc]laims?", "claim", label)
    return re.sub(r"^[Ii]dentit(?:y|ies)", "identity", label)


def _definitions(text: str, printed: bool) -> list[tuple[int, str]]:
    """Positions where a label is defined: heading a table row (a markdown row, or any line of a
    printed output), or in bold."""
    defs = []
    row = r"(?m)^[ \t]*" if printed else r"(?m)^[ \t]*\|[ \t]*(?:\*\*)?"
    for m in re.finditer(row + "(" + LABEL.pattern + r")", text):
        defs.append((m.start(1), _norm(m.group(1))))
    for m in re.finditer(r"\*\*[^*\n]*?(" + LABEL.pattern + r")[^*\n]*?\*\*", text):
        defs.append((m.start(1), _norm(m.group(1))))
    return defs


def undefined_labels(texts) -> list[tuple[str, str, str]]:
    """``(label, where, context)`` of each label used with no definition earlier on the page."""
    defined, problems, seen = set(), [], set()
    for where, text in texts:
        defs = sorted(_definitions(text, printed="markdown" not in where and where != "page"))
        for m in LABEL.finditer(text):
            label = _norm(m.group(0))
            defined |= {d for pos, d in defs if pos <= m.start()}
            if label not in defined and label not in seen:
                seen.add(label)
                problems.append((label, where, text[max(0, m.start() - 40):m.end() + 40].replace("\n", " ")))
    return problems


def violations(path: Path) -> set[tuple[str, str, str]]:
    texts = reader_texts(path)
    found = {(path.name, "internal", kind) for kind, _, _ in internal_references(texts)}
    found |= {(path.name, "claim", label) for label, _, _ in undefined_labels(texts)}
    return found


ALIGNED = re.compile(r"\S {3,}\S")      # two words three or more spaces apart: a column of a printed table


def cell_output_text(cell) -> str:
    """The text a code cell shows: its streams and the ``text/plain`` of outputs that have no richer
    form (an HTML table, Markdown or a figure is laid out by the page, not as printed text)."""
    parts = []
    for o in cell.get("outputs", []):
        if o.get("output_type") == "stream":
            parts.append(o.get("text", ""))
        elif o.get("data") and set(o["data"]) == {"text/plain"}:
            parts.append(o["data"]["text/plain"])
    return "\n".join(parts)


def garbled_by_wrapping(path: Path) -> list[str]:
    """``cell i: line`` for each aligned line in the output of a cell tagged ``wrap-output``."""
    if path.suffix != ".ipynb":
        return []
    found = []
    for i, cell in enumerate(nbformat.read(path, as_version=4).cells):
        if cell.cell_type == "code" and "wrap-output" in cell.metadata.get("tags", []):
            found += [f"cell {i}: {line.strip()[:100]}" for line in cell_output_text(cell).splitlines()
                      if ALIGNED.search(line)]
    return found


@pytest.mark.parametrize("path", PAGES, ids=lambda p: p.name)
def test_wrapping_outputs_hold_no_aligned_table(path):
    assert garbled_by_wrapping(path) == []


@pytest.mark.parametrize("path", PAGES, ids=lambda p: p.name)
def test_no_control_characters(path):
    assert control_characters(path) == []


@pytest.mark.parametrize("path", PAGES, ids=lambda p: p.name)
def test_no_internal_references_or_undefined_labels(path):
    texts = reader_texts(path)
    found = violations(path)
    known = {k for k in KNOWN if k[0] == path.name}
    new = found - known
    detail = [f"{kind}: {where}: {line}" for kind, where, line in internal_references(texts)] + \
             [f"label {label!r} used before any definition: {where}: ...{ctx}..." for label, where, ctx in undefined_labels(texts)]
    assert not new, f"{sorted(new)}\n" + "\n".join(detail)
    assert not known - found, f"fixed, remove from KNOWN: {sorted(known - found)}"


def test_rules_catch_the_known_forms():
    assert control_characters.__doc__
    wrapped = nbformat.v4.new_notebook()
    cell = nbformat.v4.new_code_cell("show()", metadata={"tags": ["wrap-output"]})
    cell.outputs = [nbformat.v4.new_output("stream", name="stdout", text="SymPy: the gradient == -sum_j a_j b_j\n"),
                    nbformat.v4.new_output("display_data", data={"text/plain": "model   loss\nCEM     1.475"})]
    wrapped.cells = [cell]
    wrapped_path = Path(pytest.importorskip("tempfile").mkdtemp()) / "w.ipynb"
    nbformat.write(wrapped, wrapped_path)
    assert garbled_by_wrapping(wrapped_path) == ["cell 0: model   loss", "cell 0: CEM     1.475"]
    cell.outputs[1]["data"]["text/html"] = "<table></table>"       # a rendered table: laid out by the page
    nbformat.write(wrapped, wrapped_path)
    assert garbled_by_wrapping(wrapped_path) == []
    bad_md = nbformat.v4.new_notebook()
    bad_md.cells = [nbformat.v4.new_markdown_cell("one-hot, $\\mC\x07pprox0$ and $\tau$")]
    bad_path = Path(pytest.importorskip("tempfile").mkdtemp()) / "x.ipynb"
    nbformat.write(bad_md, bad_path)
    assert len(control_characters(bad_path)) == 2
    assert internal_references([("p", "Also tested by `test_cem_energies.py::test_x`.")])
    assert internal_references([("p", "`tests/test_nrgpt_block.py` measures")])
    assert internal_references([("p", "see `cemlib/README_data.md`")])
    assert internal_references([("p", "run `python book/rerun.py`")])
    assert not internal_references([("p", "`python benchmarks/cpu_speed.py --all` and `cemlib/kernels/ops.py`")])
    assert not internal_references([("p", "```{literalinclude} ../cemlib/kernels/reference.py")])
    assert not internal_references([("p", "`tied_attention_triton.py` and the latest results")])
    # labels: used before a definition, defined in a table, in bold, at the start of a printed line
    md, out = "cell 0 (markdown)", "cell 1 (output)"
    assert [p[0] for p in undefined_labels([(md, "Claim C11 of the paper has three parts.")])] == ["C11"]
    assert undefined_labels([(md, "| C4 (Fig. 2a) | tied |\n\nso C4 agrees")]) == []
    assert undefined_labels([(md, "**Claim 10** (§4): it descends. Claim 10 agrees.")]) == []
    assert undefined_labels([(out, "claim 1 (Lemma 1): the Boltzmann distribution\nclaim 1 holds")]) == []
    assert [p[0] for p in undefined_labels([(md, "as claim 3 says"), (out, "claim 3: no increase")])] == ["claim 3"]
    assert [p[0] for p in undefined_labels([(md, "relate it to identity 12")])] == ["identity 12"]
    assert undefined_labels([(md, "C++ and C (the language), Cov, 2C4")]) == []
