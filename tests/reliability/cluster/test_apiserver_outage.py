"""The kube-apiserver is stopped for 30 s (etcd and everything else keep running)
and started again on the same port with the same certificates.

- The operator backs off and recovers.  Two are run, each in its own namespace,
  under a supervisor that restarts an exited process the way a Deployment's
  kubelet would: with leader election (the deployed default) it exits exactly
  once, on purpose, when Lease renewal misses its deadline (client-go
  semantics: a replica that may have lost the Lease must stop acting on it), the
  restarted process waits out the rest of the outage without exiting again and
  converges; without leader election it never exits.  Both retry with capped
  exponential backoff, which is counted from their logs.
- ``KubernetesControlPlane`` calls fail fast with ``BackendUnavailable`` during
  the outage (a ``wait_ready`` in flight too) and work again afterwards; claims
  made before the outage keep their sandbox and pod.

``JUPYTER_SANDBOX_OUTAGE_SECONDS`` changes the 30 s.
"""

from __future__ import annotations

import asyncio
import os
import signal
import threading
import time
import uuid
from pathlib import Path
from typing import Any

import pytest

from jupyter_sandbox.control_plane.base import BackendUnavailable, ClaimRequest, Phase
from jupyter_sandbox.control_plane.kubernetes import KubernetesControlPlane

from .conftest import Kube, OperatorProc, inventory, make_pool, wait_converged, wait_for

pytestmark = pytest.mark.cluster

OUTAGE = float(os.environ.get("JUPYTER_SANDBOX_OUTAGE_SECONDS", "30"))


class Supervisor:
    """Restarts an operator that exited (restartPolicy: Always, 1 s back-off)."""

    def __init__(self, kubeconfig: Path, ns: str, logdir: Path, *extra: str) -> None:
        self.kubeconfig, self.ns, self.logdir, self.extra = kubeconfig, ns, logdir, extra
        self.exits: list[tuple[float, int | None]] = []
        self.procs: list[OperatorProc] = []
        self._stop = threading.Event()
        self._start()
        self._thread = threading.Thread(target=self._loop, daemon=True)
        self._thread.start()

    def _start(self) -> None:
        p = OperatorProc(
            self.kubeconfig,
            self.ns,
            self.logdir / f"operator-{self.ns}-{len(self.procs)}.log",
            list(self.extra),
            f"{self.ns}-{len(self.procs)}",
        )
        self.procs.append(p.start())

    @property
    def current(self) -> OperatorProc:
        return self.procs[-1]

    def _loop(self) -> None:
        while not self._stop.wait(0.2):
            proc = self.current.proc
            assert proc is not None
            if proc.poll() is not None:
                self.exits.append((time.monotonic(), proc.returncode))
                time.sleep(1.0)
                self._start()

    def logs(self) -> str:
        return "".join(p.logs() for p in self.procs if p.log_path.exists())

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(5)
        for p in self.procs:
            p.stop()


async def _expect_unavailable(what: str, coro: Any, log: list[dict[str, Any]]) -> None:
    t0 = time.monotonic()
    try:
        await coro
    except BackendUnavailable as e:
        log.append({"call": what, "seconds": time.monotonic() - t0, "error": str(e)})
        return
    raise AssertionError(f"{what} did not fail with BackendUnavailable during the outage")


async def test_apiserver_unavailable_30s(kube_cluster, kube, plane, tmp_path):
    cp = kube_cluster.controlplane
    if cp is None:
        pytest.skip("an external cluster: its API server cannot be stopped from here")
    from kubernetes import client

    # namespace A: operator with leader election; namespace B: without
    ns_b = f"t-{uuid.uuid4().hex[:8]}"
    core: Any = client.CoreV1Api(kube.api_client)
    core.create_namespace({"metadata": {"name": ns_b}})
    wait_for(lambda: core.read_namespaced_service_account("default", ns_b), 30)
    kube_b = Kube(kube.api_client, ns_b)
    sup_a = Supervisor(kube_cluster.kubeconfig, kube.ns, tmp_path)
    sup_b = Supervisor(kube_cluster.kubeconfig, ns_b, tmp_path, "--no-leader-elect")
    plane_b = KubernetesControlPlane(namespace=ns_b, kubeconfig=str(kube_cluster.kubeconfig))
    try:
        await _run(cp, kube, kube_b, plane, plane_b, sup_a, sup_b)
    finally:
        sup_a.stop()
        sup_b.stop()
        await plane_b.close()
        try:
            core.delete_namespace(ns_b)
        except Exception:
            pass


async def _run(cp, kube, kube_b, plane, plane_b, sup_a, sup_b) -> None:
    for k in (kube, kube_b):
        make_pool(k, 3)
    held: dict[str, tuple[Any, list[str]]] = {}
    for p, names in ((plane, ["a0", "a1", "a2"]), (plane_b, ["b0", "b1"])):
        for n in names:
            await p.claim(ClaimRequest(pool="pool", name=n))
            await p.wait_ready(n, 60)
        held[p.namespace] = (p, names)
    before = {
        n: (st.sandbox, kube_pod_uid(k, st.sandbox))
        for p, k in ((plane, kube), (plane_b, kube_b))
        for n in held[p.namespace][1]
        if (st := await p.status(n)) is not None
    }
    # a suspended one, whose wait_ready is in flight when the API server goes away
    await plane.suspend("a2")
    wait_for(lambda: kube.pod(before["a2"][0]) is None, 30, what="a2 suspended")
    in_flight = asyncio.create_task(plane.wait_ready("a2", OUTAGE + 120))
    await asyncio.sleep(0.5)

    # ---- outage
    lines_before = {s.ns: len(s.logs().splitlines()) for s in (sup_a, sup_b)}
    t_down = time.monotonic()
    cp.stop_component("kube-apiserver", signal.SIGKILL)
    errors: list[dict[str, Any]] = []
    try:
        await _expect_unavailable("wait_ready (in flight)", in_flight, errors)
        rounds = 0
        while time.monotonic() - t_down < OUTAGE - 2:
            rounds += 1
            await _expect_unavailable("status", plane.status("a0"), errors)
            await _expect_unavailable("claim", plane.claim(ClaimRequest(pool="pool")), errors)
            await _expect_unavailable("wait_ready", plane.wait_ready("a1", 30), errors)
            await _expect_unavailable("suspend", plane.suspend("a1"), errors)
            await _expect_unavailable("release", plane.release("a0"), errors)
            await _expect_unavailable("list_pools", plane_b.list_pools(), errors)
            await asyncio.sleep(min(5.0, max(0.0, OUTAGE - 2 - (time.monotonic() - t_down))))
        await asyncio.sleep(max(0.0, OUTAGE - (time.monotonic() - t_down)))
    finally:
        down_for = time.monotonic() - t_down
        await asyncio.to_thread(cp.start_component, "kube-apiserver")
    t_up = time.monotonic()
    lines_outage = {s.ns: s.logs().splitlines()[lines_before[s.ns] :] for s in (sup_a, sup_b)}

    # ---- after: every component is back, old claims are still served
    assert all(p.poll() is None for p in cp.procs.values()), "a control-plane process died"
    for p, k in ((plane, kube), (plane_b, kube_b)):
        for n in held[p.namespace][1]:
            if n == "a2":
                continue
            st = await wait_ok(lambda p=p, n=n: p.wait_ready(n, 60))
            assert st.phase == Phase.READY
            assert (st.sandbox, kube_pod_uid(k, st.sandbox)) == before[n], f"{n} changed"
    first_ok = time.monotonic() - t_up
    st = await plane.resume("a2")
    st = await plane.wait_ready("a2", 90)
    assert st.phase == Phase.READY and st.sandbox == before["a2"][0]
    for p, extra in ((plane, "a3"), (plane_b, "b2")):
        await p.claim(ClaimRequest(pool="pool", name=extra))
        await p.wait_ready(extra, 90)
        held[p.namespace][1].append(extra)
    converged = {}
    for k, p in ((kube, plane), (kube_b, plane_b)):
        converged[k.ns] = wait_converged(k, 120, pools={"pool": 3}, claims=held[p.namespace][1])
    inv = {k.ns: inventory(k) for k in (kube, kube_b)}

    # ---- the operators: restarts, back-off
    wait_for(lambda: "caches synced" in sup_a.current.logs(), 60, what="A leads again")
    retries = {
        ns: sum(1 for ln in lines if "watch failed" in ln or "attempt failed" in ln)
        for ns, lines in lines_outage.items()
    }
    by_call: dict[str, list[float]] = {}
    for e in errors:
        by_call.setdefault(e["call"], []).append(e["seconds"])
    print(
        f"\n[apiserver outage] down {down_for:.1f}s; backend calls failed with "
        f"BackendUnavailable: {len(errors)} ("
        + ", ".join(f"{c} x{len(v)} max {max(v):.2f}s" for c, v in by_call.items())
        + f"); e.g. {errors[1]['error']!r}\n"
        f"  after restart: held claims served again in {first_ok:.1f}s, converged "
        f"{ {ns: round(s, 1) for ns, s in converged.items()} }, objects {inv}\n"
        f"  operator with leader election: exits {sup_a.exits and [rc for _, rc in sup_a.exits]}"
        f" (restarts {len(sup_a.exits)}), API retries logged during the outage "
        f"{retries[kube.ns]}\n"
        f"  operator without leader election: restarts {len(sup_b.exits)}, API retries "
        f"logged {retries[kube_b.ns]}"
    )
    assert by_call.keys() >= {"wait_ready (in flight)", "status", "claim", "list_pools"}
    assert max(e["seconds"] for e in errors) < 15, "a call hung instead of failing fast"
    assert [rc for _, rc in sup_a.exits] == [1], "leader-elected operator: exactly one exit"
    assert sup_a.exits[0][0] - t_down < 10, "it gave up leadership within the renew deadline"
    assert sup_b.exits == [], "without leader election the operator never exits"
    for ns, count in retries.items():
        # capped exponential back-off: 8 informers retrying for 30 s, not a hot loop
        assert count < 40 * OUTAGE / 30 * 8, (ns, count)
    leaked = sum(1 for c in await plane.list_claims() if c.name not in held[kube.ns][1])
    assert leaked == 0


def kube_pod_uid(k: Kube, name: str | None) -> str | None:
    pod = k.pod(name) if name else None
    return pod.metadata.uid if pod is not None else None


async def wait_ok(fn: Any, timeout: float = 60) -> Any:
    """Retry a backend call until it stops raising BackendUnavailable."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            return await fn()
        except BackendUnavailable:
            if time.monotonic() > deadline:
                raise
            await asyncio.sleep(0.5)
