"""Sphinx configuration for the dspark documentation."""

project = "dspark"
author = "dspark developers"
extensions = ["sphinx.ext.autodoc", "sphinx.ext.napoleon"]
html_theme = "alabaster"
autodoc_member_order = "bysource"
