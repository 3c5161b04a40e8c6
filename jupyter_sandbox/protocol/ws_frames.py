"""Large binary WebSocket messages written by a server without joining their pieces.

tornado's ``write_message`` copies a message twice (its framing joins header and
payload) and takes only ``bytes``. A server sends unmasked frames and, with no
compression negotiated, a single final binary frame is exactly what
``write_message`` would write, so large outputs are written as a header and
their pieces, each kept by reference in the stream's buffer.
"""

from __future__ import annotations

import asyncio
import struct
from collections.abc import Sequence

from tornado import websocket
from tornado.iostream import StreamClosedError

# Below this size tornado's own write_message (one join) is as good.
DIRECT_WRITE_BYTES = 64 * 1024


def frame_header(size: int) -> bytes:
    """RFC 6455 header of one final, unmasked binary frame of ``size`` bytes."""
    if size < 126:
        return struct.pack("!BB", 0x82, size)
    if size < 1 << 16:
        return struct.pack("!BBH", 0x82, 126, size)
    return struct.pack("!BBQ", 0x82, 127, size)


def write_binary(
    handler: websocket.WebSocketHandler, pieces: Sequence[bytes | bytearray | memoryview]
) -> None:
    """Send ``pieces`` as one binary message from the server side of ``handler``.

    The pieces must not change until written. Only for handlers that never
    negotiate compression (``get_compression_options()`` is None).
    """
    connection = handler.ws_connection
    if connection is None or connection.is_closing():
        return
    size = sum(len(piece) for piece in pieces)
    if size < DIRECT_WRITE_BYTES:
        handler.write_message(b"".join(pieces), binary=True)
        return
    stream = getattr(connection, "stream", None)
    if stream is None:
        return
    try:
        for piece in (frame_header(size), *pieces):
            stream.write(piece).add_done_callback(_ignore_closed)
    except StreamClosedError:
        return


def _ignore_closed(future: asyncio.Future[None]) -> None:
    if not future.cancelled():
        future.exception()  # a client that went away; its close handler cleans up
