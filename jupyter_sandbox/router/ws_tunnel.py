"""WebSocket proxying by splicing: the router takes part in the handshake, then copies bytes.

After authorizing the upgrade the router opens its own connection to the sandbox,
replays the client's handshake there (so the sandbox answers the client's own
Sec-WebSocket-Key and picks the subprotocol), sends the 101 back, and from then
on forwards bytes both ways. Frames are never decoded or re-masked; the router only
reads the header of each frame the client sends, to close messages over the size
limit with 1009 before they reach the sandbox.
"""

from __future__ import annotations

import asyncio
import logging
import struct
from typing import Any

from tornado import httputil, iostream, web
from tornado.tcpclient import TCPClient

from .proxy import Refused, route_request, send_error
from .routing import forward_headers
from .settings import RouterContext
from .upstreams import Upstream

log = logging.getLogger(__name__)

HANDSHAKE_LIMIT = 64 * 1024
CLOSE_TOO_BIG = 1009
CHUNK = 1024 * 1024
# Bytes written but not yet flushed before the copy waits for the sink: reading
# the next chunk while the last one drains keeps both sockets busy.
HIGH_WATER = 4 * 1024 * 1024
PASSED_BACK = (
    "upgrade",
    "connection",
    "sec-websocket-accept",
    "sec-websocket-protocol",
    "sec-websocket-extensions",
)


class WebSocketTunnelHandler(web.RequestHandler):
    def initialize(self, ctx: RouterContext) -> None:
        self.ctx = ctx

    async def get(self, *args: Any) -> None:
        try:
            to = await route_request(self.ctx, self.request)
        except Refused as exc:
            send_error(self, exc.status, exc.message)
            return
        upstream = to.upstream
        try:
            sandbox = await asyncio.wait_for(
                TCPClient(resolver=self.ctx.resolver).connect(
                    upstream.url_host().strip("[]"), upstream.url_port()
                ),
                self.ctx.connect_timeout,
            )
        except (OSError, TimeoutError, iostream.StreamClosedError) as exc:
            log.info("connect to %s failed: %r", upstream, exc)
            send_error(self, 502, "sandbox unreachable")
            return
        try:
            status, headers = await self._handshake(sandbox, upstream, to.target)
        except (
            iostream.StreamClosedError,
            iostream.UnsatisfiableReadError,
            TimeoutError,
            httputil.HTTPInputError,
        ) as exc:
            log.info("handshake with %s failed: %r", upstream, exc)
            sandbox.close()
            send_error(self, 502, "the sandbox broke off the WebSocket handshake")
            return
        if status != 101:
            sandbox.close()
            send_error(self, 502, f"sandbox refused the WebSocket ({status})")
            return
        self.set_status(101)
        self.clear_header("Content-Type")
        for name, value in headers.get_all():
            if name.lower() in PASSED_BACK:
                self.add_header(name, value)
        self.finish()
        client = self.detach()
        client.set_nodelay(True)
        sandbox.set_nodelay(True)
        await _splice(client, sandbox, self.ctx.max_ws_message)

    async def _handshake(
        self, sandbox: iostream.IOStream, upstream: Upstream, target: str
    ) -> tuple[int, httputil.HTTPHeaders]:
        """Replay the client's upgrade request, for ``target`` (origin-form, checked)."""
        request = self.request
        lines = [
            f"GET {target} HTTP/1.1",
            f"Host: {upstream.authority()}",
            "Upgrade: websocket",
            "Connection: Upgrade",
        ]
        headers = forward_headers(
            request.headers, websocket=True, runtime_token=upstream.runtime_token
        )
        for name, value in headers.items():
            lines.append(f"{name}: {value}")
        for name in (
            "Sec-WebSocket-Key",
            "Sec-WebSocket-Version",
            "Sec-WebSocket-Protocol",
            "Sec-WebSocket-Extensions",
        ):
            for value in request.headers.get_list(name):
                lines.append(f"{name}: {value}")
        await sandbox.write(("\r\n".join(lines) + "\r\n\r\n").encode("latin-1"))
        head = await asyncio.wait_for(
            sandbox.read_until(b"\r\n\r\n", max_bytes=HANDSHAKE_LIMIT), self.ctx.connect_timeout
        )
        first, _, rest = head.decode("latin-1").partition("\r\n")
        start = httputil.parse_response_start_line(first)
        return start.code, httputil.HTTPHeaders.parse(rest)


async def _splice(client: iostream.IOStream, sandbox: iostream.IOStream, limit: int) -> None:
    up = asyncio.ensure_future(_client_to_sandbox(client, sandbox, limit))
    down = asyncio.ensure_future(_copy(sandbox, client))
    try:
        await asyncio.wait({up, down}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for task in (up, down):
            task.cancel()
        client.close()
        sandbox.close()


class _Writer:
    """Writes to ``sink`` without waiting for each write to drain, up to HIGH_WATER."""

    def __init__(self, sink: iostream.IOStream) -> None:
        self.sink = sink
        self.unflushed = 0

    async def write(self, data: bytes) -> None:
        done = self.sink.write(data)
        self.unflushed += len(data)
        if self.unflushed >= HIGH_WATER:
            await done  # all written so far has reached the socket
            self.unflushed = 0
        else:
            # collected later by the await above, or by the stream closing
            done.add_done_callback(_retrieve)


def _retrieve(future: asyncio.Future[None]) -> None:
    if not future.cancelled():
        future.exception()


async def _copy(source: iostream.IOStream, sink: iostream.IOStream) -> None:
    source.read_chunk_size = CHUNK
    out = _Writer(sink)
    try:
        while True:
            await out.write(await source.read_bytes(CHUNK, partial=True))
    except iostream.StreamClosedError:
        pass


async def _client_to_sandbox(
    client: iostream.IOStream, sandbox: iostream.IOStream, limit: int
) -> None:
    """Forward client frames unchanged, counting each message's size from frame headers."""
    message_size = 0
    client.read_chunk_size = CHUNK
    out = _Writer(sandbox)
    try:
        while True:
            head = await client.read_bytes(2)
            fin, length = head[0] & 0x80, head[1] & 0x7F
            opcode = head[0] & 0x0F
            extra = b""
            if length == 126:
                extra = await client.read_bytes(2)
                (length,) = struct.unpack("!H", extra)
            elif length == 127:
                extra = await client.read_bytes(8)
                (length,) = struct.unpack("!Q", extra)
            if opcode < 0x8:  # data frames add up to a message; control frames stand alone
                message_size += length
                if message_size > limit:
                    log.info("closing a WebSocket: message over %s bytes", limit)
                    await _close_too_big(client, sandbox)
                    return
                if fin:
                    message_size = 0
            mask = await client.read_bytes(4) if head[1] & 0x80 else b""
            await out.write(head + extra + mask)
            remaining = length
            while remaining:
                chunk = await client.read_bytes(min(remaining, CHUNK), partial=True)
                remaining -= len(chunk)
                await out.write(chunk)
    except iostream.StreamClosedError:
        pass


async def _close_too_big(client: iostream.IOStream, sandbox: iostream.IOStream) -> None:
    reason = b"message too big"
    payload = struct.pack("!H", CLOSE_TOO_BIG) + reason
    try:
        await client.write(bytes([0x88, len(payload)]) + payload)  # server frames are unmasked
    except iostream.StreamClosedError:
        pass
    sandbox.close()
