"""Author-year labels for the book's bibliography.

The text cites author-year (``bibtex_reference_style: author_year`` in ``_config.yml``); this
extension makes the bibliography itself match, so that "[Hopfield, 1982]" in a chapter appears as
"[Hopfield, 1982]" in front of its entry, not as "[7]". It registers two pybtex plugins:

- the label style ``authoryear``: "Hopfield, 1982", "Krotov and Hopfield, 2016",
  "Xu et al., 2026"; two works with the same label get "a", "b", ... after the year;
- the sorting style ``authoryear``: by surnames as plain text, then year, then title;
- the formatting style ``authoryear``: pybtex's ``unsrt`` entry formatting with the two styles above.

``_config.yml`` loads this module through ``sphinx: local_extensions`` and selects the style with
``bibtex_default_style: authoryear``.
"""

from collections import Counter

from pybtex.plugin import register_plugin
from pybtex.richtext import Text
from pybtex.style.formatting.unsrt import Style as UnsrtStyle
from pybtex.style.labels import BaseLabelStyle
from pybtex.style.sorting import BaseSortingStyle


def _plain(latex: str) -> str:
    """A name or year written in LaTeX ('R{\\"u}hle', '{NVIDIA Corporation}') as plain text."""
    return Text.from_latex(latex).render_as("text")


def _surname(person) -> str:
    parts = person.prelast_names + person.last_names
    return _plain(" ".join(parts))


def author_year_label(entry) -> str:
    persons = entry.persons.get("author") or entry.persons.get("editor") or []
    names = [_surname(p) for p in persons]
    if not names:
        who = _plain(entry.fields.get("key", entry.key))
    elif len(names) == 1:
        who = names[0]
    elif len(names) == 2:
        who = f"{names[0]} and {names[1]}"
    else:
        who = f"{names[0]} et al."
    return f"{who}, {_plain(entry.fields.get('year', 'n.d.'))}"


class AuthorYearLabelStyle(BaseLabelStyle):
    def format_labels(self, sorted_entries):
        entries = list(sorted_entries)
        labels = [author_year_label(e) for e in entries]
        counts = Counter(labels)
        seen = Counter()
        for label in labels:
            if counts[label] == 1:
                yield label
            else:
                yield label + "abcdefghijklmnopqrstuvwxyz"[seen[label]]
                seen[label] += 1


class AuthorYearSortingStyle(BaseSortingStyle):
    """Sort by the label's surnames (braces and accents as plain text), then year, then title."""

    def sorting_key(self, entry):
        persons = entry.persons.get("author") or entry.persons.get("editor") or []
        names = " ".join(_surname(p) + " " + _plain(" ".join(p.first_names)) for p in persons)
        return (names.lower(), entry.fields.get("year", ""), _plain(entry.fields.get("title", "")).lower())


class AuthorYearStyle(UnsrtStyle):
    default_sorting_style = "authoryear"
    default_label_style = "authoryear"


register_plugin("pybtex.style.labels", "authoryear", AuthorYearLabelStyle)
register_plugin("pybtex.style.sorting", "authoryear", AuthorYearSortingStyle)
register_plugin("pybtex.style.formatting", "authoryear", AuthorYearStyle)


def setup(app):
    return {"version": "1.0", "parallel_read_safe": True, "parallel_write_safe": True}
