"""The runtime's command/file/kernel API and the router in front of it, over real sockets."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import struct
import subprocess
import sys
import time
import uuid
from collections.abc import AsyncIterator, Iterator
from types import SimpleNamespace
from typing import Any

import psutil
import pytest
from jupyter_client.asynchronous import AsyncKernelClient
from tornado import httpclient, web, websocket
from tornado.httpserver import HTTPServer
from tornado.netutil import bind_sockets

from jupyter_sandbox.control_plane.base import Endpoint
from jupyter_sandbox.kernel_provisioner.bridge import Bridge, channels_request
from jupyter_sandbox.protocol import framing
from jupyter_sandbox.protocol.messages import header, parent_msg_id, sign
from jupyter_sandbox.protocol.ws_frames import frame_header
from jupyter_sandbox.router.app import make_router_app
from jupyter_sandbox.router.settings import RouterContext
from jupyter_sandbox.router.tokens import Scope, TokenAuthority
from jupyter_sandbox.router.upstreams import Upstream
from jupyter_sandbox.server_extension.direct_channels import DirectLink

from .helpers import count_bridge_signatures

NS = "team-a"


@pytest.fixture(scope="module")
def runtime(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    base = tmp_path_factory.mktemp("runtime")
    workspace = base / "workspace"
    workspace.mkdir()
    sock = base / "rt.sock"
    log = open(base / "runtime.log", "wb")
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "jupyter_sandbox.runtime",
            "--unix-socket",
            str(sock),
            "--workspace",
            str(workspace),
            "--runtime-dir",
            str(base / "kernel"),
            "--max-upload-bytes",
            str(8 * 1024 * 1024),
        ],
        stdout=log,
        stderr=log,
        env={**os.environ, "HOME": str(workspace)},
    )
    deadline = time.monotonic() + 60
    while not sock.exists():
        assert proc.poll() is None, (base / "runtime.log").read_text()
        assert time.monotonic() < deadline
        time.sleep(0.1)
    (base / "outside.txt").write_text("secret outside the workspace")
    try:
        yield {"socket": str(sock), "workspace": workspace, "base": base, "proc": proc}
    finally:
        proc.terminate()
        proc.wait(30)
        log.close()


@pytest.fixture
async def router(runtime: dict[str, Any]) -> AsyncIterator[dict[str, Any]]:
    authority = TokenAuthority("test-secret-for-the-router-tests-0123456789")

    class Echo(web.RequestHandler):
        def get(self) -> None:
            self.finish(dict(self.request.headers.get_all()))

    echo = HTTPServer(web.Application([(r"/headers", Echo)]))
    echo_sockets = bind_sockets(0, "127.0.0.1")
    echo.add_sockets(echo_sockets)
    echo_port = echo_sockets[0].getsockname()[1]

    async def lookup(namespace: str, name: str, port: int) -> Upstream | None:
        if namespace == NS and name == "box-a":
            return Upstream(unix_socket=runtime["socket"])
        if namespace == NS and name == "box-echo":
            return Upstream(host="127.0.0.1", port=echo_port)
        if namespace == NS and name == "box-dead":
            return Upstream(unix_socket=str(runtime["base"] / "nobody-listens.sock"))
        return None

    ctx = RouterContext(
        lookup=lookup,
        authority=authority,
        default_namespace="default",
        max_ws_message=4 * 1024 * 1024,
    )
    server = HTTPServer(make_router_app(ctx), max_body_size=64 * 1024 * 1024)
    sockets = bind_sockets(0, "127.0.0.1")
    server.add_sockets(sockets)
    url = f"http://127.0.0.1:{sockets[0].getsockname()[1]}"
    try:
        yield {"url": url, "authority": authority}
    finally:
        server.stop()
        echo.stop()
        await ctx.close()


def routed(
    router: dict[str, Any], name: str = "box-a", namespace: str = NS, token: str | None = "auto"
) -> dict[str, str]:
    if token == "auto":
        token = router["authority"].issue(Scope(namespace, name))
    headers = {"X-Sandbox-ID": name, "X-Sandbox-Namespace": namespace}
    if token:
        headers["Authorization"] = f"Bearer {token}"
    return headers


async def fetch(
    router: dict[str, Any],
    path: str,
    headers: dict[str, str],
    method: str = "GET",
    body: Any = None,
    **kw: Any,
) -> httpclient.HTTPResponse:
    client = httpclient.AsyncHTTPClient()
    data = json.dumps(body).encode() if isinstance(body, dict) else body
    return await client.fetch(
        router["url"] + path,
        method=method,
        headers=headers,
        body=data,
        raise_error=False,
        request_timeout=60,
        **kw,
    )


# -- the upstream-compatible command and file API -----------------------------------


async def test_execute_runs_in_the_workspace(router: dict[str, Any]) -> None:
    r = await fetch(router, "/execute", routed(router), "POST", {"command": "pwd"})
    assert r.code == 200
    body = json.loads(r.body)
    assert body["exit_code"] == 0 and body["stdout"].strip().endswith("workspace")
    r = await fetch(
        router, "/execute", routed(router), "POST", {"command": "sh -c 'echo err >&2; exit 3'"}
    )
    assert json.loads(r.body) == {"stdout": "", "stderr": "err\n", "exit_code": 3}


async def test_execute_timeout_kills_the_command(router: dict[str, Any]) -> None:
    started = time.monotonic()
    r = await fetch(
        router, "/execute", routed(router), "POST", {"command": "sleep 30", "timeout": 1}
    )
    assert json.loads(r.body)["exit_code"] == 124
    assert time.monotonic() - started < 10


async def test_execute_timeout_keeps_the_output_so_far(router: dict[str, Any]) -> None:
    r = await fetch(
        router,
        "/execute",
        routed(router),
        "POST",
        {"command": "echo before; sleep 30", "shell": True, "timeout": 1},
    )
    body = json.loads(r.body)
    assert body["exit_code"] == 124
    assert body["stdout"] == "before\n"
    assert "timed out" in body["stderr"]


async def test_abandoned_stream_kills_the_command(
    router: dict[str, Any], runtime: dict[str, Any]
) -> None:
    marker = runtime["workspace"] / "stream.pid"
    marker.unlink(missing_ok=True)
    _reader, writer = await asyncio.open_connection(*router["url"][7:].split(":"))
    body = json.dumps({"command": "echo $$ > stream.pid; exec sleep 60", "shell": True})
    head = "".join(f"{k}: {v}\r\n" for k, v in routed(router).items())
    writer.write(
        (
            f"POST /execute/stream HTTP/1.1\r\nHost: x\r\n{head}"
            f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n"
            f"{body}"
        ).encode()
    )
    await writer.drain()
    deadline = time.monotonic() + 20
    while not marker.exists() or not marker.read_text().strip():
        assert time.monotonic() < deadline, "the command never started"
        await asyncio.sleep(0.1)
    pid = int(marker.read_text())
    assert psutil.pid_exists(pid)
    writer.close()  # the caller goes away mid-stream
    deadline = time.monotonic() + 15
    while psutil.pid_exists(pid) and psutil.Process(pid).status() != psutil.STATUS_ZOMBIE:
        assert time.monotonic() < deadline, "the command outlived its reader"
        await asyncio.sleep(0.1)


async def test_sandbox_timeout_header(router: dict[str, Any]) -> None:
    started = time.monotonic()
    r = await fetch(
        router,
        "/execute",
        {**routed(router), "X-Sandbox-Timeout": "1"},
        "POST",
        {"command": "sleep 10"},
    )
    assert r.code == 504
    assert time.monotonic() - started < 8
    # Like upstream, a value that is no positive number is ignored.
    for value in ("soon", "-1", "nan"):
        r = await fetch(router, "/", {**routed(router), "X-Sandbox-Timeout": value})
        assert r.code == 200


@pytest.mark.parametrize(
    "body", [{}, {"command": ""}, {"command": 5}, {"command": "ls", "timeout": -1}]
)
async def test_execute_rejects_bad_input(router: dict[str, Any], body: dict[str, Any]) -> None:
    r = await fetch(router, "/execute", routed(router), "POST", body)
    assert r.code == 400


async def test_file_round_trip_and_listing(router: dict[str, Any], runtime: dict[str, Any]) -> None:
    boundary = uuid.uuid4().hex
    payload = os.urandom(300_000)
    body = (
        (
            f'--{boundary}\r\nContent-Disposition: form-data; name="file"; '
            f'filename="data/blob.bin"\r\nContent-Type: application/octet-stream\r\n\r\n'
        ).encode()
        + payload
        + f"\r\n--{boundary}--\r\n".encode()
    )
    headers = {**routed(router), "Content-Type": f"multipart/form-data; boundary={boundary}"}
    r = await fetch(router, "/upload", headers, "POST", body)
    assert r.code == 200, r.body
    assert (runtime["workspace"] / "data" / "blob.bin").read_bytes() == payload
    r = await fetch(router, "/download/data%2Fblob.bin", routed(router))
    assert r.code == 200 and r.body == payload
    r = await fetch(router, "/list/data", routed(router))
    entries = json.loads(r.body)
    assert entries[0]["name"] == "blob.bin" and entries[0]["size"] == len(payload)
    assert entries[0]["type"] == "file"
    r = await fetch(router, "/exists/data%2Fblob.bin", routed(router))
    assert json.loads(r.body) == {"path": "data/blob.bin", "exists": True}
    r = await fetch(router, "/exists/nope", routed(router))
    assert json.loads(r.body)["exists"] is False


@pytest.mark.parametrize(
    "path,status",
    [
        ("/download/..%2Foutside.txt", 403),
        ("/download/%2Fetc%2Fpasswd", 404),  # absolute paths are taken relative to the workspace
        ("/download/nothing-here", 404),
        ("/list/..", 403),
        ("/download/a%00b", 400),
        ("/download/escape-link", 403),
    ],
)
async def test_file_api_is_confined(
    router: dict[str, Any], runtime: dict[str, Any], path: str, status: int
) -> None:
    link = runtime["workspace"] / "escape-link"
    if not link.is_symlink():
        link.symlink_to(runtime["base"] / "outside.txt")
    r = await fetch(router, path, routed(router))
    assert r.code == status, (path, r.code, r.body)
    assert b"secret outside" not in (r.body or b"")


async def test_upload_outside_the_workspace_is_refused(
    router: dict[str, Any], runtime: dict[str, Any]
) -> None:
    boundary = "b0undary"
    body = (
        f'--{boundary}\r\nContent-Disposition: form-data; name="file"; '
        f'filename="../escaped.txt"\r\n\r\nx\r\n--{boundary}--\r\n'
    ).encode()
    headers = {**routed(router), "Content-Type": f"multipart/form-data; boundary={boundary}"}
    r = await fetch(router, "/upload", headers, "POST", body)
    assert r.code == 403
    assert not (runtime["base"] / "escaped.txt").exists()


async def test_oversized_upload_is_refused(router: dict[str, Any]) -> None:
    body = (
        b'--zz\r\nContent-Disposition: form-data; name="file"; filename="big"\r\n\r\n'
        + b"x" * (9 * 1024 * 1024)
        + b"\r\n--zz--\r\n"
    )
    headers = {**routed(router), "Content-Type": "multipart/form-data; boundary=zz"}
    r = await fetch(router, "/upload", headers, "POST", body)
    assert r.code == 413
    ok = await fetch(router, "/execute", routed(router), "POST", {"command": "true"})
    assert ok.code == 200, "the runtime must survive an oversized upload"


# -- routing and authorization ---------------------------------------------------------


@pytest.mark.parametrize(
    "headers,status",
    [
        ({}, 400),
        ({"X-Sandbox-ID": "Bad_Name"}, 400),
        ({"X-Sandbox-ID": "box-a", "X-Sandbox-Namespace": "UPPER"}, 400),
        ({"X-Sandbox-ID": "box-a", "X-Sandbox-Namespace": NS, "X-Sandbox-Port": "70000"}, 400),
        ({"X-Sandbox-ID": "box-a", "X-Sandbox-Namespace": NS, "X-Sandbox-Port": "http"}, 400),
        (
            {"X-Sandbox-ID": "box-a", "X-Sandbox-Namespace": NS, "X-Sandbox-Pod-IP": "127.0.0.1"},
            400,
        ),
        (
            {
                "X-Sandbox-ID": "box-a",
                "X-Sandbox-Namespace": NS,
                "X-Sandbox-Pod-IP": "169.254.169.254",
            },
            400,
        ),
        ({"X-Sandbox-ID": "box-a", "X-Sandbox-Namespace": NS}, 401),
    ],
)
async def test_routing_header_validation(
    router: dict[str, Any], headers: dict[str, str], status: int
) -> None:
    r = await fetch(router, "/", headers)
    assert r.code == status, r.body


async def test_a_token_reaches_only_its_own_sandbox(router: dict[str, Any]) -> None:
    authority: TokenAuthority = router["authority"]
    other = authority.issue(Scope(NS, "box-b"))
    r = await fetch(router, "/", routed(router, token=other))
    assert r.code == 403
    wrong_ns = authority.issue(Scope("team-b", "box-a"))
    r = await fetch(router, "/", routed(router, token=wrong_ns))
    assert r.code == 403
    expired = authority.issue(Scope(NS, "box-a"), ttl=-10)
    r = await fetch(router, "/", routed(router, token=expired))
    assert r.code == 403
    forged = TokenAuthority("another-secret-that-is-long-enough-0123456789").issue(
        Scope(NS, "box-a")
    )
    r = await fetch(router, "/", routed(router, token=forged))
    assert r.code == 403
    r = await fetch(router, "/", routed(router))
    assert r.code == 200


async def test_unknown_and_unreachable_sandboxes(router: dict[str, Any]) -> None:
    r = await fetch(router, "/", routed(router, name="nobody"))
    assert r.code == 404
    r = await fetch(router, "/", routed(router, name="box-dead"))
    assert r.code == 502


async def test_routing_and_authorization_headers_are_not_forwarded(router: dict[str, Any]) -> None:
    r = await fetch(
        router,
        "/headers",
        {
            **routed(router, name="box-echo"),
            "X-Extra": "kept",
            "Connection": "keep-alive, X-Hop",
            "X-Hop": "dropped",
            "X-Sandbox-Port": "8888",
            "Proxy-Authorization": "Basic eA==",
        },
    )
    assert r.code == 200, r.body
    seen = {k.lower(): v for k, v in json.loads(r.body).items()}
    assert seen["x-extra"] == "kept"
    for name in (
        "authorization",
        "x-sandbox-id",
        "x-sandbox-namespace",
        "x-sandbox-port",
        "x-hop",
        "proxy-authorization",
    ):
        assert name not in seen, name
    router_netloc = router["url"].split("://", 1)[1]
    assert seen.get("host") != router_netloc, "the caller's Host must not be forwarded"


# -- the kernel WebSocket through the router --------------------------------------------


def kernel_message(msg_type: str, content: dict[str, Any]) -> tuple[str, list[bytes]]:
    msg_id = uuid.uuid4().hex
    head = {
        "msg_id": msg_id,
        "msg_type": msg_type,
        "username": "t",
        "session": "s",
        "date": "2026-01-01T00:00:00Z",
        "version": "5.3",
    }
    return msg_id, [json.dumps(head).encode(), b"{}", b"{}", json.dumps(content).encode()]


async def connect_channels(
    router: dict[str, Any], last: str | None = None, protocol: str = framing.SUBPROTOCOL
) -> websocket.WebSocketClientConnection:
    url = router["url"].replace("http", "ws") + "/api/kernel/channels"
    if last:
        url += f"?last={last}"
    request = httpclient.HTTPRequest(url, headers=routed(router))
    return await websocket.websocket_connect(
        request, subprotocols=[protocol], max_message_size=64 * 1024 * 1024
    )


async def output_containing(ws: websocket.WebSocketClientConnection, text: bytes) -> str:
    """The msg_id of the first iopub message whose content holds ``text``."""
    while True:
        raw = await asyncio.wait_for(ws.read_message(), 30)
        assert isinstance(raw, bytes), raw
        channel, parts = framing.decode(raw)
        if channel == "iopub" and text in parts[3]:
            return str(header(parts)["msg_id"])


async def collect_until_idle(
    ws: websocket.WebSocketClientConnection, msg_id: str, timeout: float = 60
) -> list[tuple[str, list[bytes]]]:
    seen: list[tuple[str, list[bytes]]] = []
    reply = idle = False
    while not (reply and idle):
        raw = await asyncio.wait_for(ws.read_message(), timeout)
        assert isinstance(raw, bytes), raw
        channel, parts = framing.decode(raw)
        if channel == framing.EVENT_CHANNEL:
            continue
        seen.append((channel, parts))
        if parent_msg_id(parts) != msg_id:
            continue
        if channel == "shell":
            reply = True
        if channel == "iopub" and b'"idle"' in parts[3]:
            idle = True
    return seen


async def test_kernel_channels_relay_binary_frames(router: dict[str, Any]) -> None:
    ws = await connect_channels(router)
    try:
        assert ws.selected_subprotocol == framing.SUBPROTOCOL
        first = framing.decode(await asyncio.wait_for(ws.read_message(), 10))  # type: ignore[arg-type]
        assert first[0] == framing.EVENT_CHANNEL
        assert json.loads(first[1][0])["kernel"]["alive"] is True
        code = (
            "from comm import create_comm\n"
            "c = create_comm(target_name='t', buffers=[bytes(range(256)) * 4096])\nprint('ok')"
        )
        msg_id, parts = kernel_message("execute_request", {"code": code, "silent": False})
        ws.write_message(framing.encode("shell", parts), binary=True)
        seen = await collect_until_idle(ws, msg_id)
        comm = [p for c, p in seen if c == "iopub" and header(p)["msg_type"] == "comm_open"]
        assert comm and comm[0][4] == bytes(range(256)) * 4096, "buffer must arrive intact"
        assert any(c == "iopub" and b'"ok\\n"' in p[3] for c, p in seen)
    finally:
        ws.close()


async def test_only_a_signed_framing_client_gets_the_key_and_the_kernels_signatures(
    router: dict[str, Any],
) -> None:
    """A v1 client (a browser's frames) is never told the kernel's key. A client of the
    signed framing is, and its requests reach the kernel with the signature it made:
    the kernel checks it, so a forged one is dropped there."""
    plain = await connect_channels(router)
    signed = await connect_channels(router, protocol=framing.SIGNED_SUBPROTOCOL)
    try:
        assert plain.selected_subprotocol == framing.SUBPROTOCOL
        assert signed.selected_subprotocol == framing.SIGNED_SUBPROTOCOL
        event = framing.decode(await asyncio.wait_for(plain.read_message(), 10))  # type: ignore[arg-type]
        assert event[0] == framing.EVENT_CHANNEL and "key" not in json.loads(event[1][0])
        event = framing.decode(await asyncio.wait_for(signed.read_message(), 10))  # type: ignore[arg-type]
        assert event[0] == framing.EVENT_CHANNEL
        state = json.loads(event[1][0])
        key = state["key"].encode()
        while not state["kernel"]["ready"]:  # the runtime may still be starting its kernel
            event = framing.decode(await asyncio.wait_for(signed.read_message(), 60))  # type: ignore[arg-type]
            if event[0] == framing.EVENT_CHANNEL:
                state = json.loads(event[1][0])

        forged_id, forged = kernel_message("execute_request", {"code": "print('forged')"})
        signed.write_message(framing.encode("shell", [b"0" * 64, *forged]), binary=True)
        msg_id, parts = kernel_message("execute_request", {"code": "print('signed')"})
        signed.write_message(framing.encode("shell", [sign(key, parts), *parts]), binary=True)
        reply = idle = False
        output = b""
        while not (reply and idle):
            raw = await asyncio.wait_for(signed.read_message(), 30)
            assert isinstance(raw, bytes), raw
            channel, received = framing.decode(raw)
            if channel == framing.EVENT_CHANNEL:
                continue
            signature, received = received[0], received[1:]
            assert signature == sign(key, received), "relayed as the kernel signed it"
            parent = parent_msg_id(received)
            assert parent != forged_id, "the kernel answered a forged request"
            if parent != msg_id:
                continue
            reply = reply or channel == "shell"
            idle = idle or (channel == "iopub" and b'"idle"' in received[3])
            if header(received)["msg_type"] == "stream":
                output += received[3]
        assert b"signed" in output
    finally:
        plain.close()
        signed.close()


async def test_output_while_disconnected_is_replayed(router: dict[str, Any]) -> None:
    ws = await connect_channels(router)
    await asyncio.wait_for(ws.read_message(), 10)
    msg_id, parts = kernel_message(
        "execute_request",
        {
            "code": "import time\nfor i in range(5):\n    print('line', i, flush=True)\n"
            "    time.sleep(0.3)",
            "silent": False,
        },
    )
    ws.write_message(framing.encode("shell", parts), binary=True)
    last = await output_containing(ws, b"line 0")
    ws.close()
    await asyncio.sleep(2.5)  # the cell finishes while nobody is connected
    ws = await connect_channels(router, last=last)
    try:
        seen = await collect_until_idle(ws, msg_id)
        lines = [
            json.loads(p[3])["text"]
            for c, p in seen
            if c == "iopub" and header(p)["msg_type"] == "stream"
        ]
        assert "".join(lines) == "".join(f"line {i}\n" for i in range(1, 5))
    finally:
        ws.close()


@pytest.mark.parametrize("size", [0, 125, 126, 65_535, 65_536, 3 << 40])
def test_runtime_frame_header_is_rfc6455(size: int) -> None:
    head = frame_header(size)
    assert head[0] == 0x82, "FIN and the binary opcode, no reserved bits"
    assert head[1] & 0x80 == 0, "a server never masks"
    length = head[1] & 0x7F
    if length == 126:
        (length,) = struct.unpack("!H", head[2:])
    elif length == 127:
        (length,) = struct.unpack("!Q", head[2:])
    else:
        assert len(head) == 2
    assert length == size


def test_frame_pieces_join_to_the_encoded_frame() -> None:
    parts = [b'{"msg_id": "a"}', b"{}", b"{}", b"{}", memoryview(b"\x00" * 70_000)]
    frame = framing.encode_pieces("iopub", parts)
    assert b"".join(frame.pieces) == framing.encode("iopub", parts)
    assert frame.size == len(framing.encode("iopub", parts))
    assert framing.decode(framing.encode("iopub", parts)) == ("iopub", [bytes(p) for p in parts])


async def test_large_output_while_disconnected_is_replayed_intact(
    router: dict[str, Any],
) -> None:
    ws = await connect_channels(router)
    await asyncio.wait_for(ws.read_message(), 10)
    code = (
        "import time\nprint('start', flush=True)\ntime.sleep(1)\n"
        "from comm import create_comm\n"
        "c = create_comm(target_name='t', buffers=[bytes(range(256)) * 8192])"
    )
    msg_id, parts = kernel_message("execute_request", {"code": code, "silent": False})
    ws.write_message(framing.encode("shell", parts), binary=True)
    last = await output_containing(ws, b"start")
    ws.close()
    await asyncio.sleep(2.5)  # the 2 MB comm_open is produced while nobody is connected
    ws = await connect_channels(router, last=last)
    try:
        seen = await collect_until_idle(ws, msg_id)
        comm = [p for c, p in seen if c == "iopub" and header(p)["msg_type"] == "comm_open"]
        assert len(comm) == 1 and comm[0][4] == bytes(range(256)) * 8192
    finally:
        ws.close()


async def test_oversized_websocket_message_closes_with_1009(router: dict[str, Any]) -> None:
    ws = await connect_channels(router)
    try:
        await asyncio.wait_for(ws.read_message(), 10)
        _, parts = kernel_message("execute_request", {"code": "x" * (5 * 1024 * 1024)})
        ws.write_message(framing.encode("shell", parts), binary=True)
        while await asyncio.wait_for(ws.read_message(), 10) is not None:
            pass
        assert ws.close_code == 1009
    finally:
        ws.close()


async def test_websocket_to_unreachable_sandbox_is_502(router: dict[str, Any]) -> None:
    url = router["url"].replace("http", "ws") + "/api/kernel/channels"
    request = httpclient.HTTPRequest(url, headers=routed(router, name="box-dead"))
    with pytest.raises(httpclient.HTTPClientError) as err:
        await websocket.websocket_connect(request, subprotocols=[framing.SUBPROTOCOL])
    assert err.value.code == 502


def make_bridge(key: bytes, on_kernel_state: Any = lambda *_: None) -> Bridge:
    """A bridge as a provisioner makes one (every request admitted), its sockets bound."""

    async def relay(channel: str, head: dict[str, Any]) -> bool:
        return True

    async def ignore(failures: int) -> None:
        return None

    bridge = Bridge(
        key=key,
        on_kernel_state=on_kernel_state,
        on_client_request=relay,
        on_disconnected=ignore,
    )
    bridge.bind()
    return bridge


@contextlib.asynccontextmanager
async def bridged_client() -> AsyncIterator[tuple[Bridge, AsyncKernelClient]]:
    """A bridge as a provisioner makes one, and a jupyter_client client on its sockets."""
    key = uuid.uuid4().hex.encode()
    bridge = make_bridge(key)
    kc = AsyncKernelClient()
    kc.load_connection_info(
        {**bridge.connection_info(), "key": key.decode(), "signature_scheme": "hmac-sha256"}
    )
    kc.start_channels()
    try:
        yield bridge, kc
    finally:
        kc.stop_channels()
        await bridge.close()


async def test_a_resuming_bridge_says_idle_before_the_kernel_answers(
    router: dict[str, Any],
) -> None:
    """The resume notice hangs on the bridge's "idle": nothing of the kernel may overtake it."""
    endpoint = Endpoint(
        router_url=router["url"],
        namespace=NS,
        name="box-a",
        token=router["authority"].issue(Scope(NS, "box-a")),
    )
    async with bridged_client() as (bridge, kc):
        bridge.connect(endpoint)
        await kc.wait_for_ready(timeout=30)
        while await kc.iopub_channel.msg_ready():
            await kc.get_iopub_msg()
        # as a suspend and a resume do it: held, then connected behind the gate
        bridge.hold()
        bridge.connect(endpoint, gated=True)
        await bridge.wait_connected(30)
        msg_id = kc.execute("'answer'")
        await asyncio.sleep(1.5)  # long enough for an ungated kernel to answer
        assert not await kc.iopub_channel.msg_ready(), "the kernel answered through the gate"
        bridge.publish_status("idle")
        bridge.open_gate()
        first = await kc.get_iopub_msg(timeout=30)
        assert first["msg_type"] == "status" and not first["parent_header"]
        assert first["content"]["execution_state"] == "idle"
        reply = await kc.get_shell_msg(timeout=30)
        assert reply["parent_header"]["msg_id"] == msg_id
        assert reply["content"]["status"] == "ok"


@pytest.mark.parametrize("adopt", [True, False], ids=["the kernel's key", "a key of its own"])
async def test_a_bridge_signs_only_what_the_kernel_could_not(
    router: dict[str, Any], monkeypatch: pytest.MonkeyPatch, adopt: bool
) -> None:
    """Given the kernel's key (as the provisioner does), the bridge relays signatures
    and computes none; with a key of its own it signs what it relays. The client
    checks every signature either way."""
    signatures = count_bridge_signatures(monkeypatch)
    endpoint = Endpoint(
        router_url=router["url"],
        namespace=NS,
        name="box-a",
        token=router["authority"].issue(Scope(NS, "box-a")),
    )
    told = asyncio.Event()
    key = uuid.uuid4().hex.encode()
    bridge = make_bridge(key, on_kernel_state=lambda *_: told.set())
    bridge.connect(endpoint)
    kc = AsyncKernelClient()
    try:
        await asyncio.wait_for(told.wait(), 30)
        if adopt:
            adopted = bridge.adopt_runtime_key()
            assert adopted is not None and adopted != key
            key = adopted
        kc.load_connection_info(
            {**bridge.connection_info(), "key": key.decode(), "signature_scheme": "hmac-sha256"}
        )
        kc.start_channels()
        await kc.wait_for_ready(timeout=30)
        signatures.clear()
        printed: list[str] = []
        reply = await kc.execute_interactive(
            "print('relayed')",
            output_hook=lambda m: printed.append(m["content"].get("text", "")),
            timeout=30,
        )
        assert reply["content"]["status"] == "ok"
        assert "relayed\n" in printed
        assert (len(signatures) == 0) == adopt, f"{len(signatures)} signatures computed"
    finally:
        kc.stop_channels()
        await bridge.close()


async def test_a_bridge_on_the_runtimes_socket_survives_a_dropped_connection(
    runtime: dict[str, Any],
) -> None:
    """Straight to the runtime's socket (the local backend's path): a connection
    dropped mid-cell is re-opened, and no output is lost or repeated."""
    # no router listens there: only the socket can work
    endpoint = Endpoint("http://127.0.0.1:9", NS, "box-a", unix_socket=runtime["socket"])
    async with bridged_client() as (bridge, kc):
        bridge.connect(endpoint)
        await kc.wait_for_ready(timeout=30)
        lines = 1500  # printed without pause: a gap of a millisecond would lose some
        printed: list[dict[str, Any]] = []
        cell = asyncio.create_task(
            kc.execute_interactive(
                f"import time\nfor i in range({lines}):\n    print(i, flush=True)\n"
                "    time.sleep(0.001)",
                output_hook=printed.append,
                timeout=60,
            )
        )
        await asyncio.sleep(0.5)
        assert bridge._ws is not None
        bridge._ws.close()  # as a restarted peer or a broken connection would
        reply = await cell
        assert reply["content"]["status"] == "ok"
        text = "".join(m["content"]["text"] for m in printed if m["msg_type"] == "stream")
        assert text.split() == [str(i) for i in range(lines)]


async def test_a_bridge_reuses_large_buffers_without_mixing_them(
    runtime: dict[str, Any],
) -> None:
    """Large outputs arrive in receive buffers the bridge uses again once ZMQ has sent
    them on: every output must still arrive whole and as the kernel made it."""
    endpoint = Endpoint("http://127.0.0.1:9", NS, "box-a", unix_socket=runtime["socket"])
    sizes = [3_000_000, 2_600_000, 3_000_000, 2_900_000, 2_700_000, 3_000_000]
    async with bridged_client() as (bridge, kc):
        bridge.connect(endpoint)
        await kc.wait_for_ready(timeout=30)
        received: list[bytes] = []

        def keep(msg: dict[str, Any]) -> None:
            if msg["msg_type"] == "comm_open":
                received.extend(bytes(buffer) for buffer in msg["buffers"])

        code = (
            "import time\nfrom comm import create_comm\n"
            f"for i, size in enumerate({sizes!r}):\n"
            "    create_comm(target_name='t', buffers=[bytes([i]) * size])\n"
            "    time.sleep(0.2)"
        )
        reply = await kc.execute_interactive(code, output_hook=keep, timeout=60)
        assert reply["content"]["status"] == "ok"
        assert [len(b) for b in received] == sizes
        for index, buffer in enumerate(received):
            assert buffer == bytes([index]) * sizes[index], f"output {index} was changed"
        assert bridge._receive_buffers.reused > 0, "the bridge never used a buffer again"


@pytest.mark.parametrize("route", ["socket", "router"])
async def test_a_direct_link_survives_a_dropped_connection(
    runtime: dict[str, Any], router: dict[str, Any], route: str
) -> None:
    """A JupyterLab tab's link to the runtime (no ZMQ, no bridge) drops mid-cell: it
    reconnects with ``?last=`` and the runtime replays, so nothing is lost or repeated,
    and answers meant for other clients never reach the tab. On the runtime's socket
    (the local backend) and through the router with a scoped token (Kubernetes)."""
    if route == "socket":
        endpoint = Endpoint("http://127.0.0.1:9", NS, "box-a", unix_socket=runtime["socket"])
    else:
        token = router["authority"].issue(Scope(NS, "box-a"))
        endpoint = Endpoint(router_url=router["url"], namespace=NS, name="box-a", token=token)
    # What a link reads of its kernel's session (the provisioner's SandboxSession).
    session = SimpleNamespace(suspended=False, released=False, endpoint=endpoint)
    link = DirectLink(session)  # type: ignore[arg-type]
    await link.open()
    other = await websocket.websocket_connect(
        channels_request(endpoint, None)[0],
        resolver=channels_request(endpoint, None)[1],
        subprotocols=[framing.SUBPROTOCOL],
    )
    iopub: list[Any] = []
    shell: list[Any] = []
    link.streams["iopub"].on_recv(iopub.append)
    link.streams["shell"].on_recv(shell.append)
    lines = 3000  # printed without pause: a gap of a millisecond would lose some
    msg_id, parts = kernel_message(
        "execute_request",
        {
            "code": f"import time\nfor i in range({lines}):\n    print(i, flush=True)\n"
            "    time.sleep(0.0003)",
            "silent": False,
        },
    )
    try:
        for _ in range(100):  # the module's kernel may still be starting
            link.send("shell", kernel_message("kernel_info_request", {})[1])
            await asyncio.sleep(0.2)
            if shell:
                break
        shell.clear()
        link.send("shell", parts)
        # another client's request: its answer is not the tab's
        other_id, other_parts = kernel_message("kernel_info_request", {})
        other.write_message(framing.encode("shell", other_parts), binary=True)
        await asyncio.sleep(0.4)
        assert link._ws is not None
        link._ws.close()  # as a restarted router or a broken connection would

        async def replied() -> bool:
            return any(parent_msg_id(m.parts) == msg_id for m in shell)

        await wait_until(replied, 60)
        await asyncio.sleep(0.3)  # the idle status follows the reply
    finally:
        link.close()
        other.close()
    assert all(parent_msg_id(m.parts) != other_id for m in shell), "another client's reply"
    text = "".join(
        json.loads(m.parts[3])["text"]
        for m in iopub
        if header(m.parts)["msg_type"] == "stream" and parent_msg_id(m.parts) == msg_id
    )
    assert text.split() == [str(i) for i in range(lines)]
    # Frames go on to the browser as the runtime sent them.
    for message in iopub[:5]:
        assert framing.decode(bytes(message.frame))[1] == [bytes(p) for p in message.parts]


async def wait_until(predicate: Any, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while not await predicate():
        assert time.monotonic() < deadline, "timed out"
        await asyncio.sleep(0.05)
