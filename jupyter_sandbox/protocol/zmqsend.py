"""Send on a zmq.asyncio socket without the asyncio machinery when it can go at once."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import zmq
import zmq.asyncio

_send = zmq.Socket.send  # the synchronous send, not zmq.asyncio's override
# pyzmq's own re-check of an asyncio socket's pending events. It is private: the
# unit test of this module fails loudly if a pyzmq release renames it.
_recheck_events: Callable[[zmq.asyncio.Socket], None] = getattr(  # noqa: B009
    zmq.asyncio.Socket, "_schedule_remaining_events"
)


def try_send(
    sock: zmq.Socket[Any], frames: Sequence[bytes | memoryview], *, track: bool = False
) -> list[zmq.MessageTracker] | None:
    """Send a multipart message without blocking; None if the socket's queue is full.

    ``track``: the result holds a tracker for each frame ZMQ sends without copying
    (those of ``sock.copy_threshold`` bytes and more), done once ZMQ no longer needs
    its memory. On any socket, zmq.asyncio's included (its own send is bypassed).
    """
    last = len(frames) - 1
    threshold = sock.copy_threshold
    trackers: list[zmq.MessageTracker] = []

    def send(index: int, flags: int) -> None:
        frame = frames[index]
        tracked = track and len(frame) >= threshold
        sent = _send(sock, frame, flags, copy=False, track=tracked)
        if tracked:
            trackers.append(sent)

    try:
        send(0, zmq.NOBLOCK | (zmq.SNDMORE if last else 0))
    except zmq.Again:
        return None
    # Once the first part is queued the message is accepted whole (zmq delivers
    # all parts or none), so the rest cannot meet a full queue.
    for index in range(1, last + 1):
        send(index, zmq.SNDMORE if index < last else 0)
    return trackers


def send_now(
    sock: zmq.asyncio.Socket, frames: Sequence[bytes | memoryview], *, track: bool = False
) -> list[zmq.MessageTracker] | None:
    """A direct non-blocking send; only a full queue falls back to the awaitable path.

    ``track``: as for ``try_send``; None when the send fell back (the frames'
    memory stays in use).

    zmq.asyncio's send_multipart builds futures and registers events for every
    frame, which costs more than the send itself at a kernel's message rate.
    (``zmq.Socket.send_multipart(sock, ...)`` would not avoid that: it calls
    ``sock.send``, which is the asyncio override; hence ``try_send``'s frame loop.)
    ipykernel 7 met the same edge in its shell channel (ipykernel#1529).
    """
    trackers = try_send(sock, frames, track=track)
    if trackers is None:
        sock.send_multipart(frames, copy=False)
        return None
    # libzmq's notification fd is edge-triggered and this send, unseen by
    # zmq.asyncio, may have consumed the edge announcing an incoming message: have
    # zmq.asyncio look at the socket's events again, or a pending receive sleeps.
    _recheck_events(sock)
    return trackers
