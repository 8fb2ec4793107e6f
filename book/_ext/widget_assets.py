"""Load the ipywidgets manager only on pages that show a widget.

MyST-NB adds the widget manager (RequireJS and ``@jupyter-widgets/html-manager``'s
``embed-amd.js``, about 1.1 MB) and the notebook's saved widget state to every page whose notebook
has widget state in its metadata, even when no widget is shown on the page (a chapter whose
explorer cell is tagged ``remove-output`` keeps the state). This extension drops those three
scripts from a page whose body contains no widget view. ``_config.yml`` loads it through
``sphinx: local_extensions``; ``tests/book/test_site.py`` checks the built pages.
"""

WIDGET_VIEW = "application/vnd.jupyter.widget-view+json"
WIDGET_STATE = "application/vnd.jupyter.widget-state+json"
MANAGER_FILES = ("embed-amd.js", "require.min.js")


def is_widget_asset(js) -> bool:
    """A script of the widget manager or the widget state (a ``sphinx`` ``_JavaScript`` entry)."""
    name = getattr(js, "filename", None) or ""
    attributes = getattr(js, "attributes", None) or {}
    return name.endswith(MANAGER_FILES) or attributes.get("type") == WIDGET_STATE


def drop_unused_widget_assets(app, pagename, templatename, context, doctree):
    if WIDGET_VIEW in context.get("body", ""):
        return
    files = context.get("script_files")
    if files:
        context["script_files"] = [js for js in files if not is_widget_asset(js)]


def setup(app):
    app.connect("html-page-context", drop_unused_widget_assets, priority=900)   # after MyST-NB adds them
    return {"parallel_read_safe": True, "parallel_write_safe": True}
