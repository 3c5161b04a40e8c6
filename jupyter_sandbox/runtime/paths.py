"""The workspace's layout, and user-supplied paths confined to it."""

from __future__ import annotations

import hashlib
import logging
import os

log = logging.getLogger(__name__)

# Where ``%pip install`` puts packages: in the workspace, so they stay across a
# suspend (and, on Kubernetes, live on the workspace volume).
PACKAGES_DIR = ".local/packages"
# Set by the operator when the pod mounts the user's volume (the notebook's directory).
KERNEL_CWD_ENV = "SANDBOX_RUNTIME_KERNEL_CWD"
# ... and where the notebook project's %pip packages are kept on that volume.
PACKAGES_DIR_ENV = "SANDBOX_RUNTIME_PACKAGES_DIR"
# Set by the operator when that volume is writable: it is the user's home, which
# their own Jupyter server and shells read (write_guard.py keeps it to data).
GUARD_HOME_ENV = "SANDBOX_RUNTIME_GUARD_HOME"
# Under the user's volume: one directory per notebook project.
USER_PACKAGES_SUBDIR = ".local/share/jupyter-sandbox/packages"


def within(path: str, top: str) -> bool:
    """Whether ``path`` is ``top`` or lies beneath it (both absolute and normalized,
    or both relative to the same place): by components, so /a/bc is not in /a/b."""
    return path == top or path.startswith(top.rstrip(os.sep) + os.sep)


def project_key(directory: str) -> str:
    """A notebook project's name for its kept %pip packages: its directory, hashed."""
    return hashlib.sha256(directory.encode()).hexdigest()[:16]


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


def kernel_cwd(requested: str | None, workspace: str) -> str:
    """The kernel's working directory: ``requested`` when it is a directory, else the workspace.

    The client compares it with the notebook's directory to know whether the
    sandbox shows the notebook's files (else it copies them into the workspace).
    """
    if requested:
        if os.path.isabs(requested) and os.path.isdir(requested):
            return os.path.normpath(requested)
        log.warning("kernel directory %s is not a directory here; using the workspace", requested)
    return workspace
