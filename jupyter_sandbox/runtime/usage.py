"""What the sandbox uses now: memory and CPU of the runtime's process tree.

The tree is the runtime, its kernel and whatever the kernel started (``!pip``,
subprocesses, a notebook's worker pool): everything the user's code can make
the sandbox spend.  CPU "now" is measured over a short window rather than since
the previous reading, so a dialog opened after an hour idle does not show the
hour's average.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

import psutil

WINDOW_SECONDS = 0.25


def _tree() -> list[psutil.Process]:
    root = psutil.Process()
    try:
        return [root, *root.children(recursive=True)]
    except psutil.Error:
        return [root]


def _totals(procs: list[psutil.Process]) -> tuple[int, float, int]:
    """(resident bytes, CPU seconds, processes alive) of ``procs``."""
    rss, cpu, alive = 0, 0.0, 0
    for proc in procs:
        try:
            with proc.oneshot():
                rss += proc.memory_info().rss
                times = proc.cpu_times()
                cpu += times.user + times.system
            alive += 1
        except psutil.Error:  # exited between listing and reading
            continue
    return rss, cpu, alive


async def read_usage(window: float = WINDOW_SECONDS) -> dict[str, Any]:
    """Memory in use (MB), CPU now (% of one core) and CPU used so far (s)."""
    procs = _tree()
    _, cpu_before, _ = _totals(procs)
    started = time.monotonic()
    await asyncio.sleep(window)
    rss, cpu_after, alive = _totals(procs)
    elapsed = time.monotonic() - started
    return {
        "memory_in_use_mb": round(rss / 1e6, 1),
        "cpu_percent": round(max(0.0, cpu_after - cpu_before) / elapsed * 100, 1),
        "cpu_seconds_used": round(cpu_after, 2),
        "processes": alive,
    }
