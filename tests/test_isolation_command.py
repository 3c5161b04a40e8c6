"""The bubblewrap command line: what a sandbox sees, in the order bwrap mounts it."""

from __future__ import annotations

import os
import sys

import pytest

from jupyter_sandbox.control_plane.local.isolation import (
    bwrap_command,
    package_parent,
    probe,
    python_paths,
)


def command() -> list[str]:
    return bwrap_command(
        workspace="/srv/ws",
        inner=["python"],
        env={"A": "1"},
    )


def test_python_is_bound_after_the_private_tmp() -> None:
    # A virtualenv under /tmp must not be hidden by the sandbox's own /tmp.
    argv = command()
    tmpfs = argv.index("--tmpfs")
    for path in python_paths():
        bind = next(
            i for i in range(len(argv) - 2) if argv[i] == "--ro-bind" and argv[i + 1] == path
        )
        assert bind > tmpfs, path


def test_secure_defaults() -> None:
    argv = command()
    for flag in (
        "--unshare-user",
        "--disable-userns",
        "--unshare-pid",
        "--unshare-ipc",
        "--unshare-net",
        "--die-with-parent",
        "--new-session",
        "--clearenv",
    ):
        assert flag in argv
    assert argv[argv.index("--cap-drop") + 1] == "ALL"
    # The home directory, /etc/shadow and the rest of /etc are never bound.
    bound = {argv[i + 1] for i in range(len(argv) - 1) if argv[i] in ("--bind", "--ro-bind")}
    assert "/etc/shadow" not in bound and "/etc" not in bound
    home = os.path.realpath(os.path.expanduser("~"))
    assert not any(home == path or home.startswith(path.rstrip("/") + "/") for path in bound)
    assert argv[
        argv.index(
            "--",
        )
        + 1 :
    ] == ["python"]


@pytest.mark.skipif(not probe().isolated, reason=f"no isolation here: {probe().detail}")
def test_the_current_interpreter_runs_in_the_sandbox(tmp_path: object) -> None:
    import subprocess
    from pathlib import Path

    base = Path(str(tmp_path))
    parent = package_parent()
    (base / "ws").mkdir()
    argv = bwrap_command(
        workspace=str(base / "ws"),
        inner=[sys.executable, "-c", "import jupyter_sandbox, os; print(os.getcwd(), os.getuid())"],
        env={"PATH": "/usr/bin:/bin", **({"PYTHONPATH": parent} if parent else {})},
    )
    result = subprocess.run(argv, capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["/workspace", "1000"]
