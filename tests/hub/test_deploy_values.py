"""deploy/jupyterhub: the values are consistent, and the RBAC is exactly what it says."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from jupyter_sandbox.kernelspec import make_kernelspec

DEPLOY = Path(__file__).resolve().parents[2] / "deploy" / "jupyterhub"


def values() -> dict[str, Any]:
    return yaml.safe_load((DEPLOY / "values.yaml").read_text())


def rbac() -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all((DEPLOY / "rbac.yaml").read_text()) if d]


def test_kernelspec_and_server_config() -> None:
    files = values()["singleuser"]["extraFiles"]
    spec = json.loads(files["sandbox-kernelspec"]["stringData"])
    config = spec["metadata"]["kernel_provisioner"]["config"]
    assert spec == make_kernelspec(
        config["pool"],
        backend="kubernetes",
        display_name=spec["display_name"],
        backend_options=config["backend_options"],
    )
    # never the router's secret in a user's pod: the hub token authorizes instead
    assert "token_secret_file" not in config["backend_options"]
    assert config["backend_options"]["router_auth"] == "jupyterhub"
    name = Path(files["sandbox-kernelspec"]["mountPath"]).parent.name
    server = json.loads(files["sandbox-server-config"]["stringData"])
    assert server["KernelSpecManager"]["allowed_kernelspecs"] == [name]
    assert (
        server["KernelProvisionerFactory"]["default_provisioner_name"]
        == (spec["metadata"]["kernel_provisioner"]["provisioner_name"])
    )
    assert server["ServerApp"]["kernel_manager_class"].endswith("SandboxKernelManager")


def test_rbac_is_namespaced_and_minimal() -> None:
    docs = {d["kind"]: d for d in rbac()}
    assert set(docs) == {"ServiceAccount", "Role", "RoleBinding"}  # no Cluster* objects
    sa = docs["ServiceAccount"]["metadata"]["name"]
    assert values()["singleuser"]["serviceAccountName"] == sa
    namespace = docs["ServiceAccount"]["metadata"]["namespace"]
    assert {d["metadata"]["namespace"] for d in docs.values()} == {namespace}
    binding = docs["RoleBinding"]
    assert binding["roleRef"] == {
        "apiGroup": "rbac.authorization.k8s.io",
        "kind": "Role",
        "name": docs["Role"]["metadata"]["name"],
    }
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": sa, "namespace": namespace}]
    rules = {
        (g, r): sorted(rule["verbs"])
        for rule in docs["Role"]["rules"]
        for g in rule["apiGroups"]
        for r in rule["resources"]
    }
    assert rules == {
        ("extensions.agents.x-k8s.io", "sandboxclaims"): [
            "create", "delete", "get", "list", "watch"
        ],
        ("extensions.agents.x-k8s.io", "sandboxwarmpools"): ["get", "list"],
        ("agents.x-k8s.io", "sandboxes"): ["get", "list", "patch", "watch"],
    }  # fmt: skip


@pytest.mark.cluster
def test_rbac_on_the_api_server(kube_cluster: Any) -> None:
    """Applied to a real API server, the service account may do that and nothing else."""
    from kubernetes import client, utils

    api = kube_cluster.api_client()
    core = client.CoreV1Api(api)
    namespace = "jhub-rbac-test"
    try:
        core.create_namespace({"metadata": {"name": namespace}})
    except client.ApiException as exc:
        if exc.status != 409:
            raise
    try:
        docs = rbac()
        for doc in docs:
            doc["metadata"]["namespace"] = namespace
        docs[-1]["subjects"][0]["namespace"] = namespace
        utils.create_from_yaml(api, yaml_objects=docs, namespace=namespace)
        user = f"system:serviceaccount:{namespace}:jupyter-sandbox-singleuser"
        authz = client.AuthorizationV1Api(api)

        def allowed(verb: str, group: str, resource: str, ns: str = namespace) -> bool:
            review = authz.create_subject_access_review(
                {
                    "spec": {
                        "user": user,
                        "groups": ["system:serviceaccounts", f"system:serviceaccounts:{namespace}"],
                        "resourceAttributes": {
                            "namespace": ns,
                            "verb": verb,
                            "group": group,
                            "resource": resource,
                        },
                    }
                }
            )
            return bool(review.status.allowed)

        ext = "extensions.agents.x-k8s.io"
        for verb in ("create", "get", "list", "watch", "delete"):
            assert allowed(verb, ext, "sandboxclaims")
        assert not allowed("update", ext, "sandboxclaims")
        assert not allowed("patch", ext, "sandboxclaims")
        assert not allowed("create", ext, "sandboxclaims", ns="default")
        assert allowed("patch", "agents.x-k8s.io", "sandboxes")
        assert not allowed("delete", "agents.x-k8s.io", "sandboxes")
        assert not allowed("create", ext, "sandboxwarmpools")
        assert not allowed("get", "", "secrets")
        assert not allowed("create", "", "pods")
        assert not allowed("list", "", "pods")
    finally:
        core.delete_namespace(namespace)
