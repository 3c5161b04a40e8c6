"""Sandbox reconciler against the real API server (pods run under kwok)."""

from __future__ import annotations

import datetime as dt
import itertools
from collections.abc import Callable

import pytest

from .conftest import SB, cond, is_ready, sandbox_body, wait_for

pytestmark = pytest.mark.cluster


def fnv1a(s: str) -> str:
    h = 0x811C9DC5
    for b in s.encode():
        h = ((h ^ b) * 0x01000193) & 0xFFFFFFFF
    return f"{h:08x}"


def test_children_shape_ownership_and_ready(kube, operator, make_pv):
    make_pv()
    vct = {
        "metadata": {"name": "work"},
        "spec": {"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": "1Gi"}}},
    }
    sb = kube.create(SB, sandbox_body("sb1", service=True, volumeClaimTemplates=[vct]))
    uid = sb["metadata"]["uid"]
    h = fnv1a("sb1")

    s = wait_for(lambda: (x := kube.get(SB, "sb1")) and is_ready(x) and x, 60, what="Sandbox Ready")
    st = s["status"]
    assert st["podIPs"] and st["nodeName"] == "kwok-node-0"
    assert st["selector"] == f"agents.x-k8s.io/sandbox-name-hash={h}"
    assert st["service"] == "sb1"
    assert st["serviceFQDN"] == f"sb1.{kube.ns}.svc.cluster.local"
    assert cond(s, "Ready")["reason"] == "DependenciesReady"
    assert cond(s, "Suspended")["status"] == "False"
    assert cond(s, "PodScheduled")["status"] == "True"
    assert s["spec"]["operatingMode"] == "Running"  # CRD default
    assert s["spec"]["shutdownPolicy"] == "Retain"

    pod = kube.pod("sb1")
    assert pod.metadata.labels["agents.x-k8s.io/sandbox-name-hash"] == h
    assert pod.metadata.labels["app"] == "kernel"
    assert pod.metadata.annotations["example.com/a"] == "b"
    (ref,) = pod.metadata.owner_references
    assert (ref.kind, ref.name, ref.uid, ref.controller) == ("Sandbox", "sb1", uid, True)
    vols = {v.name: v for v in pod.spec.volumes or []}
    assert vols["work"].persistent_volume_claim.claim_name == "work-sb1"

    svc = kube.core.read_namespaced_service("sb1", kube.ns)
    assert svc.spec.cluster_ip == "None"
    assert svc.spec.selector == {"agents.x-k8s.io/sandbox-name-hash": h}
    assert [(p.port, p.name) for p in svc.spec.ports] == [(8888, "p-8888-tcp")]
    assert svc.metadata.owner_references[0].uid == uid

    pvc = kube.core.read_namespaced_persistent_volume_claim("work-sb1", kube.ns)
    assert pvc.metadata.owner_references[0].uid == uid
    assert pvc.metadata.labels["agents.x-k8s.io/sandbox-name-hash"] == h

    # volumeClaimTemplates are immutable (CEL rule in the CRD)
    from kubernetes.client.rest import ApiException

    with pytest.raises(ApiException) as ei:
        kube.patch(SB, "sb1", {"spec": {"volumeClaimTemplates": []}})
    assert ei.value.status == 422


def _watch_writes(kube, name: str, until: Callable[[dict], bool], timeout: float) -> list[dict]:
    """Every version of Sandbox ``name`` a watch sees until ``until`` holds."""
    from kubernetes import watch

    g, v, p = SB
    seen: list[dict] = []
    w = watch.Watch()
    for ev in w.stream(
        kube.co.list_namespaced_custom_object,
        g,
        v,
        kube.ns,
        p,
        field_selector=f"metadata.name={name}",
        timeout_seconds=int(timeout),
    ):
        seen.append(ev["object"])
        if until(ev["object"]):
            w.stop()
    return seen


def test_a_new_sandbox_is_written_as_upstream_writes_it(kube, operator):
    """Between creation and Ready the operator writes only status, and never the
    node name on its own (upstream defers it to the next status write): a write
    that upstream's controller does not make lands in a client's read-modify-write
    of a new Sandbox as a 409 (upstream's TestSandboxVolumeClaimTemplatesImmutable).
    """
    created = kube.create(SB, sandbox_body("writes"))
    versions = _watch_writes(kube, "writes", is_ready, 60)
    assert versions and is_ready(versions[-1]), "the Sandbox never became Ready"
    assert versions[0]["metadata"]["resourceVersion"] == created["metadata"]["resourceVersion"]
    for before, after in itertools.pairwise(versions):
        for part in ("spec", "metadata"):
            volatile = ("resourceVersion", "managedFields")
            a = {k: x for k, x in before[part].items() if k not in volatile}
            b = {k: x for k, x in after[part].items() if k not in volatile}
            assert a == b, f"the operator wrote the Sandbox's {part}: {a} -> {b}"
        old, new = before.get("status") or {}, after.get("status") or {}
        changed = {k for k in set(old) | set(new) if old.get(k) != new.get(k)}
        assert changed != {"nodeName"}, f"a write of the node name alone: {old} -> {new}"
    # creation, the first reconcile's conditions, then what the pod's progress brings:
    # bound and scheduled, then Ready (kwok may make the pod Ready at once)
    assert 3 <= len(versions) <= 4, [sorted(x.get("status") or {}) for x in versions]


def test_suspend_keeps_pvc_and_service_resume_recreates_pod(kube, operator, make_pv):
    make_pv()
    vct = {
        "metadata": {"name": "work"},
        "spec": {"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": "1Gi"}}},
    }
    kube.create(SB, sandbox_body("sus", service=True, volumeClaimTemplates=[vct]))
    wait_for(lambda: is_ready(kube.get(SB, "sus")), 60, what="Ready")
    uid1 = kube.pod("sus").metadata.uid

    kube.patch(SB, "sus", {"spec": {"operatingMode": "Suspended"}})
    s = wait_for(
        lambda: (x := kube.get(SB, "sus")) and cond(x, "Suspended").get("status") == "True" and x,
        60,
        what="Suspended",
    )
    assert cond(s, "Ready")["reason"] == "SandboxSuspended"
    assert "podIPs" not in s["status"] and "nodeName" not in s["status"]
    wait_for(lambda: kube.pod("sus") is None, 30, what="pod gone")
    assert kube.core.read_namespaced_service("sus", kube.ns)
    assert kube.core.read_namespaced_persistent_volume_claim("work-sus", kube.ns)

    kube.patch(SB, "sus", {"spec": {"operatingMode": "Running"}})
    s = wait_for(lambda: (x := kube.get(SB, "sus")) and is_ready(x) and x, 60, what="Ready again")
    assert cond(s, "Suspended")["reason"] == "NotSuspended"
    pod = kube.pod("sus")
    assert pod.metadata.uid != uid1
    assert pod.spec.volumes[0].persistent_volume_claim.claim_name == "work-sus"


@pytest.mark.parametrize("policy", ["Retain", "Delete"])
def test_shutdown_time(kube, operator, policy):
    when = (dt.datetime.now(dt.UTC) + dt.timedelta(seconds=4)).strftime("%Y-%m-%dT%H:%M:%SZ")
    kube.create(SB, sandbox_body("exp", service=True, shutdownTime=when, shutdownPolicy=policy))
    wait_for(lambda: is_ready(kube.get(SB, "exp")), 60, what="Ready")
    if policy == "Retain":
        s = wait_for(
            lambda: (
                (x := kube.get(SB, "exp"))
                and cond(x, "Ready").get("reason") == "SandboxExpired"
                and x
            ),
            30,
            what="expired",
        )
        assert "podIPs" not in s["status"]
        wait_for(lambda: kube.pod("exp") is None, 30, what="pod deleted")
        svcs = [s.metadata.name for s in kube.core.list_namespaced_service(kube.ns).items]
        wait_for(
            lambda: (
                "exp"
                not in [s.metadata.name for s in kube.core.list_namespaced_service(kube.ns).items]
            ),
            30,
            what=f"service deleted {svcs}",
        )
        assert kube.get(SB, "exp") is not None
    else:
        wait_for(lambda: kube.get(SB, "exp") is None, 30, what="sandbox deleted")
        wait_for(lambda: kube.pod("exp") is None, 30, what="pod garbage-collected")


def test_foreign_pod_gets_condition_not_crash(kube, operator):
    # a pod with the sandbox's name that someone else owns: clear reason + Event
    kube.core.create_namespaced_pod(
        kube.ns,
        {"metadata": {"name": "taken"}, "spec": {"containers": [{"name": "c", "image": "x"}]}},
    )
    kube.create(SB, sandbox_body("taken"))
    s = wait_for(
        lambda: (
            (x := kube.get(SB, "taken")) and cond(x, "Ready").get("reason") == "ChildConflict" and x
        ),
        30,
        what="ChildConflict",
    )
    assert "cannot adopt unowned pod" in cond(s, "Ready")["message"]
    wait_for(
        lambda: any(e.reason == "ChildConflict" for e in kube.events("taken")), 30, what="Event"
    )
    assert operator.proc.poll() is None


def test_a_foreign_pod_of_the_same_name_blocks_suspension_and_is_left_alone(kube, operator):
    # Upstream's TestSandboxSuspensionBlockedByUnownedPodConflict: the pod has no
    # labels, so no label-filtered pod cache can see it.
    from jupyter_sandbox.agent_sandbox import NAME_HASH_LABEL, name_hash

    kube.core.create_namespaced_pod(
        kube.ns,
        {"metadata": {"name": "clash"}, "spec": {"containers": [{"name": "c", "image": "x"}]}},
    )
    kube.create(SB, sandbox_body("clash", service=True, operatingMode="Suspended"))
    s = wait_for(
        lambda: (
            (x := kube.get(SB, "clash"))
            and cond(x, "Suspended").get("reason") == "PodNotOwned"
            and x
        ),
        30,
        what="PodNotOwned",
    )
    conditions = {
        c["type"]: (c["status"], c["reason"], c["message"], c.get("observedGeneration"))
        for c in s["status"]["conditions"]
    }
    assert conditions == {
        "Suspended": (
            "False",
            "PodNotOwned",
            "Refused to delete pod because it is not owned by this sandbox",
            1,
        ),
        "Ready": ("False", "SandboxSuspended", "Sandbox is suspending", 1),
    }
    assert s["status"]["selector"] == f"{NAME_HASH_LABEL}={name_hash('clash')}"
    assert s["status"]["service"] == "clash"
    assert s["status"]["serviceFQDN"] == f"clash.{kube.ns}.svc.cluster.local"
    assert kube.pod("clash") is not None, "the operator deleted a pod it does not own"

    # Once the foreign pod is gone (outside the operator's pod watch), suspension
    # completes without any change to the Sandbox.
    kube.core.delete_namespaced_pod("clash", kube.ns, grace_period_seconds=0)
    wait_for(lambda: kube.pod("clash") is None, 30, what="foreign pod gone")
    s = wait_for(
        lambda: (x := kube.get(SB, "clash")) and cond(x, "Suspended").get("status") == "True" and x,
        30,
        what="Suspended once the pod is gone",
    )
    assert cond(s, "Suspended")["reason"] == "PodTerminated"
    assert cond(s, "Ready")["message"] == "Sandbox is suspended"
    assert operator.proc.poll() is None
