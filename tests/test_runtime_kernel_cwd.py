"""Where the runtime starts its kernel: the notebook's directory when it has it.

A pod that mounts the user's volume gets ``SANDBOX_RUNTIME_KERNEL_CWD`` from the
operator; the runtime starts its kernel there when it is a directory, else in
the workspace, and says which (the client copies files in only in the latter
case). Checked on the kernel process itself, through ``/proc/<pid>/cwd``.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from tests.helpers import free_port, wait_listening


def start_runtime(tmp_path: Path, kernel_cwd: str) -> tuple[subprocess.Popen[bytes], int, Path]:
    workspace = tmp_path / "workspace"
    workspace.mkdir()
    port = free_port()
    log_path = tmp_path / "runtime.log"
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "jupyter_sandbox.runtime",
                "--ip=127.0.0.1",
                f"--port={port}",
                f"--workspace={workspace}",
                f"--runtime-dir={tmp_path / 'kernel'}",
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
            env={**os.environ, "HOME": str(workspace), "SANDBOX_RUNTIME_KERNEL_CWD": kernel_cwd},
        )
    wait_listening(proc, port, log_path, "the runtime")
    return proc, port, workspace


@pytest.mark.parametrize("where", ["notebook dir", "missing dir", "relative", "a file"])
def test_kernel_starts_in_the_notebooks_directory_when_the_sandbox_has_it(
    tmp_path: Path, where: str
) -> None:
    home = tmp_path / "home" / "jovyan"
    (home / "project").mkdir(parents=True)
    (home / "notes.txt").write_text("not a directory")
    requested = {
        "notebook dir": str(home / "project"),
        "missing dir": str(home / "gone"),
        "relative": "home/jovyan/project",
        "a file": str(home / "notes.txt"),
    }[where]
    proc, port, workspace = start_runtime(tmp_path, requested)
    try:
        deadline = time.monotonic() + 60
        while True:  # the kernel starts after the server listens
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/api/kernel", timeout=30) as r:
                info = json.load(r)
            if info["kernel"]["ready"] or time.monotonic() > deadline:
                break
            time.sleep(0.1)
        expected = str(home / "project") if where == "notebook dir" else str(workspace)
        assert info["kernel_cwd"] == expected
        assert os.readlink(f"/proc/{info['kernel']['pid']}/cwd") == expected
        # the runtime's own variable does not reach the kernel's environment
        with open(f"/proc/{info['kernel']['pid']}/environ", "rb") as env:
            assert b"SANDBOX_RUNTIME_KERNEL_CWD" not in env.read()
    finally:
        proc.terminate()
        proc.wait(30)
