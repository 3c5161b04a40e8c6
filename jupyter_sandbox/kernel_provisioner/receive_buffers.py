"""Large WebSocket receive buffers, used again once ZMQ has sent what they held.

A 50 MB output costs the bridge more in fresh memory than in copying: every
page of a new buffer is faulted in and zeroed by the kernel (about 19 ms for
50 MB on a small VM, against 2 ms to copy into pages already mapped), and
allocations that large always come straight from ``mmap``, so the next output
pays again. The bridge hands a received message's large parts to ZMQ without
copying them; once ZMQ says it is done with them (a ``MessageTracker``), the
buffer can take the next large message. Spare buffers are dropped after a few
seconds without large messages, so an idle kernel pins no memory.

A new buffer is anonymous memory that the kernel commits page by page as the
payload is written into it (``lazy_buffer``), not a zero-filled ``bytearray``:
a frame header declaring a large size, sent by a runtime that then sends
nothing, costs the host nothing until the bytes arrive.
"""

from __future__ import annotations

import asyncio
import mmap
import time
from collections.abc import Sequence
from dataclasses import dataclass, field

import zmq

KEEP_SECONDS = 5.0
MAX_BUFFERS = 3  # spare and in flight, per pool
MAX_SPARE_BYTES = 256 * 1024 * 1024


def lazy_buffer(size: int) -> memoryview:
    """``size`` writable bytes, committed only as they are written."""
    return memoryview(mmap.mmap(-1, size))


@dataclass
class _Buffer:
    data: mmap.mmap
    trackers: Sequence[zmq.MessageTracker] = ()
    last_used: float = field(default_factory=time.monotonic)

    def free(self) -> bool:
        return all(tracker.done for tracker in self.trackers)


class ReceiveBuffers:
    """A few large buffers, handed out by ``take`` and given back by ``recycle``.

    Only a buffer given back with the trackers of every ZMQ send that still
    references it is ever handed out again, and only once they are done; one
    that is never given back is simply garbage collected.
    """

    def __init__(self, keep_seconds: float = KEEP_SECONDS) -> None:
        self.keep_seconds = keep_seconds
        self._buffers: list[_Buffer] = []
        self._trim_timer: asyncio.TimerHandle | None = None
        self.allocated = 0  # new buffers made (for tests and figures)
        self.reused = 0

    def take(self, size: int) -> memoryview:
        """A writable view of exactly ``size`` bytes, over a spare buffer when one fits."""
        self._expire(time.monotonic())
        for index, entry in enumerate(self._buffers):
            # Not much bigger than needed: a small message must not pin a huge buffer.
            if size <= len(entry.data) <= 2 * size and entry.free():
                del self._buffers[index]
                self.reused += 1
                return memoryview(entry.data)[:size]
        self.allocated += 1
        return lazy_buffer(size)

    def recycle(self, view: object, trackers: Sequence[zmq.MessageTracker]) -> None:
        """Give back a view from ``take`` once its sends are tracked (no-op for others)."""
        # Views from ``take`` are the only memoryviews over an mmap the bridge gets.
        if not isinstance(view, memoryview) or not isinstance(view.obj, mmap.mmap):
            return
        data = view.obj
        if any(entry.data is data for entry in self._buffers):
            return
        if len(self._buffers) >= MAX_BUFFERS:
            self._buffers.pop(0)  # the oldest goes; it is freed once ZMQ is done with it
        self._buffers.append(_Buffer(data, tuple(trackers)))
        self._schedule_trim()

    def _expire(self, now: float) -> None:
        keep: list[_Buffer] = []
        total = 0
        for entry in reversed(self._buffers):  # newest first
            if now - entry.last_used < self.keep_seconds and total + len(entry.data) <= (
                MAX_SPARE_BYTES
            ):
                keep.append(entry)
                total += len(entry.data)
        self._buffers = keep[::-1]

    def _schedule_trim(self) -> None:
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            return
        if self._trim_timer is not None:
            self._trim_timer.cancel()
        self._trim_timer = loop.call_later(self.keep_seconds, self._trim)

    def _trim(self) -> None:
        self._trim_timer = None
        self._expire(time.monotonic())
        if self._buffers:
            self._schedule_trim()

    @property
    def spare_bytes(self) -> int:
        return sum(len(entry.data) for entry in self._buffers)
