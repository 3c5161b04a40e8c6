"""Kernel variables across a suspend: what saving costs the suspend, what it saves the resume.

For namespaces of several sizes (numpy arrays where numpy is installed, else
random bytes), each measured beside its baseline in the same run:

- suspend: from the suspend request to the sandbox's compute released, saving
  the variables, against the same suspend with saving turned off for the pool;
- resume to first result: from running a cell that uses the variables in the
  suspended kernel to its reply, against what a user without saved state does
  after the resume: run the cell that built them again, then the same cell.
"""

from __future__ import annotations

import time
from typing import Any

from jupyter_sandbox.control_plane.local.client import LocalControlPlane

from .kernels import SANDBOX, _wait_phase, start_ready, stop, wait_pool_warm
from .stats import Figure, Series

POOL = "bench"

BUILD = """
try:
    import numpy as np
    data = np.random.default_rng(0).random({size} // 8)
except ImportError:
    import os
    data = os.urandom({size})
"""
USE = "print(len(data))"


async def _run(kc: Any, code: str) -> None:
    reply = await kc.execute_interactive(code, timeout=600, output_hook=lambda _: None)
    if reply["content"]["status"] != "ok":
        raise RuntimeError(f"benchmark cell failed: {reply['content']}")


async def _suspend(plane: LocalControlPlane, km: Any) -> float:
    claim = km.provisioner.session.claim_name
    started = time.perf_counter()
    await km.provisioner.suspend()
    await _wait_phase(plane, claim, "Suspended")
    return time.perf_counter() - started


async def _one(plane: LocalControlPlane, size: int, save: bool) -> tuple[float, float]:
    """(suspend seconds, resume-to-first-result seconds) for one kernel."""
    await plane.apply_pool(POOL, {"replicas": 2, "save_state": save, "state_max_mb": 2048})
    await wait_pool_warm(plane, POOL)
    _, km, kc = await start_ready(SANDBOX)
    try:
        await wait_pool_warm(plane, POOL)  # the replacement starts beside nothing
        await _run(kc, BUILD.format(size=size))
        suspended = await _suspend(plane, km)
        started = time.perf_counter()
        # With the state saved the variables are there; without, the cell that
        # built them has to run again first.
        await _run(kc, USE if save else BUILD.format(size=size) + USE)
        return suspended, time.perf_counter() - started
    finally:
        await stop(km, kc)


async def state_figures(plane: LocalControlPlane, sizes_mb: list[int], reps: int) -> list[Figure]:
    figures: list[Figure] = []
    try:
        for mb in sizes_mb:
            size = mb * 1_000_000
            saved = (Series("saving the variables", "s"), Series("saved, then the cell", "s"))
            plain = (Series("not saving", "s"), Series("rebuilt, then the cell", "s"))
            for _ in range(reps):  # interleaved, so drift hits both alike
                for save, series in ((True, saved), (False, plain)):
                    suspend_s, resume_s = await _one(plane, size, save)
                    series[0].values.append(suspend_s)
                    series[1].values.append(resume_s)
            pause_rate = saved[0].median / (mb / 1000)
            figures.append(
                Figure(
                    f"suspend with a {mb} MB namespace",
                    saved[0],
                    plain[0],
                    "<= 4 s/GB saved (E2B's pause)",
                    notes=f"{pause_rate:.2f} s/GB",
                )
            )
            figures.append(
                Figure(
                    f"resume to first result, {mb} MB namespace",
                    saved[1],
                    plain[1],
                    "<= 1.5 s at 100 MB",
                )
            )
    finally:
        await plane.apply_pool(POOL, {"replicas": 2})
    return figures
