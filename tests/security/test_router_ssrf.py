"""The router forwards only origin-form request targets, to the sandbox it resolved.

An attacker holding a valid token for one sandbox sends raw request lines whose
target is not a path (``@host:port/``, ``http://host/``, ``host:port``, ``*``,
``//host/``): built into the upstream URL by concatenation these made the router
fetch another host:port.  Each attack goes over a raw socket through a real router
on a loopback port, beside a "victim" server on another loopback port that must
never see a connection.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from typing import Any

import pytest

from tests.test_runtime_and_router import NS, fetch, routed, router, runtime  # noqa: F401

TIMEOUT = 10.0


class Victim:
    """A loopback TCP server that records every connection made to it."""

    def __init__(self) -> None:
        self.connections = 0
        self.received = b""
        self.server: asyncio.Server | None = None

    @property
    def port(self) -> int:
        assert self.server is not None
        return int(self.server.sockets[0].getsockname()[1])

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        try:
            self.received += await asyncio.wait_for(reader.read(4096), 2)
            body = b'{"victim": "reached"}'
            writer.write(
                b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
                + f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n".encode()
                + body
            )
            await writer.drain()
        except (TimeoutError, ConnectionError):
            pass
        finally:
            writer.close()


@pytest.fixture
async def victim() -> AsyncIterator[Victim]:
    target = Victim()
    target.server = await asyncio.start_server(target._handle, "127.0.0.1", 0)
    try:
        yield target
    finally:
        target.server.close()
        await target.server.wait_closed()


async def raw_exchange(proxy: dict[str, Any], request_line: str, headers: dict[str, str]) -> bytes:
    """Send one request exactly as written and return the whole answer."""
    host, port = proxy["url"].split("://", 1)[1].split(":")
    reader, writer = await asyncio.open_connection(host, int(port))
    try:
        head = "".join(f"{name}: {value}\r\n" for name, value in headers.items())
        writer.write(f"{request_line}\r\nHost: x\r\n{head}\r\n".encode())
        await writer.drain()
        return await asyncio.wait_for(read_response(reader), TIMEOUT)
    finally:
        writer.close()


async def read_response(reader: asyncio.StreamReader) -> bytes:
    """One HTTP/1.1 response: its head, and a body by Content-Length or chunks."""
    head = await reader.readuntil(b"\r\n\r\n")
    lowered = head.lower()
    if b"transfer-encoding: chunked" in lowered:
        return head + await reader.readuntil(b"0\r\n\r\n")
    for line in lowered.split(b"\r\n"):
        if line.startswith(b"content-length:"):
            return head + await reader.readexactly(int(line.split(b":", 1)[1]))
    return head


def status_and_body(answer: bytes) -> tuple[int, bytes]:
    head, _, body = answer.partition(b"\r\n\r\n")
    return int(head.split(b" ", 2)[1]), body


WEBSOCKET = {
    "Upgrade": "websocket",
    "Connection": "Upgrade",
    "Sec-WebSocket-Key": "dGhlIHNhbXBsZSBub25jZQ==",
    "Sec-WebSocket-Version": "13",
}

ATTACKS = [
    ("GET", "@127.0.0.1:{port}/"),  # userinfo@host: the reported SSRF
    ("GET", "@127.0.0.1:{port}/api?x=1"),
    ("POST", "@127.0.0.1:{port}/execute"),
    ("GET", "@127.0.0.1:{port}"),
    ("GET", "x@127.0.0.1:{port}/"),
    ("GET", "http://127.0.0.1:{port}/"),  # absolute-form
    ("GET", "HTTP://127.0.0.1:{port}/"),
    ("GET", "127.0.0.1:{port}"),  # authority-form
    ("OPTIONS", "*"),  # asterisk-form
    ("GET", "//127.0.0.1:{port}/"),  # a network-path reference
    ("GET", "/\\127.0.0.1:{port}/"),
]


@pytest.mark.parametrize("method,target", ATTACKS)
async def test_non_origin_form_targets_are_refused(
    router: dict[str, Any],  # noqa: F811
    victim: Victim,
    method: str,
    target: str,
) -> None:
    line = f"{method} {target.format(port=victim.port)} HTTP/1.1"
    headers = routed(router, name="box-echo")  # a valid token for a TCP sandbox
    if method == "POST":
        headers["Content-Length"] = "0"
    status, body = status_and_body(await raw_exchange(router, line, headers))
    assert status == 400, (line, status, body)
    assert "origin-form" in json.loads(body)["detail"]
    assert victim.connections == 0, f"{line!r} reached the victim"


async def test_websocket_upgrade_with_a_foreign_target_is_refused(
    router: dict[str, Any],  # noqa: F811
    victim: Victim,
) -> None:
    line = f"GET @127.0.0.1:{victim.port}/api/kernel/channels HTTP/1.1"
    headers = {**routed(router, name="box-echo"), **WEBSOCKET}
    status, body = status_and_body(await raw_exchange(router, line, headers))
    assert status == 400, body
    assert victim.connections == 0


async def test_the_check_comes_before_authorization(
    router: dict[str, Any],  # noqa: F811
    victim: Victim,
) -> None:
    """Without any token the answer is the same 400: nothing about tokens is learnt."""
    line = f"GET @127.0.0.1:{victim.port}/ HTTP/1.1"
    status, _ = status_and_body(await raw_exchange(router, line, routed(router, token=None)))
    assert status == 400
    assert victim.connections == 0


async def test_origin_form_paths_still_go_up_byte_for_byte(
    router: dict[str, Any],  # noqa: F811
) -> None:
    """Paths are not normalized on the way: ``/a/../headers`` is not ``/headers``."""
    r = await fetch(router, "/headers?x=%2e%2e", routed(router, name="box-echo"))
    assert r.code == 200, r.body
    line = "GET /nothing/../headers HTTP/1.1"
    status, _ = status_and_body(await raw_exchange(router, line, routed(router, name="box-echo")))
    assert status == 404, "the router folded a dot-segment the sandbox should have seen"
