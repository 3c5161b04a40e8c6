"""The workspace's layout, and user-supplied paths confined to it."""

from __future__ import annotations

import os

# Where ``%pip install`` puts packages: in the workspace, so they stay across a
# suspend (and, on Kubernetes, live on the workspace volume).
PACKAGES_DIR = ".local/packages"


class PathRefused(ValueError):
    """The path leaves the workspace (403)."""


class PathInvalid(ValueError):
    """The path cannot name a file at all (400)."""


def confine(base: str, user_path: str) -> str:
    """Resolve ``user_path`` under ``base``; symlinks are followed before the check."""
    if "\x00" in user_path:
        raise PathInvalid("path contains a NUL byte")
    root = os.path.realpath(base)
    full = os.path.realpath(os.path.join(root, user_path.lstrip("/")))
    if full != root and os.path.commonpath([root, full]) != root:
        raise PathRefused("path is outside the workspace")
    return full
