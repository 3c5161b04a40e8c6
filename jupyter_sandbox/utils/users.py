"""Who the current user is, as the sandboxes' labels and annotations name them."""

from __future__ import annotations

import getpass
import os


def current_user() -> str:
    """The hub user when running under JupyterHub, else the OS user."""
    return os.environ.get("JUPYTERHUB_USER") or getpass.getuser()
