"""Our operator on a real node: a warm pool of real runtime pods from the example
template (deploy/examples/python-kernel.yaml, image overridden to the locally built
one), a claim adopting one of them, suspend (pod gone, PVC kept) and resume (a new
pod on the same PVC, the workspace file still there), then release.

Storage: hostPath PersistentVolumes the test pre-creates (owned by uid 1000, the
runtime's user), bound by kube-controller-manager's PV binder; no provisioner."""

from __future__ import annotations

import copy
import json
import os
import time
import urllib.error
import urllib.request
import uuid
from pathlib import Path

import pytest
import yaml

from tests.operator.conftest import (
    CLAIM,
    POOL,
    SB,
    TPL,
    Kube,
    OperatorProc,
    cond,
    is_ready,
    wait_for,
)

pytestmark = [pytest.mark.node, pytest.mark.timeout(900)]

REPO = Path(__file__).resolve().parents[2]
EXAMPLE = REPO / "deploy" / "examples" / "python-kernel.yaml"
REPLICAS = 2


def _http(method: str, url: str, body: dict | None = None, timeout: float = 30) -> tuple[int, dict]:
    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request(
        url, data=data, method=method, headers={"Content-Type": "application/json"}
    )
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return r.status, json.loads(r.read() or b"{}")
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read() or b"{}")


def run(ip: str, command: str) -> dict:
    code, body = _http(
        "POST", f"http://{ip}:8888/execute", {"command": command, "shell": True, "timeout": 30}
    )
    assert code == 200, body
    return body


def example_objects(image: str) -> tuple[dict, dict]:
    docs = [d for d in yaml.safe_load_all(EXAMPLE.read_text()) if d]
    tpl = copy.deepcopy(next(d for d in docs if d["kind"] == "SandboxTemplate"))
    pool = copy.deepcopy(next(d for d in docs if d["kind"] == "SandboxWarmPool"))
    for d in (tpl, pool):
        d["metadata"].pop("namespace", None)
    (c,) = tpl["spec"]["podTemplate"]["spec"]["containers"]
    c["image"] = image
    c["imagePullPolicy"] = "Never"
    pool["spec"]["replicas"] = REPLICAS
    return tpl, pool


@pytest.fixture
def kube(kube_node_cluster):
    from kubernetes import client

    api = kube_node_cluster.api_client()
    ns = f"t-{uuid.uuid4().hex[:8]}"
    core = client.CoreV1Api(api)
    core.create_namespace({"metadata": {"name": ns}})
    wait_for(lambda: core.read_namespaced_service_account("default", ns), 30, what="default SA")
    yield Kube(api, ns)
    try:
        core.delete_namespace(ns)
    except Exception:
        pass
    api.close()


@pytest.fixture
def host_pvs(kube, tmp_path):
    """hostPath PVs, one directory each, writable by the runtime's uid 1000."""
    made = []
    for i in range(REPLICAS + 2):
        d = tmp_path / f"pv{i}"
        d.mkdir()
        os.chown(d, 1000, 1000)
        name = f"pv-{kube.ns}-{i}"
        kube.core.create_persistent_volume(
            {
                "metadata": {"name": name},
                "spec": {
                    "capacity": {"storage": "1Gi"},
                    "accessModes": ["ReadWriteOnce"],
                    "persistentVolumeReclaimPolicy": "Retain",
                    "hostPath": {"path": str(d), "type": "Directory"},
                },
            }
        )
        made.append(name)
    yield made
    for name in made:
        try:
            kube.core.delete_persistent_volume(name)
        except Exception:
            pass


@pytest.fixture
def operator(kube_node_cluster, kube, tmp_path):
    p = OperatorProc(kube_node_cluster.kubeconfig, kube.ns, tmp_path / "operator.log").start()
    yield p
    p.stop()


def sandbox_pod(kube: Kube, name: str):
    from kubernetes import client

    try:
        return kube.core.read_namespaced_pod(name, kube.ns)
    except client.ApiException as e:
        if e.status == 404:
            return None
        raise


def pod_ready(pod) -> bool:
    conds = {c.type: c.status for c in (pod.status.conditions or [])} if pod else {}
    return conds.get("Ready") == "True" and bool(pod.status.pod_ip)


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
    assert pod.spec.automount_service_account_token is False
    pvc_name = f"workspace-{name}"
    (vol,) = [v for v in pod.spec.volumes if v.persistent_volume_claim]
    assert vol.persistent_volume_claim.claim_name == pvc_name
    ip = pod.status.pod_ip
    code, body = _http("GET", f"http://{ip}:8888/readyz")
    assert code == 200 and body["ready"], body
    out = run(ip, "echo kept-across-suspend > /workspace/keep.txt && id -u && hostname")
    assert out["exit_code"] == 0 and out["stdout"].split() == ["1000", name], out

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
    out = run(new.status.pod_ip, "cat /workspace/keep.txt")
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
