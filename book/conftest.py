"""nbval configuration for the chapters (strict mode; see pyproject.toml for the flags).

Chapters run on the CPU reference path, like the committed outputs. Widget views and JavaScript
animations carry random model ids, so those mimetypes are not compared (their ``text/plain``
fallback still is); everything else -- stdout, text/plain, LaTeX -- must match exactly after the
substitutions of ``tests/nbval_sanitize.cfg``. A cell tagged ``nbval-ignore-output`` still runs
(its asserts still decide) but its printed numbers are not compared: only cells whose numbers come
from a live float32 training run on the CPU carry the tag (``tests/test_book_hygiene.py`` checks
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

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
import portable_numerics  # noqa: E402

sys.path.pop(0)

KERNEL_ENV = {"CEMLIB_DEVICE": "cpu"}


def kernel_environment(environ=None) -> dict:
    """Set the chapter kernels' variables in ``environ`` (default ``os.environ``), keeping values
    already there; returns the previous values (``None``: unset), for :func:`restore`."""
    environ = os.environ if environ is None else environ
    keys = list(KERNEL_ENV) + list(portable_numerics.PORTABLE_ENV)
    before = {k: environ.get(k) for k in keys}
    for key, value in KERNEL_ENV.items():
        environ.setdefault(key, value)
    portable_numerics.apply(environ)
    return before


def restore(before: dict, environ=None) -> None:
    environ = os.environ if environ is None else environ
    for key, value in before.items():
        if value is None:
            environ.pop(key, None)
        else:
            environ[key] = value


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_setup(item):
    """Around the setup of a notebook cell (where nbval starts the chapter's kernel), the kernel's
    environment; the process's own environment before and after is unchanged."""
    if item.path.suffix != ".ipynb":
        yield
        return
    before = kernel_environment()
    try:
        yield
    finally:
        restore(before)


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
