"""tornado's WebSocket client, reading large messages straight into their buffer.

tornado reads a payload through its stream buffer: 64 KiB chunks appended to a
growing bytearray, then copied out as bytes, which for a 50 MB output is two
extra copies on the client's own process. Payloads of DIRECT_READ_BYTES and more
are read with ``read_into`` into one buffer of their final size instead; the
frame parsing, limits, pings and closing handshake stay tornado's. With
``receive_buffers`` those buffers come from (and go back to) a pool.
"""

from __future__ import annotations

from asyncio import Future
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


class _Connection(websocket.WebSocketClientConnection):
    receive_buffers: ReceiveBuffers | None = None

    def get_websocket_protocol(self) -> websocket.WebSocketProtocol:
        return _DirectReadProtocol(self, mask_outgoing=True, params=self.params)


def websocket_connect(
    request: httpclient.HTTPRequest,
    receive_buffers: ReceiveBuffers | None = None,
    **options: Any,
) -> Future[websocket.WebSocketClientConnection]:
    """Like ``tornado.websocket.websocket_connect`` (same keyword options)."""
    request.headers = httputil.HTTPHeaders(request.headers)
    # As tornado's own websocket_connect does: fill in the request defaults.
    proxy = httpclient._RequestProxy(request, httpclient.HTTPRequest._DEFAULTS)
    connection = _Connection(proxy, **options)  # type: ignore[arg-type]
    connection.receive_buffers = receive_buffers
    return connection.connect_future
