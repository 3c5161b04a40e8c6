"""Where the local daemon keeps its socket, state and workspaces."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

from jupyter_core.paths import jupyter_data_dir

ENV_HOME = "JUPYTER_SANDBOX_HOME"


def state_dir() -> Path:
    """``$JUPYTER_SANDBOX_HOME``, else ``<jupyter data dir>/sandbox``."""
    configured = os.environ.get(ENV_HOME)
    path = Path(configured) if configured else Path(jupyter_data_dir()) / "sandbox"
    return private_dir(path)


def private_dir(path: Path) -> Path:
    """Create ``path`` if needed and make it 0700 whatever existed before."""
    path.mkdir(parents=True, exist_ok=True, mode=0o700)
    if path.stat().st_uid == os.getuid():
        path.chmod(0o700)
    return path


def make_dirs_inside(top: Path, relative: str) -> bool:
    """Create ``top/relative`` one level at a time, never through a symbolic link.

    ``top`` is the daemon's own (a workspace); what is below it the sandbox may
    have written, so a planted ``.local -> ~/.ssh`` must not make the daemon
    create directories in the user's home. False when a level is a link or not a
    directory: the directory is then not made.
    """
    flags = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
    fd = os.open(top, flags)
    try:
        for name in Path(relative).parts:
            try:
                os.mkdir(name, 0o755, dir_fd=fd)
            except FileExistsError:
                pass
            try:
                below = os.open(name, flags, dir_fd=fd)
            except OSError:  # a link (ELOOP) or a file (ENOTDIR)
                return False
            os.close(fd)
            fd = below
        return True
    finally:
        os.close(fd)


def socket_path(base: Path) -> Path:
    return base / "daemon.sock"


def runtime_dir(base: Path, sandbox: str) -> Path:
    """Where a sandbox's kernel sockets live (bound at /run/sandbox inside)."""
    return base / "run" / sandbox


def listen_socket(base: Path, sandbox: str) -> Path:
    """Where the router reaches a sandbox's runtime.

    The daemon binds it, in a directory no sandbox can see or write, and hands
    the runtime the listening descriptor (as systemd socket activation does): a
    sandbox cannot swap the path for a link to another socket.
    """
    # Named by a digest: a fixed, short length keeps deep state directories usable.
    return base / "sockets" / hashlib.sha256(sandbox.encode()).hexdigest()[:16]


# sun_path holds 108 bytes with the terminating NUL.
MAX_SOCKET_PATH = 107


def check_socket_room(base: Path) -> None:
    """Refuse a state directory too deep for the sandboxes' Unix sockets, saying why."""
    longest = listen_socket(base, "any")
    if len(os.fsencode(longest)) > MAX_SOCKET_PATH:
        raise ValueError(
            f"the sandbox state directory {base} is too long for Unix socket paths "
            f"({len(os.fsencode(longest))} > {MAX_SOCKET_PATH} bytes); "
            f"set {ENV_HOME} to a shorter directory"
        )
