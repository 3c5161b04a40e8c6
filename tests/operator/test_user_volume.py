"""A template with a user volume: each claim gets its own user's PVC, nobody else's.

On the real API server with the operator, a scheduler and kwok nodes: the user's
volume is chosen by KubeSpawner's ``hub.jupyter.org/username`` annotation on the
PVC against the claim's ``jupyter-sandbox/user``, a ReadWriteOnce volume in use
pins the sandbox to the node of the pod using it, and a claim for a user without
a volume, or naming nobody, fails with a reason instead of starting without files.
"""

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

PATH_ANNOTATION = "jupyter-sandbox/user-volume-path"


def user_pvc(kube, name: str, user: str, volume: str | None = None) -> None:
    kube.core.create_namespaced_persistent_volume_claim(
        kube.ns,
        {
            "metadata": {"name": name, "annotations": {"hub.jupyter.org/username": user}},
            "spec": {
                "accessModes": ["ReadWriteOnce"],
                "resources": {"requests": {"storage": "1Gi"}},
                "storageClassName": "",
                **({"volumeName": volume} if volume else {}),
            },
        },
    )


def user_claim(name: str, user: str | None, cwd: str | None = None) -> dict:
    body = claim_body(name, pool="home")
    annotations = {}
    if user is not None:
        annotations["jupyter-sandbox/user"] = user
    if cwd is not None:
        annotations["jupyter-sandbox/kernel-cwd"] = cwd
    body["metadata"]["annotations"] = annotations
    return body


def reason(kube, name: str) -> str:
    return cond(kube.get(CLAIM, name), "Ready").get("reason", "")


def test_each_claim_gets_its_users_volume_and_no_one_elses(kube, operator, make_pv):
    template = template_body("home")
    template["metadata"]["annotations"] = {PATH_ANNOTATION: "/home/jovyan"}
    kube.create(TPL, template)
    kube.create(POOL, pool_body(name="home", template="home", replicas=1))
    wait_for(lambda: (kube.get(POOL, "home") or {}).get("status", {}).get("readyReplicas") == 1, 60)
    warm = {s["metadata"]["name"] for s in kube.list(SB)}

    # alice's home volume, bound, and in use by her single-user server on one node
    user_pvc(kube, "claim-alice", "alice", volume=make_pv())
    node = kube.core.list_node().items[-1].metadata.name
    kube.core.create_namespaced_pod(
        kube.ns,
        {
            "metadata": {"name": "jupyter-alice"},
            "spec": {
                "nodeName": node,
                "containers": [{"name": "notebook", "image": "jupyter/singleuser"}],
                "volumes": [
                    {"name": "home", "persistentVolumeClaim": {"claimName": "claim-alice"}}
                ],
            },
        },
    )
    # a volume whose name says bob but whose annotation says mallory: names do not count
    user_pvc(kube, "claim-bob", "mallory")

    kube.create(CLAIM, user_claim("alice-1", "alice", cwd="/home/jovyan/project"))
    kube.create(CLAIM, user_claim("bob-1", "bob"))
    kube.create(CLAIM, user_claim("nobody-1", None))
    kube.create(CLAIM, user_claim("alice-2", "alice", cwd="/etc"))

    claim = wait_for(
        lambda: (x := kube.get(CLAIM, "alice-1")) and is_ready(x) and x, 60, what="alice's claim"
    )
    # a new sandbox (a warm pod cannot gain a volume), with her volume where her server has it
    assert claim["status"]["sandbox"]["name"] == "alice-1"
    assert "alice-1" not in warm
    sandbox = kube.get(SB, "alice-1")
    assert sandbox["metadata"]["labels"]["agents.x-k8s.io/launch-type"] == "cold"
    spec = sandbox["spec"]["podTemplate"]["spec"]
    (volume,) = [v for v in spec["volumes"] if "persistentVolumeClaim" in v]
    assert volume["persistentVolumeClaim"] == {"claimName": "claim-alice", "readOnly": False}
    runtime = spec["containers"][0]
    assert {"name": volume["name"], "mountPath": "/home/jovyan", "readOnly": False} in runtime[
        "volumeMounts"
    ]
    assert {"name": "SANDBOX_RUNTIME_KERNEL_CWD", "value": "/home/jovyan/project"} in runtime["env"]
    # ReadWriteOnce and in use: the pod runs on the node that has the volume attached
    pod = kube.pod("alice-1")
    assert pod.spec.node_name == node
    assert pod.spec.volumes[-1].persistent_volume_claim.claim_name == "claim-alice"

    wait_for(lambda: reason(kube, "bob-1") == "UserVolumeError", 30, what="bob refused")
    assert "'bob'" in cond(kube.get(CLAIM, "bob-1"), "Ready")["message"]
    assert kube.get(SB, "bob-1") is None
    wait_for(lambda: reason(kube, "nobody-1") == "UserVolumeError", 30, what="nobody refused")
    assert "names no user" in cond(kube.get(CLAIM, "nobody-1"), "Ready")["message"]
    assert kube.get(SB, "nobody-1") is None
    assert any(e.reason == "UserVolumeError" for e in kube.events("bob-1"))

    # a kernel directory off the volume: the kernel starts at the volume's root
    wait_for(lambda: kube.get(SB, "alice-2"), 30, what="alice's second sandbox")
    env = kube.get(SB, "alice-2")["spec"]["podTemplate"]["spec"]["containers"][0]["env"]
    assert {"name": "SANDBOX_RUNTIME_KERNEL_CWD", "value": "/home/jovyan"} in env

    # the warm member was left alone, for claims on pools without user volumes
    assert warm <= {s["metadata"]["name"] for s in kube.list(SB)}
    assert operator.proc.poll() is None, operator.logs()[-3000:]


def test_a_bad_user_volume_setting_is_reported_on_the_claim(kube, operator):
    template = template_body("home")
    template["metadata"]["annotations"] = {PATH_ANNOTATION: "home/jovyan"}
    kube.create(TPL, template)
    kube.create(POOL, pool_body(name="home", template="home", replicas=0))
    kube.create(CLAIM, user_claim("c", "alice"))
    wait_for(lambda: reason(kube, "c") == "UserVolumeError", 30)
    assert "absolute" in cond(kube.get(CLAIM, "c"), "Ready")["message"]
    assert kube.get(SB, "c") is None
