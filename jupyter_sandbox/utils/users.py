"""Who the current user is, as the sandboxes' labels and annotations name them."""

from __future__ import annotations

import getpass
import os


def current_user() -> str:
    """The hub user when running under JupyterHub, else the OS user."""
    return os.environ.get("JUPYTERHUB_USER") or getpass.getuser()


def label_value(value: str) -> str:
    """``value`` as a Kubernetes label value (63 characters of ``[-_.a-zA-Z0-9]``,
    alphanumeric at both ends). Lossy: exact names go into annotations."""
    cleaned = "".join(c if c.isalnum() and c.isascii() else c if c in "-_." else "-" for c in value)
    return cleaned[:63].strip("-_.") or "unknown"
