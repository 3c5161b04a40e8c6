"""A Jupyter server killed and started again finds its sandboxed kernels (or releases them)."""

from __future__ import annotations

from pathlib import Path

import pytest

from jupyter_sandbox.control_plane.local.client import LocalControlPlane

from ..helpers import KernelSocket, jupyter_server, start_kernel, wait_for

pytestmark = pytest.mark.usefixtures("warm_daemon")

SAME_SERVER = (
    "--SandboxKernelManager.server_id=restart-test",
    "--SandboxProvisioner.orphan_grace=120",
)


async def claims_of(kernel_id: str) -> list:
    plane = LocalControlPlane()
    try:
        return await plane.list_claims({"jupyter-sandbox/kernel-id": kernel_id})
    finally:
        await plane.close()


async def test_killed_server_restarts_and_reattaches_running_kernels(tmp_path: Path) -> None:
    with jupyter_server(tmp_path, *SAME_SERVER) as first:
        kernel_id = await start_kernel(first)
        ws = await KernelSocket(first, kernel_id).connect()
        await ws.execute("import os\nx = 42\nkernel_pid = os.getpid()")
        ws.close()
        first.proc.kill()  # no shutdown, no cleanup
        first.proc.wait()

    with jupyter_server(tmp_path, *SAME_SERVER) as second:

        async def listed() -> bool:
            kernels = await second.request("GET", "/api/kernels")
            if not isinstance(kernels, list):  # e.g. a 5xx while the server starts up
                print("GET /api/kernels while restarting:", kernels)
                return False
            return kernel_id in [k["id"] for k in kernels]

        await wait_for(listed, 60)
        ws = await KernelSocket(second, kernel_id).connect()
        try:
            result = await ws.execute("print(x, os.getpid() == kernel_pid)")
        finally:
            ws.close()
        assert result.stdout.strip() == "42 True", "the same kernel process, state intact"
        claims = await claims_of(kernel_id)
        assert len(claims) == 1
        assert claims[0].resources["owner_pid"] == second.proc.pid
        await second.request("DELETE", f"/api/kernels/{kernel_id}", expect=204)
    assert await claims_of(kernel_id) == []


async def test_restart_with_reattach_off_releases_the_old_kernels(tmp_path: Path) -> None:
    with jupyter_server(tmp_path, *SAME_SERVER) as first:
        kernel_id = await start_kernel(first)
        first.proc.kill()
        first.proc.wait()
    assert len(await claims_of(kernel_id)) == 1, "the grace keeps the claim for a restart"

    with jupyter_server(tmp_path, *SAME_SERVER, "--SandboxKernelManager.reattach=False") as second:

        async def released() -> bool:
            return await claims_of(kernel_id) == []

        await wait_for(released, 60)
        kernels = await second.request("GET", "/api/kernels")
        assert kernel_id not in [k["id"] for k in kernels]
