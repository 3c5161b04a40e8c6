"""Faults injected under running notebooks: nothing lost, nothing duplicated, nothing leaked."""

from __future__ import annotations

import asyncio
import signal
from pathlib import Path

import psutil
import pytest

from ..conftest import HOME
from ..helpers import KernelSocket, jupyter_server, start_kernel, wait_for

pytestmark = pytest.mark.usefixtures("warm_daemon")

LINES = 120


def router_process() -> psutil.Process:
    for proc in psutil.process_iter(["cmdline"]):
        cmdline = " ".join(proc.info["cmdline"] or [])
        if "jupyter_sandbox.router.local" in cmdline and str(HOME) in cmdline:
            return proc
    raise LookupError("no local router process")


async def test_router_killed_while_a_cell_prints(tmp_path: Path) -> None:
    """The local router dies and is restarted under a printing cell.  (Kernel channels
    on the local backend go straight to the runtime's socket; this keeps that so.)"""
    with jupyter_server(tmp_path) as server:
        kernel_id = await start_kernel(server)
        ws = await KernelSocket(server, kernel_id).connect()
        try:
            cell = asyncio.create_task(
                ws.execute(
                    "import time\n"
                    f"for i in range({LINES}):\n"
                    "    print(f'line {i}', flush=True)\n"
                    "    time.sleep(0.03)\n",
                    timeout=120,
                )
            )
            await asyncio.sleep(1.0)
            first = router_process()
            first.send_signal(signal.SIGKILL)
            first.wait(10)

            async def restarted() -> bool:
                try:
                    return router_process().pid != first.pid
                except LookupError:
                    return False

            await wait_for(restarted, 30)
            result = await cell
        finally:
            ws.close()
        assert result.status == "ok"
        lines = [line for line in result.stdout.splitlines() if line]
        assert lines == [f"line {i}" for i in range(LINES)], (
            f"{len(lines)} lines; missing or duplicated output after the router restart"
        )
        await server.request("DELETE", f"/api/kernels/{kernel_id}", expect=204)
