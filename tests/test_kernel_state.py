"""A suspended notebook comes back with its variables (tier 1: saved with dill in the workspace).

Driven through a real jupyter_server and its kernel WebSocket, as JupyterLab does:
define variables, suspend (the REST API, or an idle cull), run a cell that uses them.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from jupyter_sandbox.control_plane.local.client import LocalControlPlane
from jupyter_sandbox.kernelspec import install_kernelspec

from .conftest import ROOT
from .helpers import (
    KernelSocket,
    apply_pool,
    count_bridge_signatures,
    jupyter_server,
    start_kernel,
    suspend_via_api,
    wait_for,
)

pytestmark = pytest.mark.usefixtures("warm_daemon")

DEFINITIONS = """
import json, socket, threading
import collections as co
from math import sqrt
x = 42
data = list(range(1000))
shared = [1, 2]
alias = shared
def double(v):
    return 2 * v
class Point:
    def __init__(self, a, b):
        self.a, self.b = a, b
    def norm(self):
        return sqrt(self.a ** 2 + self.b ** 2)
p = Point(3, 4)
counts = co.Counter("hello")
conn = socket.socket()
worker = threading.Thread(target=lambda: None)
"""

USES = (
    "print(x, sum(data), double(21), p.norm(), counts['l'], alias is shared, "
    "json.dumps([1]), 'conn' in globals(), 'worker' in globals())"
)


async def test_variables_functions_classes_and_imports_survive_a_suspend(tmp_path: Path) -> None:
    with jupyter_server(tmp_path) as server:
        kernel_id = await start_kernel(server)
        ws = await KernelSocket(server, kernel_id).connect()
        try:
            defined = await ws.execute(DEFINITIONS)
            assert defined.status == "ok", defined.reply
            count_before = defined.reply["execution_count"]
        finally:
            ws.close()
        await suspend_via_api(server, kernel_id)

        ws = await KernelSocket(server, kernel_id).connect()
        try:
            result = await ws.execute(USES, timeout=120)
            assert result.status == "ok", result.reply
            notice, answer = result.stdout.strip().splitlines()
            assert answer == "42 499500 42 5.0 2 True [1] False False"
            # A new connection to a resumed kernel is told so in the first output.
            assert notice.startswith("[sandbox] Resumed after suspension"), notice
            assert "restored 13 variables; not restored: conn (socket), worker (thread)" in notice
            # The prompt numbers go on from where they were.
            assert result.reply["execution_count"] == count_before + 1
        finally:
            ws.close()
        await server.request("DELETE", f"/api/kernels/{kernel_id}", expect=204)


async def test_a_cell_that_resumes_the_sandbox_says_what_came_back(tmp_path: Path) -> None:
    with jupyter_server(tmp_path) as server:
        kernel_id = await start_kernel(server)
        ws = await KernelSocket(server, kernel_id).connect()
        try:
            await ws.execute(DEFINITIONS)
            # Suspend under a live connection: the next cell resumes the sandbox.
            await suspend_via_api(server, kernel_id)
            result = await ws.execute("print(double(x))", timeout=120)
        finally:
            ws.close()
        notice, answer = result.stdout.splitlines()[0], result.stdout.splitlines()[-1]
        assert answer == "84"
        assert "Resumed after suspension" in notice
        assert "restored" in notice and "not restored: conn (socket), worker (thread)" in notice
        errors = [o for o in result.outputs if o["content"].get("name") == "stderr"]
        assert errors == [], "the notice is information, not an error"
        await server.request("DELETE", f"/api/kernels/{kernel_id}", expect=204)


async def test_a_restart_is_still_a_fresh_kernel(tmp_path: Path) -> None:
    with jupyter_server(tmp_path) as server:
        kernel_id = await start_kernel(server)
        ws = await KernelSocket(server, kernel_id).connect()
        try:
            await ws.execute("z = 1")
            await suspend_via_api(server, kernel_id)
            await ws.execute("z += 1")  # resumes, with z back
            await server.request("POST", f"/api/kernels/{kernel_id}/restart", expect=200)
            result = await ws.execute("print('z' in globals())")
        finally:
            ws.close()
        assert result.stdout.strip().splitlines()[-1] == "False"
        await server.request("DELETE", f"/api/kernels/{kernel_id}", expect=204)


@pytest.mark.parametrize(
    ("pool", "spec", "expected"),
    [
        # Over the size cap: the big one is left out, the rest comes back.
        ("capped", {"replicas": 0, "state_max_mb": 1}, "small True big False"),
        # Saving turned off for the pool: a fresh kernel, as before.
        ("nostate", {"replicas": 0, "save_state": False}, "small False big False"),
    ],
)
async def test_pool_options_bound_or_turn_off_saving(
    tmp_path: Path, pool: str, spec: dict[str, object], expected: str
) -> None:
    await apply_pool(pool, spec)
    install_kernelspec(pool, prefix=str(ROOT))  # where the session's kernelspecs are
    try:
        with jupyter_server(tmp_path) as server:
            kernel_id = await start_kernel(server, f"sandbox-{pool}")
            ws = await KernelSocket(server, kernel_id).connect()
            try:
                await ws.execute("small = 1\nbig = bytes(3 * 1024 * 1024)")
                await suspend_via_api(server, kernel_id)
                result = await ws.execute(
                    "print('small', 'small' in globals(), 'big', 'big' in globals())"
                )
            finally:
                ws.close()
            assert result.stdout.strip().splitlines()[-1] == expected
            await server.request("DELETE", f"/api/kernels/{kernel_id}", expect=204)
    finally:
        await apply_pool(pool, None)


async def test_a_suspend_that_cannot_save_the_variables_is_refused(tmp_path: Path) -> None:
    """A save too slow for the pool's state_timeout used to end in a suspend anyway:
    every variable lost. Now the suspend is refused with the reason and the kernel
    runs on with them; only force suspends it."""
    pool = "slowsave"
    await apply_pool(pool, {"replicas": 0, "state_timeout": 0.05})
    install_kernelspec(pool, prefix=str(ROOT))
    try:
        with jupyter_server(tmp_path) as server:
            kernel_id = await start_kernel(server, f"sandbox-{pool}")
            ws = await KernelSocket(server, kernel_id).connect()
            path = f"/api/sandbox/kernels/{kernel_id}"
            try:
                await ws.execute("big = [str(i) for i in range(3_000_000)]; kept = 42")
                answer = await server.request("POST", f"{path}/suspend", {})
                assert answer.get("reason") == "KernelStateNotSaved", answer
                assert "could not be saved" in answer["message"], answer
                assert "force" in answer["message"], answer
                model = await server.request("GET", path, expect=200)
                assert model["sandbox"]["suspended"] is False
                result = await ws.execute("print('kept', kept, len(big))")
                assert result.stdout.strip() == "kept 42 3000000", result.stdout
                forced = await server.request(
                    "POST", f"{path}/suspend", {"force": True}, expect=200
                )
                assert forced["sandbox"]["suspended"] is True
            finally:
                ws.close()
            await server.request("DELETE", f"/api/kernels/{kernel_id}", expect=204)
    finally:
        await apply_pool(pool, None)


async def suspend_provisioned(provisioner: Any) -> str:
    """Suspend a provisioner's sandbox as an idle cull does; its claim once Suspended."""
    claim: str = provisioner.session.claim_name
    await provisioner.suspend()
    plane = LocalControlPlane()
    try:

        async def suspended() -> bool:
            status = await plane.status(claim)
            return status is not None and status.phase == "Suspended"

        await wait_for(suspended, 60)
    finally:
        await plane.close()
    return claim


async def test_a_batch_run_suspended_between_cells_keeps_its_state() -> None:
    """nbclient: the sandbox is suspended after the first cell; the second resumes it."""
    import nbformat
    from nbclient import NotebookClient

    nb = nbformat.v4.new_notebook(
        cells=[
            nbformat.v4.new_code_cell("x = 21\ndef twice(v):\n    return 2 * v"),
            nbformat.v4.new_code_cell("print(twice(x))"),
        ]
    )
    client = NotebookClient(nb, kernel_name="sandbox-default", timeout=180)
    suspended: list[str] = []

    async def suspend_after_first(cell: object, cell_index: int, execute_reply: object) -> None:
        if cell_index != 0:
            return
        suspended.append(await suspend_provisioned(client.km.provisioner))

    client.on_cell_executed = suspend_after_first
    await client.async_execute()
    assert suspended, "the sandbox was suspended between the cells"
    assert nb.cells[1].outputs[-1]["text"] == "42\n"


KERNELS_OWN_KEY = (
    "import json\nfrom ipykernel.kernelapp import IPKernelApp\n"
    "print(json.load(open(IPKernelApp.instance().abs_connection_file))['key'])"
)


async def test_zmq_clients_sign_with_the_kernels_own_key_across_restart_and_suspend(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """jupyter_client is handed the key the kernel in the sandbox was started with, the
    same after a restart and after a suspend, so the bridge computes no signatures."""
    from jupyter_client.manager import AsyncKernelManager

    signatures = count_bridge_signatures(monkeypatch)
    km = AsyncKernelManager(kernel_name="sandbox-default")
    await km.start_kernel()
    kc = km.client()
    kc.start_channels()

    async def kernels_key() -> str:
        printed: list[str] = []
        signatures.clear()
        reply = await kc.execute_interactive(
            KERNELS_OWN_KEY,
            output_hook=lambda m: printed.append(m["content"].get("text", "")),
            timeout=120,
        )
        assert reply["content"]["status"] == "ok", reply["content"]
        return "".join(printed).strip().splitlines()[-1]

    try:
        await kc.wait_for_ready(timeout=120)
        key = km.session.key.decode()
        assert await kernels_key() == key
        assert signatures == [], "the bridge signed what the kernel had signed"

        await km.restart_kernel()
        await kc.wait_for_ready(timeout=120)
        assert km.session.key.decode() == key
        assert await kernels_key() == key
        assert signatures == []

        await suspend_provisioned(km.provisioner)
        assert await kernels_key() == key, "the resumed kernel has another key"
        assert await kernels_key() == key
        assert signatures == [], "after the resume the bridge signs again"
    finally:
        kc.stop_channels()
        await km.shutdown_kernel(now=True)
