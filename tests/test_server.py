"""A real jupyter_server with the sandbox provisioner, driven over REST and the kernel WebSocket."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

import pytest

from jupyter_sandbox.control_plane.local.client import LocalControlPlane
from jupyter_sandbox.control_plane.runtime_client import call

from .helpers import (
    KernelSocket,
    claims_for,
    jupyter_server,
    start_kernel,
    suspend_via_api,
    wait_for,
)

pytestmark = pytest.mark.usefixtures("warm_daemon")


# v1: JupyterLab's framing, relayed straight to the runtime; json: through the bridge.
PROTOCOLS = pytest.mark.parametrize("protocol", ["v1", "json"])


@PROTOCOLS
async def test_execute_rich_output_stdin_buffers(tmp_path: Path, protocol: str) -> None:
    with jupyter_server(tmp_path) as server:
        kernel_id = await start_kernel(server)
        claims = await claims_for(kernel_id)
        assert len(claims) == 1 and claims[0].phase == "Ready"
        assert claims[0].warm is True, "the kernel should start from a warm sandbox"
        ws = await KernelSocket(server, kernel_id, protocol).connect()
        try:
            result = await ws.execute("import os; print(os.getcwd()); 6 * 7")
            assert result.status == "ok"
            assert result.stdout.strip() in ("/workspace", claims[0].workspace)
            assert any(
                o["msg_type"] == "execute_result" and o["content"]["data"]["text/plain"] == "42"
                for o in result.outputs
            )

            html = await ws.execute(
                "from IPython.display import HTML, display\ndisplay(HTML('<b>bold</b>'))"
            )
            assert html.outputs[0]["content"]["data"]["text/html"] == "<b>bold</b>"

            asked = await ws.execute(
                "name = input('who? ')\nprint('hello', name)", stdin=["sandbox"]
            )
            assert "hello sandbox" in asked.stdout

            # A comm message carrying binary buffers, as widgets send.
            comm = await ws.execute(
                "from comm import create_comm\n"
                "c = create_comm(target_name='t', data={'k': 1},\n"
                "                buffers=[b'\\x00\\x01\\xff' * 1000])"
            )
            assert comm.status == "ok"
            opened = [m for m in ws.seen if m["header"]["msg_type"] == "comm_open"]
            assert opened, "comm_open did not reach the frontend"
            buffers = opened[-1]["buffers"]
            assert bytes(buffers[0]) == b"\x00\x01\xff" * 1000

            # Outputs large enough to take the runtime's and the bridge's uncopied paths.
            big = await ws.execute(
                "from comm import create_comm\n"
                "big = create_comm(target_name='t', buffers=[bytes(range(256)) * 12288])\n"
                "print('y' * 400_000)"
            )
            assert big.status == "ok"
            assert big.stdout == "y" * 400_000 + "\n"
            opened = [m for m in ws.seen if m["header"]["msg_type"] == "comm_open"]
            assert bytes(opened[-1]["buffers"][0]) == bytes(range(256)) * 12288
        finally:
            ws.close()
        await server.request("DELETE", f"/api/kernels/{kernel_id}", expect=204)
        assert await claims_for(kernel_id) == []


async def test_interrupt_restart_and_shutdown(tmp_path: Path) -> None:
    with jupyter_server(tmp_path) as server:
        kernel_id = await start_kernel(server)
        ws = await KernelSocket(server, kernel_id).connect()
        try:
            await ws.execute("x = 1")
            sleeper = asyncio.create_task(ws.execute("import time; time.sleep(60)", timeout=60))
            await asyncio.sleep(2)
            started = time.monotonic()
            await server.request("POST", f"/api/kernels/{kernel_id}/interrupt", expect=204)
            interrupted = await sleeper
            assert interrupted.status == "error"
            assert interrupted.reply["ename"] == "KeyboardInterrupt"
            assert time.monotonic() - started < 30

            claim_before = (await claims_for(kernel_id))[0]
            await server.request("POST", f"/api/kernels/{kernel_id}/restart", expect=200)
        finally:
            ws.close()
        ws = await KernelSocket(server, kernel_id).connect()
        try:
            after = await ws.execute("print('x' in globals())")
            assert after.stdout.strip() == "False", "restart must give a fresh kernel"
            claim_after = (await claims_for(kernel_id))[0]
            assert claim_after.name == claim_before.name
            assert claim_after.sandbox == claim_before.sandbox, "restart keeps the sandbox"
        finally:
            ws.close()
        workspace = Path(claim_after.workspace or "")
        await server.request("DELETE", f"/api/kernels/{kernel_id}", expect=204)
        # Twice is harmless.
        await server.request("DELETE", f"/api/kernels/{kernel_id}", expect=404)
        assert await claims_for(kernel_id) == []

        async def workspace_gone() -> bool:
            return not workspace.exists()

        await wait_for(workspace_gone, 15)


@PROTOCOLS
async def test_cull_suspends_and_next_execute_resumes(tmp_path: Path, protocol: str) -> None:
    with jupyter_server(
        tmp_path,
        "--MappingKernelManager.cull_idle_timeout=3",
        "--MappingKernelManager.cull_interval=1",
    ) as server:
        kernel_id = await start_kernel(server)
        ws = await KernelSocket(server, kernel_id, protocol).connect()
        await ws.execute("open('kept.txt', 'w').write('still here'); y = 5")
        ws.close()

        async def suspended() -> bool:
            model = await server.request("GET", f"/api/sandbox/kernels/{kernel_id}")
            return bool(model["sandbox"]["suspended"])

        await wait_for(suspended, 30)

        async def compute_released() -> bool:
            return (await claims_for(kernel_id))[0].phase == "Suspended"

        await wait_for(compute_released, 30)
        claim = (await claims_for(kernel_id))[0]
        assert claim.resources["pid"] is None, "a suspended sandbox has no process"
        # (the files are checked from inside after the resume: as root the workspace
        # is an image that nothing has mounted while the sandbox is suspended)
        assert Path(claim.workspace or "").is_dir(), "the workspace is kept"
        kernels = await server.request("GET", "/api/kernels")
        assert kernel_id in [k["id"] for k in kernels], "a suspended kernel stays listed"

        ws = await KernelSocket(server, kernel_id, protocol).connect()
        try:
            result = await ws.execute(
                "print(open('kept.txt').read(), 'y' in globals())", timeout=120
            )
            notice, answer = result.stdout.strip().splitlines()
            assert answer == "still here True", "files and variables are kept"
            # Told in words, in the first execution's output; never with a "restarting"
            # status, which JupyterLab takes for a crash ("the kernel appears to have died").
            assert notice.startswith("[sandbox] Resumed after suspension"), notice
            restarting = [
                m
                for m in ws.seen
                if m["header"]["msg_type"] == "status"
                and m["content"]["execution_state"] == "restarting"
            ]
            assert restarting == []
        finally:
            ws.close()
        claim = (await claims_for(kernel_id))[0]
        assert claim.phase == "Ready"
        await server.request("DELETE", f"/api/kernels/{kernel_id}", expect=204)


async def test_jupyterlab_tabs_reach_the_runtime_directly_and_get_their_buffer_back(
    tmp_path: Path,
) -> None:
    """A v1 tab has its own connection to the runtime (JSON tabs go through the bridge);
    a tab that reconnects with its session gets what was said while it was away."""
    with jupyter_server(tmp_path) as server:
        kernel_id = await start_kernel(server)
        endpoint = (await claims_for(kernel_id))[0].endpoint

        async def runtime_clients() -> int:
            return int((await call(endpoint, "GET", "api/kernel"))["clients"])

        assert await runtime_clients() == 1, "the bridge"
        legacy = await KernelSocket(server, kernel_id, "json").connect()
        assert (await legacy.execute("1")).status == "ok"
        assert await runtime_clients() == 1, "a JSON tab goes through the bridge"
        legacy.close()

        tab = await KernelSocket(server, kernel_id).connect()
        assert await runtime_clients() == 2, "a v1 tab has its own connection"
        assert (await tab.execute("print('direct')")).stdout == "direct\n"

        # Closed while a cell prints; reopened with the same session.
        msg_id = tab.send(
            "shell",
            "execute_request",
            {
                "code": "import time\nfor i in range(30):\n    print(i, flush=True)\n"
                "    time.sleep(0.05)",
                "silent": False,
                "store_history": True,
                "user_expressions": {},
                "allow_stdin": False,
                "stop_on_error": True,
            },
        )
        while not any(m["msg_type"] == "stream" for m in tab.seen[-3:]):
            await tab.recv(30)
        tab.close()
        await asyncio.sleep(2.5)  # the cell ends while nobody listens
        back = await KernelSocket(server, kernel_id, session=tab.session).connect()
        try:
            reply = None
            while reply is None:
                msg = await back.recv(30)
                if msg["channel"] == "shell" and msg["parent_header"].get("msg_id") == msg_id:
                    reply = msg
            assert reply["content"]["status"] == "ok", "the reply waited for the tab"

            def printed(seen: list[dict[str, Any]]) -> list[int]:
                return [
                    int(line)
                    for m in seen
                    if m["msg_type"] == "stream" and m["parent_header"].get("msg_id") == msg_id
                    for line in m["content"]["text"].split()
                ]

            before, after = printed(tab.seen), printed(back.seen)
            assert after and after[-1] == 29, "what was printed meanwhile is replayed"
            assert before + after == sorted(set(before + after)), "nothing twice"

            async def spare_link_closed() -> bool:
                return await runtime_clients() == 2

            await wait_for(spare_link_closed, 10)
        finally:
            back.close()
        await server.request("DELETE", f"/api/kernels/{kernel_id}", expect=204)


async def test_shutdown_of_a_suspended_kernel_does_not_resume_it(tmp_path: Path) -> None:
    with jupyter_server(tmp_path) as server:
        kernel_id = await start_kernel(server)
        await server.request("POST", f"/api/sandbox/kernels/{kernel_id}/suspend", expect=200)
        claim = (await claims_for(kernel_id))[0]
        assert claim.phase in ("Suspended", "Suspending")
        started = time.monotonic()
        await server.request("DELETE", f"/api/kernels/{kernel_id}", expect=204)
        assert time.monotonic() - started < 5
        assert await claims_for(kernel_id) == []


async def test_stopping_the_server_does_not_resume_suspended_kernels(tmp_path: Path) -> None:
    with jupyter_server(tmp_path) as server:
        kernel_id = await start_kernel(server)
        await suspend_via_api(server, kernel_id)
    # The server stopped (SIGTERM): it released the claim without resuming it first.
    assert await claims_for(kernel_id) == []
    log = server.log_text()
    for sign in ("Traceback", "ClaimNotFound", "resuming claim"):
        assert sign not in log, log[-3000:]


async def test_unknown_pool_is_a_clear_error_and_leaks_nothing(tmp_path: Path) -> None:
    with jupyter_server(tmp_path) as server:
        before = await server.request("GET", "/api/kernels")
        response = await server.request("POST", "/api/kernels", {"name": "sandbox-missing"})
        assert isinstance(response, dict)
        assert response.get("reason") == "PoolNotFound"
        assert "jupyter-sandbox pool create missing" in str(response.get("message"))
        assert await server.request("GET", "/api/kernels") == before
        plane = LocalControlPlane()
        try:
            assert [c for c in await plane.list_claims() if c.pool == "missing"] == []
        finally:
            await plane.close()
        # The log says it once, with what to do, and without a traceback.
        log = server.log_text()
        assert log.count("Sandbox kernel did not start: pool 'missing'") == 1, log[-3000:]
        assert "create it with" in log
        assert "Traceback" not in log, log[-3000:]
    # The first SIGTERM stopped the server (SIGKILL after the grace period gives -9).
    assert server.proc.returncode == 0, server.log_text()[-3000:]


async def test_server_secrets_never_reach_the_sandbox(tmp_path: Path) -> None:
    from .conftest import SERVER_SECRETS

    with jupyter_server(tmp_path) as server:
        kernel_id = await start_kernel(server)
        ws = await KernelSocket(server, kernel_id).connect()
        try:
            result = await ws.execute(
                "import os, subprocess\n"
                f"print([n for n in {sorted(SERVER_SECRETS)!r} if n in os.environ])\n"
                "print(subprocess.run(['env'], capture_output=True, text=True).stdout)"
            )
            assert result.stdout.splitlines()[0] == "[]"
            assert "do-not-leak" not in result.stdout
        finally:
            ws.close()
        await server.request("DELETE", f"/api/kernels/{kernel_id}", expect=204)


async def test_details_say_what_the_sandbox_uses_now(tmp_path: Path) -> None:
    with jupyter_server(tmp_path) as server:
        kernel_id = await start_kernel(server)
        path = f"/api/sandbox/kernels/{kernel_id}"
        ws = await KernelSocket(server, kernel_id).connect()
        try:
            idle = (await server.request("GET", f"{path}?fresh=true"))["usage"]
            await ws.execute(
                "import subprocess, sys\n"
                "held = b'x' * 150_000_000\n"
                "spin = subprocess.Popen([sys.executable, '-c', 'while True: pass'])"
            )
            busy = (await server.request("GET", f"{path}?fresh=true"))["usage"]
            # the kernel's memory and a process it started count: the sandbox's, not the runtime's
            assert busy["memory_in_use_mb"] >= idle["memory_in_use_mb"] + 140, (idle, busy)
            assert busy["processes"] == idle["processes"] + 1, (idle, busy)
            assert busy["cpu_percent"] >= 5, busy  # a spinning child (loaded CI: not a full core)
            assert busy["cpu_seconds_used"] > idle["cpu_seconds_used"]
            await ws.execute("spin.kill(); spin.wait(); del held")
            # only a fresh read asks the runtime
            assert "usage" not in await server.request("GET", path)
        finally:
            ws.close()
        await server.request("POST", f"{path}/suspend", expect=200)
        assert (await server.request("GET", f"{path}?fresh=true"))["usage"] is None
        await server.request("DELETE", f"/api/kernels/{kernel_id}", expect=204)


@PROTOCOLS
async def test_the_servers_message_policies_hold_for_sandboxed_kernels(
    tmp_path: Path, protocol: str
) -> None:
    policies = (
        "--MappingKernelManager.allow_tracebacks=False",
        '--MappingKernelManager.allowed_message_types=["execute_request", "kernel_info_request"]',
        "--ZMQChannelsWebsocketConnection.iopub_data_rate_limit=100000",
    )
    with jupyter_server(tmp_path, *policies) as server:
        kernel_id = await start_kernel(server)
        ws = await KernelSocket(server, kernel_id, protocol).connect()
        try:
            # Hidden tracebacks: neither the error output nor the reply says what failed.
            failed = await ws.execute("raise ValueError('the-secret-' + 'in-a-traceback')")
            assert failed.status == "error"
            errors = [o for o in failed.outputs if o["msg_type"] == "error"]
            assert len(errors) == 1, failed.outputs
            assert errors[0]["content"]["ename"] == "ExecutionError"
            assert failed.reply["ename"] == "ExecutionError"
            assert "not shown due to security reasons" in errors[0]["content"]["traceback"][0]
            assert not [m for m in ws.seen if "the-secret-in-a-traceback" in repr(m)]

            # A message type the server does not allow never reaches the kernel.
            ws.send("shell", "complete_request", {"code": "impo", "cursor_pos": 4})
            ok = await ws.execute("print('still here')")
            assert ok.stdout == "still here\n"
            assert not [m for m in ws.seen if m["header"]["msg_type"] == "complete_reply"]

            # The IOPub data rate limit stops a flood, and lifts when the cell ends.
            flood = await ws.execute("for _ in range(40):\n    print('x' * 20_000, flush=True)")
            stderr = "".join(
                o["content"]["text"]
                for o in flood.outputs
                if o["msg_type"] == "stream" and o["content"]["name"] == "stderr"
            )
            assert "IOPub data rate exceeded" in stderr
            assert len(flood.stdout) < 40 * 20_001
            after = await ws.execute("print('after the flood')")
            assert after.stdout == "after the flood\n"
        finally:
            ws.close()
        await server.request("DELETE", f"/api/kernels/{kernel_id}", expect=204)


async def test_activity_tracking_sees_a_tabs_cells_and_zmq_clients_come_and_go(
    tmp_path: Path,
) -> None:
    """The bridge feeds jupyter_server's activity tracking in-process, and publishes on
    ZMQ only while a ZMQ client subscribes: both must hold as clients come and go."""
    with jupyter_server(tmp_path) as server:
        kernel_id = await start_kernel(server)
        tab = await KernelSocket(server, kernel_id, "v1").connect()
        try:
            await tab.execute("import time")
            before = (await server.request("GET", f"/api/kernels/{kernel_id}"))["last_activity"]
            tab.send("shell", "execute_request", {"code": "time.sleep(3)", "silent": False})

            async def busy() -> bool:
                model = await server.request("GET", f"/api/kernels/{kernel_id}")
                return bool(model["execution_state"] == "busy")

            await wait_for(busy, 10)
            assert (await tab.execute("print('done')")).stdout == "done\n"
            model = await server.request("GET", f"/api/kernels/{kernel_id}")
            assert model["execution_state"] == "idle"
            assert model["last_activity"] > before

            # ZMQ subscribers (JSON tabs go through the bridge) one after another.
            for round_ in range(2):
                old = await KernelSocket(server, kernel_id, "json").connect()
                try:
                    result = await old.execute(f"print('json {round_}')")
                    assert result.stdout == f"json {round_}\n"
                finally:
                    old.close()
                await asyncio.sleep(0.5)  # its unsubscription reaches the bridge
            assert (await tab.execute("print('tab')")).stdout == "tab\n"
        finally:
            tab.close()
        await server.request("DELETE", f"/api/kernels/{kernel_id}", expect=204)
