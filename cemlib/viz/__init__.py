"""Plots, energy landscapes and widgets. Every live widget (:func:`landscape_explorer`, which needs a
kernel) has a static companion that works on the website (:func:`landscape_small_multiples`,
:func:`landscape_animation` / :func:`animation_html`). :mod:`cemlib.viz.energy2d` does the same for
any energy of a 2-D state (the CEM attention and MLP landscapes of Chapters 2 and 3)."""

from cemlib.viz.landscape import (animation_html, energy_grid, landscape_animation,
                                  landscape_small_multiples, plot_landscape, plot_patterns,
                                  plot_trajectory)
from cemlib.viz.style import STYLE_PATH, use_book_style
from cemlib.viz.widgets import landscape_explorer, render_landscape_png

__all__ = ["use_book_style", "STYLE_PATH", "energy_grid", "plot_landscape", "plot_patterns",
           "plot_trajectory", "landscape_small_multiples", "landscape_animation", "animation_html",
           "landscape_explorer", "render_landscape_png"]
