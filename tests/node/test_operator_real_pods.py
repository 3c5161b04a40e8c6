"""Our operator on a real node: a warm pool of real runtime pods from the example
template (deploy/examples/python-kernel.yaml, image overridden to the locally built
one), a claim adopting one of them, suspend (pod gone, PVC kept) and resume (a new
pod on the same PVC, the workspace file still there), then release.

Storage: hostPath PersistentVolumes the test pre-creates (owned by uid 1000, the
runtime's user), bound by kube-controller-manager's PV binder; no provisioner."""

from __future__ import annotations

import time
import urllib.error

import pytest

from tests.operator.conftest import CLAIM, POOL, SB, TPL, cond, is_ready, wait_for

from .conftest import (
    REPLICAS,
    _http,
    example_objects,
    pod_ready,
    run,
    runtime_token,
    sandbox_pod,
)

pytestmark = [pytest.mark.node, pytest.mark.timeout(900)]


def test_pool_claim_suspend_resume_on_real_pods(kube_node_cluster, kube, host_pvs, operator):
    tpl, pool = example_objects(kube_node_cluster.runtime_image)
    t0 = time.monotonic()
    kube.create(TPL, tpl)
    kube.create(POOL, pool)
    wait_for(
        lambda: (kube.get(POOL, "python") or {}).get("status", {}).get("readyReplicas") == REPLICAS,
        300,
        interval=0.5,
        what=f"{REPLICAS} warm sandboxes with Ready pods",
    )
    warm_s = time.monotonic() - t0
    pool_sandboxes = {s["metadata"]["name"] for s in kube.list(SB)}
    assert len(pool_sandboxes) == REPLICAS

    # claim: adopts a warm sandbox, whose pod is already running
    t1 = time.monotonic()
    kube.create(
        CLAIM,
        {
            "apiVersion": "extensions.agents.x-k8s.io/v1beta1",
            "kind": "SandboxClaim",
            "metadata": {"name": "alice"},
            "spec": {"warmPoolRef": {"name": "python"}},
        },
    )
    c = wait_for(
        lambda: (x := kube.get(CLAIM, "alice")) and is_ready(x) and x, 120, 0.05, "claim Ready"
    )
    claim_s = time.monotonic() - t1
    name = c["status"]["sandbox"]["name"]
    assert name in pool_sandboxes, "the claim cold-started instead of adopting a warm sandbox"
    pod = sandbox_pod(kube, name)
    assert pod_ready(pod) and pod.spec.node_name == kube_node_cluster.node_name
    # pod security of template-provisioned pods: no service-account token in the
    # real container, and the managed NetworkPolicy exists (NOT enforced here: the
    # CNI bridge plugin has no policy support; see tests/cluster/NODE.md)
    assert pod.spec.automount_service_account_token is False
    assert not any(
        m.mount_path.startswith("/var/run/secrets/kubernetes.io")
        for m in pod.spec.containers[0].volume_mounts or []
    )
    np = kube.net.read_namespaced_network_policy("python-network-policy", kube.ns)
    assert np.spec.pod_selector is not None
    pvc_name = f"workspace-{name}"
    (vol,) = [v for v in pod.spec.volumes if v.persistent_volume_claim]
    assert vol.persistent_volume_claim.claim_name == pvc_name
    ip = pod.status.pod_ip
    code, body = _http("GET", f"http://{ip}:8888/readyz")
    assert code == 200 and body["ready"], body
    # the pod IP alone gives nothing: not without the sandbox's token, not with another's
    token = runtime_token(kube, name)
    other = runtime_token(kube, next(iter(pool_sandboxes - {name})))
    for presented in ("", other):
        code, _ = _http("POST", f"http://{ip}:8888/execute", {"command": "id"}, token=presented)
        assert code == 401, (presented, code)
    out = run(ip, "echo kept-across-suspend > /workspace/keep.txt && id -u && hostname", token)
    assert out["exit_code"] == 0 and out["stdout"].split() == ["1000", name], out
    assert "SANDBOX_RUNTIME_TOKEN" not in run(ip, "env", token)["stdout"]
    out = run(ip, "ls /var/run/secrets/kubernetes.io/serviceaccount 2>&1; echo rc=$?", token)
    assert "rc=0" not in out["stdout"], out

    # suspend: the pod goes, PVC and Service stay
    t2 = time.monotonic()
    kube.patch(SB, name, {"spec": {"operatingMode": "Suspended"}})
    wait_for(
        lambda: (x := kube.get(SB, name)) and cond(x, "Suspended").get("status") == "True",
        120,
        what="Sandbox Suspended",
    )
    wait_for(lambda: sandbox_pod(kube, name) is None, 120, what="pod deleted")
    suspend_s = time.monotonic() - t2
    pvc = kube.core.read_namespaced_persistent_volume_claim(pvc_name, kube.ns)
    assert pvc.status.phase == "Bound" and pvc.metadata.deletion_timestamp is None
    kube.core.read_namespaced_service(name, kube.ns)
    try:
        _http("GET", f"http://{ip}:8888/readyz", timeout=2)
        reachable = True
    except (OSError, urllib.error.URLError):
        reachable = False
    assert not reachable, "the suspended sandbox's old pod IP still answers"

    # resume: a new pod on the same PVC; the file written before is there
    t3 = time.monotonic()
    kube.patch(SB, name, {"spec": {"operatingMode": "Running"}})
    new = wait_for(
        lambda: (p := sandbox_pod(kube, name)) and pod_ready(p) and p,
        180,
        0.2,
        "resumed pod Ready",
    )
    resume_s = time.monotonic() - t3
    assert new.metadata.uid != pod.metadata.uid
    (vol,) = [v for v in new.spec.volumes if v.persistent_volume_claim]
    assert vol.persistent_volume_claim.claim_name == pvc_name
    out = run(new.status.pod_ip, "cat /workspace/keep.txt", token)  # (same Sandbox: same token)
    assert out["stdout"].strip() == "kept-across-suspend", out
    wait_for(lambda: is_ready(kube.get(SB, name)), 60, what="Sandbox Ready after resume")

    # release: claim, sandbox, pod and service go (ownerReference cascade)
    kube.delete(CLAIM, "alice")
    wait_for(lambda: kube.get(SB, name) is None, 120, what="sandbox deleted")
    wait_for(lambda: sandbox_pod(kube, name) is None, 120, what="pod deleted")
    print(
        f"\n[node] pool of {REPLICAS} warm in {warm_s:.1f}s;"
        f" claim Ready in {claim_s * 1000:.0f} ms; suspend {suspend_s:.1f}s;"
        f" resume to Ready pod {resume_s:.1f}s"
    )
