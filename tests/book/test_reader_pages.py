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

ROOT = Path(__file__).resolve().parents[2]
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
    assert internal_references([("p", "`tests/layers/test_nrgpt_block.py` measures")])
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


# ------------------------------------------------------------------ no process on the page
# What the site shows of a page: its markdown and the outputs of cells not tagged ``remove-cell`` or
# ``remove-output`` (the input of a hidden cell is code, never shown as prose). A reader page says
# nothing about how the book was made: no "campaign", no "session" (the word), no "STORED:" label,
# no "stored sweep", no "not yet run" row, no commit hash (7 or more hexadecimal characters with a
# digit and a letter), no internal claim ID (H3, H12: internal hypothesis numbers).
PROCESS = [
    ("campaign", re.compile(r"\bcampaigns?\b", re.I)),
    ("session", re.compile(r"\bsessions?\b", re.I)),
    ("STORED", re.compile(r"\bSTORED\b")),
    ("stored sweep", re.compile(r"\bstored sweeps?\b", re.I)),
    ("not yet run", re.compile(r"\bnot yet run\b", re.I)),
    ("commit hash", re.compile(r"(?<![\w/.-])(?=[0-9a-f]*[a-f])(?=[0-9a-f]*[0-9])[0-9a-f]{7,40}(?![\w/.-])")),
    ("claim ID", re.compile(r"(?<![\w$\\{_^-])H\d{1,2}(?![\w}])")),
]
SHOWN_MIMES = ("text/plain", "text/markdown", "text/latex", "text/html")


def shown_texts(path: Path) -> list[tuple[str, str]]:
    """``(where, text)`` of what the site shows: markdown, and the outputs of cells that are not
    removed from the page (the image data and widget state of an output are not text)."""
    if path.suffix == ".md":
        return [("page", path.read_text(encoding="utf-8"))]
    out = []
    for i, cell in enumerate(nbformat.read(path, as_version=4).cells):
        if cell.cell_type == "markdown":
            out.append((f"cell {i} (markdown)", cell.source))
            continue
        if {"remove-cell", "remove-output"} & set(cell.metadata.get("tags", [])):
            continue
        for o in cell.get("outputs", []):
            if o.get("output_type") == "stream":
                out.append((f"cell {i} (output)", o.get("text", "")))
            for mime in SHOWN_MIMES:
                if mime in o.get("data", {}) and not (mime == "text/plain" and len(o["data"]) > 1):
                    out.append((f"cell {i} ({mime})", o["data"][mime]))
    return out


def process_words(texts) -> list[tuple[str, str, str]]:
    """``(kind, where, context)`` of every mention of the book's making on a page."""
    found = []
    for where, text in texts:
        text = re.sub(r"[A-Za-z0-9+/=\\]{40,}", " ", text)       # base64 data: images, animation frames
        for kind, pat in PROCESS:
            for m in pat.finditer(text):
                found.append((kind, where, text[max(0, m.start() - 40):m.end() + 40].replace("\n", " ")))
    return found


# Accepted for now (page, kind), with a reason: none. A new one fails, and so does a listed one that
# has gone (remove it here).
KNOWN_PROCESS: set[tuple[str, str]] = set()


@pytest.mark.parametrize("path", PAGES, ids=lambda p: p.name)
def test_no_process_on_the_page(path):
    found = process_words(shown_texts(path))
    known = {k for k in KNOWN_PROCESS if k[0] == path.name}
    new = [f for f in found if (path.name, f[0]) not in known]
    assert not new, "\n".join(f"{kind}: {where}: ...{ctx}..." for kind, where, ctx in new)
    assert not known - {(path.name, f[0]) for f in found}, f"fixed, remove from KNOWN_PROCESS: {known}"


def test_process_rule_catches_each_form():
    bad = [("cell 1 (markdown)", "The book's GPU campaign ran these."),
           ("cell 2 (output)", "in the first session of the run"),
           ("cell 3 (output)", "STORED: runs/ch05.json"),
           ("cell 4 (markdown)", "from the stored sweep of chapter 5"),
           ("cell 5 (text/html)", "<td>not yet run</td>"),
           ("cell 6 (output)", "recorded at commit 4dc4d4c on a clean tree"),
           ("cell 7 (markdown)", "H12 says that recursion helps")]
    assert [k for k, _, _ in process_words(bad)] == [k for k, _ in PROCESS]
    fine = [("p", "a GPU run on an H100, 16 heads, the 1,234,567 tokens, "
                  "the sha256 of a file is not shown, $\\mathbf H_1$, $H_2$, W_{H3}, a 5e-07 error, "
                  "decade 1970, the stored results of a sweep")]
    assert process_words(fine) == []


# ------------------------------------------------------------------ captions: counts come from the data
# A figure caption may not type a count of what the figure plots (seeds, steps, runs, tokens, ...):
# such a number is glued from the cell that computes it ({glue:text}`key`), so that the caption
# cannot disagree with the data. Equation, section, table and figure numbers, units and the
# caption's math are not counts; "one" is not counted (one panel, one seed of a live run).
NUMBER_WORDS = ("two three four five six seven eight nine ten eleven twelve thirteen fourteen fifteen "
                "sixteen seventeen eighteen nineteen twenty thirty forty fifty sixty hundred thousand").split()
COUNT_NOUNS = ("seeds steps runs iterations epochs tokens samples examples sequences characters batches "
               "draws starts particles patterns models layers heads expressions windows frames states "
               "contexts inputs images trials repetitions points temperatures kernels queries tiles sizes "
               "settings keys matrices anchors subspaces directions values").split()   # plural: a count >= 2
COUNT = re.compile(r"(?:(?<![\w.§,-])(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?k?(?![\w,.]\d)"
                   r"|(?<![\w-])(?:" + "|".join(NUMBER_WORDS) + r"))"
                   r"(?:\s+[A-Za-z][\w-]*){0,2}?\s+(?:" + "|".join(COUNT_NOUNS) + r")\b", re.I)
_NOT_COUNTED = [re.compile(p, re.S) for p in (
    r"\$\$.*?\$\$", r"\$[^$]*\$",                       # math
    r"\{[\w:-]+\}`[^`]*`",                              # roles: glue, eq, numref, cite, ...
    r"``?[^`]*``?",                                     # code
    r"(?:[Ee]qs?\.|[Tt]ables?|[Ff]igs?\.|[Ff]igures?|§|[Ss]ections?|App\.|[Aa]ppendix|Algorithms?|"
    r"Theorems?|Lemmas?|Props?\.|Proposition)\s*[\dA-Z][\d.,–-]*")]

# Typed counts in captions of pages still being edited, or that quote the paper's own numbers
# (page, phrase): a new one fails, and a listed one that has gone fails (remove it here).
KNOWN_CAPTION_COUNTS: set[tuple[str, str]] = {
    # training-set sizes of the recorded sweeps (the sweep's settings; glued when ch06 is next run)
    ("ch06_recursion_regression.ipynb", "1,000 training inputs"),
    ("ch06_recursion_regression.ipynb", "4,000 inputs"),
    # the live LIS run's model size, typed (glued when ch08 is next run)
    ("ch08_free_energy_newton.ipynb", "3 layers"), ("ch08_free_energy_newton.ipynb", "4 heads"),
    # the evaluation batches and sublayer steps of the stored runs (glued when ch10 is next run)
    ("ch10_four_energies_benchmark.ipynb", "8 fixed batches"),
    ("ch10_four_energies_benchmark.ipynb", "eight sublayer steps"),
    # settings of a model drawn, not data: the roofline's cache, the tile picture, the two kernels
    # and runs of a stored file named in the text above the figure
    ("ch11_fused_kernels.ipynb", "4096 tokens"), ("ch11_fused_kernels.ipynb", "8 tiles"),
    ("ch11_fused_kernels.ipynb", "two CEM kernels"), ("ch11_fused_kernels.ipynb", "two runs"),
    # the paper's own number (Fig. 3's 100k steps), and settings of the demonstrations run in the
    # visible code above each figure (a random block's steps and step sizes, the live model's rerun)
    ("ch07_nrgpt.ipynb", "100k steps"), ("ch07_nrgpt.ipynb", "16 expressions"),
    ("ch07_nrgpt.ipynb", "200 steps"), ("ch07_nrgpt.ipynb", "30 steps"),
    ("ch07_nrgpt.ipynb", "40 steps"), ("ch07_nrgpt.ipynb", "three step sizes"),
    # the circle demonstrations' settings, typed in the visible code above the figures
    ("ch09_hyperset.ipynb", "40 steps"), ("ch09_hyperset.ipynb", "Forty iterations"),
    ("ch09_hyperset.ipynb", "Twelve tokens"), ("ch09_hyperset.ipynb", "four subspaces"),
    ("ch09_hyperset.ipynb", "three anchor directions"), ("ch09_hyperset.ipynb", "three anchors"),
    ("ch09_hyperset.ipynb", "twelve tokens"),
}


def figure_captions(path: Path) -> list[tuple[str, str]]:
    """``(figure name, caption)`` of every numbered figure of a page: a code cell's
    ``mystnb.figure`` metadata, or a ``{figure}`` / ``{glue:figure}`` directive in markdown."""
    if path.suffix == ".md":
        cells = [("page", "markdown", path.read_text(encoding="utf-8"), {})]
    else:
        cells = [(f"cell {i}", c.cell_type, c.source, c.metadata)
                 for i, c in enumerate(nbformat.read(path, as_version=4).cells)]
    out = []
    for where, kind, source, meta in cells:
        fig = meta.get("mystnb", {}).get("figure", {}) if kind == "code" else {}
        if fig.get("caption"):
            out.append((fig.get("name", where), fig["caption"]))
        if kind == "markdown":
            for m in re.finditer(r"^(```+|:::+)\{(?:glue:)?figure\}[^\n]*\n(.*?)^\1", source, re.S | re.M):
                body = re.sub(r"^:\w+:.*$", "", m.group(2), flags=re.M)
                name = re.search(r"^:name:\s*(\S+)", m.group(2), re.M)
                out.append((name.group(1) if name else where, body))
    return out


def typed_counts(caption: str) -> list[str]:
    """The counts a caption types instead of gluing (see COUNT)."""
    for pat in _NOT_COUNTED:
        caption = pat.sub(" ", caption)
    return [re.sub(r"\s+", " ", m.group(0)) for m in COUNT.finditer(caption)]


def test_caption_counts_are_glued():
    found = {(path.name, phrase) for path in PAGES for _, cap in figure_captions(path) for phrase in typed_counts(cap)}
    new = found - KNOWN_CAPTION_COUNTS
    assert not new, "typed counts in figure captions (glue them): " + "; ".join(f"{p}: '{c}'" for p, c in sorted(new))
    assert not KNOWN_CAPTION_COUNTS - found, f"fixed, remove from KNOWN_CAPTION_COUNTS: {sorted(KNOWN_CAPTION_COUNTS - found)}"


def test_caption_rule():
    assert typed_counts("The validation loss of three seeds, after 600 steps of 5 runs.") == \
        ["three seeds", "600 steps", "5 runs"]
    assert typed_counts("Twelve tokens on the unit circle; 1,000 training inputs; 100k steps") == \
        ["Twelve tokens", "1,000 training inputs", "100k steps"]
    assert typed_counts("the mean of {glue:text}`ch05-n-seeds` seeds over {glue:text}`ch05-steps` steps, "
                        "eq. 8 (eq. 10 steps), Table 3, Fig. 2 and §4.2 runs, $N=3$ particles, "
                        "$T=2$ steps, `run(c, 30)` steps, one seed, 20% of the pixels, 8 GB, 64 px, "
                        "180 dpi, 3.2 ms, Appendix D.4 settings") == []
