"""Send on a zmq.asyncio socket without the asyncio machinery when it can go at once."""

from __future__ import annotations

from collections.abc import Sequence

import zmq
import zmq.asyncio


def send_now(sock: zmq.asyncio.Socket, frames: Sequence[bytes | memoryview]) -> None:
    """A direct non-blocking send; only a full queue falls back to the awaitable path.

    zmq.asyncio's send_multipart builds futures and registers events for every
    message, which costs more than the send itself on a kernel's message rate.
    """
    try:
        zmq.Socket.send_multipart(sock, frames, zmq.NOBLOCK, copy=False)
    except zmq.Again:
        sock.send_multipart(frames, copy=False)
