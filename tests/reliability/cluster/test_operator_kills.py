"""Operator killed (SIGKILL) in the middle of suspend, resume, claim adoption and
pool refill/scale, restarted each time as a new process: the system converges.

After the last restart: no pod for a Suspended sandbox, no duplicate or orphaned
sandbox, pool exactly at target, every held claim Ready (or Suspended where it
was suspended); then, after releasing every claim, nothing but the pool is left.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import pytest

from jupyter_sandbox.control_plane.base import ClaimRequest, Phase

from .conftest import (
    POOL,
    SB,
    Kube,
    OperatorProc,
    controller,
    inventory,
    make_pool,
    wait_converged,
    wait_for,
)

pytestmark = pytest.mark.cluster

POOL_SIZE = 4


class Chaos:
    """The current operator process; ``strike`` kills it (SIGKILL) and starts the next."""

    def __init__(self, kube: Kube, factory: Callable[..., OperatorProc]) -> None:
        self.kube = kube
        self.factory = factory
        self.n = 0
        self.op = self._start()
        self.kills: list[dict[str, Any]] = []

    def _start(self) -> OperatorProc:
        op = self.factory(identity=f"op-{self.n}")
        self.n += 1
        return op

    def leading(self) -> None:
        """Wait until the current process leads and runs its controllers."""
        wait_for(lambda: "caches synced" in self.op.logs(), 60, 0.1, what="operator leading")

    def strike(self, what: str, delay: float, probe: Callable[[], str]) -> None:
        time.sleep(delay)
        self.op.kill()
        rc = self.op.proc.returncode if self.op.proc else None
        state = probe()  # what was still in flight when it died
        self.kills.append({"what": what, "delay": delay, "rc": rc, "state_at_kill": state})
        self.op = self._start()


def _pods_of(kube: Kube, names: list[str]) -> str:
    pods: Any = kube.pods()
    present = {p.metadata.name for p in pods}
    return f"pods present {sum(n in present for n in names)}/{len(names)}"


def _pool_state(kube: Kube) -> str:
    members = [s for s in kube.list(SB) if controller(s).get("kind") == "SandboxWarmPool"]
    st = (kube.get(POOL, "pool") or {}).get("status") or {}
    return f"pool members {len(members)}, ready {st.get('readyReplicas')}"


async def test_operator_sigkill_during_suspend_resume_and_refill(kube, operator_factory, plane):
    chaos = Chaos(kube, operator_factory)
    chaos.leading()
    make_pool(kube, POOL_SIZE)

    async def claim(i: int, wait: bool = True) -> str:
        st = await plane.claim(ClaimRequest(pool="pool", name=f"c{i}", labels={"n": str(i)}))
        if wait:
            await plane.wait_ready(st.name, 60)
        return st.name

    held = [await claim(i) for i in range(4)]
    sb = {c: (await plane.status(c)).sandbox for c in held}  # type: ignore[union-attr]
    suspended: set[str] = set()

    # 1. suspend two, kill at once (before the operator can have deleted the pods)
    chaos.leading()
    for c in ("c0", "c1"):
        await plane.suspend(c)
    suspended |= {"c0", "c1"}
    chaos.strike("suspend c0,c1", 0.0, lambda: _pods_of(kube, [sb["c0"], sb["c1"]]))

    # 2. resume one while the new operator is mid-way through its start-up work
    chaos.leading()
    await plane.resume("c0")
    suspended.discard("c0")
    chaos.strike("resume c0", 0.1, lambda: _pods_of(kube, [sb["c0"]]))

    # 3. suspend another, kill a little later
    chaos.leading()
    await plane.suspend("c2")
    suspended.add("c2")
    chaos.strike("suspend c2", 0.3, lambda: _pods_of(kube, [sb["c2"]]))

    # 4. two claims adopt pool members; kill during adoption and refill
    chaos.leading()
    held += [await claim(4, wait=False), await claim(5, wait=False)]
    chaos.strike("adopt c4,c5 + refill", 0.05, lambda: _pool_state(kube))

    # 5. pool scaled up 4 -> 6; kill during the refill
    chaos.leading()
    kube.patch(POOL, "pool", {"spec": {"replicas": 6}})
    chaos.strike("scale pool 4->6", 0.2, lambda: _pool_state(kube))

    # 6. resume and suspend at the same moment
    chaos.leading()
    await plane.resume("c1")
    await plane.suspend("c3")
    suspended.discard("c1")
    suspended.add("c3")
    chaos.strike("resume c1 + suspend c3", 0.02, lambda: _pods_of(kube, [sb["c1"], sb["c3"]]))

    # 7. release one, claim another; kill during deletion + adoption + refill
    chaos.leading()
    await plane.release("c4")
    held.remove("c4")
    held.append(await claim(6, wait=False))
    chaos.strike("release c4 + adopt c6", 0.15, lambda: _pool_state(kube))

    # 8. suspend again, and kill the next process too before it leads
    chaos.leading()
    await plane.suspend("c0")
    suspended.add("c0")
    chaos.strike("suspend c0", 0.0, lambda: _pods_of(kube, [sb["c0"]]))
    # and the next one 1 s after its start, still waiting for the dead holder's Lease
    chaos.strike("while waiting for the Lease", 1.0, lambda: _pods_of(kube, [sb["c0"]]))

    chaos.leading()
    took = wait_converged(kube, 120, pools={"pool": 6}, claims=held, suspended=suspended)
    # the backend agrees: Suspended ones are Suspended (no pod), the rest are Ready
    for c in held:
        if c in suspended:
            st = await plane.status(c)
            assert st is not None and st.phase == Phase.SUSPENDED, (c, st)
            assert st.resources.get("podIPs") == []
        else:
            st = await plane.wait_ready(c, 30)
            assert st.phase == Phase.READY, (c, st)
    # resuming a sandbox suspended across kills works
    await plane.resume("c2")
    await plane.wait_ready("c2", 60)
    suspended.discard("c2")
    inv = inventory(kube)

    # release everything: only the pool remains, nothing leaked
    for c in held:
        await plane.release(c)
    wait_converged(kube, 120, pools={"pool": 6})
    assert chaos.op.proc is not None and chaos.op.proc.poll() is None

    print(f"\n[operator kills] {len(chaos.kills)} SIGKILLs, converged {took:.1f}s after the last")
    for k in chaos.kills:
        print(f"  kill after {k['delay']:.2f}s during {k['what']!r}: {k['state_at_kill']}")
    print(f"  objects at convergence: {inv}; leftovers after release: 0")
    assert len(chaos.kills) == 9
    assert all(k["rc"] == -9 for k in chaos.kills)
