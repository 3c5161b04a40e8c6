"""The daemon's disk watch outlives a sandbox that stops while it is measured."""

from __future__ import annotations

import asyncio
from pathlib import Path

from jupyter_sandbox.control_plane.local.controller import LocalController
from jupyter_sandbox.control_plane.local.disk_usage import Usage
from jupyter_sandbox.control_plane.local.isolation import Isolation
from jupyter_sandbox.control_plane.local.model import PoolSpec, Sandbox


async def test_a_sandbox_gone_mid_measure_does_not_end_the_watch(tmp_path: Path) -> None:
    """Its /proc went between the listing and statvfs: FileNotFoundError ended the
    watch task, and no workspace was measured again (a full one never showed)."""
    controller = LocalController(tmp_path, Isolation("none", "test"), disk_check_seconds=0.01)
    controller.store.pools["p"] = PoolSpec(name="p", disk_mb=1)
    for name in ("gone", "full"):
        controller.store.sandboxes[name] = Sandbox(
            name=name, pool="p", workspace=str(tmp_path), runtime_dir="", owner=f"claim/{name}"
        )
        controller.processes[name] = object()  # type: ignore[assignment]
    calls: list[str] = []

    def measure(sandbox: Sandbox) -> Usage:
        calls.append(sandbox.name)
        if sandbox.name == "gone":
            raise FileNotFoundError(2, "No such file or directory", "/proc/1234/root/ws")
        return Usage(8 << 20, 3, True, True)

    controller._measure = measure  # type: ignore[method-assign]
    controller._touch = lambda *_: None  # type: ignore[method-assign]
    watch = asyncio.create_task(controller.watch_disk())
    try:
        for _ in range(200):
            await asyncio.sleep(0.01)
            if calls.count("full") >= 3:
                break
    finally:
        watch.cancel()
    assert calls.count("gone") >= 2, "measured again in the next rounds"
    assert controller.disk["full"].over(1 << 20)
