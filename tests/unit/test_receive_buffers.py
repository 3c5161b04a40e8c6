"""The bridge's pool of large receive buffers: reuse only what ZMQ is done with."""

from __future__ import annotations

import time

import pytest
import zmq

from jupyter_sandbox.kernel_provisioner.receive_buffers import MAX_BUFFERS, ReceiveBuffers

MB = 1_000_000


def pending_tracker() -> zmq.MessageTracker:
    """A tracker that stays not done while its frame lives (never sent)."""
    frame = zmq.Frame(b"x" * 100_000, track=True)
    tracker = frame.tracker
    pending_tracker.frames.append(frame)  # type: ignore[attr-defined]
    return tracker


pending_tracker.frames = []  # type: ignore[attr-defined]
DONE = zmq.MessageTracker()  # watches nothing: done


def test_a_view_has_exactly_the_size_asked() -> None:
    pool = ReceiveBuffers()
    view = pool.take(3 * MB)
    assert len(view) == 3 * MB and not view.readonly


@pytest.mark.parametrize(
    ("first", "second", "trackers", "reused"),
    [
        (3 * MB, 3 * MB, [DONE], True),  # same size, sent: reused
        (3 * MB, 2 * MB, [DONE], True),  # smaller, within twice the size: reused
        (3 * MB, 1 * MB, [DONE], False),  # far smaller: a small message pins no big buffer
        (2 * MB, 3 * MB, [DONE], False),  # bigger than the spare: a new one
        (3 * MB, 3 * MB, "pending", False),  # ZMQ still sending it: never handed out
        (3 * MB, 3 * MB, [], True),  # nothing sent without copying: free at once
    ],
)
def test_reuse(first: int, second: int, trackers: object, reused: bool) -> None:
    pool = ReceiveBuffers()
    view = pool.take(first)
    pool.recycle(view, [pending_tracker()] if trackers == "pending" else trackers)  # type: ignore[arg-type]
    again = pool.take(second)
    assert (again.obj is view.obj) is reused
    assert len(again) == second


def test_only_views_from_take_come_back() -> None:
    pool = ReceiveBuffers()
    pool.recycle(b"bytes from tornado's own path", [DONE])
    pool.recycle(memoryview(b"read-only bytes"), [DONE])
    assert pool.spare_bytes == 0


def test_a_buffer_given_back_twice_is_kept_once() -> None:
    pool = ReceiveBuffers()
    view = pool.take(MB)
    pool.recycle(view, [DONE])
    pool.recycle(view, [DONE])
    assert pool.spare_bytes == MB


def test_at_most_a_few_buffers_are_kept() -> None:
    pool = ReceiveBuffers()
    views = [pool.take(MB) for _ in range(MAX_BUFFERS + 2)]
    for view in views:
        pool.recycle(view, [DONE])
    assert pool.spare_bytes == MAX_BUFFERS * MB


def test_spare_buffers_expire() -> None:
    pool = ReceiveBuffers(keep_seconds=0.05)
    pool.recycle(pool.take(MB), [DONE])
    time.sleep(0.1)
    assert pool.take(MB // 2 + 1) is not None  # a take expires what is too old
    assert pool.spare_bytes == 0
    assert pool.allocated == 2 and pool.reused == 0
