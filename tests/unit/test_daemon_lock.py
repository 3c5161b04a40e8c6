"""Whether a local daemon runs: it holds its lock for as long as it lives."""

from __future__ import annotations

import fcntl
from pathlib import Path

from jupyter_sandbox.control_plane.local.client import _daemon_holds_lock


def test_a_daemon_is_running_while_it_holds_its_lock(tmp_path: Path) -> None:
    """The client starts a daemon when none holds the lock; a socket file left by
    a daemon killed outright does not count."""
    (tmp_path / "daemon.sock").touch()
    assert not _daemon_holds_lock(tmp_path)
    with open(tmp_path / "daemon.lock", "w") as held:
        fcntl.flock(held, fcntl.LOCK_EX | fcntl.LOCK_NB)
        assert _daemon_holds_lock(tmp_path)
    assert not _daemon_holds_lock(tmp_path)
