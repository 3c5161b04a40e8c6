"""A pool's limits, attacked from inside one of its sandboxes through the real daemon.

As root the daemon enforces them with cgroups; as an ordinary user without a
delegated cgroup, with rlimits and a sized /tmp. Either way they must hold, and
the sandbox must say which.
"""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from jupyter_sandbox.client import Sandbox, SandboxClient
from jupyter_sandbox.control_plane.local.client import LocalControlPlane
from jupyter_sandbox.control_plane.local.isolation import probe
from jupyter_sandbox.control_plane.local.model import DEFAULT_MAX_PROCESSES
from tests.helpers import apply_pool
from tests.security.test_limits_and_seccomp import FORK_BOMB

pytestmark = pytest.mark.skipif(not probe().isolated, reason=f"no isolation here: {probe().detail}")

POOL = "limited"
MAX_PROCESSES = 50
TMP_MB = 128
DISK_MB = 16

FILL_TMP = """
import os, sys
path = sys.argv[1] if len(sys.argv) > 1 else "/tmp/fill"
written = 0
block = b"x" * (1 << 20)
try:
    with open(path, "wb") as handle:
        for _ in range(1536):
            handle.write(block)
            written += 1
except OSError as exc:
    print("stopped", exc.errno)
print("written_mb", written)
try:  # a tmpfs's pages count as the sandbox's memory: give them back for the next test
    os.remove(path)
except OSError:
    pass
"""


@pytest.fixture(scope="module")
def limited(warm_daemon_module: Path) -> Iterator[Sandbox]:
    asyncio.run(
        apply_pool(
            POOL,
            {
                "replicas": 0,
                "max_processes": MAX_PROCESSES,
                "memory_mb": 768,
                "tmp_mb": TMP_MB,
                "disk_mb": DISK_MB,
            },
        )
    )
    try:
        with SandboxClient() as client:
            with client.create_sandbox(warmpool=POOL, sandbox_ready_timeout=120) as sb:
                yield sb
    finally:
        asyncio.run(apply_pool(POOL, None))


@pytest.fixture(scope="module")
def warm_daemon_module(sandbox_home: Path) -> Path:
    asyncio.run(apply_pool(POOL, {"replicas": 0}))  # starts the daemon if needed
    return sandbox_home


def run(sb: Sandbox, code: str, *args: str) -> str:
    sb.files.write("attack.py", code)
    result = sb.commands.run(" ".join(["python3 attack.py", *args]), timeout=120)
    return result.stdout + result.stderr


def test_a_fork_bomb_stops_at_the_process_limit(limited: Sandbox) -> None:
    out = run(limited, FORK_BOMB)
    started = int(out.split()[0])
    # The runtime, its kernel and the attacker count too.
    assert started < MAX_PROCESSES, out


def test_the_private_tmp_cannot_outgrow_its_size(limited: Sandbox) -> None:
    out = run(limited, FILL_TMP)
    written = int(out.split("written_mb")[1].split()[0])
    assert written <= TMP_MB, out
    assert "stopped 28" in out, out  # ENOSPC


def test_dev_shm_is_sized_and_dev_itself_takes_no_files(limited: Sandbox) -> None:
    """/dev was an unsized tmpfs the sandbox owned (/dev/shm a directory of it): the
    review put 1.3 GB there in a 1 GB pool."""
    out = run(limited, FILL_TMP, "/dev/shm/fill")
    written = int(out.split("written_mb")[1].split()[0])
    assert written <= TMP_MB, out
    assert "stopped 28" in out, out  # ENOSPC
    out = run(limited, FILL_TMP, "/dev/fill")
    assert "stopped 30" in out and "written_mb 0" in out, out  # EROFS


def test_the_runtime_directory_cannot_fill_the_hosts_disk(
    limited: Sandbox, sandbox_home: Path
) -> None:
    """/run/sandbox (the kernel's sockets) was a host directory the sandbox could
    write without bound; it is a tmpfs of its own now, of a few MB."""
    from jupyter_sandbox.control_plane.local.isolation import RUNTIME_DIR_BYTES

    out = run(limited, FILL_TMP, "/run/sandbox/fill")
    written = int(out.split("written_mb")[1].split()[0])
    assert "stopped 28" in out and written <= RUNTIME_DIR_BYTES >> 20, out  # ENOSPC
    run(limited, "open('/run/sandbox/probe', 'wb').write(b'x' * 1024)")
    assert not list(sandbox_home.glob("run/*/probe")), "nothing reaches the host's disk"
    run(limited, "import os; os.remove('/run/sandbox/probe')")
    assert "kernel" in run(limited, "import os; print(os.listdir('/run/sandbox'))")


@pytest.mark.parametrize("path", ["/fill", "/etc/fill", "/run/fill"])
def test_bubblewraps_own_root_takes_no_files(limited: Sandbox, path: str) -> None:
    """bwrap's root (and the /etc and /run it makes there) is an unsized tmpfs that
    an ordinary user's sandbox owns: 50 MB went into /big past every bound. It is
    read-only now (EROFS), and the Landlock layer inside would refuse it too."""
    out = run(limited, FILL_TMP, path)
    assert "written_mb 0" in out and ("stopped 30" in out or "stopped 13" in out), out


MANY_PROCESSES = FORK_BOMB.replace("range(300)", "range(1500)")


def test_a_pool_that_names_no_limit_still_has_a_process_limit(sandbox_home: Path) -> None:
    """As an ordinary user without a delegated cgroup, the default pool had no process
    limit at all (the review started 1,500 processes; the README said 1024)."""
    with SandboxClient() as client:
        with client.create_sandbox(warmpool="default", sandbox_ready_timeout=120) as sb:
            out = run(sb, MANY_PROCESSES)
    started = int(out.split()[0])
    assert started < DEFAULT_MAX_PROCESSES, out


def test_the_sandbox_says_how_limits_are_enforced(limited: Sandbox) -> None:
    async def detail() -> str:
        plane = LocalControlPlane()
        try:
            assert limited.claim_name is not None
            status = await plane.status(limited.claim_name)
            assert status is not None
            return status.isolation_detail
        finally:
            await plane.close()

    text = asyncio.run(detail())
    assert "limits: cgroup" in text or "rlimits only" in text, text


def _claim(sb: Sandbox) -> Any:
    async def status() -> Any:
        plane = LocalControlPlane()
        try:
            assert sb.claim_name is not None
            return await plane.status(sb.claim_name)
        finally:
            await plane.close()

    return asyncio.run(status())


def _disk_settles(sb: Sandbox, used: Callable[[float], bool]) -> Any:
    """The claim once the daemon's measurement (every second in the tests) says
    the workspace holds an amount for which ``used`` (in MB) is true."""
    deadline = time.monotonic() + 30
    while True:
        status = _claim(sb)
        disk = status.resources["disk"]
        if disk["used_mb"] is not None and used(disk["used_mb"]):
            time.sleep(1.5)  # the claim's message follows at the next reconcile
            return _claim(sb)
        assert time.monotonic() < deadline, status
        time.sleep(0.5)


WRITE_10_MB = """
import os, sys
try:
    with open(sys.argv[1], "wb") as handle:
        for _ in range(10):
            handle.write(os.urandom(1 << 20))
except OSError as exc:
    print("stopped", exc.errno)
"""


def test_a_workspace_over_its_disk_limit_is_marked(limited: Sandbox, sandbox_home: Path) -> None:
    """The sandbox fills its workspace. A root daemon's workspace is an ext4 image
    of the pool's size: the write fails with ENOSPC, the host's disk holds no more
    than the image, and the claim says the workspace is full. An ordinary user's
    daemon measures the workspace and marks the claim over its limit, counting
    what is on disk and never following a link the sandbox planted or counting a
    hard link twice. Either way JupyterLab shows the claim's words."""
    enforced = os.geteuid() == 0
    run(
        limited,
        "import os\n"
        "with open('/workspace/sparse', 'wb') as f: f.truncate(4 << 30)\n"  # no blocks
        "os.symlink('/', '/workspace/root')\n"  # the host's / if followed
        "open('/workspace/half', 'wb').write(os.urandom(10 << 20))\n"
        "for i in range(20): os.link('/workspace/half', f'/workspace/again{i}')\n",
    )
    status = _disk_settles(limited, lambda mb: mb > 9)
    disk = status.resources["disk"]
    assert disk["limit_mb"] == DISK_MB and 9 < disk["used_mb"] < DISK_MB, disk
    assert disk["over"] is False and disk["enforced"] is enforced, disk
    assert "disk limit" not in status.message

    out = run(limited, WRITE_10_MB, "/workspace/more")
    if enforced:
        assert "stopped 28" in out, out  # ENOSPC
        status = _disk_settles(limited, lambda mb: mb > DISK_MB - 2)
        assert status.resources["disk"]["over"] is True, status.resources
        assert "workspace is full" in status.message and "enforced" in status.message
        image = sandbox_home / "disks" / f"{status.sandbox}.ext4"
        assert image.stat().st_blocks * 512 <= DISK_MB << 20, image.stat()
    else:
        status = _disk_settles(limited, lambda mb: mb > DISK_MB)
        assert status.resources["disk"]["over"] is True
        assert "over its disk limit" in status.message and "delete files" in status.message

    run(limited, "import os; os.remove('/workspace/more')")
    status = _disk_settles(limited, lambda mb: mb < DISK_MB - 2)
    assert status.resources["disk"]["over"] is False
    assert "disk limit" not in status.message and "full" not in status.message


MEMORY = """
import mmap
# what numpy, pandas and OpenBLAS do on import: reserve address space, touch little
reserved = mmap.mmap(-1, 3 << 30, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS, prot=mmap.PROT_READ)
print("reserved_mb", len(reserved) >> 20)
held = b"x" * (400 << 20)
print("held_mb", len(held) >> 20)
try:
    more = b"y" * (2 << 30)
    print("allocated_mb", len(more) >> 20)
except MemoryError:
    print("refused")
"""


def test_memory_limits_count_memory_not_address_space(limited: Sandbox) -> None:
    """The limit was also set as RLIMIT_AS: importing numpy and pandas reserved a GB
    of address space, and a 1 GB pool could not hold a 100 MB array. Now the memory
    cgroup (or, without one, RLIMIT_DATA) counts what is used: reserved address
    space is free, 400 MB fit in a 768 MB pool, and 2 GB do not (refused, or the
    process is killed by the cgroup)."""
    out = run(limited, MEMORY)
    assert "reserved_mb 3072" in out and "held_mb 400" in out, out
    assert "allocated_mb" not in out, out
