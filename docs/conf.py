"""Sphinx configuration of monarch_nb's documentation site (docs/).

Build: ``.venv/bin/pip install -q -e '.[docs]' && .venv/bin/sphinx-build -W --keep-going -b html docs docs/_build/html``
(as ``.ci/run`` does: every warning fails the build).

Pages are MyST Markdown. The notebooks of ``notebooks/`` are rendered by myst-nb from
the outputs they hold, never executed here: before the build, each is copied into
``docs/notebooks/`` (ignored by git), its executed copy
(``notebooks/NAME.executed.ipynb``, written by ``monarch-nb run``, as CI does before
this step) when there is one, else the committed notebook, which has no outputs.
"""

from __future__ import annotations

import shutil
from pathlib import Path

HERE = Path(__file__).resolve().parent
NOTEBOOKS = HERE.parent / "notebooks"
RENDERED = HERE / "notebooks"


def _copy_notebooks() -> None:
    """docs/notebooks/NAME.ipynb for each notebooks/NAME.ipynb: its executed copy if any."""
    RENDERED.mkdir(exist_ok=True)
    wanted = set()
    for source in sorted(NOTEBOOKS.glob("*.ipynb")):
        if source.name.endswith(".executed.ipynb"):
            continue
        executed = source.with_name(source.stem + ".executed.ipynb")
        target = RENDERED / source.name
        shutil.copyfile(executed if executed.exists() else source, target)
        wanted.add(target.name)
    for stale in RENDERED.glob("*.ipynb"):
        if stale.name not in wanted:
            stale.unlink()


_copy_notebooks()

project = "monarch_nb"
author = "monarch_nb contributors"
copyright = "monarch_nb contributors"

extensions = ["myst_nb", "sphinx.ext.autodoc", "sphinx.ext.napoleon"]
source_suffix = {".md": "myst-nb", ".ipynb": "myst-nb"}
exclude_patterns = ["_build", "Thumbs.db", ".DS_Store"]

# Warnings fail the build (-W), but unresolved Python cross-references in docstrings
# (types of third-party or private names) are not checked.
nitpicky = False

myst_enable_extensions = ["colon_fence", "deflist"]
myst_heading_anchors = 3

# Notebooks are shown with the outputs they were saved with (CI's executed copies).
nb_execution_mode = "off"

autodoc_member_order = "bysource"
autodoc_typehints = "description"
autodoc_default_options = {"members": True, "show-inheritance": True}

html_theme = "alabaster"
html_title = "monarch_nb"
