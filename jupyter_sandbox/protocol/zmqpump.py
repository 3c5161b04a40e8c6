"""A ZMQ socket driven from an asyncio loop by its file descriptor, without futures.

zmq.asyncio makes a future, a task step and an event registration for every
message received, which in the runtime cost more than relaying the message
itself. pyzmq's ZMQStream avoids the futures but takes one loop iteration per
message and defers every send to the next one. A ``SocketPump`` receives
everything the socket holds each time its descriptor wakes the loop, hands each
message to a callback, and sends at once; only a send that meets a full queue
waits, in order, for the socket to take it.

libzmq's descriptor is edge-triggered and says only that the socket's state
may have changed: a wake-up is followed until the socket has nothing more to
give, and after a send (which may consume the edge of an arrival) the socket is
asked again.
"""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from collections.abc import Callable, Sequence

import zmq

from .zmqsend import try_send

log = logging.getLogger(__name__)

Receiver = Callable[[list[zmq.Frame]], None]


class SocketPump:
    """Relays one socket: ``on_message(frames)`` for each message, ``send`` for output.

    The pump owns the socket from here on and closes it in ``close``.
    """

    def __init__(self, sock: zmq.Socket[bytes], on_message: Receiver) -> None:
        self.sock = sock
        self._on_message = on_message
        self._outbox: deque[Sequence[bytes | memoryview]] = deque()
        self._loop = asyncio.get_running_loop()
        self._fd: int = sock.FD
        self._closed = False
        self._loop.add_reader(self._fd, self._service)
        # Messages may have arrived before the reader was there to be woken.
        self._loop.call_soon(self._service)

    def send(self, frames: Sequence[bytes | memoryview]) -> None:
        """Send a multipart message now, or queue it behind those the socket refused."""
        if self._closed:
            raise zmq.ZMQError(zmq.ENOTSOCK, "the pump is closed")
        if self._outbox or try_send(self.sock, frames) is None:
            self._outbox.append(frames)
        # The send may have taken the descriptor's edge (an arrival, or room to send).
        events = self.sock.getsockopt(zmq.EVENTS)
        assert isinstance(events, int)
        if events & zmq.POLLIN or (self._outbox and events & zmq.POLLOUT):
            self._loop.call_soon(self._service)

    @property
    def queued(self) -> int:
        """Messages waiting for the socket to take them."""
        return len(self._outbox)

    def _service(self) -> None:
        # Until the socket says there is nothing more to do now: each look at its
        # events re-arms the descriptor, so nothing that arrived meanwhile is missed.
        while not self._closed:
            try:
                events = self.sock.getsockopt(zmq.EVENTS)
            except zmq.ZMQError as exc:  # closed under us, or the context is gone
                log.debug("zmq socket stopped: %s", exc)
                self.close()
                return
            assert isinstance(events, int)
            sent = 0
            if self._outbox and events & zmq.POLLOUT:
                while self._outbox and try_send(self.sock, self._outbox[0]) is not None:
                    self._outbox.popleft()
                    sent += 1
            received = self._receive_all() if events & zmq.POLLIN else 0
            if not (sent or received):
                return

    def _receive_all(self) -> int:
        count = 0
        while not self._closed:
            try:
                frames = self.sock.recv_multipart(zmq.NOBLOCK, copy=False)
            except zmq.Again:
                break
            except zmq.ZMQError as exc:
                log.debug("zmq socket stopped: %s", exc)
                self.close()
                break
            count += 1
            try:
                self._on_message(frames)
            except Exception:  # one odd message must never end the relay
                log.exception("handling a zmq message failed")
        return count

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        self._outbox.clear()
        self._loop.remove_reader(self._fd)
        self.sock.close(linger=0)
