# ruff: noqa: F811 - the imported fixtures are used as parameters by name
"""Cluster-side reliability tests: the operator and the Kubernetes backend on the
real test control plane (``tests/cluster``), under operator kills, an API server
outage and sustained claim/release churn.

Fixtures are the operator tests' (a namespace per test, the operator as a
subprocess scoped to it); :func:`leftovers` is the shared end-of-test audit.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterable
from typing import Any

import pytest

from tests.operator.conftest import (  # noqa: F401 - fixtures are used by name
    CLAIM,
    POOL,
    SB,
    TPL,
    Kube,
    OperatorProc,
    api_client,
    cond,
    is_ready,
    kube,
    operator,
    operator_factory,
    pool_body,
    template_body,
    wait_for,
)

CONTROLLER_KINDS = ("SandboxClaim", "SandboxWarmPool")


def controller(obj: dict) -> dict:
    for ref in (obj.get("metadata") or {}).get("ownerReferences") or []:
        if ref.get("controller"):
            return ref
    return {}


def make_pool(k: Kube, replicas: int, name: str = "pool", **template_spec: Any) -> dict:
    """Template ``python`` and a warm pool of it, waited until every member is Ready."""
    k.create(TPL, template_body("python", **template_spec))
    k.create(POOL, pool_body(name, "python", replicas))
    return wait_for(
        lambda: (
            (p := k.get(POOL, name))
            and (p.get("status") or {}).get("readyReplicas") == replicas
            and p
        ),
        120,
        0.5,
        what=f"pool {name} with {replicas} ready members",
    )


def leftovers(
    k: Kube, pools: dict[str, int], claims: Iterable[str] = (), suspended: Iterable[str] = ()
) -> list[str]:
    """Every object in the namespace that is not accounted for, described.

    Accounted for: the ``claims`` the test still holds (each Ready, or its
    sandbox Suspended when listed in ``suspended``), exactly ``pools[name]``
    unclaimed members per pool, one Pod per Running sandbox and none per
    Suspended one, Services/PVCs owned by an existing sandbox.  Anything else
    (orphans, duplicates, a pod of a Suspended sandbox, a pool over or under
    target, an object still being deleted) is returned.
    """
    keep, want_suspended = set(claims), set(suspended)
    bad: list[str] = []
    all_claims = {c["metadata"]["name"]: c for c in k.list(CLAIM)}
    sandboxes = {s["metadata"]["name"]: s for s in k.list(SB)}
    core: Any = k.core
    all_pods: Any = k.pods()
    pods = {p.metadata.name: p for p in all_pods}
    services = {s.metadata.name: s for s in core.list_namespaced_service(k.ns).items}
    pvcs = {p.metadata.name: p for p in core.list_namespaced_persistent_volume_claim(k.ns).items}

    for name, c in all_claims.items():
        if name not in keep:
            bad.append(f"SandboxClaim/{name}: not held by the test")
        elif c["metadata"].get("deletionTimestamp"):
            bad.append(f"SandboxClaim/{name}: being deleted")
        elif name in want_suspended:
            pass  # Ready=False (the sandbox is suspended): checked on the sandbox below
        elif not is_ready(c):
            bad.append(f"SandboxClaim/{name}: not Ready {cond(c, 'Ready')}")
    for name in keep - set(all_claims):
        bad.append(f"SandboxClaim/{name}: missing")

    claim_uids = {c["metadata"]["uid"]: n for n, c in all_claims.items() if n in keep}
    members: dict[str, int] = {}
    owners_seen: dict[str, str] = {}
    for name, sb in sandboxes.items():
        ref = controller(sb)
        mode = (sb.get("spec") or {}).get("operatingMode", "Running")
        if sb["metadata"].get("deletionTimestamp"):
            bad.append(f"Sandbox/{name}: being deleted")
            continue
        if ref.get("kind") == "SandboxClaim" and ref.get("uid") in claim_uids:
            claim = claim_uids[ref["uid"]]
            if claim in owners_seen:
                bad.append(f"Sandbox/{name}: second sandbox of claim {claim}")
            owners_seen[claim] = name
            if claim in want_suspended:
                if mode != "Suspended" or cond(sb, "Suspended").get("status") != "True":
                    bad.append(f"Sandbox/{name}: should be Suspended ({mode}, {sb.get('status')})")
            elif not is_ready(sb) or mode != "Running":
                bad.append(f"Sandbox/{name}: claimed but not Ready/Running ({mode})")
        elif ref.get("kind") == "SandboxWarmPool" and ref.get("name") in pools:
            members[ref["name"]] = members.get(ref["name"], 0) + 1
            if not is_ready(sb):
                bad.append(f"Sandbox/{name}: pool member not Ready")
        else:
            bad.append(f"Sandbox/{name}: owned by {ref.get('kind')}/{ref.get('name')} (orphan)")
    for pool, target in pools.items():
        if members.get(pool, 0) != target:
            bad.append(f"SandboxWarmPool/{pool}: {members.get(pool, 0)} members, target {target}")
        pool_obj = k.get(POOL, pool)
        ready = ((pool_obj or {}).get("status") or {}).get("readyReplicas")
        if ready != target:
            bad.append(f"SandboxWarmPool/{pool}: status.readyReplicas={ready}, target {target}")

    for name, pod in pods.items():
        sb_of = sandboxes.get(name)
        refs = [r for r in pod.metadata.owner_references or [] if r.controller]
        if sb_of is None:
            bad.append(f"Pod/{name}: no sandbox")
        elif not refs or refs[0].uid != sb_of["metadata"]["uid"]:
            bad.append(f"Pod/{name}: not controlled by its sandbox")
        elif (sb_of.get("spec") or {}).get("operatingMode") == "Suspended":
            bad.append(f"Pod/{name}: running for a Suspended sandbox")
        elif pod.metadata.deletion_timestamp:
            bad.append(f"Pod/{name}: being deleted")
    for name, sb in sandboxes.items():
        mode = (sb.get("spec") or {}).get("operatingMode", "Running")
        if mode == "Running" and name not in pods and not sb["metadata"].get("deletionTimestamp"):
            bad.append(f"Sandbox/{name}: Running without a pod")
    for kind, objs in (("Service", services), ("PersistentVolumeClaim", pvcs)):
        for name, obj in objs.items():
            refs = [r for r in obj.metadata.owner_references or [] if r.controller]
            uids = {s["metadata"]["uid"] for s in sandboxes.values()}
            if not refs or refs[0].uid not in uids:
                bad.append(f"{kind}/{name}: not owned by an existing sandbox")
    return bad


def inventory(k: Kube) -> dict[str, int]:
    return {
        "claims": len(k.list(CLAIM)),
        "sandboxes": len(k.list(SB)),
        "pods": len(k.pods()),
        "services": len(k.core.list_namespaced_service(k.ns).items),
        "pvcs": len(k.core.list_namespaced_persistent_volume_claim(k.ns).items),
    }


def wait_converged(k: Kube, timeout: float, **kw: Any) -> float:
    """Wait until :func:`leftovers` is empty (and stays so for a second); returns seconds."""
    import time

    t0 = time.monotonic()
    last: list[str] = []
    while True:
        last = leftovers(k, **kw)
        if not last:
            time.sleep(1.0)
            last = leftovers(k, **kw)
            if not last:
                return time.monotonic() - t0
        if time.monotonic() - t0 > timeout:
            raise AssertionError(
                f"not converged after {timeout}s; unexpected objects:\n  " + "\n  ".join(last)
            )
        time.sleep(0.5)


@pytest.fixture
async def plane(kube: Kube, kube_cluster: Any) -> AsyncIterator[Any]:
    from jupyter_sandbox.control_plane.kubernetes import KubernetesControlPlane

    p = KubernetesControlPlane(namespace=kube.ns, kubeconfig=str(kube_cluster.kubeconfig))
    yield p
    await p.close()
