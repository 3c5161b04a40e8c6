"""Claim bursts: 200 concurrent claims against a warm pool of 100, with and
without the operator being killed mid-burst; and two replicas at once."""

from __future__ import annotations

import socket
import time
import urllib.request
from collections import Counter
from concurrent.futures import ThreadPoolExecutor

import pytest

from .conftest import CLAIM, POOL, SB, TPL, claim_body, is_ready, pool_body, template_body, wait_for

pytestmark = pytest.mark.cluster

N_POOL = 100
N_CLAIMS = 200


def _setup_pool(kube):
    kube.create(TPL, template_body("python"))
    kube.create(POOL, pool_body(replicas=N_POOL))
    t0 = time.monotonic()
    wait_for(
        lambda: kube.get(POOL, "pool").get("status", {}).get("readyReplicas") == N_POOL,
        240,
        1,
        what="pool ready",
    )
    fill = time.monotonic() - t0
    warm = {s["metadata"]["name"] for s in kube.list(SB)}
    assert len(warm) == N_POOL
    return warm, fill


def _create_claims(kube, prefix: str, n: int) -> float:
    t0 = time.monotonic()
    with ThreadPoolExecutor(16) as ex:
        list(ex.map(lambda i: kube.create(CLAIM, claim_body(f"{prefix}{i:03d}")), range(n)))
    return time.monotonic() - t0


def _all_ready(kube, n: int):
    claims = kube.list(CLAIM)
    ready = [c for c in claims if is_ready(c)]
    return claims if len(claims) == n and len(ready) == n else None


def _check_assignment(kube, claims, warm):
    by_uid = {c["metadata"]["uid"]: c for c in claims}
    sandboxes = kube.list(SB)
    owners = Counter()
    for sb in sandboxes:
        refs = [r for r in sb["metadata"].get("ownerReferences", []) if r.get("controller")]
        assert len(refs) == 1, sb["metadata"]
        if refs[0]["kind"] == "SandboxClaim":
            owners[refs[0]["uid"]] += 1
    # every claim owns exactly one sandbox; no sandbox has two owners
    assert set(owners) == set(by_uid), "claims without sandbox"
    assert max(owners.values()) == 1
    names = [c["status"]["sandbox"]["name"] for c in claims]
    assert len(set(names)) == len(names), "a sandbox was assigned twice"
    sb_by_name = {s["metadata"]["name"]: s for s in sandboxes}
    for c in claims:
        sb = sb_by_name[c["status"]["sandbox"]["name"]]
        assert sb["metadata"]["ownerReferences"][0]["uid"] == c["metadata"]["uid"]
    warm_adopted = [n for n in names if n in warm]
    cold = [
        n
        for n in names
        if sb_by_name[n]["metadata"]["labels"].get("agents.x-k8s.io/launch-type") == "cold"
    ]
    refill_adopted = len(names) - len(warm_adopted) - len(cold)
    return len(warm_adopted), len(cold), refill_adopted


def _delete_all_and_check_gc(kube, timeout=180):
    g, v, p = CLAIM
    kube.co.delete_collection_namespaced_custom_object(g, v, kube.ns, p)
    kube.patch(POOL, "pool", {"spec": {"replicas": 0}})
    wait_for(lambda: not kube.list(SB), timeout, 1, what="all sandboxes gone")
    wait_for(lambda: not kube.pods(), timeout, 1, what="all pods gone")
    wait_for(
        lambda: not kube.core.list_namespaced_service(kube.ns).items,
        timeout,
        1,
        what="all services gone",
    )


def test_200_claims_against_pool_of_100(kube, operator_factory):
    # hold refills while the burst drains the pool (upstream's replenish delay),
    # so the claims beyond the first 100 are served cold, deterministically
    op = operator_factory("--warm-pool-replenish-delay=10")
    warm, fill = _setup_pool(kube)
    create_s = _create_claims(kube, "c", N_CLAIMS)
    t0 = time.monotonic()
    claims = wait_for(lambda: _all_ready(kube, N_CLAIMS), 300, 0.5, what="all claims Ready")
    ready_s = time.monotonic() - t0 + create_s
    warm_n, cold_n, refill_n = _check_assignment(kube, claims, warm)
    print(
        f"\n[burst] pool fill {fill:.1f}s; {N_CLAIMS} claims created in {create_s:.1f}s; all Ready "
        f"{ready_s:.1f}s after the first create; warm(original pool)={warm_n} cold={cold_n} "
        f"warm(refilled members)={refill_n}"
    )
    assert warm_n == N_POOL, "every original warm sandbox must be adopted exactly once"
    assert (cold_n, refill_n) == (N_CLAIMS - N_POOL, 0)
    _delete_all_and_check_gc(kube)
    assert op.proc.poll() is None


def test_operator_killed_mid_burst_converges(kube, operator_factory):
    op = operator_factory(identity="first")
    warm, _ = _setup_pool(kube)
    with ThreadPoolExecutor(16) as ex:
        futs = [ex.submit(kube.create, CLAIM, claim_body(f"k{i:03d}")) for i in range(N_CLAIMS)]
        # kill once some claims are bound but most are not
        wait_for(
            lambda: (
                sum(1 for c in kube.list(CLAIM) if (c.get("status") or {}).get("sandbox")) >= 20
            ),
            60,
            0.1,
        )
        op.kill()
        for f in futs:
            f.result()
    bound_at_kill = sum(1 for c in kube.list(CLAIM) if (c.get("status") or {}).get("sandbox"))
    operator_factory(identity="second")
    claims = wait_for(
        lambda: _all_ready(kube, N_CLAIMS), 300, 0.5, what="all claims Ready after restart"
    )
    warm_n, cold_n, refill_n = _check_assignment(kube, claims, warm)
    print(
        f"\n[restart] bound at kill={bound_at_kill} warm={warm_n} cold={cold_n} refill={refill_n}"
    )
    assert warm_n == N_POOL
    # no orphans: every sandbox is owned by a claim or is a current pool member
    for sb in kube.list(SB):
        ref = sb["metadata"]["ownerReferences"][0]
        assert ref["kind"] in ("SandboxClaim", "SandboxWarmPool")
    _delete_all_and_check_gc(kube)


def test_two_replicas_one_leader_and_failover(kube, operator_factory):
    a = operator_factory(identity="replica-a")
    wait_for(lambda: "became leader" in a.logs(), 30, what="a leads")
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    b = operator_factory(f"--metrics-bind-address=127.0.0.1:{port}", identity="replica-b")

    def standby_ready() -> bool:
        # A Deployment of two replicas is Available only if the standby is ready too.
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/readyz", timeout=2) as r:
                return r.status == 200
        except OSError:
            return False

    wait_for(standby_ready, 30, what="the standby replica reports ready")
    kube.create(TPL, template_body("python"))
    kube.create(POOL, pool_body(replicas=5))
    wait_for(lambda: kube.get(POOL, "pool").get("status", {}).get("readyReplicas") == 5, 60)
    with ThreadPoolExecutor(8) as ex:
        list(ex.map(lambda i: kube.create(CLAIM, claim_body(f"h{i:02d}")), range(10)))
    time.sleep(1)
    assert "became leader" not in b.logs()
    a.kill()
    wait_for(lambda: "became leader" in b.logs(), 30, what="b takes over")
    claims = wait_for(lambda: _all_ready(kube, 10), 120, 0.5, what="claims Ready")
    names = [c["status"]["sandbox"]["name"] for c in claims]
    assert len(set(names)) == 10
    assert len(kube.list(SB)) == 15  # 10 claimed + 5 refilled, nothing doubled
