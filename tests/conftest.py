"""Test session set-up: an isolated sandbox home and kernelspecs, and a leak check at the end.

Every test talks to the same per-session local daemon, exactly as a user's Jupyter
servers and nbclient runs share theirs.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import tempfile
import time
from pathlib import Path

import psutil
import pytest

# The real Kubernetes control plane (tests marked "cluster") comes from this plugin.
pytest_plugins = ["tests.cluster.fixtures"]

ROOT = Path(tempfile.mkdtemp(prefix="jsbx-test-"))
HOME = ROOT / "sandbox-home"
DATA = ROOT / "share" / "jupyter"

# Secrets a Jupyter server might hold: none may reach a sandbox.
SERVER_SECRETS = {
    "AWS_SECRET_ACCESS_KEY": "test-aws-secret-do-not-leak",
    "JUPYTERHUB_API_TOKEN": "test-hub-token-do-not-leak",
    "MY_APP_PASSWORD": "test-app-password-do-not-leak",
}


def pytest_configure(config: pytest.Config) -> None:
    os.environ["JUPYTER_SANDBOX_HOME"] = str(HOME)
    os.environ["JUPYTER_SANDBOX_ORPHAN_GRACE"] = "1"
    os.environ["JUPYTER_SANDBOX_DEFAULT_REPLICAS"] = "2"
    os.environ["JUPYTER_SANDBOX_IDLE_TIMEOUT"] = "0"
    os.environ["JUPYTER_SANDBOX_DISK_CHECK_SECONDS"] = "1"
    os.environ["JUPYTER_RUNTIME_DIR"] = str(ROOT / "runtime")
    os.environ["JUPYTER_PATH"] = os.pathsep.join(
        [str(DATA), *filter(None, [os.environ.get("JUPYTER_PATH")])]
    )
    os.environ.update(SERVER_SECRETS)
    from jupyter_sandbox.kernelspec import install_kernelspec

    install_kernelspec("default", prefix=str(ROOT))
    install_kernelspec("nonet", prefix=str(ROOT))
    install_kernelspec("missing", prefix=str(ROOT))


def sandbox_processes() -> list[psutil.Process]:
    found = []
    for proc in psutil.process_iter(["cmdline"]):
        cmdline = " ".join(proc.info["cmdline"] or [])
        if str(HOME) in cmdline and "daemon" not in cmdline:
            found.append(proc)
    return found


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    from jupyter_sandbox.control_plane.local.client import LocalControlPlane

    async def stop() -> None:
        plane = LocalControlPlane(HOME, autostart=False)
        await plane.stop_daemon()
        await plane.close()

    if (HOME / "daemon.sock").exists():
        asyncio.run(stop())
    deadline = time.monotonic() + 10
    leaked = sandbox_processes()
    while leaked and time.monotonic() < deadline:
        time.sleep(0.2)
        leaked = sandbox_processes()
    if leaked:
        print(f"\nLEAK: {len(leaked)} sandbox processes left after the session:")
        for proc in leaked:
            print("  ", proc.pid, " ".join(proc.cmdline())[:200])
            proc.kill()
        session.exitstatus = pytest.ExitCode.TESTS_FAILED
    else:
        print("\nno sandbox processes left after the session")
    shutil.rmtree(ROOT, ignore_errors=True)


@pytest.fixture(scope="session")
def sandbox_home() -> Path:
    return HOME


async def _wait_pools_ready(timeout: float = 120) -> None:
    from jupyter_sandbox.control_plane.local.client import LocalControlPlane

    plane = LocalControlPlane(HOME)
    try:
        await plane.ensure_daemon()
        await plane.apply_pool("nonet", {"replicas": 1, "network": False})
        deadline = time.monotonic() + timeout
        while True:
            pools = await plane.list_pools()
            if all(p.ready >= p.replicas for p in pools):
                return
            if time.monotonic() > deadline:
                raise TimeoutError(f"pools not warm: {pools}")
            await asyncio.sleep(0.2)
    finally:
        await plane.close()


@pytest.fixture
def warm_daemon() -> Path:
    """The session's daemon, running, with every pool's warm sandboxes ready."""
    asyncio.run(_wait_pools_ready())
    return HOME
