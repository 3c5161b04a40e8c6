"""The JupyterLab path: a kernel WebSocket through a real Jupyter server.

A JupyterLab tab talks to its kernel over jupyter_server's kernel WebSocket in
the v1 binary subprotocol. Here a WebSocket client does the same against one
Jupyter server running the sandbox kernel manager, with a sandboxed kernel and
a plain ipykernel side by side, interleaved so that drift hits both alike.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Awaitable, Callable
from typing import Any

from jupyter_server.services.kernels.connection.base import (
    deserialize_msg_from_ws_v1,
    serialize_msg_to_ws_v1,
)
from tornado import httpclient, websocket

from .kernels import output_cells
from .ports import free_port
from .stats import Figure, Series

MANAGER = "jupyter_sandbox.kernel_provisioner.manager.SandboxKernelManager"
V1 = "v1.kernel.websocket.jupyter.org"


class Server:
    """A Jupyter server (or JupyterLab: ``app="jupyterlab"``) with the sandbox kernel manager."""

    def __init__(
        self, app: str = "jupyter_server", *extra: str, env: dict[str, str] | None = None
    ) -> None:
        self.port = free_port()
        self.token = uuid.uuid4().hex
        self.root = tempfile.mkdtemp(prefix="bench-server-")
        self.log = open(os.path.join(self.root, "server.log"), "wb")
        self.proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                app,
                "--no-browser",
                f"--port={self.port}",
                "--ServerApp.ip=127.0.0.1",
                f"--IdentityProvider.token={self.token}",
                f"--ServerApp.root_dir={self.root}",
                f"--ServerApp.kernel_manager_class={MANAGER}",
                # Its default IOPub limit (1 MB/s of stream output) would be what a
                # 50 MB print measures, sandboxed or not.
                "--ZMQChannelsWebsocketConnection.limit_rate=False",
                "--allow-root",
                *extra,
            ],
            stdout=self.log,
            stderr=subprocess.STDOUT,
            env=env,
        )
        self.url = f"http://127.0.0.1:{self.port}"

    async def wait_up(self, timeout: float = 60) -> None:
        deadline = time.monotonic() + timeout
        while True:
            try:
                await self.request("GET", "/api/status")
                return
            except (OSError, httpclient.HTTPError):
                if self.proc.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError("jupyter server did not start") from None
                await asyncio.sleep(0.2)

    async def request(self, method: str, path: str, body: Any = None) -> Any:
        response = await httpclient.AsyncHTTPClient().fetch(
            self.url + path,
            method=method,
            headers={"Authorization": f"token {self.token}"},
            body=json.dumps(body) if body is not None else None,
            request_timeout=180,
        )
        return json.loads(response.body) if response.body else None

    async def shutdown_kernels(self) -> None:
        """Release the sandbox claims now rather than when the server's exit gets to them."""
        for kernel in await self.request("GET", "/api/kernels"):
            await self.request("DELETE", f"/api/kernels/{kernel['id']}")

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
        self.log.close()


class _Tab:
    """One kernel WebSocket in the v1 subprotocol, as JupyterLab opens it."""

    def __init__(self, server: Server, kernel_id: str) -> None:
        self.server, self.kernel_id, self.session = server, kernel_id, uuid.uuid4().hex
        self.ws: websocket.WebSocketClientConnection | None = None

    async def connect(self) -> None:
        url = self.server.url.replace("http", "ws", 1)
        request = httpclient.HTTPRequest(
            f"{url}/api/kernels/{self.kernel_id}/channels?session_id={self.session}",
            headers={"Authorization": f"token {self.server.token}"},
        )
        self.ws = await websocket.websocket_connect(
            request, subprotocols=[V1], max_message_size=1 << 30
        )
        assert self.ws.selected_subprotocol == V1, "the server did not take the v1 protocol"

    async def execute(self, code: str) -> float:
        """Seconds from sending the request to the kernel's idle status after it."""
        return (await self.execute_counting(code))[0]

    async def execute_counting(self, code: str) -> tuple[float, int]:
        """Seconds to idle, and the bytes of output (stream text, comm buffers) received."""
        assert self.ws is not None
        msg_id = uuid.uuid4().hex
        msg = {
            "header": {
                "msg_id": msg_id,
                "msg_type": "execute_request",
                "username": "bench",
                "session": self.session,
                "date": "",
                "version": "5.3",
            },
            "parent_header": {},
            "metadata": {},
            "content": {"code": code, "silent": False, "store_history": False},
        }
        started = time.perf_counter()
        frame = serialize_msg_to_ws_v1(msg, "shell", lambda part: json.dumps(part).encode())
        self.ws.write_message(frame, binary=True)
        replied = idle = False
        output = 0
        while not (replied and idle):
            raw = await asyncio.wait_for(self.ws.read_message(), 120)
            if raw is None:
                raise RuntimeError("kernel WebSocket closed")
            if isinstance(raw, str):
                continue
            channel, parts = deserialize_msg_from_ws_v1(raw)
            if json.loads(parts[1]).get("msg_id") != msg_id:
                continue
            head = json.loads(parts[0])
            if head["msg_type"] == "stream":
                output += len(json.loads(parts[3])["text"])
            elif head["msg_type"] == "comm_open":
                output += sum(len(buffer) for buffer in parts[4:])
            if channel == "shell" and head["msg_type"] == "execute_reply":
                replied = True
            elif head["msg_type"] == "status":
                idle = json.loads(parts[3]).get("execution_state") == "idle"
        return time.perf_counter() - started, output

    def close(self) -> None:
        if self.ws is not None:
            self.ws.close()


async def server_figures(
    sandbox_kernel: str,
    plain_kernel: str,
    reps: int,
    megabytes: int,
    throughput_reps: int,
    settle: Callable[[], Awaitable[None]],
) -> list[Figure]:
    """Round trip and output throughput from a kernel WebSocket client, sandboxed vs
    plain, on one server.

    ``settle`` returns once the pool has replaced the sandbox the claim took.
    """
    server = Server()
    tabs: list[_Tab] = []
    try:
        await server.wait_up()
        for name in (sandbox_kernel, plain_kernel):
            kernel = await server.request("POST", "/api/kernels", {"name": name})
            tab = _Tab(server, kernel["id"])
            await tab.connect()
            tabs.append(tab)
        sandbox_tab, plain_tab = tabs
        await settle()
        for _ in range(5):  # warm both paths up
            await sandbox_tab.execute("pass")
            await plain_tab.execute("pass")
        sandbox, plain = Series("sandbox", "ms"), Series("plain ipykernel", "ms")
        for _ in range(max(1, reps // 10)):
            for _ in range(10):
                sandbox.values.append(await sandbox_tab.execute("pass") * 1000)
            for _ in range(10):
                plain.values.append(await plain_tab.execute("pass") * 1000)
        figures = [
            Figure(
                "execute round trip of `pass`, kernel WebSocket through jupyter_server",
                sandbox,
                plain,
                "<= 1.2x",
            )
        ]
        size = megabytes * 1_000_000
        for label, code in output_cells(size):
            sandbox, plain = Series("sandbox", "MB/s"), Series("plain ipykernel", "MB/s")
            for _ in range(throughput_reps):
                for tab, series in ((sandbox_tab, sandbox), (plain_tab, plain)):
                    seconds, received = await tab.execute_counting(code)
                    if received < size * 0.99:
                        raise RuntimeError(f"{label}: {received} of {size} bytes arrived")
                    series.values.append(size / seconds / 1e6)
            figures.append(
                Figure(
                    f"output throughput, {megabytes} MB {label}, kernel WebSocket through "
                    "jupyter_server",
                    sandbox,
                    plain,
                    ">= 0.8x",
                    higher_is_better=True,
                )
            )
    finally:
        for tab in tabs:
            tab.close()
        server.stop()
    return figures
