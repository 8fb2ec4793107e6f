"""Write the repository URL and pinned ref of ``_config.yml`` into every chapter's Colab cells.

``_config.yml`` holds the repository in one place (``repository: url`` and ``branch``, the pinned
ref). The site's Colab launch button reads it directly; this script copies it into the two places
inside each chapter notebook that a reader sees in Jupyter or Colab:

- the **Colab badge** in the first (title) cell:
  ``[![Open In Colab](.../colab-badge.svg)](https://colab.research.google.com/github/ORG/REPO/blob/REF/book/CHAPTER.ipynb)``;
  inserted under the title if missing;
- the **install cell** (the code cell that tests ``"google.colab" in sys.modules``): rewritten to
  ``%pip install -q "git+URL@REF"`` and tagged ``remove-cell`` so the site does not show it (it runs
  in Colab and does nothing elsewhere); inserted after the title cell if missing.

Only those two cells' ``source`` (and the install cell's tags) change; outputs, execution counts
and every other cell are left exactly as they are, so the committed, executed notebooks stay
valid for nbval. ``tests/book/test_site.py`` checks that every chapter agrees with ``_config.yml``.

Usage, from the repository root::

    python book/sync_colab.py                 # every book/*.ipynb
    python book/sync_colab.py book/ch01_associative_memory.ipynb
    python book/sync_colab.py --check         # only report notebooks that disagree (exit 1 if any)

It refuses to write a ref that is not pinned (see :func:`pin_problem`).
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

import nbformat
import yaml

ROOT = Path(__file__).resolve().parent.parent
BADGE_IMG = "https://colab.research.google.com/assets/colab-badge.svg"
BADGE_RE = re.compile(r"\[!\[Open In Colab\]\(" + re.escape(BADGE_IMG) + r"\)\]\([^)]*\)")
INSTALL_MARK = '"google.colab" in sys.modules'
HIDDEN_TAG = "remove-cell"
SITE_TAGS = {"hide-cell", "hide-input", "remove-cell", "remove-input"}  # replaced by HIDDEN_TAG


def settings(root: Path = ROOT) -> dict:
    """Repository URL, pinned ref, Colab base URL and path of the book in the repository."""
    cfg = yaml.safe_load((root / "_config.yml").read_text())
    repo = cfg["repository"]
    url = repo["url"].rstrip("/")
    m = re.fullmatch(r"https://github\.com/([^/]+)/([^/]+?)(?:\.git)?", url)
    if not m:
        raise ValueError(f"repository.url must be a GitHub URL, got {url!r}")
    return {
        "url": url,
        "org": m.group(1),
        "repo": m.group(2),
        "ref": str(repo["branch"]),
        "path_to_book": str(repo.get("path_to_book") or "").strip("/"),
        "colab": cfg.get("launch_buttons", {}).get("colab_url", "https://colab.research.google.com").rstrip("/"),
    }


def project_version(root: Path = ROOT) -> str:
    """``version`` of ``pyproject.toml``'s ``[project]`` table."""
    m = re.search(r'(?ms)^\[project\].*?^version\s*=\s*"([^"]+)"', (root / "pyproject.toml").read_text())
    if not m:
        raise ValueError("pyproject.toml has no [project] version")
    return m.group(1)


def pin_problem(ref: str, version: str) -> str | None:
    """Why ``ref`` is not a pinned ref for this release (``None`` when it is): it must be the release
    tag ``v<version>`` or a full 40-hex commit hash, never a branch such as ``main``, which moves
    (a chapter would then open in Colab with a library that no longer matches its outputs)."""
    if re.fullmatch(r"[0-9a-f]{40}", ref) or ref == f"v{version}":
        return None
    return (f"repository.branch is {ref!r}: pin it to the release tag 'v{version}' (pyproject.toml's version) "
            "or to a full commit hash")


def notebook_repo_path(nb_path: Path, root: Path = ROOT) -> str:
    """The notebook's path inside the repository, as the launch button builds it."""
    return nb_path.resolve().relative_to(root.resolve()).as_posix()


def colab_url(nb_path: Path, s: dict, root: Path = ROOT) -> str:
    """The URL of the launch button and the badge (the same as sphinx-book-theme's)."""
    return f"{s['colab']}/github/{s['org']}/{s['repo']}/blob/{s['ref']}/{notebook_repo_path(nb_path, root)}"


def badge(nb_path: Path, s: dict, root: Path = ROOT) -> str:
    return f"[![Open In Colab]({BADGE_IMG})]({colab_url(nb_path, s, root)})"


def install_source(s: dict) -> str:
    return (
        "import sys\n"
        "\n"
        'if "google.colab" in sys.modules:  # on Colab only: install cemlib at the book\'s pinned ref '
        "(torch and ipywidgets are already there)\n"
        f'    %pip install -q "git+{s["url"]}@{s["ref"]}"'
    )


def find_install_cell(nb) -> int | None:
    for i, c in enumerate(nb.cells):
        if c.cell_type == "code" and INSTALL_MARK in c.source:
            return i
    return None


def problems(nb, nb_path: Path, s: dict, root: Path = ROOT) -> list[str]:
    """How the notebook disagrees with ``_config.yml`` (empty when it agrees)."""
    out = []
    first = nb.cells[0] if nb.cells else None
    if first is None or first.cell_type != "markdown":
        out.append("the first cell is not the markdown title cell")
    else:
        found = BADGE_RE.findall(first.source)
        if found != [badge(nb_path, s, root)]:
            out.append(f"Colab badge is {found or 'missing'}, expected {colab_url(nb_path, s, root)}")
    i = find_install_cell(nb)
    if i is None:
        out.append("no install cell")
    else:
        c = nb.cells[i]
        if c.source != install_source(s):
            out.append(f"install cell differs from the pinned install:\n{c.source}")
        if HIDDEN_TAG not in c.metadata.get("tags", []):
            out.append(f"install cell is not tagged {HIDDEN_TAG}")
        if any(cc.cell_type == "code" for cc in nb.cells[:i]):
            out.append("a code cell comes before the install cell")
    return out


def sync(nb, nb_path: Path, s: dict, root: Path = ROOT) -> bool:
    """Rewrite the badge and the install cell in place; True if anything changed."""
    before = nbformat.writes(nb)
    first = nb.cells[0]
    if first.cell_type != "markdown":
        raise ValueError(f"{nb_path}: the first cell must be the markdown title cell")
    b = badge(nb_path, s, root)
    if BADGE_RE.search(first.source):
        first.source = BADGE_RE.sub(lambda _: b, first.source)
    else:
        lines = first.source.split("\n")
        title = next((k for k, line in enumerate(lines) if line.startswith("# ")), -1)
        lines[title + 1:title + 1] = ["", b] if title >= 0 else [b, ""]
        first.source = "\n".join(lines)
    i = find_install_cell(nb)
    if i is None:
        cell = nbformat.v4.new_code_cell(install_source(s))
        cell.execution_count = None
        nb.cells.insert(1, cell)
        i = 1
    cell = nb.cells[i]
    cell.source = install_source(s)
    tags = [t for t in cell.metadata.get("tags", []) if t not in SITE_TAGS]
    cell.metadata["tags"] = tags + [HIDDEN_TAG]
    return nbformat.writes(nb) != before


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("notebooks", nargs="*", type=Path, help="default: every book/*.ipynb")
    ap.add_argument("--check", action="store_true", help="only report disagreements; exit 1 if any")
    args = ap.parse_args(argv)
    s = settings()
    problem = pin_problem(s["ref"], project_version())
    if problem and not args.check:
        print(problem, file=sys.stderr)
        return 1
    paths = [p.resolve() for p in args.notebooks] or sorted((ROOT / "book").glob("*.ipynb"))
    bad = 0
    for path in paths:
        nb = nbformat.read(path, as_version=4)
        if args.check:
            for p in problems(nb, path, s):
                print(f"{path.name}: {p}")
                bad += 1
        elif sync(nb, path, s):
            nbformat.write(nb, path)
            print(f"updated {path.name}")
        else:
            print(f"unchanged {path.name}")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
