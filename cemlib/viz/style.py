"""The book's shared matplotlib style (white, opaque figures that stay readable in dark mode)."""

from __future__ import annotations

from importlib import resources

import matplotlib

__all__ = ["STYLE_PATH", "use_book_style", "render_png"]

STYLE_PATH = str(resources.files("cemlib.viz") / "book.mplstyle")


def use_book_style() -> None:
    """Apply the book style globally (call once at the top of a chapter)."""
    import matplotlib.pyplot as plt

    plt.style.use(STYLE_PATH)
    matplotlib.rcParams["figure.max_open_warning"] = 0


def render_png(draw, figsize, dpi: int = 80):
    """Draw one figure off-screen in the book style and return ``(png_bytes, draw(fig))``.

    ``draw`` fills a constrained-layout ``Figure`` (no pyplot, so no figure is left open and nothing
    is displayed): what every explorer's ``render_*_png`` needs for its ``ipywidgets.Image``."""
    import io

    import matplotlib.style
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    with matplotlib.style.context(STYLE_PATH):
        fig = Figure(figsize=figsize, dpi=dpi, layout="constrained")
        FigureCanvasAgg(fig)
        result = draw(fig)
        buf = io.BytesIO()
        fig.savefig(buf, format="png")
    return buf.getvalue(), result
