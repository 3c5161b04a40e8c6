"""A root daemon's workspaces are ext4 images of their pool's disk_mb.

The review filled the host's disk from a sandbox's workspace: the daemon only
measured it. As root each workspace is now a filesystem of its own: a write past
the limit fails inside the sandbox, the host holds at most the image, and the
image is mounted only in the sandbox's own mount namespace, so a daemon killed
outright leaves no mount and no loop device, and the next daemon brings the files
back.
An ordinary user's daemon cannot enforce a size and says so.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import signal
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

from jupyter_sandbox.client import SandboxClient
from jupyter_sandbox.control_plane.local.client import LocalControlPlane
from jupyter_sandbox.control_plane.local.isolation import probe

pytestmark = pytest.mark.skipif(not probe().isolated, reason=f"no isolation here: {probe().detail}")

POOL = "disky"
DISK_MB = 32
FILL = """
import os
written = 0
try:
    with open("/workspace/fill", "wb") as handle:
        for _ in range(64):
            handle.write(os.urandom(1 << 20))
            written += 1
except OSError as exc:
    print("stopped", exc.errno)
print("written_mb", written)
"""


@pytest.fixture
def own_daemon(monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """A daemon of this test's own (it is killed here), in a short state directory."""
    base = Path(tempfile.mkdtemp(prefix="jsbx-")) / "state"
    monkeypatch.setenv("JUPYTER_SANDBOX_HOME", str(base))
    plane = LocalControlPlane(base)
    try:
        asyncio.run(plane.apply_pool(POOL, {"replicas": 0, "disk_mb": DISK_MB}))
        yield base
    finally:
        asyncio.run(_stop(plane))
        for proc in psutil.process_iter(["cmdline"]):
            if any(str(base) in part for part in proc.info["cmdline"] or []):
                proc.kill()
        shutil.rmtree(base.parent, ignore_errors=True)


async def _stop(plane: LocalControlPlane) -> None:
    await plane.stop_daemon()
    await plane.close()


def _daemon_info(base: Path) -> dict:
    return dict(json.loads((base / "daemon.json").read_text()))


def _loops_backed_by(path: Path) -> list[str]:
    found = []
    for backing in Path("/sys/block").glob("loop*/loop/backing_file"):
        try:
            if backing.read_text().strip().startswith(str(path)):
                found.append(backing.parent.parent.name)
        except OSError:
            continue
    return found


def _loops_freed(image: Path, timeout: float = 15) -> bool:
    """The kernel clears an auto-clearing loop device shortly after its last user."""
    deadline = time.monotonic() + timeout
    while _loops_backed_by(image):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.1)
    return True


@pytest.mark.skipif(os.geteuid() != 0, reason="an ordinary user's daemon cannot enforce sizes")
def test_a_workspace_image_bounds_the_disk_and_keeps_files_until_release(own_daemon: Path) -> None:
    base = own_daemon
    assert "ext4 image" in _daemon_info(base)["limits"], _daemon_info(base)
    with SandboxClient() as client:
        sb = client.create_sandbox(warmpool=POOL, sandbox_ready_timeout=120)
        sandbox = sb.sandbox_id
        workspace = base / "workspaces" / sandbox
        image = base / "disks" / f"{sandbox}.ext4"
        sb.files.write("kept.txt", "still here")
        sb.files.write("fill.py", FILL)
        out = sb.commands.run("python3 fill.py", timeout=120).stdout
        assert "stopped 28" in out, out  # ENOSPC, inside the sandbox
        written = int(out.split("written_mb")[1])
        assert DISK_MB - 8 <= written < DISK_MB, out
        # The host holds no more than the image, and sees none of it: the mount is
        # the sandbox's alone.
        assert image.stat().st_blocks * 512 <= DISK_MB << 20, image.stat()
        assert list(workspace.iterdir()) == [], "the host's view is an empty mount point"
        assert str(workspace) not in Path("/proc/self/mountinfo").read_text()
        sb.commands.run("rm fill.py fill")

        sb.suspend()
        assert _loops_freed(image), "a suspended sandbox holds no loop device"
        sb.resume()
        assert sb.files.read("kept.txt") == b"still here"

        # Killed outright: its sandboxes die with their parent, and with their
        # mount namespace the mount and the loop device go.
        assert _loops_backed_by(image), "mounted from a loop device while running"
        daemon = psutil.Process(_daemon_info(base)["pid"])
        daemon.send_signal(signal.SIGKILL)
        daemon.wait(10)
        assert _loops_freed(image), "the loop device went with the daemon"
        assert image.exists(), "the claim's files stay in its image"

        # The next daemon (started by the next call) mounts it again.
        sb.resume(timeout=120)
        assert sb.files.read("kept.txt") == b"still here"
        claim = sb.claim_name
        assert claim is not None
        client.delete_sandbox(claim, namespace="local")
    deadline = time.monotonic() + 15
    while (image.exists() or workspace.exists()) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not image.exists() and not workspace.exists(), "released: image and workspace gone"
    assert _loops_freed(image)


@pytest.mark.skipif(os.geteuid() == 0, reason="as root the sizes are enforced")
def test_an_ordinary_users_daemon_says_sizes_are_measured_not_enforced(own_daemon: Path) -> None:
    limits = _daemon_info(own_daemon)["limits"]
    assert (
        "disk: each workspace measured against its pool's disk_mb (enforcing needs root)" in limits
    )
    assert not (own_daemon / "disks").exists()
