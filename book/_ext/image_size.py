"""Figures keep their aspect ratio at every width: no image gets a fixed height.

Where the fixed height came from. The book's figures are notebook outputs drawn with
``cemlib.viz.style.use_book_style``, which shows them as *retina* PNGs (twice the pixels, shown at
half size); IPython stores that display size in the output's metadata,
``{"image/png": {"width": W, "height": H}}``. MyST-NB's ``render_image`` copies both numbers onto
the image node, and Sphinx writes them as ``style="width: Wpx; height: Hpx"``. An inline height
wins over the stylesheet's ``height: auto``, so in a column narrower than ``W`` the image shrank in
width only (up to 1.5 times squashed on a laptop, 3.3 times on a phone).

The fix is at that step: this extension removes ``height`` (and ``scale``) from every image node
before the page is written, and keeps ``width``, the size the figure was drawn for. With
``book/_static/reader.css`` (``img { max-width: 100%; height: auto }``) the browser then scales the
image to the column with its own aspect ratio. The book never asks for a fixed height anywhere
else (no ``:height:`` option on a figure directive; ``tests/book/test_site.py`` checks the sources, the
stylesheet and the built pages).
"""

from docutils import nodes

#: image-node options that fix the rendered height (the width alone keeps the aspect ratio)
FIXED_HEIGHT = ("height", "scale")


def drop_fixed_heights(doctree) -> int:
    """Remove the height-fixing options from every image node of ``doctree``; return how many."""
    n = 0
    for image in doctree.findall(nodes.image):
        for key in FIXED_HEIGHT:
            if key in image.attributes:
                del image.attributes[key]
                n += 1
    return n


def _resolved(app, doctree, docname):
    drop_fixed_heights(doctree)


def setup(app):
    # after every transform and post-transform (glued figures are pasted in by then), per page
    app.connect("doctree-resolved", _resolved)
    return {"version": "1.0", "parallel_read_safe": True, "parallel_write_safe": True}
