"""Tables and long outputs that fit the page: rendered HTML tables instead of printed text.

A printed table (``print(f"{name:34s} {value:8.3f} ...")``) keeps its width on every screen, so on
the book's website a wide one is cut at the column edge, and on a phone every one is. :func:`table`
returns an object that Jupyter, Colab and the website show as an HTML table, whose text cells wrap
and whose number cells line up on the right (the site's CSS, ``book/_static/reader.css``, styles
the classes ``cemlib-table``; elsewhere it is a plain HTML table). Its ``text/plain`` form is the
same table as aligned text, which is what nbval compares, so every number stays checked.
:func:`collapsed` shows a long output (a list of numbers) folded under a one-line summary.

    display(table([("CEM", 0.412, "agree"), ("Llama", 0.398, "")], ["model", "loss", "verdict"],
                  caption="Final validation loss", formats={"loss": "{:.3f}"}))
"""

from __future__ import annotations

import html
import numbers
import re

__all__ = ["Table", "table", "collapsed", "Collapsed"]

_NUMBER = re.compile(r"^[\s+\-−±x×~≈<>=]*[0-9.]+(?:e[+\-]?\d+)?[\s0-9.,%±+\-−e×x/()KMGkmsµ]*$")


def _is_number(value) -> bool:
    if isinstance(value, bool):
        return False
    if isinstance(value, numbers.Number):
        return True
    return isinstance(value, str) and bool(_NUMBER.match(value.strip())) if value else False


class Table:
    """A table shown as HTML (``_repr_html_``) and as aligned text (``__repr__``, ``str``)."""

    def __init__(self, rows, columns, caption: str | None = None, formats: dict | None = None,
                 float_format: str = "{:.4g}", stack: bool = False):
        self.columns = [str(c) for c in columns]
        self.caption = caption
        self.stack = bool(stack)
        formats = formats or {}
        self.rows = []
        for r, row in enumerate(rows):
            row = list(row)
            if len(row) != len(self.columns):
                raise ValueError(f"row {r} has {len(row)} cells, the table has {len(self.columns)} columns")
            cells = []
            for name, value in zip(self.columns, row):
                fmt = formats.get(name)
                if value is None:
                    cells.append("")
                elif fmt is not None and not isinstance(value, str):
                    cells.append(fmt.format(value))
                elif isinstance(value, float):
                    cells.append(float_format.format(value))
                else:
                    cells.append(str(value))
            self.rows.append(cells)
        self.numeric = [all(_is_number(row[j]) or row[j] == "" for row in self.rows) and
                        any(row[j] != "" for row in self.rows) for j in range(len(self.columns))]

    def to_text(self) -> str:
        """The table as aligned text (numbers right-aligned), with the caption above."""
        widths = [max([len(c)] + [len(row[j]) for row in self.rows]) for j, c in enumerate(self.columns)]

        def line(cells):
            return "  ".join(c.rjust(w) if num else c.ljust(w)
                             for c, w, num in zip(cells, widths, self.numeric)).rstrip()

        out = [self.caption] if self.caption else []
        out += [line(self.columns), line(["-" * w for w in widths])] + [line(r) for r in self.rows]
        return "\n".join(out)

    def to_html(self) -> str:
        def cls(j):
            return "num" if self.numeric[j] else ("text" if any(len(r[j]) > 24 for r in self.rows) else "")

        def label(j):  # stacked on a phone, each cell is labelled with its column
            return f" data-label='{html.escape(self.columns[j], quote=True)}'" if self.stack else ""

        head = "".join(f"<th class='{cls(j)}'>{html.escape(c)}</th>" for j, c in enumerate(self.columns))
        body = "".join("<tr>" + "".join(f"<td class='{cls(j)}'{label(j)}>{html.escape(c)}</td>"
                                        for j, c in enumerate(r)) + "</tr>" for r in self.rows)
        caption = f"<caption>{html.escape(self.caption)}</caption>" if self.caption else ""
        classes = "cemlib-table cemlib-stack" if self.stack else "cemlib-table"
        return (f"<div class='cemlib-table-wrap'><table class='{classes}'>{caption}"
                f"<thead><tr>{head}</tr></thead><tbody>{body}</tbody></table></div>")

    def _repr_html_(self) -> str:
        return self.to_html()

    def __repr__(self) -> str:
        return self.to_text()

    __str__ = __repr__


def table(rows, columns, caption: str | None = None, formats: dict | None = None,
          float_format: str = "{:.4g}", stack: bool = False) -> Table:
    """A :class:`Table` of ``rows`` (sequences of cells) under the headers ``columns``.

    Cells are shown as given when they are strings (format numbers yourself where the digits
    matter, or name a format per column in ``formats``, e.g. ``{"loss": "{:.3f}"}``, which applies
    to the column's non-string cells); other floats
    use ``float_format``; ``None`` is an empty cell. A column whose cells all look like numbers is
    right-aligned and never wraps; text wraps inside its cell. With ``stack`` (for tables of
    sentences, such as the claims tables with their verdicts) each row becomes a block of lines
    labelled with the column names on a phone (the site's CSS, class ``cemlib-stack``), so that
    no cell sits off the screen; the text form is unchanged."""
    return Table(rows, columns, caption, formats, float_format, stack)


class Collapsed:
    """A long text output shown folded under a summary line (HTML ``<details>``); its text form is
    the whole text (nbval compares it)."""

    def __init__(self, text: str, summary: str):
        self.text, self.summary = text, summary

    def _repr_html_(self) -> str:
        return (f"<details class='cemlib-collapsed'><summary>{html.escape(self.summary)}</summary>"
                f"<pre>{html.escape(self.text)}</pre></details>")

    def __repr__(self) -> str:
        return self.text

    __str__ = __repr__


def collapsed(text: str, summary: str) -> Collapsed:
    """Show ``text`` (a long output: a list of numbers, a log) folded under ``summary``."""
    return Collapsed(text, summary)
