"""nbval configuration for the chapters (strict mode; see pyproject.toml for the flags).

Chapters run on the CPU reference path, like the committed outputs. Widget views and JavaScript
animations carry random model ids, so those mimetypes are not compared (their ``text/plain``
fallback still is); everything else -- stdout, text/plain, LaTeX -- must match exactly after the
substitutions of ``tests/nbval_sanitize.cfg``. A cell tagged ``nbval-ignore-output`` still runs
(its asserts still decide) but its printed numbers are not compared: only cells whose numbers come
from a live float32 training run on the CPU carry the tag (``tests/book/test_book_hygiene.py`` checks
that), because those numbers depend on the processor (see ``book/portable_numerics.py``).

The chapter kernels run with ``CEMLIB_DEVICE=cpu`` and the portable CPU numerics of
``book/portable_numerics.py``. nbval starts a chapter's kernel while setting up its first cell and
the kernel inherits this process's environment, so the variables are set for exactly that moment
(:func:`pytest_runtest_setup`) and restored after it: the tests collected beside the book run in
this process with the numerics they were recorded with (the stored results under ``book/results``
are re-run here and compared to 1e-3 on the processor that wrote them; oneMKL reads ``MKL_CBWR``
once, at its first call, so a variable set at collection time changed their numbers).
"""

import os
import sys
from pathlib import Path
from unittest import mock

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
import portable_numerics  # noqa: E402

sys.path.pop(0)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_setup(item):
    """Around the setup of a notebook cell (where nbval starts the chapter's kernel), the kernel's
    environment: ``CEMLIB_DEVICE=cpu`` and the portable numerics, values already set kept; the
    process's own environment is restored after (``mock.patch.dict``)."""
    if item.path.suffix != ".ipynb":
        yield
        return
    with mock.patch.dict(os.environ):
        os.environ.setdefault("CEMLIB_DEVICE", "cpu")
        portable_numerics.apply()
        yield


def pytest_collectstart(collector):
    if getattr(collector, "skip_compare", None) is not None:
        collector.skip_compare += (
            "application/vnd.jupyter.widget-view+json",
            "application/vnd.jupyter.widget-state+json",
            "application/javascript",
            "text/html",
            # figures and animations stored with myst_nb.glue (display=False) for numbered captions:
            # compared like plt.show() images, i.e. not at all (their text/plain still is)
            "application/papermill.record/image/png",
            "application/papermill.record/image/jpeg",
            "application/papermill.record/text/html",
        )


def pytest_collection_modifyitems(items):
    """Every chapter cell is ``slow``: the quick loop (``pytest -m "not slow"``) leaves the
    chapters to the full suite."""
    for item in items:
        if item.path.suffix == ".ipynb":
            item.add_marker(pytest.mark.slow)
