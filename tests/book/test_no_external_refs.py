"""Nothing in the repository refers to material outside it.

The book and the library cite the papers themselves (authors, year, arXiv id or venue, section,
equation, table). Notes that were used while writing them (per-paper reading notes, extracted paper
texts, design documents) are not part of the repository, so a reader cannot follow a reference to
them. This test scans every text file git knows about (tracked, or new and not ignored), notebooks
included, and fails on the forms such references took.
"""

import re
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SELF = Path(__file__).resolve()

# (name, pattern): each names a kind of reference to material outside the repository.
PATTERNS = [
    ("path outside the repository", re.compile(r"\.\./shared|\bshared/(?:papers|seeds|design|anchors)\b")),
    ("reading notes ('digest')", re.compile(r"(?<![?&])\bdigests?\b(?!=)", re.IGNORECASE)),
    ("numbered paper file ('seed 003')", re.compile(r"\bseeds?\b\W{0,3}0\d\d", re.IGNORECASE)),
    ("note markers ([ISSUE], FLAG)", re.compile(r"\[ISSUE\b|\bFLAG\b")),
    ("labels of unnumbered equations from notes ([U1])", re.compile(r"\[U\d+\]")),
    ("design document", re.compile(r"\bPLAN\.md\b")),
]


def _files() -> list[Path]:
    try:
        out = subprocess.run(["git", "ls-files", "--cached", "--others", "--exclude-standard", "-z"],
                             cwd=ROOT, capture_output=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError):
        pytest.skip("not a git checkout")
    paths = [ROOT / p for p in out.decode().split("\0") if p]
    return sorted(p for p in paths if p.is_file() and p.resolve() != SELF)


def offending_lines(text: str) -> list[tuple[int, str, str]]:
    """(line number, kind, line) for every line of ``text`` that refers outside the repository."""
    hits = []
    for n, line in enumerate(text.splitlines(), 1):
        for name, pat in PATTERNS:
            if pat.search(line):
                hits.append((n, name, line.strip()[:160]))
    return hits


def test_patterns_catch_the_known_forms_and_spare_ordinary_words():
    bad = ["see ../shared/papers/cem.md", "digest §2.7", "the digest's reading", "(seed ``003``)",
           "seed 004, eqs. 3-12", "**[ISSUE]**", "§2.6 FLAG (a)", "[U4] gradient", "PLAN.md §7"]
    good = ["hashlib.sha256(raw).hexdigest()", "_digest(h, obj)", "seed_everything(0)",
            "torch.manual_seed(7)", "--seeds 0,1,2", "seed 0", "flag = True", "U[0, 1]",
            "re.sub(r\"[?&]digest=[0-9a-f]+\", \"\", text)"]
    assert all(offending_lines(s) for s in bad)
    assert not any(offending_lines(s) for s in good)


def test_no_reference_outside_the_repository():
    problems = []
    for path in _files():
        try:
            text = path.read_text(encoding="utf-8")
        except (UnicodeDecodeError, OSError):
            continue  # binary (images, compressed data)
        rel = path.relative_to(ROOT).as_posix()
        problems += [f"{rel}:{n}: {kind}: {line}" for n, kind, line in offending_lines(text)]
    assert not problems, "references to material outside the repository:\n" + "\n".join(problems)
