"""Sphinx configuration of mpiml's API reference (build: sphinx-build -W -b html docs/api BUILD)."""

import os
import sys

sys.path.insert(0, os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..", "src")))

project = "mpiml"
author = "the mpiml developers"
extensions = ["sphinx.ext.autodoc", "numpydoc"]
autodoc_default_options = {"members": True, "inherited-members": False, "show-inheritance": False}
autodoc_mock_imports = ["cupy", "cupyx"]
numpydoc_show_class_members = False
numpydoc_class_members_toctree = False
numpydoc_xref_param_type = False
exclude_patterns = ["_build"]
html_theme = "alabaster"
nitpicky = False


def _skip_inherited_machinery(app, what, name, obj, skip, options):
    """scikit-learn's metadata-routing setters are documented by scikit-learn, not here."""
    if name.startswith("set_") and name.endswith("_request"):
        return True
    return skip


def setup(app):
    app.connect("autodoc-skip-member", _skip_inherited_machinery)
