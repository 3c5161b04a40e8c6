"""Where the local daemon keeps its socket, state and workspaces."""

from __future__ import annotations

import os
from pathlib import Path

from jupyter_core.paths import jupyter_data_dir

ENV_HOME = "JUPYTER_SANDBOX_HOME"


def state_dir() -> Path:
    """``$JUPYTER_SANDBOX_HOME``, else ``<jupyter data dir>/sandbox``."""
    configured = os.environ.get(ENV_HOME)
    path = Path(configured) if configured else Path(jupyter_data_dir()) / "sandbox"
    path.mkdir(parents=True, exist_ok=True, mode=0o700)
    return path


def socket_path(base: Path) -> Path:
    return base / "daemon.sock"


def runtime_dir(base: Path, sandbox: str) -> Path:
    """Where a sandbox's runtime socket and kernel sockets live."""
    return base / "run" / sandbox


SOCKET_NAME = "runtime.sock"


def runtime_socket(base: Path, sandbox: str) -> Path:
    return runtime_dir(base, sandbox) / SOCKET_NAME
