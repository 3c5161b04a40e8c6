"""Connections that never finish a request head are closed, and WebSockets are not.

A client that connects and then sends nothing, or trickles its headers, used to hold
its connection (and the router's memory for it) for an hour; hundreds of them cost
nothing to open.  Both routers now close such connections after the header/idle
timeout (``ROUTER_IDLE_TIMEOUT_SECONDS``, 20 s by default) and bound request bodies
(``ROUTER_BODY_TIMEOUT_SECONDS``).  The attacks run over raw sockets against the real
router processes, started with a 1 s timeout; an upgraded WebSocket must outlive it.
"""

from __future__ import annotations

import asyncio
import os
import socket
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
from tornado import httpclient, web, websocket
from tornado.httpserver import HTTPServer
from tornado.netutil import bind_sockets

from jupyter_sandbox.router.app import make_router_app
from jupyter_sandbox.router.settings import (
    BODY_TIMEOUT_ENV,
    DEFAULT_IDLE_TIMEOUT,
    IDLE_TIMEOUT_ENV,
    RouterContext,
)
from jupyter_sandbox.router.upstreams import Upstream
from tests.helpers import free_port, stop_process, wait_listening
from tests.security.test_router_ssrf import read_response

TIMEOUT = 1.0  # the routers' header/idle timeout in these tests
SLACK = 6.0  # how much later than TIMEOUT a close may come on a busy machine
HALF_OPEN = 200
SECRET = "timeouts-test-router-secret-0123456789abcdef"


@contextmanager
def router_process(
    tmp_path: Path, module: str, *args: str, env: dict[str, str] | None = None
) -> Iterator[tuple[int, subprocess.Popen[bytes]]]:
    """``python -m <module> <args> --port P`` on loopback, once it accepts connections."""
    port = free_port()
    log_path = tmp_path / f"{module}-{port}.log"
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(
            [sys.executable, "-m", module, *args, f"--port={port}"],
            stdout=log,
            stderr=subprocess.STDOUT,
            env={**os.environ, **(env or {})},
        )
    try:
        wait_listening(proc, port, log_path, "the router")
        yield port, proc
    finally:
        stop_process(proc)


@pytest.fixture
def standalone_router(tmp_path: Path) -> Iterator[int]:
    """``jupyter-sandbox router`` (Kubernetes' router) with a scoped-token secret."""
    secret = tmp_path / "router-secret"
    secret.write_text(SECRET + "\n")
    with router_process(
        tmp_path,
        "jupyter_sandbox.router",
        "--address=127.0.0.1",
        "--resolve=dns",
        f"--token-secret-file={secret}",
        env={IDLE_TIMEOUT_ENV: str(TIMEOUT)},
    ) as (port, _):
        yield port


@pytest.fixture
def local_router(tmp_path: Path) -> Iterator[int]:
    """The local backend's router process, on a state directory of its own."""
    state = tmp_path / "state"
    state.mkdir(mode=0o700)
    (state / "router-secret").write_text(SECRET)
    with router_process(
        tmp_path,
        "jupyter_sandbox.router.local",
        f"--state-dir={state}",
        env={IDLE_TIMEOUT_ENV: str(TIMEOUT)},
    ) as (port, _):
        yield port


def closed_by_peer(sock: socket.socket, deadline: float) -> bool:
    """Whether the other end closes ``sock`` before ``deadline`` (monotonic)."""
    while (left := deadline - time.monotonic()) > 0:
        sock.settimeout(left)
        try:
            if sock.recv(4096) == b"":
                return True
        except TimeoutError:
            return False
        except ConnectionError:
            return True
    return False


def half_open_connections(port: int) -> list[socket.socket]:
    """Connections that never complete a request head, in three flavours."""
    partial = [b"", b"GET / HTTP/1.1\r\n", b"GET / HTTP/1.1\r\nHost: x\r\nX-Sandbox-ID: a"]
    opened = []
    for i in range(HALF_OPEN):
        sock = socket.create_connection(("127.0.0.1", port), timeout=5)
        if partial[i % 3]:
            sock.sendall(partial[i % 3])
        opened.append(sock)
    return opened


def assert_all_closed(sockets: list[socket.socket], started: float) -> None:
    deadline = started + TIMEOUT + SLACK
    try:
        still_open = [s for s in sockets if not closed_by_peer(s, deadline)]
        assert not still_open, f"{len(still_open)} of {len(sockets)} half-open connections held"
        assert time.monotonic() - started >= TIMEOUT * 0.5, "closed before the timeout?"
    finally:
        for sock in sockets:
            sock.close()


@pytest.mark.parametrize("which", ["standalone_router", "local_router"])
def test_half_open_connections_are_closed(which: str, request: pytest.FixtureRequest) -> None:
    port = request.getfixturevalue(which)
    started = time.monotonic()
    assert_all_closed(half_open_connections(port), started)
    # and the router still serves: a complete request is answered
    with socket.create_connection(("127.0.0.1", port), timeout=5) as sock:
        sock.sendall(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
        assert sock.recv(4096).startswith(b"HTTP/1.1 400"), "no X-Sandbox-ID: 400"


def test_trickled_headers_do_not_extend_the_timeout(standalone_router: int) -> None:
    """Slowloris: a byte every 0.2 s keeps the connection busy, yet it is closed."""
    started = time.monotonic()
    with socket.create_connection(("127.0.0.1", standalone_router), timeout=5) as sock:
        head = b"GET / HTTP/1.1\r\n" + b"".join(b"X-Pad-%d: y\r\n" % i for i in range(200))
        try:
            for byte in head:
                sock.sendall(bytes([byte]))
                time.sleep(0.2)
                assert time.monotonic() - started < TIMEOUT + SLACK, "still open"
        except ConnectionError:
            pass
        else:
            raise AssertionError("the whole trickled head was accepted")
    assert time.monotonic() - started >= TIMEOUT * 0.5


def test_the_default_timeouts_are_short() -> None:
    async def nowhere(namespace: str, name: str, port: int) -> Upstream | None:
        return None

    ctx = RouterContext(lookup=nowhere, authority=None)
    options = ctx.server_options()
    if IDLE_TIMEOUT_ENV not in os.environ:
        assert options["idle_connection_timeout"] == DEFAULT_IDLE_TIMEOUT <= 30
    assert options["body_timeout"] is not None


# -- an in-process router in front of a WebSocket upstream ---------------------------


class Echo(websocket.WebSocketHandler):
    def on_message(self, message: str | bytes) -> None:
        self.write_message(message, binary=isinstance(message, bytes))


class Sink(web.RequestHandler):
    def get(self) -> None:
        self.finish({"received": 0})

    def post(self) -> None:
        self.finish({"received": len(self.request.body)})


@pytest.fixture
async def ws_router(monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[dict[str, Any]]:
    """A router (timeouts from the environment, as the router processes read them)
    in front of a sandbox that echoes WebSocket messages and swallows POST bodies."""
    monkeypatch.setenv(IDLE_TIMEOUT_ENV, str(TIMEOUT))
    monkeypatch.setenv(BODY_TIMEOUT_ENV, str(TIMEOUT))
    upstream = HTTPServer(web.Application([(r"/ws", Echo), (r"/sink", Sink)]))
    upstream_sockets = bind_sockets(0, "127.0.0.1")
    upstream.add_sockets(upstream_sockets)
    upstream_port = upstream_sockets[0].getsockname()[1]

    async def lookup(namespace: str, name: str, port: int) -> Upstream | None:
        return Upstream(host="127.0.0.1", port=upstream_port) if name == "box" else None

    ctx = RouterContext(lookup=lookup, authority=None)
    server = HTTPServer(make_router_app(ctx), **ctx.server_options())
    sockets = bind_sockets(0, "127.0.0.1")
    server.add_sockets(sockets)
    try:
        yield {"port": sockets[0].getsockname()[1], "ctx": ctx}
    finally:
        server.stop()
        upstream.stop()
        await ctx.close()


async def test_an_upgraded_websocket_outlives_the_idle_timeout(ws_router: dict[str, Any]) -> None:
    assert ws_router["ctx"].idle_timeout == TIMEOUT
    request = httpclient.HTTPRequest(
        f"ws://127.0.0.1:{ws_router['port']}/ws", headers={"X-Sandbox-ID": "box"}
    )
    ws = await websocket.websocket_connect(request)
    try:
        ws.write_message("first")
        assert await asyncio.wait_for(ws.read_message(), 5) == "first"
        await asyncio.sleep(TIMEOUT * 3)  # silent, well past the idle and body timeouts
        ws.write_message("after a silence")
        assert await asyncio.wait_for(ws.read_message(), 5) == "after a silence"
    finally:
        ws.close()


async def test_a_stalled_request_body_is_cut(ws_router: dict[str, Any]) -> None:
    assert ws_router["ctx"].body_timeout == TIMEOUT
    reader, writer = await asyncio.open_connection("127.0.0.1", ws_router["port"])
    try:
        writer.write(
            b"POST /sink HTTP/1.1\r\nHost: x\r\nX-Sandbox-ID: box\r\n"
            b"Content-Length: 100000\r\n\r\n" + b"x" * 10
        )
        await writer.drain()
        started = time.monotonic()
        try:
            answer = await asyncio.wait_for(reader.read(), TIMEOUT + SLACK)
        except TimeoutError:
            raise AssertionError("a body that never comes held the connection") from None
        assert answer == b"", answer  # cut, not answered
        assert time.monotonic() - started >= TIMEOUT * 0.5
    finally:
        writer.close()


async def test_idle_keep_alive_connections_are_closed(ws_router: dict[str, Any]) -> None:
    """After a proxied answer the connection stays open for a next request, not longer."""
    reader, writer = await asyncio.open_connection("127.0.0.1", ws_router["port"])
    try:
        for _ in range(2):  # kept alive between requests sent without a pause
            writer.write(b"GET /sink HTTP/1.1\r\nHost: x\r\nX-Sandbox-ID: box\r\n\r\n")
            answer = await asyncio.wait_for(read_response(reader), 10)
            assert answer.startswith(b"HTTP/1.1 200"), answer
        started = time.monotonic()
        try:
            rest = await asyncio.wait_for(reader.read(), TIMEOUT + SLACK)
        except TimeoutError:
            raise AssertionError("an idle keep-alive connection was held") from None
        assert rest == b""
        assert time.monotonic() - started >= TIMEOUT * 0.5
    finally:
        writer.close()
