"""nbval configuration for the chapters (strict mode; see pyproject.toml for the flags).

Chapters run on the CPU reference path, like the committed outputs. Widget views and JavaScript
animations carry random model ids, so those mimetypes are not compared (their ``text/plain``
fallback still is); everything else -- stdout, text/plain, LaTeX -- must match exactly after the
substitutions of ``tests/nbval_sanitize.cfg``. The kernels inherit this process's environment, so
they also run with the portable CPU numerics of ``book/portable_numerics.py`` (the kernel choice of
the math libraries pinned, so that the printed digits do not depend on the processor).
"""

import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import portable_numerics  # noqa: E402

os.environ.setdefault("CEMLIB_DEVICE", "cpu")
portable_numerics.apply()
sys.path.pop(0)


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
