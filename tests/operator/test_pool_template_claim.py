"""SandboxTemplate, SandboxWarmPool and SandboxClaim reconcilers on real objects."""

from __future__ import annotations

import pytest

from .conftest import (
    CLAIM,
    POOL,
    SB,
    TPL,
    claim_body,
    cond,
    is_ready,
    pool_body,
    template_body,
    wait_for,
)

pytestmark = pytest.mark.cluster

TREF = "agents.x-k8s.io/sandbox-template-ref-hash"
POOL_LABEL = "agents.x-k8s.io/warm-pool-sandbox"


def pool_members(kube, pool="pool"):
    from jupyter_sandbox.agent_sandbox import name_hash

    return kube.list(SB, label_selector=f"{POOL_LABEL}={name_hash(pool)}")


def test_template_network_policy_and_secure_defaults(kube, operator):
    from jupyter_sandbox.agent_sandbox import name_hash

    kube.create(TPL, template_body("python"))
    np = wait_for(
        lambda: kube.net.read_namespaced_network_policy("python-network-policy", kube.ns),
        30,
        what="NetworkPolicy",
    )
    t = kube.get(TPL, "python")
    assert t["metadata"]["labels"][TREF] == name_hash("python")
    assert np.metadata.owner_references[0].uid == t["metadata"]["uid"]
    assert np.spec.pod_selector.match_labels == {TREF: name_hash("python")}
    assert sorted(np.spec.policy_types) == ["Egress", "Ingress"]
    (ing,) = np.spec.ingress
    (peer,) = ing._from
    assert peer.namespace_selector.match_labels == {
        "kubernetes.io/metadata.name": "agent-sandbox-system"
    }
    assert peer.pod_selector.match_labels == {"app": "sandbox-router"}
    (eg,) = np.spec.egress
    v4, v6 = eg.to
    assert v4.ip_block.cidr == "0.0.0.0/0"
    assert set(v4.ip_block._except) == {
        "10.0.0.0/8",
        "172.16.0.0/12",
        "192.168.0.0/16",
        "169.254.0.0/16",
    }
    assert v6.ip_block.cidr == "::/0" and set(v6.ip_block._except) == {"fc00::/7", "fe80::/10"}
    wait_for(
        lambda: cond(kube.get(TPL, "python"), "Ready").get("reason") == "NetworkPolicyReady", 30
    )

    # drift is repaired
    kube.net.patch_namespaced_network_policy(
        "python-network-policy", kube.ns, {"spec": {"egress": []}}
    )
    wait_for(
        lambda: (
            kube.net.read_namespaced_network_policy("python-network-policy", kube.ns).spec.egress
        ),
        30,
        what="egress restored",
    )

    # pool sandboxes get secure defaults and the template label on their pods
    kube.create(POOL, pool_body(replicas=1))
    (sb,) = wait_for(lambda: pool_members(kube), 30, what="pool member")
    pspec = sb["spec"]["podTemplate"]["spec"]
    assert pspec["automountServiceAccountToken"] is False
    assert pspec["dnsPolicy"] == "None" and pspec["dnsConfig"]["nameservers"] == [
        "8.8.8.8",
        "1.1.1.1",
    ]
    pod = wait_for(lambda: kube.pod(sb["metadata"]["name"]), 30, what="pod")
    assert pod.spec.automount_service_account_token is False
    assert pod.metadata.labels[TREF] == name_hash("python")

    # Unmanaged removes our policy
    kube.patch(TPL, "python", {"spec": {"networkPolicyManagement": "Unmanaged"}})
    wait_for(
        lambda: not kube.net.list_namespaced_network_policy(kube.ns).items,
        30,
        what="policy removed",
    )


def test_pool_fills_scales_and_reports(kube, operator):
    from jupyter_sandbox.agent_sandbox import name_hash

    kube.create(TPL, template_body("python"))
    kube.create(POOL, pool_body(replicas=3))
    p = wait_for(
        lambda: (
            (x := kube.get(POOL, "pool")) and x.get("status", {}).get("readyReplicas") == 3 and x
        ),
        60,
        what="3 ready",
    )
    assert p["status"]["replicas"] == 3
    assert p["status"]["selector"] == f"{POOL_LABEL}={name_hash('pool')}"
    members = pool_members(kube)
    assert len(members) == 3
    for m in members:
        assert m["metadata"]["name"].startswith("pool-")
        ref = m["metadata"]["ownerReferences"][0]
        assert ref["kind"] == "SandboxWarmPool" and ref["controller"] is True
        assert m["metadata"]["labels"]["agents.x-k8s.io/launch-type"] == "warm"

    # scale subresource (what `kubectl scale` and an HPA use)
    g, v, plural = POOL
    scale = kube.co.get_namespaced_custom_object_scale(g, v, kube.ns, plural, "pool")
    assert scale["spec"]["replicas"] == 3 and scale["status"]["replicas"] == 3
    assert scale["status"]["selector"] == f"{POOL_LABEL}={name_hash('pool')}"
    kube.co.patch_namespaced_custom_object_scale(
        g, v, kube.ns, plural, "pool", {"spec": {"replicas": 1}}
    )
    wait_for(
        lambda: (
            len([m for m in pool_members(kube) if not m["metadata"].get("deletionTimestamp")]) == 1
        ),
        30,
        what="scaled down",
    )
    kube.co.patch_namespaced_custom_object_scale(
        g, v, kube.ns, plural, "pool", {"spec": {"replicas": 2}}
    )
    wait_for(
        lambda: kube.get(POOL, "pool")["status"].get("readyReplicas") == 2, 60, what="scaled up"
    )


def test_pool_update_strategy_recreate(kube, operator):
    kube.create(TPL, template_body("python"))
    kube.create(POOL, pool_body(replicas=2, updateStrategy={"type": "Recreate"}))
    kube.create(POOL, pool_body(name="lazy", replicas=1))  # OnReplenish (default)
    wait_for(lambda: kube.get(POOL, "pool").get("status", {}).get("readyReplicas") == 2, 60)
    wait_for(lambda: kube.get(POOL, "lazy").get("status", {}).get("readyReplicas") == 1, 60)
    old = {m["metadata"]["name"] for m in pool_members(kube)}
    lazy_old = {m["metadata"]["name"] for m in pool_members(kube, "lazy")}
    kube.patch(
        TPL,
        "python",
        {
            "spec": {
                "podTemplate": {"spec": {"containers": [{"name": "runtime", "image": "new:2"}]}}
            }
        },
    )

    def replaced():
        cur = [m for m in pool_members(kube) if not m["metadata"].get("deletionTimestamp")]
        return (
            len(cur) == 2
            and not ({m["metadata"]["name"] for m in cur} & old)
            and all(
                m["spec"]["podTemplate"]["spec"]["containers"][0]["image"] == "new:2" for m in cur
            )
        )

    wait_for(replaced, 60, what="stale members recreated")
    assert {m["metadata"]["name"] for m in pool_members(kube, "lazy")} == lazy_old


def assert_first_observed(claim: dict, since: float) -> None:
    """Upstream's TestSandboxClaimObservabilityAnnotation: RFC 3339 with nanoseconds,
    not before the claim was made."""
    import datetime as dt

    stamp = claim["metadata"]["annotations"]["agents.x-k8s.io/controller-first-observed-at"]
    seconds, _, rest = stamp.partition(".")
    digits = rest.rstrip("Z")
    assert stamp.endswith("Z") and digits.isdigit() and len(digits) <= 9, stamp
    assert int(digits.ljust(9, "0")) != 0, stamp
    observed = dt.datetime.fromisoformat(seconds + "+00:00").timestamp() + int(digits) / 10 ** len(
        digits
    )
    assert observed >= since - 1.0, (stamp, since)  # clocks of one machine; 1 s for rounding


def test_claim_adopts_warm_then_pool_refills_and_delete_cascades(kube, operator):
    import time

    started = time.time()
    kube.create(TPL, template_body("python"))
    kube.create(POOL, pool_body(replicas=2))
    wait_for(lambda: kube.get(POOL, "pool").get("status", {}).get("readyReplicas") == 2, 60)
    warm = {m["metadata"]["name"] for m in pool_members(kube)}

    kube.create(CLAIM, claim_body("c1", additionalPodMetadata={"labels": {"user": "alice"}}))
    c = wait_for(lambda: (x := kube.get(CLAIM, "c1")) and is_ready(x) and x, 30, what="claim Ready")
    name = c["status"]["sandbox"]["name"]
    assert name in warm
    assert c["status"]["sandbox"]["podIPs"]
    assert c["metadata"]["annotations"]["agents.x-k8s.io/sandbox-name"] == name
    sb = kube.get(SB, name)
    assert "serviceFQDN" not in c["status"]["sandbox"]  # no Service yet
    (ref,) = sb["metadata"]["ownerReferences"]
    assert (ref["kind"], ref["uid"]) == ("SandboxClaim", c["metadata"]["uid"])
    assert POOL_LABEL not in sb["metadata"]["labels"]
    assert sb["metadata"]["labels"]["agents.x-k8s.io/claim-uid"] == c["metadata"]["uid"]
    wait_for(lambda: POOL_LABEL not in kube.pod(name).metadata.labels, 30, what="pod relabelled")
    assert kube.pod(name).metadata.labels["user"] == "alice"
    assert any(e.reason == "SandboxAdopted" for e in kube.events("c1"))
    assert_first_observed(c, since=started)

    # the Sandbox's Service name is mirrored into the claim, as upstream does
    kube.patch(SB, name, {"spec": {"service": True}})
    fqdn = f"{name}.{kube.ns}.svc.cluster.local"
    wait_for(
        lambda: (
            (kube.get(CLAIM, "c1").get("status") or {}).get("sandbox", {}).get("serviceFQDN")
            == fqdn
        ),
        30,
        what="serviceFQDN on the claim",
    )

    # refill
    wait_for(
        lambda: kube.get(POOL, "pool")["status"].get("readyReplicas") == 2, 60, what="refilled"
    )
    assert len(pool_members(kube)) == 2

    # cold start when env is set (template must allow it)
    kube.patch(TPL, "python", {"spec": {"envVarsInjectionPolicy": "Allowed"}})
    kube.create(CLAIM, claim_body("c2", env=[{"name": "FOO", "value": "bar"}]))
    c2 = wait_for(
        lambda: (x := kube.get(CLAIM, "c2")) and is_ready(x) and x, 60, what="cold claim Ready"
    )
    assert c2["status"]["sandbox"]["name"] == "c2"
    sb2 = kube.get(SB, "c2")
    assert sb2["metadata"]["labels"]["agents.x-k8s.io/launch-type"] == "cold"
    assert {"name": "FOO", "value": "bar"} in sb2["spec"]["podTemplate"]["spec"]["containers"][0][
        "env"
    ]
    assert_first_observed(c2, since=started)

    # deleting the claim deletes sandbox, pod, service (garbage collector)
    kube.delete(CLAIM, "c1")
    wait_for(lambda: kube.get(SB, name) is None, 60, what="adopted sandbox collected")
    wait_for(lambda: kube.pod(name) is None, 60, what="pod collected")


def test_bad_claims_get_conditions_and_events(kube, operator):
    kube.create(CLAIM, claim_body("nopool", pool="missing"))
    c = wait_for(
        lambda: (
            (x := kube.get(CLAIM, "nopool"))
            and cond(x, "Ready").get("reason") == "WarmPoolNotFound"
            and x
        ),
        30,
    )
    assert cond(c, "Ready")["status"] == "False"
    wait_for(
        lambda: any(
            e.reason == "WarmPoolNotFound" and e.type == "Warning" for e in kube.events("nopool")
        ),
        30,
    )
    c = kube.get(CLAIM, "nopool")
    assert "agents.x-k8s.io/controller-first-observed-at" in c["metadata"]["annotations"]

    kube.create(POOL, pool_body(name="orphanpool", template="nope"))
    wait_for(
        lambda: cond(kube.get(POOL, "orphanpool"), "Ready").get("reason") == "TemplateNotFound", 30
    )
    wait_for(lambda: any(e.reason == "TemplateNotFound" for e in kube.events("orphanpool")), 30)
    kube.create(CLAIM, claim_body("notpl", pool="orphanpool"))
    wait_for(
        lambda: cond(kube.get(CLAIM, "notpl"), "Ready").get("reason") == "TemplateNotFound", 30
    )

    kube.create(TPL, template_body("python"))
    kube.create(POOL, pool_body(replicas=0))
    kube.create(CLAIM, claim_body("envbad", env=[{"name": "X", "value": "1"}]))
    wait_for(
        lambda: (
            cond(kube.get(CLAIM, "envbad"), "Ready").get("reason") == "EnvVarsInjectionRejected"
        ),
        30,
    )
    kube.create(
        CLAIM, claim_body("mdbad", additionalPodMetadata={"labels": {"agents.x-k8s.io/x": "y"}})
    )
    wait_for(lambda: cond(kube.get(CLAIM, "mdbad"), "Ready").get("reason") == "InvalidMetadata", 30)

    # volume claim templates: the same name twice would be one PVC for two volumes
    kube.patch(TPL, "python", {"spec": {"volumeClaimTemplatesPolicy": "Allowed"}})
    vct = {
        "metadata": {"name": "custom-data"},
        "spec": {"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": "1Gi"}}},
    }
    for name, vcts, message in [
        ("vctdup", [vct, vct], "duplicate name 'custom-data'"),
        ("vctnoname", [{**vct, "metadata": {}}], "name at index 0 is empty"),
    ]:
        kube.create(CLAIM, claim_body(name, volumeClaimTemplates=vcts))
        c = wait_for(
            lambda name=name: (
                (x := kube.get(CLAIM, name))
                and cond(x, "Ready").get("reason") == "VolumeClaimTemplatesError"
                and x
            ),
            30,
            what=f"{name} rejected",
        )
        assert cond(c, "Ready")["status"] == "False"
        assert message in cond(c, "Ready")["message"]
        assert kube.get(SB, name) is None, "a rejected claim started a Sandbox"

    # a late template heals the claim (level-triggered, no manual retry)
    kube.create(TPL, template_body("nope"))
    wait_for(lambda: is_ready(kube.get(CLAIM, "notpl")), 60, what="claim healed by template")
    assert operator.proc.poll() is None, operator.logs()[-3000:]


def test_claim_lifecycle_retain_and_delete(kube, operator):
    import datetime as dt

    kube.create(TPL, template_body("python"))
    kube.create(POOL, pool_body(replicas=0))
    soon = (dt.datetime.now(dt.UTC) + dt.timedelta(seconds=5)).strftime("%Y-%m-%dT%H:%M:%SZ")
    kube.create(
        CLAIM, claim_body("keep", lifecycle={"shutdownTime": soon, "shutdownPolicy": "Retain"})
    )
    kube.create(
        CLAIM, claim_body("gone", lifecycle={"shutdownTime": soon, "shutdownPolicy": "Delete"})
    )
    wait_for(lambda: is_ready(kube.get(CLAIM, "keep")), 60)
    wait_for(lambda: cond(kube.get(CLAIM, "keep"), "Ready").get("reason") == "ClaimExpired", 30)
    wait_for(lambda: kube.get(SB, "keep") is None, 30, what="sandbox of expired claim deleted")
    wait_for(lambda: kube.get(CLAIM, "gone") is None, 30, what="claim deleted")
    wait_for(lambda: kube.get(SB, "gone") is None, 60, what="its sandbox collected")


def test_with_no_ready_member_a_claim_adopts_one_that_has_its_pod_ip(kube, operator):
    # Upstream's adoption order: Ready members first, else the oldest member that
    # already has a pod IP (closer to Ready than a cold start).
    kube.create(TPL, template_body("python"))
    kube.create(POOL, pool_body(replicas=1))
    wait_for(lambda: kube.get(POOL, "pool").get("status", {}).get("readyReplicas") == 1, 60)
    (member,) = [m["metadata"]["name"] for m in pool_members(kube)]
    pod = kube.pod(member)
    conditions = [
        {"type": c.type, "status": "False" if c.type in ("Ready", "ContainersReady") else c.status}
        for c in pod.status.conditions
    ]
    kube.core.patch_namespaced_pod_status(member, kube.ns, {"status": {"conditions": conditions}})
    wait_for(
        lambda: (
            (sb := kube.get(SB, member))
            and not is_ready(sb)
            and (sb.get("status") or {}).get("podIPs")
        ),
        30,
        what="pool member not Ready, with a pod IP",
    )

    kube.create(CLAIM, claim_body("c1"))
    c = wait_for(
        lambda: (x := kube.get(CLAIM, "c1")) and (x.get("status") or {}).get("sandbox") and x,
        30,
        what="claim bound",
    )
    assert c["status"]["sandbox"]["name"] == member
    assert cond(c, "Ready")["reason"] == "SandboxNotReady"
    assert kube.get(SB, "c1") is None, "cold-started although a member had its pod IP"
    assert kube.get(SB, member)["metadata"]["labels"]["agents.x-k8s.io/launch-type"] == "warm"
