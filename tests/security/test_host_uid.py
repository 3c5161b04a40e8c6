"""Who a sandbox is on the host, and what it can leave behind with its identity.

The review: a daemon run as root (containers, ``--allow-root``; CI) mapped each
sandbox's uid 1000 to host uid 0, so the sandbox was root to the kernel: the owner
of every root-owned file and kernel object it could reach. Now a root daemon's
sandboxes are an unprivileged host uid, and what they write in the notebook's
directory lands owned by the directory's owner. Because that owner may be root, no
sandbox (root's or an ordinary user's) may make a set-user-ID or set-group-ID file
there: a set-user-ID copy of a shell left in a shared project directory would be
its owner for any host user who runs it.
"""

from __future__ import annotations

import asyncio
import json
import os
import stat
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest

from jupyter_sandbox.client import SandboxClient
from jupyter_sandbox.control_plane.local.host_uid import host_uid_setting
from jupyter_sandbox.control_plane.local.isolation import probe
from tests.helpers import KernelSocket, jupyter_server
from tests.security.attacker import ATTEMPT
from tests.test_notebook_files import project, start_notebook_kernel

from .test_bound_directory import notebooks_outside_tmp  # noqa: F401  (a fixture)

pytestmark = [
    pytest.mark.usefixtures("warm_daemon"),
    pytest.mark.skipif(not probe().isolated, reason=f"no isolation here: {probe().detail}"),
]

UID_MAP = """
import json
print(json.dumps([line.split() for line in open("/proc/self/uid_map")]))
"""


@pytest.fixture
def client() -> Iterator[SandboxClient]:
    with SandboxClient() as sdk:
        yield sdk


@pytest.mark.skipif(os.geteuid() != 0, reason="an ordinary user's sandboxes are that user")
def test_a_root_daemons_sandbox_is_an_unprivileged_host_uid(client: SandboxClient) -> None:
    with client.create_sandbox(warmpool="default", sandbox_ready_timeout=120) as sb:
        sb.files.write("uid_map.py", UID_MAP)
        run = sb.commands.run("python3 uid_map.py")
        mapping = {int(inside): int(host) for inside, host, _ in json.loads(run.stdout)}
        me = int(sb.commands.run("id -u").stdout)
        # and on the host, this sandbox's runtime (not bubblewrap, which sets it up)
        # runs as that uid. Only this one: a runtime another sandbox is starting at
        # this moment (the pool refilling) has not made its first call yet.
        status = asyncio.run(_status(sb.claim_name))
        top = psutil.Process(int(status.resources["pid"]))
        runtimes = [
            p.uids().real
            for p in [top, *top.children(recursive=True)]
            if (p.cmdline() or [""])[0] == sys.executable and "--runtime-dir" in p.cmdline()
        ]
    assert me == 1000
    assert mapping[me] == host_uid_setting() != 0, mapping
    assert runtimes and set(runtimes) == {host_uid_setting()}, runtimes


async def _status(claim: str | None) -> Any:
    from jupyter_sandbox.control_plane.local.client import LocalControlPlane

    plane = LocalControlPlane()
    try:
        assert claim is not None
        return await plane.status(claim)
    finally:
        await plane.close()


SET_ID = (
    ATTEMPT
    + """
import os, shutil, stat
shutil.copy("/bin/sh", "shell")
attempt("chmod u+s", lambda: os.chmod("shell", 0o4755))
attempt("chmod g+s", lambda: os.chmod("shell", 0o2755))
attempt("fchmod u+s", lambda: os.fchmod(os.open("shell", os.O_RDONLY), 0o4755))
attempt("create u+s", lambda: os.close(os.open("made", os.O_CREAT | os.O_WRONLY, 0o4755)))
attempt("create g+s", lambda: os.close(os.open("made2", os.O_CREAT | os.O_WRONLY, 0o2755)))
attempt("mknod u+s", lambda: os.mknod("node", stat.S_IFREG | 0o4755))
attempt("chmod +x", lambda: os.chmod("shell", 0o755))
print(json.dumps(out))
"""
)


async def test_no_set_id_file_can_be_left_in_the_notebook_directory(
    tmp_path: Path,
    notebooks_outside_tmp: Path,  # noqa: F811
) -> None:
    with jupyter_server(tmp_path, root=notebooks_outside_tmp) as server:
        folder = project(server.root)
        kernel_id = await start_notebook_kernel(server, "project/analysis.ipynb")
        ws = await KernelSocket(server, kernel_id).connect()
        try:
            result = await ws.execute(SET_ID)
        finally:
            ws.close()
        assert result.status == "ok", result.reply
        outcome = json.loads(result.stdout)
        await server.request("DELETE", f"/api/kernels/{kernel_id}", expect=204)
    refused = {k: v for k, v in outcome.items() if k != "chmod +x"}
    assert set(refused.values()) == {"PermissionError"}, outcome
    assert outcome["chmod +x"] == "made", outcome  # ordinary modes still work
    owner = folder.stat().st_uid
    for path in folder.rglob("*"):
        info = path.lstat()
        assert not info.st_mode & (stat.S_ISUID | stat.S_ISGID), path
        # what the sandbox wrote belongs to the directory's owner, as the user's own files
        assert info.st_uid == owner, (path, info.st_uid)


@pytest.fixture
def notebooks_on_ramfs(notebooks_outside_tmp: Path) -> Iterator[Path]:  # noqa: F811
    """A notebook root on a filesystem without idmapped mounts (ramfs has none)."""
    import subprocess

    root = notebooks_outside_tmp / "ramfs"
    root.mkdir()
    subprocess.run(["mount", "-t", "ramfs", "ramfs", str(root)], check=True)
    try:
        yield root
    finally:
        subprocess.run(["umount", "-l", str(root)], check=False)


@pytest.mark.skipif(os.geteuid() != 0, reason="an ordinary user's sandboxes need no idmap")
async def test_a_notebook_directory_without_idmapped_mounts_is_copied_not_bound(
    tmp_path: Path, notebooks_on_ramfs: Path
) -> None:
    """The root daemon's start probe tried idmapped mounts on the state
    directory's filesystem only. A notebook directory on one without them (NFS,
    FUSE, ramfs) made every kernel there fail to start with "exception in
    preexec_fn"; now the kernel starts with the notebook's files copied in, and a
    claim that insists on binding is refused with the reason."""
    with jupyter_server(tmp_path, root=notebooks_on_ramfs) as server:
        folder = project(server.root)
        kernel_id = await start_notebook_kernel(server, "project/analysis.ipynb")
        ws = await KernelSocket(server, kernel_id).connect()
        try:
            result = await ws.execute(
                "import os; print(os.getcwd(), open('data.csv').read().splitlines()[1])"
            )
        finally:
            ws.close()
        assert result.status == "ok", result.reply
        assert result.stdout.split() == ["/workspace", "1,2"], result.stdout
        await server.request("DELETE", f"/api/kernels/{kernel_id}", expect=204)

    from jupyter_sandbox.control_plane.base import ClaimRequest, FilesNotBindable
    from jupyter_sandbox.control_plane.local.client import LocalControlPlane

    plane = LocalControlPlane()
    try:
        with pytest.raises(FilesNotBindable, match="no idmapped mounts") as refused:
            await plane.claim(ClaimRequest(pool="default", files_dir=str(folder)))
        assert "files option 'copy'" in str(refused.value)
    finally:
        await plane.close()
