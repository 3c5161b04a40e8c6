"""The local control plane: isolation, input validation, orphans and crash recovery."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest
from jupyter_client.manager import AsyncKernelManager

from jupyter_sandbox.control_plane.base import (
    ClaimRequest,
    InvalidRequest,
    Phase,
    PoolNotFound,
)
from jupyter_sandbox.control_plane.local.client import LocalControlPlane
from jupyter_sandbox.control_plane.local.isolation import probe
from jupyter_sandbox.control_plane.local.model import default_memory_mb

from .conftest import HOME
from .helpers import KernelSocket, jupyter_server, start_kernel, wait_for

pytestmark = pytest.mark.usefixtures("warm_daemon")

ISOLATED = probe().isolated


@pytest.fixture
async def plane() -> LocalControlPlane:
    client = LocalControlPlane()
    yield client  # type: ignore[misc]
    await client.close()


async def start_sandbox_kernel() -> AsyncKernelManager:
    km = AsyncKernelManager(kernel_name="sandbox-default")
    await km.start_kernel()
    return km


async def run_code(km: AsyncKernelManager, code: str, timeout: float = 60) -> str:
    kc = km.client()
    kc.start_channels()
    try:
        await kc.wait_for_ready(timeout=timeout)
        out: list[str] = []

        def hook(msg: dict) -> None:
            if msg["msg_type"] == "stream":
                out.append(msg["content"]["text"])
            elif msg["msg_type"] == "error":
                out.append("ERROR " + msg["content"]["ename"])

        await kc.execute_interactive(code, timeout=timeout, output_hook=hook)
        return "".join(out)
    finally:
        kc.stop_channels()


@pytest.mark.skipif(not ISOLATED, reason=f"no isolation here: {probe().detail}")
async def test_sandbox_cannot_read_the_users_files(tmp_path: Path) -> None:
    secret = tmp_path / "private.txt"
    secret.write_text("the user's private data")
    home_secret = Path.home() / ".jsbx-test-secret"
    home_secret.write_text("home secret")
    km = await start_sandbox_kernel()
    try:
        out = await run_code(
            km,
            (
                "import os\n"
                f"for p in [{str(secret)!r}, {str(home_secret)!r}, '/etc/shadow', {str(HOME)!r}]:\n"
                "    try:\n"
                "        print(p, 'READ' if os.path.isfile(p) and open(p).read() else\n"
                "              ('LISTED' if os.path.isdir(p) and os.listdir(p) else 'hidden'))\n"
                "    except OSError as e:\n"
                "        print(p, 'hidden', type(e).__name__)\n"
                "print('uid', os.getuid(), 'pid1', open('/proc/1/cmdline').read()[:40])\n"
            ),
        )
    finally:
        await km.shutdown_kernel()
        home_secret.unlink()
    assert "READ" not in out and "LISTED" not in out, out
    assert "uid 1000" in out


@pytest.mark.skipif(not ISOLATED, reason=f"no isolation here: {probe().detail}")
async def test_no_network_pool_has_no_network() -> None:
    km = AsyncKernelManager(kernel_name="sandbox-nonet")
    await km.start_kernel()
    try:
        out = await run_code(
            km,
            (
                "import socket\n"
                "print(sorted(i[1] for i in socket.if_nameindex()))\n"
                "s = socket.socket()\n"
                "s.settimeout(2)\n"
                "try:\n"
                "    s.connect(('127.0.0.1', 1)); print('connected')\n"
                "except OSError as e:\n"
                "    print('refused', e.errno)\n"
            ),
        )
    finally:
        await km.shutdown_kernel()
    assert out.splitlines()[0] == "['lo']", out


async def test_claims_validate_their_input(plane: LocalControlPlane) -> None:
    with pytest.raises(PoolNotFound) as missing:
        await plane.claim(ClaimRequest(pool="no-such-pool"))
    assert "jupyter-sandbox pool create" in missing.value.hint
    for bad in [
        ClaimRequest(pool="Bad Pool"),
        ClaimRequest(pool="default", labels={"bad key!": "x"}),
        ClaimRequest(pool="default", labels={"k": 5}),  # type: ignore[dict-item]
        ClaimRequest(pool="default", env={"A=B": "x"}),
        ClaimRequest(pool="default", owner_pid=2**30),
        ClaimRequest(pool="default", name="UPPER"),
        # A caller of the daemon's API may ask for any directory: these never bind.
        ClaimRequest(pool="default", files_dir="/"),
        ClaimRequest(pool="default", files_dir=str(Path.home())),
        ClaimRequest(pool="default", files_dir=str(HOME / "workspaces")),
        ClaimRequest(pool="default", files_dir="relative/path"),
        ClaimRequest(pool="default", files_dir="/usr/lib"),
    ]:
        with pytest.raises(InvalidRequest):
            await plane.claim(bad)
    assert await plane.list_claims() == []


async def test_pools_validate_their_input(plane: LocalControlPlane) -> None:
    for name, spec in [
        ("ok-name", {"replicas": -1}),
        ("ok-name", {"replicas": "2"}),
        ("ok-name", {"surprise": 1}),
        ("ok-name", {"memory_mb": -1}),  # 0 lifts the limit (tests/unit/test_pool_limits.py)
        ("ok-name", {"tmp_mb": 0}),
        ("Bad_Name", {"replicas": 1}),
        ("ok-name", {"network": "yes"}),
        ("ok-name", {"files": "rwx"}),
    ]:
        with pytest.raises(InvalidRequest):
            await plane.apply_pool(name, spec)
    names = [p.name for p in await plane.list_pools()]
    assert "ok-name" not in names


async def test_a_pool_that_cannot_start_says_why(plane: LocalControlPlane) -> None:
    """Members that keep exiting (here: a memory limit too small to load Python)
    are reported with the last line of their log, not left "starting" silently."""
    await plane.apply_pool("starved", {"replicas": 1, "memory_mb": 8})
    try:

        async def explained() -> str:
            pool = next(p for p in await plane.list_pools() if p.name == "starved")
            assert pool.ready == 0
            return pool.message

        message = await wait_for(explained, 60)
        assert message.startswith("sandboxes keep exiting: ")
        assert "(log: " in message and message.endswith(".log)")
        result = subprocess.run(
            [sys.executable, "-m", "jupyter_sandbox.cli", "pool", "list"],
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert "starved: sandboxes keep exiting" in result.stdout
        # what its sandboxes get, defaults applied
        (row,) = [line for line in result.stdout.splitlines() if line.startswith("starved ")]
        assert "8 MB" in row and "10240 MB" in row and " rw " in row, result.stdout
    finally:
        await plane.delete_pool("starved")
    assert "starved" not in [p.name for p in await plane.list_pools()]


def test_cli_reports_errors_plainly() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "jupyter_sandbox.cli", "pool", "create", "Bad_Name"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 2
    assert "error: pool name 'Bad_Name' is not valid" in result.stderr
    assert "Traceback" not in result.stderr
    listing = subprocess.run(
        [sys.executable, "-m", "jupyter_sandbox.cli", "pool", "--json", "list"],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    assert "default" in [p["name"] for p in json.loads(listing.stdout)]


async def test_claim_of_a_killed_owner_is_released(plane: LocalControlPlane) -> None:
    owner = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    try:
        status = await plane.claim(
            ClaimRequest(pool="default", owner_pid=owner.pid, labels={"test": "orphan"})
        )
        await plane.wait_ready(status.name, 60)
    finally:
        owner.kill()
        owner.wait()

    async def released() -> bool:
        return await plane.status(status.name) is None

    await wait_for(released, 30)


async def test_killed_jupyter_server_leaves_nothing_behind(
    tmp_path: Path, plane: LocalControlPlane
) -> None:
    with jupyter_server(tmp_path) as server:
        kernel_id = await start_kernel(server)
        claims = await plane.list_claims({"jupyter-sandbox/kernel-id": kernel_id})
        assert len(claims) == 1
        pid = claims[0].resources["pid"]
        server.proc.kill()  # no shutdown, no cleanup
        server.proc.wait()

    async def reaped() -> bool:
        left = await plane.list_claims({"jupyter-sandbox/kernel-id": kernel_id})
        return not left and not psutil.pid_exists(pid)

    await wait_for(reaped, 30)


async def test_kernel_killed_with_sigkill_restarts_in_the_same_sandbox(
    tmp_path: Path, plane: LocalControlPlane
) -> None:
    with jupyter_server(tmp_path) as server:
        kernel_id = await start_kernel(server)
        ws = await KernelSocket(server, kernel_id).connect()
        try:
            result = await ws.execute("import os; print(os.getpid())")
            kernel_pid = int(result.stdout)
            claim = (await plane.list_claims({"jupyter-sandbox/kernel-id": kernel_id}))[0]
            ws.send(
                "shell",
                "execute_request",
                {
                    "code": "import os, signal; os.kill(os.getpid(), signal.SIGKILL)",
                    "silent": False,
                    "store_history": False,
                    "user_expressions": {},
                    "allow_stdin": False,
                    "stop_on_error": True,
                },
            )

            async def restarted() -> bool:
                try:
                    again = await ws.execute("import os; print(os.getpid())", timeout=5)
                except TimeoutError:
                    return False
                return again.status == "ok" and int(again.stdout) != kernel_pid

            await wait_for(restarted, 60, interval=1)
        finally:
            ws.close()
        after = (await plane.list_claims({"jupyter-sandbox/kernel-id": kernel_id}))[0]
        assert after.name == claim.name and after.sandbox == claim.sandbox
        await server.request("DELETE", f"/api/kernels/{kernel_id}", expect=204)


async def test_sandbox_process_killed_recovers_with_workspace(
    tmp_path: Path, plane: LocalControlPlane
) -> None:
    with jupyter_server(tmp_path) as server:
        kernel_id = await start_kernel(server)
        ws = await KernelSocket(server, kernel_id).connect()
        try:
            await ws.execute("open('survives.txt', 'w').write('yes')")
            claim = (await plane.list_claims({"jupyter-sandbox/kernel-id": kernel_id}))[0]
            os.killpg(claim.resources["pid"], signal.SIGKILL)  # the whole sandbox

            # First the daemon sees it die: a cell sent at once may still reach the
            # dying kernel (SIGKILL reaches the sandbox's own processes a moment after
            # bubblewrap's), and on a loaded machine it answered before it died.
            async def restarted() -> bool:
                now = (await plane.list_claims({"jupyter-sandbox/kernel-id": kernel_id}))[0]
                return int(now.resources["restarts"] or 0) >= 1

            await wait_for(restarted, 60, interval=0.5)

            async def working() -> bool:
                try:
                    result = await ws.execute("print(open('survives.txt').read())", timeout=5)
                except TimeoutError:
                    return False
                return result.stdout.strip() == "yes"

            await wait_for(working, 90, interval=1)
        finally:
            ws.close()
        after = (await plane.list_claims({"jupyter-sandbox/kernel-id": kernel_id}))[0]
        assert after.sandbox == claim.sandbox
        assert after.resources["restarts"] >= 1
        await server.request("DELETE", f"/api/kernels/{kernel_id}", expect=204)


async def test_a_start_that_dies_before_ready_is_retried_not_failed(
    plane: LocalControlPlane,
) -> None:
    """One failed start (here: the sandbox killed while its kernel starts) is retried
    after a back-off; the claim stays Pending through it instead of turning Failed."""
    await plane.apply_pool("cold", {"replicas": 0})
    claim = None
    try:
        for _ in range(3):  # the start may win the race to Ready; then try again
            claim = await plane.claim(ClaimRequest(pool="cold"))

            async def starting_pid(name: str = claim.name) -> int | None:
                status = await plane.status(name)
                assert status is not None
                return status.resources.get("pid") if status.phase == Phase.PENDING else None

            pid = await wait_for(starting_pid, 60, interval=0.02)
            status = await plane.status(claim.name)
            if status is not None and status.phase == Phase.PENDING:
                os.killpg(pid, signal.SIGKILL)
                break
            await plane.release(claim.name)
        else:
            pytest.skip("every cold start was Ready before it could be killed")

        phases = set()

        async def ready_again() -> bool:
            status = await plane.status(claim.name)
            assert status is not None
            phases.add(status.phase)
            return status.phase == Phase.READY

        await wait_for(ready_again, 90, interval=0.05)
        assert Phase.FAILED not in phases, phases
        status = await plane.status(claim.name)
        assert status is not None and status.resources["restarts"] >= 1
        assert status.resources["pid"] != pid
    finally:
        if claim is not None:
            await plane.release(claim.name)
        await plane.delete_pool("cold")


async def test_pool_refills_after_claims(plane: LocalControlPlane) -> None:
    status = await plane.claim(ClaimRequest(pool="default"))
    try:
        assert status.warm is True

        async def refilled() -> bool:
            pool = next(p for p in await plane.list_pools() if p.name == "default")
            return pool.ready >= pool.replicas

        started = time.monotonic()
        await wait_for(refilled, 60)
        assert time.monotonic() - started < 60
    finally:
        await plane.release(status.name)
        await plane.release(status.name)  # idempotent


@pytest.mark.skipif(not ISOLATED, reason=f"no isolation here: {probe().detail}")
async def test_a_sandbox_has_no_route_to_another(plane: LocalControlPlane) -> None:
    other = await plane.claim(ClaimRequest(pool="default"))
    other = await plane.wait_ready(other.name, 60)
    assert other.endpoint is not None
    other_socket = HOME / "run" / str(other.sandbox) / "runtime.sock"
    km = await start_sandbox_kernel()
    try:
        out = await run_code(
            km,
            (
                "import os, socket, urllib.request, urllib.error\n"
                f"print('socket visible', os.path.exists({str(other_socket)!r}))\n"
                f"print('state dir visible', os.path.exists({str(HOME)!r}))\n"
                f"req = urllib.request.Request({other.endpoint.router_url!r} + '/list/',\n"
                f"    headers={{'X-Sandbox-ID': {other.sandbox!r},\n"
                "             'X-Sandbox-Namespace': 'local'})\n"
                "try:\n"
                "    urllib.request.urlopen(req, timeout=5)\n"
                "    print('router: reached')\n"
                "except urllib.error.HTTPError as e:\n"
                "    print('router:', e.code)\n"
                "except OSError as e:\n"
                "    print('router: unreachable')\n"
            ),
        )
    finally:
        await km.shutdown_kernel()
        await plane.release(other.name)
    assert "socket visible False" in out, out
    assert "state dir visible False" in out, out
    assert "router: 401" in out or "router: unreachable" in out, out


async def test_claims_list_says_each_claims_notebook_directory_and_age(
    plane: LocalControlPlane, tmp_path: Path
) -> None:
    status = await plane.claim(ClaimRequest(pool="default", files_dir=str(tmp_path)))
    try:
        result = subprocess.run(
            [sys.executable, "-m", "jupyter_sandbox.cli", "claims", "list"],
            capture_output=True,
            text=True,
            timeout=60,
        )
        header, *rows = result.stdout.splitlines()
        assert "AGE" in header and "NOTEBOOK DIR" in header, result.stdout
        (row,) = [line for line in rows if line.startswith(status.name)]
        assert str(tmp_path) in row and " s " in row, row
    finally:
        await plane.release(status.name)


async def test_a_claim_says_the_memory_limit_that_applies(plane: LocalControlPlane) -> None:
    """The default pool names no memory limit, yet one applies (the default, by
    cgroup or RLIMIT_DATA); Sandbox Details said "Memory limit: none"."""
    claim = await plane.claim(ClaimRequest(pool="default"))
    try:
        ready = await plane.wait_ready(claim.name, 120)
        assert ready.resources["memory_mb"] == default_memory_mb(), ready.resources
    finally:
        await plane.release(claim.name)
