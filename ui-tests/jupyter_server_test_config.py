"""Jupyter server for the Galata tests: a throw-away root dir, no token (galata's settings), as root."""

import os

from jupyterlab.galata import configure_jupyter_server

configure_jupyter_server(c)  # noqa: F821 (c is the config object jupyter injects)
c.ServerApp.allow_root = True  # noqa: F821
# A port of our own so the tests do not collide with a Jupyter server someone else runs here.
c.ServerApp.port = int(os.environ.get("MEMVIZ_UI_PORT", "18888"))  # noqa: F821
c.ServerApp.port_retries = 0  # noqa: F821
