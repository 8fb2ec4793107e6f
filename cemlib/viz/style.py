"""The book's shared matplotlib style (white, opaque figures that stay readable in dark mode)."""

from __future__ import annotations

from importlib import resources

import matplotlib

__all__ = ["STYLE_PATH", "use_book_style", "render_png", "png_size"]

STYLE_PATH = str(resources.files("cemlib.viz") / "book.mplstyle")


def use_book_style(retina: bool = True) -> None:
    """Apply the book style globally (call once at the top of a chapter).

    In a notebook (IPython running) with ``retina``, figures are also displayed as PNGs of twice
    the resolution shown at their normal size (``figure.dpi`` of the style, 90, so 180 dpi): sharp
    on high-density screens and when a phone reader zooms in."""
    import matplotlib.pyplot as plt

    plt.style.use(STYLE_PATH)
    matplotlib.rcParams["figure.max_open_warning"] = 0
    if retina:
        try:
            from IPython import get_ipython
        except ImportError:
            return
        if get_ipython() is not None:
            try:
                from matplotlib_inline.backend_inline import set_matplotlib_formats
            except ImportError:
                return
            set_matplotlib_formats("retina")


#: frozen layouts of :func:`render_png`: (layout_key, figsize, dpi) -> the axes' positions
_LAYOUTS: dict = {}


def render_png(draw, figsize, dpi: int = 80, layout_key=None):
    """Draw one figure off-screen in the book style and return ``(png_bytes, draw(fig))``.

    ``draw`` fills a ``Figure`` (no pyplot, so no figure is left open and nothing is displayed):
    what every explorer's ``render_*_png`` needs for its ``ipywidgets.Image``. The first drawing
    is laid out by constrained layout. With a ``layout_key`` (any hashable, e.g. the explorer and
    the choices that change the axes' labels), the axes' positions of that first drawing are kept
    and reused by every later drawing with the same key, size and dpi, which then skips the layout
    engine (about half of an explorer's redraw time); a drawing with a different number of axes is
    laid out again."""
    import io

    import matplotlib.style
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    key = None if layout_key is None else (layout_key, tuple(figsize), dpi)
    frozen = _LAYOUTS.get(key) if key is not None else None
    with matplotlib.style.context(STYLE_PATH):
        fig = Figure(figsize=figsize, dpi=dpi, layout=None if frozen else "constrained")
        FigureCanvasAgg(fig)
        result = draw(fig)
        if frozen is not None and len(frozen) == len(fig.axes):
            for ax, pos in zip(fig.axes, frozen):
                ax.set_position(pos, which="both")
        elif frozen is not None:
            fig.set_layout_engine("constrained")
        buf = io.BytesIO()
        fig.savefig(buf, format="png", dpi=dpi)       # at ``dpi``, not the style's savefig.dpi
        if key is not None and (frozen is None or len(frozen) != len(fig.axes)):
            _LAYOUTS[key] = [ax.get_position(original=True).frozen() for ax in fig.axes]
    return buf.getvalue(), result


def png_size(png: bytes) -> tuple[int, int]:
    """``(width, height)`` in pixels of PNG bytes (from the IHDR chunk)."""
    if png[:8] != b"\x89PNG\r\n\x1a\n":
        raise ValueError("not PNG data")
    return int.from_bytes(png[16:20], "big"), int.from_bytes(png[20:24], "big")
