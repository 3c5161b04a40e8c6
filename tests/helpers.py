"""Drive a real jupyter_server over REST and the kernel WebSocket, as JupyterLab does."""

from __future__ import annotations

import asyncio
import json
import os
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager, contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tornado import httpclient, websocket

from tests.cluster.controlplane import free_port

MANAGER = "jupyter_sandbox.kernel_provisioner.manager.SandboxKernelManager"


@dataclass
class Server:
    url: str
    token: str
    proc: subprocess.Popen[bytes]
    root: Path
    log: Path

    def headers(self) -> dict[str, str]:
        return {"Authorization": f"token {self.token}"}

    async def request(
        self,
        method: str,
        path: str,
        body: Any = None,
        expect: int | None = None,
        timeout: float = 120,
    ) -> Any:
        client = httpclient.AsyncHTTPClient()
        response = await client.fetch(
            f"{self.url}{path}",
            method=method,
            headers=self.headers(),
            body=json.dumps(body) if body is not None else (b"" if method == "POST" else None),
            raise_error=False,
            request_timeout=timeout,
            allow_nonstandard_methods=True,
        )
        if expect is not None:
            assert response.code == expect, (response.code, response.body, self.log_text()[-3000:])
        if not response.body:
            return response.code
        return json.loads(response.body)

    def log_text(self) -> str:
        return self.log.read_text(errors="replace")


@contextmanager
def jupyter_server(
    tmp_path: Path, *extra: str, env: dict[str, str] | None = None, root: Path | None = None
) -> Iterator[Server]:
    port = free_port()
    token = uuid.uuid4().hex
    root = root or tmp_path / "notebooks"
    root.mkdir(exist_ok=True)
    log = tmp_path / f"server-{port}.log"
    handle = open(log, "wb")
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "jupyter_server",
            "--no-browser",
            f"--port={port}",
            "--ServerApp.ip=127.0.0.1",
            f"--IdentityProvider.token={token}",
            f"--ServerApp.root_dir={root}",
            f"--ServerApp.kernel_manager_class={MANAGER}",
            "--ServerApp.open_browser=False",
            "--allow-root",
            *extra,
        ],
        stdout=handle,
        stderr=subprocess.STDOUT,
        env={**os.environ, **(env or {})},
    )
    handle.close()
    server = Server(f"http://127.0.0.1:{port}", token, proc, root, log)
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                with socket.create_connection(("127.0.0.1", port), timeout=1):
                    break
            except OSError:
                if proc.poll() is not None or time.monotonic() > deadline:
                    message = "jupyter server did not start:\n" + server.log_text()
                    raise RuntimeError(message) from None
                time.sleep(0.1)
        yield server
    finally:
        stop_process(proc, 30)


@dataclass
class ExecResult:
    status: str
    outputs: list[dict[str, Any]] = field(default_factory=list)
    reply: dict[str, Any] = field(default_factory=dict)
    statuses: list[str] = field(default_factory=list)

    @property
    def stdout(self) -> str:
        return "".join(
            o["content"]["text"]
            for o in self.outputs
            if o["msg_type"] == "stream" and o["content"]["name"] == "stdout"
        )


V1_PROTOCOL = "v1.kernel.websocket.jupyter.org"


class KernelSocket:
    """The kernel WebSocket of jupyter_server, like a browser tab.

    ``protocol="v1"`` is JupyterLab's binary framing (what its tabs speak);
    ``"json"`` is the older JSON protocol, which other clients still use.
    """

    def __init__(
        self, server: Server, kernel_id: str, protocol: str = "v1", session: str | None = None
    ) -> None:
        assert protocol in ("v1", "json")
        self.server = server
        self.kernel_id = kernel_id
        self.protocol = protocol
        self.session = session or uuid.uuid4().hex
        self.ws: websocket.WebSocketClientConnection | None = None
        self.seen: list[dict[str, Any]] = []

    async def connect(self) -> KernelSocket:
        url = self.server.url.replace("http", "ws", 1)
        request = httpclient.HTTPRequest(
            f"{url}/api/kernels/{self.kernel_id}/channels?session_id={self.session}",
            headers=self.server.headers(),
        )
        self.ws = await websocket.websocket_connect(
            request,
            max_message_size=1 << 30,
            subprotocols=[V1_PROTOCOL] if self.protocol == "v1" else None,
        )
        assert self.ws.selected_subprotocol == (V1_PROTOCOL if self.protocol == "v1" else None)
        return self

    def close(self) -> None:
        if self.ws is not None:
            self.ws.close()

    def send(self, channel: str, msg_type: str, content: dict[str, Any]) -> str:
        assert self.ws is not None
        msg_id = uuid.uuid4().hex
        msg = {
            "header": {
                "msg_id": msg_id,
                "msg_type": msg_type,
                "username": "test",
                "session": self.session,
                "version": "5.3",
                "date": "",
            },
            "parent_header": {},
            "metadata": {},
            "content": content,
            "channel": channel,
            "buffers": [],
        }
        if self.protocol == "v1":
            from jupyter_server.services.kernels.connection.base import serialize_msg_to_ws_v1

            frame = serialize_msg_to_ws_v1(msg, channel, lambda part: json.dumps(part).encode())
            self.ws.write_message(frame, binary=True)
        else:
            self.ws.write_message(json.dumps(msg))
        return msg_id

    async def recv(self, timeout: float) -> dict[str, Any]:
        assert self.ws is not None
        raw = await asyncio.wait_for(self.ws.read_message(), timeout)
        if raw is None:
            raise ConnectionError("kernel websocket closed")
        if self.protocol == "v1":
            from jupyter_server.services.kernels.connection.base import (
                deserialize_msg_from_ws_v1,
            )

            assert isinstance(raw, bytes), "v1 frames are binary"
            channel, parts = deserialize_msg_from_ws_v1(raw)
            msg = {
                "channel": channel,
                **{
                    name: json.loads(part)
                    for name, part in zip(
                        ("header", "parent_header", "metadata", "content"), parts, strict=False
                    )
                },
                "buffers": parts[4:],
            }
            msg["msg_type"] = msg["header"]["msg_type"]  # as jupyter_client's messages have
            msg["msg_id"] = msg["header"]["msg_id"]
        elif isinstance(raw, bytes):
            from jupyter_server.services.kernels.connection.base import (
                deserialize_binary_message,
            )

            msg = deserialize_binary_message(raw)
        else:
            msg = json.loads(raw)
        self.seen.append(msg)
        return msg  # type: ignore[no-any-return]

    async def execute(
        self, code: str, *, timeout: float = 120, stdin: list[str] | None = None
    ) -> ExecResult:
        msg_id = self.send(
            "shell",
            "execute_request",
            {
                "code": code,
                "silent": False,
                "store_history": True,
                "user_expressions": {},
                "allow_stdin": stdin is not None,
                "stop_on_error": True,
            },
        )
        result = ExecResult(status="")
        idle = False
        deadline = time.monotonic() + timeout
        answers = list(stdin or [])
        while not (idle and result.reply):
            msg = await self.recv(max(0.1, deadline - time.monotonic()))
            parent = msg.get("parent_header", {}).get("msg_id")
            kind = msg["header"]["msg_type"]
            if msg["channel"] == "iopub" and kind == "status":
                result.statuses.append(msg["content"]["execution_state"])
            if parent != msg_id:
                continue
            if msg["channel"] == "stdin" and kind == "input_request":
                self.send("stdin", "input_reply", {"value": answers.pop(0)})
            elif msg["channel"] == "shell":
                result.reply = msg["content"]
                result.status = msg["content"]["status"]
            elif kind == "status" and msg["content"]["execution_state"] == "idle":
                idle = True
            elif kind in ("stream", "display_data", "execute_result", "error"):
                result.outputs.append(msg)
        return result


@asynccontextmanager
async def kernel_socket(
    server: Server, name: str = "sandbox-default", path: str | None = None
) -> AsyncIterator[tuple[str, KernelSocket]]:
    """Start a kernel (for the notebook at ``path``) and connect to it like a browser tab.

    The kernel outlives the block; tests shut it down when they want to see what stays.
    """
    body = {"name": name, **({"path": path} if path else {})}
    model = await server.request("POST", "/api/kernels", body, expect=201)
    kernel_id = str(model["id"])
    ws = await KernelSocket(server, kernel_id).connect()
    try:
        yield kernel_id, ws
    finally:
        ws.close()


async def start_kernel(server: Server, name: str = "sandbox-default") -> str:
    model = await server.request("POST", "/api/kernels", {"name": name}, expect=201)
    return str(model["id"])


async def wait_for(predicate: Any, timeout: float, interval: float = 0.2) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        value = await predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise TimeoutError("condition not met in time")
        await asyncio.sleep(interval)


def wait_listening(proc: subprocess.Popen[bytes], port: int, log_path: Path, what: str) -> None:
    """Wait (60 s at most) until ``proc`` accepts connections on loopback ``port``."""
    deadline = time.monotonic() + 60
    while True:
        assert proc.poll() is None, log_path.read_text()
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return
        except OSError:
            assert time.monotonic() < deadline, f"{what} did not listen"
            time.sleep(0.1)


def wait_ready(
    proc: subprocess.Popen[bytes], url: str, log_path: Path, timeout: float = 60
) -> None:
    """Wait until GET ``url`` answers 200 (a runtime's ``/readyz``), while ``proc`` lives."""
    import httpx

    deadline = time.monotonic() + timeout
    while True:
        try:
            if httpx.get(url, timeout=2).status_code == 200:
                return
        except httpx.TransportError:
            pass
        assert proc.poll() is None, log_path.read_text()
        assert time.monotonic() < deadline, f"{url} not ready: {log_path.read_text()[-2000:]}"
        time.sleep(0.1)


def stop_process(proc: subprocess.Popen[bytes], grace: float = 10) -> None:
    """SIGTERM, then SIGKILL after ``grace`` seconds."""
    if proc.poll() is not None:
        return
    proc.terminate()
    try:
        proc.wait(grace)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


@contextmanager
def runtime_on_loopback(tmp_path: Path, env: dict[str, str] | None = None) -> Iterator[int]:
    """A real ``python -m jupyter_sandbox.runtime`` on 127.0.0.1 (as a pod's listens,
    where kwok's pods run nothing), with ``env`` added to this process's environment;
    yields its port once it is ready."""
    port = free_port()
    ws = tmp_path / "workspace"
    ws.mkdir(parents=True)
    log = open(tmp_path / "runtime.log", "wb")
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "jupyter_sandbox.runtime",
            "--port",
            str(port),
            "--ip",
            "127.0.0.1",
            "--workspace",
            str(ws),
            "--runtime-dir",
            str(tmp_path / "rt"),
        ],
        stdout=log,
        stderr=subprocess.STDOUT,
        cwd=Path(__file__).resolve().parents[1],
        env={**os.environ, **(env or {})},
        start_new_session=True,
    )
    try:
        wait_ready(proc, f"http://127.0.0.1:{port}/readyz", tmp_path / "runtime.log")
        yield port
    finally:
        stop_process(proc, grace=15)
        log.close()


async def apply_pool(name: str, spec: dict[str, Any] | None) -> None:
    """Create or change a pool of the session's daemon, or delete it (``spec`` None)."""
    from jupyter_sandbox.control_plane.local.client import LocalControlPlane

    plane = LocalControlPlane()
    try:
        if spec is None:
            await plane.delete_pool(name)
        else:
            await plane.apply_pool(name, spec)
    finally:
        await plane.close()


async def claims_for(kernel_id: str | None = None) -> list[Any]:
    """The session daemon's claims of one kernel (all claims when ``kernel_id`` is None)."""
    from jupyter_sandbox.control_plane.local.client import LocalControlPlane

    plane = LocalControlPlane()
    try:
        labels = {"jupyter-sandbox/kernel-id": kernel_id} if kernel_id else None
        return await plane.list_claims(labels)
    finally:
        await plane.close()


async def suspend_via_api(server: Server, kernel_id: str) -> None:
    """Suspend a kernel's sandbox through the server's REST API and wait until it is."""
    await server.request("POST", f"/api/sandbox/kernels/{kernel_id}/suspend", expect=200)

    async def released() -> bool:
        return bool((await claims_for(kernel_id))[0].phase == "Suspended")

    await wait_for(released, 60)


def count_bridge_signatures(monkeypatch: Any) -> list[int]:
    """One entry for every signature the bridge computes from now on (clear it to restart)."""
    from jupyter_sandbox.kernel_provisioner import bridge

    signatures: list[int] = []
    real_sign = bridge.sign

    def counted(key: bytes, parts: Any) -> bytes:
        signatures.append(1)
        return real_sign(key, parts)

    monkeypatch.setattr(bridge, "sign", counted)
    return signatures
