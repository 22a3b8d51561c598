"""Sphinx configuration: the README as the guide, one API page per module (numpydoc), the tutorials with their
figures. Pages under ``generated/`` are written at build time by ``build_pages.py``; ``make docs`` builds with
warnings as errors, so a broken docstring fails the build."""

import sys
import warnings
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent))

import build_pages  # noqa: E402

import pyro_bbb  # noqa: E402

project = "pyro_bbb"
author = "the pyro_bbb developers"
release = version = pyro_bbb.__version__
extensions = ["sphinx.ext.autodoc", "numpydoc", "myst_parser"]
source_suffix = {".rst": "restructuredtext", ".md": "markdown"}
exclude_patterns = ["_build"]
html_theme = "alabaster"
html_static_path: list[str] = []

autodoc_member_order = "bysource"
autodoc_inherit_docstrings = False  # a subclass of a torch or Lightning class documents only its own
autodoc_typehints = "none"  # the numpydoc Parameters sections say it in words
numpydoc_show_class_members = False  # one entry per object, documented by autodoc
numpydoc_class_members_toctree = False
numpydoc_xref_param_type = False
# numpydoc reports a malformed docstring (an unknown section, a bad heading) as a Python warning: make it an error
warnings.filterwarnings("error", category=UserWarning, module="numpydoc")
# The README links to files of the repository (scripts, benchmarks); those are not pages of this site.
suppress_warnings = ["myst.xref_missing"]
myst_heading_anchors = 3


def setup(app):
    app.connect("builder-inited", lambda app: build_pages.write_pages(HERE))
