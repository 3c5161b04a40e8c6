"""The RBAC in deploy/ is enough: the operator and the router run under exactly
their ServiceAccounts' permissions and do their jobs on the real API server."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
import yaml

from jupyter_sandbox.kube.client import Client, load_config
from jupyter_sandbox.router.kubernetes import SandboxResolver

from .conftest import CLAIM, POOL, SB, TPL, is_ready, pool_body, template_body, wait_for
from .test_deploy import kustomize_documents

pytestmark = pytest.mark.cluster

SYSTEM_NS = "jupyter-sandbox-system"


def apply_rbac(api_client) -> None:
    """Namespaces, ServiceAccounts, (Cluster)Roles and bindings of deploy/, for real."""
    from kubernetes import dynamic

    dyn = dynamic.DynamicClient(api_client)
    kinds = (
        "Namespace",
        "ServiceAccount",
        "ClusterRole",
        "ClusterRoleBinding",
        "Role",
        "RoleBinding",
    )
    docs = [d for d in kustomize_documents() if d["kind"] in kinds]
    for doc in sorted(docs, key=lambda d: kinds.index(d["kind"])):
        res = dyn.resources.get(api_version=doc["apiVersion"], kind=doc["kind"])
        md = doc["metadata"]
        res.server_side_apply(
            body=doc,
            name=md["name"],
            namespace=md.get("namespace") if res.namespaced else None,
            field_manager="jupyter-sandbox-rbac-test",
            force_conflicts=True,
        )


def sa_kubeconfig(
    api_client, admin_kubeconfig: Path, sa: str, out: Path, namespace: str = SYSTEM_NS
) -> Path:
    """A kubeconfig authenticating as ServiceAccount ``namespace/sa`` (TokenRequest API)."""
    from kubernetes import client

    core = client.CoreV1Api(api_client)
    token = core.create_namespaced_service_account_token(
        sa, namespace, {"spec": {"expirationSeconds": 3600}}
    ).status.token
    cfg = yaml.safe_load(admin_kubeconfig.read_text())
    cfg["users"] = [{"name": sa, "user": {"token": token}}]
    cfg["contexts"][0]["context"]["user"] = sa
    out.write_text(yaml.safe_dump(cfg))
    return out


def test_operator_works_with_its_clusterrole(
    kube, api_client, kube_cluster, operator_factory, tmp_path
):
    apply_rbac(api_client)
    kc = sa_kubeconfig(
        api_client, Path(kube_cluster.kubeconfig), "jupyter-sandbox-operator", tmp_path / "op"
    )
    op = operator_factory(start=False)
    op.kubeconfig = kc
    key = tmp_path / "runtime-key"
    key.write_text("k" * 48)
    op.extra = [
        f"--leader-election-namespace={SYSTEM_NS}",
        f"--leader-election-id=rbac-test-{kube.ns}",
        f"--runtime-key-file={key}",  # each sandbox's token Secret, under the same RBAC
    ]
    op.start()
    try:
        kube.create(TPL, template_body("python", service=True))
        kube.create(POOL, pool_body("pool", "python", 1))
        wait_for(
            lambda: (kube.get(POOL, "pool").get("status") or {}).get("readyReplicas") == 1,
            60,
            what="pool filled by the operator under its own RBAC",
        )
        kube.create(CLAIM, {**_claim("c1")})
        claim = wait_for(
            lambda: (c := kube.get(CLAIM, "c1")) and is_ready(c) and c, 60, what="claim Ready"
        )
        name = claim["status"]["sandbox"]["name"]
        assert kube.pod(name) is not None
        assert kube.core.read_namespaced_service(name, kube.ns) is not None
        assert kube.core.read_namespaced_secret(f"{name}-runtime-token", kube.ns) is not None
        # the managed NetworkPolicy and events were allowed too
        wait_for(
            lambda: kube.net.list_namespaced_network_policy(kube.ns).items, 30, what="NetworkPolicy"
        )
        wait_for(lambda: kube.events("c1"), 30, what="an Event on the claim")
        # suspend: the pod deletion is allowed
        kube.patch(SB, name, {"spec": {"operatingMode": "Suspended"}})
        wait_for(lambda: kube.pod(name) is None, 30, what="pod deleted on suspend")
        logs = op.logs()
        assert "forbidden" not in logs.lower(), logs[-3000:]
    finally:
        op.stop()


def _claim(name: str) -> dict:
    return {
        "apiVersion": "extensions.agents.x-k8s.io/v1beta1",
        "kind": "SandboxClaim",
        "metadata": {"name": name},
        "spec": {"warmPoolRef": {"name": "pool"}},
    }


def test_router_works_with_its_clusterrole(kube, api_client, kube_cluster, tmp_path):
    from kubernetes import client, config

    apply_rbac(api_client)
    cfg = sa_kubeconfig(
        api_client, Path(kube_cluster.kubeconfig), "jupyter-sandbox-router", tmp_path / "rt"
    )
    kube.create(
        SB,
        {
            "apiVersion": "agents.x-k8s.io/v1beta1",
            "kind": "Sandbox",
            "metadata": {"name": "visible"},
            "spec": {"podTemplate": {"spec": {"containers": [{"name": "c", "image": "x"}]}}},
        },
    )

    async def resolve() -> None:
        router = Client(await asyncio.to_thread(load_config, str(cfg)))
        # track_owners: also the claim watch of JupyterHub authorization
        resolver = SandboxResolver(router, fallback_dns=False, track_owners=True).start()
        try:
            assert await resolver.wait_synced(30), "the router could not list sandboxes and claims"
            for _ in range(100):
                if resolver.get(kube.ns, "visible") is not None:
                    break
                await asyncio.sleep(0.1)
            assert resolver.get(kube.ns, "visible") is not None, "sandbox not in the cache"
        finally:
            await resolver.stop()
            await router.close()

    asyncio.run(resolve())
    # and nothing more: no secrets, no pods
    router_api = config.new_client_from_config(config_file=str(cfg))
    try:
        core = client.CoreV1Api(router_api)
        with pytest.raises(client.ApiException) as err:
            core.list_namespaced_secret(kube.ns)
        assert err.value.status == 403
        with pytest.raises(client.ApiException) as err:
            core.list_namespaced_pod(kube.ns)
        assert err.value.status == 403
    finally:
        router_api.close()
