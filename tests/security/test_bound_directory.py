"""A notebook directory bound from the host carries only data.

The review, from a kernel in bind mode (the local default): ``os.symlink`` of
``~/.ssh/id_rsa`` as ``results.csv`` next to the notebook; opening that file in
JupyterLab read the key through the host's contents API (and a checkpoint copied
it where the sandbox reads). The same for FIFOs (a host process that opens one
hangs), Unix sockets and device nodes. Driven as it was: a real Jupyter server on
the notebook directory, the kernel's own code, then the contents API.
"""

from __future__ import annotations

import json
import os
import shutil
import stat
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from tornado import httpclient

from jupyter_sandbox.runtime import landlock
from tests.helpers import KernelSocket, jupyter_server
from tests.security.attacker import ATTEMPT
from tests.test_notebook_files import project, start_notebook_kernel

pytestmark = [
    pytest.mark.usefixtures("warm_daemon"),
    pytest.mark.skipif(landlock.abi_version() < 2, reason="no Landlock ABI 2 on this kernel"),
]

PLANT = (
    ATTEMPT
    + """
import os, socket
os.makedirs("subdir", exist_ok=True)
for where in (".", "/tmp", "/workspace", "subdir"):
    attempt(f"{where}: symlink", lambda: os.symlink(SECRET, os.path.join(where, "results.csv")))
    attempt(f"{where}: fifo", lambda: os.mkfifo(os.path.join(where, "pipe")))
    unix = socket.socket(socket.AF_UNIX)
    attempt(f"{where}: socket", lambda: unix.bind(os.path.join(where, "s")))
    attempt(f"{where}: file", lambda: open(os.path.join(where, "plain.txt"), "w").write("data"))
print(json.dumps(out))
print(json.dumps(open("linked.csv").read()))
"""
)


@pytest.fixture
def notebooks_outside_tmp() -> Iterator[Path]:
    """A notebook root outside /tmp: beneath a sandbox's own /tmp (an ancestor of the
    bound directory) only the entries present at its start keep special files, as
    landlock.py says, which would blur what this test checks."""
    root = Path(tempfile.mkdtemp(prefix="jsbx-bound-", dir="/var/tmp"))
    try:
        yield root
    finally:
        shutil.rmtree(root, ignore_errors=True)


@pytest.mark.parametrize("where", ["outside /tmp", "under /tmp"])
async def test_no_link_fifo_or_socket_can_be_planted_next_to_the_notebook(
    tmp_path: Path, where: str, request: pytest.FixtureRequest
) -> None:
    """Under /tmp too: the sandbox's own /tmp may create links, and Landlock adds
    rights down a hierarchy, so a notebook directory beneath /tmp (pytest's, a
    scratch project) must not get them back through it."""
    root = request.getfixturevalue("notebooks_outside_tmp") if where == "outside /tmp" else None
    secret = tmp_path / "id_rsa"
    secret.write_text("-----BEGIN OPENSSH PRIVATE KEY----- not for the sandbox")
    with jupyter_server(tmp_path, root=root) as server:
        assert str(server.root).startswith("/tmp/") == (where == "under /tmp"), server.root
        folder = project(server.root)
        # a link the user made before stays usable
        (folder / "linked.csv").symlink_to("data.csv")
        kernel_id = await start_notebook_kernel(server, "project/analysis.ipynb")
        ws = await KernelSocket(server, kernel_id).connect()
        try:
            result = await ws.execute(f"SECRET = {str(secret)!r}\n" + PLANT)
        finally:
            ws.close()
        assert result.status == "ok", result.reply
        made, linked = result.stdout.splitlines()
        outcome = json.loads(made)
        for kind in ("symlink", "fifo", "socket"):
            assert outcome[f".: {kind}"] == "PermissionError", outcome
            assert outcome[f"subdir: {kind}"] == "PermissionError", outcome
            assert outcome[f"/workspace: {kind}"] == "made", outcome  # the sandbox's own
            if where == "outside /tmp":
                assert outcome[f"/tmp: {kind}"] == "made", outcome
        assert outcome[".: file"] == outcome["subdir: file"] == "made", outcome
        assert json.loads(linked) == "a,b\n1,2\n3,4\n"
        # nothing but data reached the host's directory
        for path in folder.rglob("*"):
            mode = path.lstat().st_mode
            assert stat.S_ISREG(mode) or stat.S_ISDIR(mode) or path.name == "linked.csv", path
        # and the host's contents API has no key to give
        response = await httpclient.AsyncHTTPClient().fetch(
            f"{server.url}/api/contents/project/results.csv",
            headers=server.headers(),
            raise_error=False,
        )
        assert response.code == 404, response.code
        assert b"PRIVATE KEY" not in (response.body or b"")
        await server.request("DELETE", f"/api/kernels/{kernel_id}", expect=204)
    assert not os.path.lexists(folder / "results.csv")
