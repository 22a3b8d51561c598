"""Sphinx configuration: a landing page, concepts, the user guide, benchmarks, the tutorials with their outputs and
figures, one API page per public module (numpydoc), grouped by role. Pages under ``generated/`` are written at build
time by ``build_pages.py``; ``make docs`` builds with warnings as errors, so a broken docstring fails the build, then
looks at the site in headless Chromium (``check_site.py``)."""

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
extensions = ["sphinx.ext.autodoc", "numpydoc", "myst_parser", "sphinx_copybutton"]
source_suffix = {".rst": "restructuredtext", ".md": "markdown"}
exclude_patterns = ["_build", "figures/*.json"]
html_theme = "furo"
html_title = "pyro_bbb"
html_static_path = ["static"]
html_css_files = ["pyro_bbb.css"]
copyright = "the pyro_bbb developers"
copybutton_prompt_text = ">>> "  # copy doctest examples without their prompts
pygments_style = "sphinx"
pygments_dark_style = "monokai"

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
