"""Sphinx configuration for the mlcomm docs: ``sphinx-build -W -b html docs build/docs``."""

import os
import subprocess
import sys

from docutils import nodes
from sphinx.util.docutils import SphinxDirective

import mlcomm

project = "mlcomm"
author = "the mlcomm authors"
copyright = "2026, the mlcomm authors"
release = version = mlcomm.__version__

extensions = ["sphinx.ext.autodoc"]
html_theme = "furo"
html_title = "mlcomm"
exclude_patterns = ["_build"]
highlight_language = "none"        # ``::`` blocks are plain text; Python is ``code-block:: python``
autodoc_member_order = "bysource"
autodoc_typehints = "none"         # the signatures' defaults say enough
nitpicky = False


class CommandHelp(SphinxDirective):
    """``.. command-help:: bench``: the ``--help`` text of ``mlcomm bench``, as the CLI prints it."""

    required_arguments = 0
    optional_arguments = 1

    def run(self):
        argv = [sys.executable, "-m", "mlcomm", *self.arguments, "--help"]
        env = dict(os.environ, COLUMNS="88")
        proc = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=120)
        if proc.returncode != 0:
            raise self.error(f"{' '.join(argv[2:])} exited {proc.returncode}:\n{proc.stderr}")
        return [nodes.literal_block(proc.stdout, proc.stdout)]


def setup(app):
    app.add_directive("command-help", CommandHelp)
