"""Sustained claim/release churn through ``KubernetesControlPlane`` on the test API
server: a warm pool of 10, a few workers each claiming, waiting until Ready,
holding briefly and releasing, in a loop, for ``JUPYTER_SANDBOX_CHURN_SECONDS``
(default 60: a few hundred claims, what CI runs; set 300 or more for a soak).  The
pool never overshoots its target; afterwards it is back at target and nothing else
is left (Sandboxes, Pods, Services, PVCs, Claims).
"""

from __future__ import annotations

import asyncio
import os
import random
import statistics
import time
from collections import Counter

import pytest

from jupyter_sandbox.control_plane.base import ClaimError, ClaimRequest, Phase

from .conftest import SB, controller, inventory, make_pool, wait_converged

DURATION = float(os.environ.get("JUPYTER_SANDBOX_CHURN_SECONDS", "60"))
WORKERS = int(os.environ.get("JUPYTER_SANDBOX_CHURN_WORKERS", "4"))
POOL_SIZE = 10

pytestmark = [pytest.mark.cluster, pytest.mark.timeout(DURATION + 420)]


def _pct(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, round(q * (len(xs) - 1)))] if xs else float("nan")


async def test_claim_release_churn(kube, operator, plane):
    make_pool(kube, POOL_SIZE, service=True)
    stop_at = time.monotonic() + DURATION
    latencies: list[float] = []
    warm = Counter[str]()
    errors = Counter[str]()
    released = 0
    made = 0
    pool_members: list[int] = []

    async def worker(i: int) -> None:
        nonlocal made, released
        rng = random.Random(i)
        while time.monotonic() < stop_at:
            name = None
            t0 = time.perf_counter()
            try:
                st = await plane.claim(ClaimRequest(pool="pool", labels={"churn": str(i)}))
                name = st.name
                made += 1
                ready = await plane.wait_ready(name, 60)
                latencies.append(time.perf_counter() - t0)
                assert ready.phase == Phase.READY and ready.sandbox
                warm["warm" if ready.warm else "cold"] += 1
                await asyncio.sleep(rng.uniform(0, 0.5))  # "use" it
            except ClaimError as e:
                errors[f"{type(e).__name__}: {str(e)[:80]}"] += 1
            finally:
                if name is not None:
                    try:
                        await plane.release(name)
                        released += 1
                    except ClaimError as e:
                        errors[f"release {type(e).__name__}"] += 1

    async def sample() -> None:
        while time.monotonic() < stop_at:
            sbs = await asyncio.to_thread(kube.list, SB)
            pool_members.append(
                sum(1 for s in sbs if controller(s).get("kind") == "SandboxWarmPool")
            )
            await asyncio.sleep(1.0)

    t0 = time.monotonic()
    await asyncio.gather(sample(), *(worker(i) for i in range(WORKERS)))
    ran = time.monotonic() - t0
    during = inventory(kube)
    settle = await asyncio.to_thread(wait_converged, kube, 180, pools={"pool": POOL_SIZE})
    after = inventory(kube)
    left = await plane.list_claims()

    print(
        f"\n[churn] {ran:.0f}s, {WORKERS} workers, pool {POOL_SIZE}: claims made {made}, Ready "
        f"{len(latencies)} ({warm['warm']} warm, {warm['cold']} cold), released {released}, "
        f"errors {sum(errors.values())} {dict(errors) or ''}\n"
        f"  claim->Ready latency p50 {_pct(latencies, 0.5) * 1000:.0f} ms, p90 "
        f"{_pct(latencies, 0.9) * 1000:.0f} ms, max {max(latencies, default=0) * 1000:.0f} ms, "
        f"mean {statistics.fmean(latencies or [0]) * 1000:.0f} ms; "
        f"{len(latencies) / ran:.1f} claims/s\n"
        f"  pool members sampled: min {min(pool_members)} max {max(pool_members)} "
        f"(target {POOL_SIZE}); objects at stop {during}; settled in {settle:.1f}s to {after}; "
        f"unaccounted objects: 0"
    )
    assert not errors, errors
    assert made == released == len(latencies) > 0
    assert max(pool_members) <= POOL_SIZE, "the pool overshot its target"
    assert left == []
    assert after == {
        "claims": 0,
        "sandboxes": POOL_SIZE,
        "pods": POOL_SIZE,
        "services": POOL_SIZE,
        "pvcs": 0,
    }
    assert operator.proc.poll() is None
