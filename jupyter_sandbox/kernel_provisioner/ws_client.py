"""tornado's WebSocket client, reading large messages straight into their buffer.

tornado reads a payload through its stream buffer: 64 KiB chunks appended to a
growing bytearray, then copied out as bytes, which for a 50 MB output is two
extra copies on the client's own process. Payloads of DIRECT_READ_BYTES and more
are read with ``read_into`` into one buffer of their final size instead; the
frame parsing, limits, pings and closing handshake stay tornado's. With
``receive_buffers`` those buffers come from (and go back to) a pool.

``on_open`` sees the connection as soon as it is upgraded, before any message
has been passed on: what the server chose (its subprotocol) decides how the
very first message is read.
"""

from __future__ import annotations

from asyncio import Future
from collections.abc import Callable
from typing import Any

from tornado import httpclient, httputil, websocket

from .receive_buffers import ReceiveBuffers

DIRECT_READ_BYTES = 256 * 1024


class _DirectReadProtocol(websocket.WebSocketProtocol13):
    async def _read_bytes(self, n: int) -> bytes:
        if n < DIRECT_READ_BYTES:
            return await super()._read_bytes(n)
        # tornado checked n against max_message_size before asking for the payload.
        pool = getattr(self.handler, "receive_buffers", None)
        buffer = pool.take(n) if pool is not None else bytearray(n)
        assert self.stream is not None
        await self.stream.read_into(buffer)
        self._wire_bytes_in += n
        return buffer  # type: ignore[return-value]  # bytes-like; the receivers take views


OpenCallback = Callable[[websocket.WebSocketClientConnection], None]


class _Connection(websocket.WebSocketClientConnection):
    receive_buffers: ReceiveBuffers | None = None
    on_open: OpenCallback | None = None

    async def headers_received(
        self,
        start_line: httputil.RequestStartLine | httputil.ResponseStartLine,
        headers: httputil.HTTPHeaders,
    ) -> None:
        await super().headers_received(start_line, headers)
        # tornado has only scheduled its frame loop yet: no message was read.
        if self.protocol is not None and self.on_open is not None:
            self.on_open(self)

    def get_websocket_protocol(self) -> websocket.WebSocketProtocol:
        return _DirectReadProtocol(self, mask_outgoing=True, params=self.params)


def websocket_connect(
    request: httpclient.HTTPRequest,
    receive_buffers: ReceiveBuffers | None = None,
    on_open: OpenCallback | None = None,
    **options: Any,
) -> Future[websocket.WebSocketClientConnection]:
    """Like ``tornado.websocket.websocket_connect`` (same keyword options)."""
    request.headers = httputil.HTTPHeaders(request.headers)
    # As tornado's own websocket_connect does: fill in the request defaults.
    proxy = httpclient._RequestProxy(request, httpclient.HTTPRequest._DEFAULTS)
    connection = _Connection(proxy, **options)  # type: ignore[arg-type]
    connection.receive_buffers = receive_buffers
    connection.on_open = on_open
    return connection.connect_future
