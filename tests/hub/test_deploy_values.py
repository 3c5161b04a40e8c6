"""deploy/jupyterhub: the values are consistent, and the RBAC is exactly what it says."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pytest
import yaml

from jupyter_sandbox.kernelspec import make_kernelspec
from tests.kubernetes.test_rbac import sa_kubeconfig

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
    # never the router's secret nor Kubernetes credentials in a user's pod: the
    # hub token authorizes at the claim service and the router instead
    assert set(config["backend_options"]) == {"claim_service_url", "router_auth"}
    assert config["backend_options"]["router_auth"] == "jupyterhub"
    service = {
        d["kind"]: d for d in yaml.safe_load_all((DEPLOY / "claim-service.yaml").read_text())
    }
    url = config["backend_options"]["claim_service_url"]
    assert url.startswith(f"http://{service['Service']['metadata']['name']}.")
    assert url.endswith(f":{service['Service']['spec']['ports'][0]['port']}")
    name = Path(files["sandbox-kernelspec"]["mountPath"]).parent.name
    server = json.loads(files["sandbox-server-config"]["stringData"])
    assert server["KernelSpecManager"]["allowed_kernelspecs"] == [name]
    assert server["MappingKernelManager"]["default_kernel_name"] == name
    assert (
        server["KernelProvisionerFactory"]["default_provisioner_name"]
        == (spec["metadata"]["kernel_provisioner"]["provisioner_name"])
    )
    assert server["ServerApp"]["kernel_manager_class"].endswith("SandboxKernelManager")


def test_the_server_settings_are_where_jupyter_server_reads_them(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The server settings file, mounted where values.yaml mounts it under a
    config directory, is what a starting Jupyter server runs with (a file in
    jupyter_server_config.d/ was read for extension switches only: no sandbox
    kernel manager, and the pod's own Python kernel was offered)."""
    from jupyter_server.serverapp import ServerApp

    files = values()["singleuser"]["extraFiles"]
    mount = Path(files["sandbox-server-config"]["mountPath"])
    config_dir = Path("/usr/local/etc/jupyter")
    assert mount.is_relative_to(config_dir), mount
    target = tmp_path / "etc" / mount.relative_to(config_dir)
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text(files["sandbox-server-config"]["stringData"])
    monkeypatch.setenv("JUPYTER_CONFIG_DIR", str(tmp_path / "etc"))
    monkeypatch.setenv("JUPYTER_RUNTIME_DIR", str(tmp_path / "runtime"))
    app = ServerApp(root_dir=str(tmp_path))
    app.load_config_file()
    server = json.loads(files["sandbox-server-config"]["stringData"])
    for section, settings in server.items():
        for name, value in settings.items():
            assert app.config[section][name] == value, (section, name)


ADMISSION = ("ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding")


def grant(api: Any, namespace: str) -> None:
    """The ServiceAccount, Role and RoleBinding of rbac.yaml, moved to ``namespace``."""
    from kubernetes import utils

    docs = [d for d in rbac() if d["kind"] not in ADMISSION]
    for doc in docs:
        doc["metadata"]["namespace"] = namespace
    docs[-1]["subjects"][0]["namespace"] = namespace
    utils.create_from_yaml(api, yaml_objects=docs, namespace=namespace)


def test_rbac_is_namespaced_and_minimal() -> None:
    docs = {d["kind"]: d for d in rbac()}
    # no Cluster* grants; the cluster-scoped objects only restrict (admission policy)
    assert set(docs) == {"ServiceAccount", "Role", "RoleBinding", *ADMISSION}
    sa = docs["ServiceAccount"]["metadata"]["name"]
    # the claim service's account; users' pods get none, and no token
    service = next(yaml.safe_load_all((DEPLOY / "claim-service.yaml").read_text()))
    assert service["spec"]["template"]["spec"]["serviceAccountName"] == sa
    assert values()["singleuser"]["serviceAccountName"] is None
    kubespawner = values()["hub"]["config"]["KubeSpawner"]
    assert kubespawner["automount_service_account_token"] is False
    namespace = docs["ServiceAccount"]["metadata"]["namespace"]
    granted = [d for kind, d in docs.items() if kind not in ADMISSION]
    assert {d["metadata"]["namespace"] for d in granted} == {namespace}
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
    from kubernetes import client

    api = kube_cluster.api_client()
    core = client.CoreV1Api(api)
    namespace = "jhub-rbac-test"
    try:
        core.create_namespace({"metadata": {"name": namespace}})
    except client.ApiException as exc:
        if exc.status != 409:
            raise
    try:
        grant(api, namespace)
        user = f"system:serviceaccount:{namespace}:jupyter-sandbox-claims"
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


@pytest.mark.cluster
def test_admission_policy_limits_sandbox_patches(kube_cluster: Any, tmp_path: Path) -> None:
    """RBAC lets the claim service's account patch Sandboxes (suspend and
    resume); the admission policy of rbac.yaml keeps that to spec.operatingMode
    and the resumed-at annotation, so even a subverted service cannot re-point
    or relabel a Sandbox. Tested as that service account on the real API server."""
    from kubernetes import client, config

    from jupyter_sandbox.agent_sandbox import SANDBOX

    api = kube_cluster.api_client()
    core = client.CoreV1Api(api)
    namespace = "jhub-admission-test"
    core.create_namespace({"metadata": {"name": namespace}})
    admission = [d for d in rbac() if d["kind"] in ADMISSION]
    adm = client.AdmissionregistrationV1Api(api)
    try:
        grant(api, namespace)
        adm.create_validating_admission_policy(admission[0])
        adm.create_validating_admission_policy_binding(admission[1])
        co = client.CustomObjectsApi(api)
        group, version, plural = SANDBOX.gvp
        for name in ("bobs", "probe"):
            co.create_namespaced_custom_object(
                group,
                version,
                namespace,
                plural,
                {
                    "apiVersion": f"{group}/{version}",
                    "kind": "Sandbox",
                    "metadata": {"name": name, "labels": {"jupyter-sandbox/user": "bob"}},
                    "spec": {
                        "podTemplate": {"spec": {"containers": [{"name": "c", "image": "x"}]}}
                    },
                },
            )
        kubeconfig = sa_kubeconfig(
            api,
            Path(kube_cluster.kubeconfig),
            "jupyter-sandbox-claims",
            tmp_path / "kubeconfig",
            namespace=namespace,
        )
        as_user = client.CustomObjectsApi(config.new_client_from_config(str(kubeconfig)))

        def patch(body: dict[str, Any], name: str = "bobs") -> int:
            try:
                as_user.patch_namespaced_custom_object(
                    group, version, namespace, plural, name, body
                )
            except client.ApiException as exc:
                return int(exc.status)
            return 200

        refused = {"metadata": {"labels": {"jupyter-sandbox/user": "alice"}}}
        # The policy takes effect once the API server's admission plugin has
        # loaded it and its REST mapper knows the Sandbox kind, which on a
        # freshly started API server with new CRDs can take a while.
        deadline = time.monotonic() + 120
        started = time.monotonic()
        # on a probe, with a new value each time (a patch that changes nothing passes)
        # (422 is the policy's answer; a 403 would be RBAC not yet in effect)
        while patch({"metadata": {"labels": {"probe": str(time.monotonic_ns())}}}, "probe") != 422:
            policy = adm.read_validating_admission_policy(admission[0]["metadata"]["name"])
            assert time.monotonic() < deadline, f"the policy never took effect: {policy.status}"
            time.sleep(0.5)
        print(f"\n[admission] policy in effect after {time.monotonic() - started:.1f}s")
        hijack = {
            "metadata": {
                "ownerReferences": [
                    {
                        "apiVersion": "extensions.agents.x-k8s.io/v1beta1",
                        "kind": "SandboxClaim",
                        "name": "alices-claim",
                        "uid": "00000000-0000-0000-0000-000000000001",
                        "controller": True,
                    }
                ]
            }
        }
        for body in (
            refused,
            hijack,
            {"metadata": {"annotations": {"something": "else"}}},
            {"metadata": {"finalizers": ["example.com/keep"]}},
            {"spec": {"podTemplate": {"metadata": {"labels": {"sneaky": "yes"}}}}},
        ):
            assert patch(body) == 422, body
        # what the provisioner does: suspend, and resume with its annotation
        assert patch({"spec": {"operatingMode": "Suspended"}}) == 200
        resume = {
            "metadata": {"annotations": {"jupyter-sandbox/resumed-at": "2026-12-02T00:00:00Z"}},
            "spec": {"operatingMode": "Running"},
        }
        assert patch(resume) == 200
        sandbox = co.get_namespaced_custom_object(group, version, namespace, plural, "bobs")
        assert sandbox["metadata"]["labels"] == {"jupyter-sandbox/user": "bob"}
        assert "ownerReferences" not in sandbox["metadata"]
    finally:
        for name in ("jupyter-sandbox-claim-service-sandbox-writes",):
            for delete in (
                adm.delete_validating_admission_policy_binding,
                adm.delete_validating_admission_policy,
            ):
                try:
                    delete(name)
                except client.ApiException:
                    pass
        core.delete_namespace(namespace)
