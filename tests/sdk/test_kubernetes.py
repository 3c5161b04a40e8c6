"""The SDK on the Kubernetes backend, against the real test API server.

Run with ``-p tests.cluster.fixtures``. Sandboxes' pods are not real here, so
this covers the control-plane half (claim, wait ready, labels, list, status,
terminate, errors); the runtime half is the same code as on the local backend.
"""

from __future__ import annotations

from typing import Any

import pytest

from jupyter_sandbox.client import (
    SandboxClient,
    SandboxDirectConnectionConfig,
    SandboxGatewayConnectionConfig,
    SandboxInClusterConnectionConfig,
    SandboxWarmPoolNotFoundError,
)
from jupyter_sandbox.protocol import runtime_auth
from tests.kubernetes.conftest import (  # noqa: F401 - fixtures are used by name
    CLAIM,
    SB,
    api_client,
    kube,
    make_pool,
    operator,
    operator_factory,
    wait_for,
    warm_pool,
)

pytestmark = pytest.mark.cluster


def gone(k: Any, name: str) -> bool:
    claim = k.get(CLAIM, name)
    return claim is None or bool(claim["metadata"].get("deletionTimestamp"))


def test_sdk_claims_and_terminates_on_kubernetes(kube, kube_cluster, warm_pool) -> None:  # noqa: F811
    options = {"kubeconfig": str(kube_cluster.kubeconfig)}
    client = SandboxClient(SandboxInClusterConnectionConfig(), backend_options=options)
    assert client.backend == "kubernetes"
    names = []
    with pytest.raises(RuntimeError, match="boom"):
        with client.create_sandbox("pool", namespace=kube.ns, labels={"suite": "sdk"}) as sb:
            names.append(sb.claim_name)
            claim = kube.get(CLAIM, sb.claim_name)
            assert claim is not None
            assert claim["metadata"]["labels"]["suite"] == "sdk"
            assert claim["metadata"]["labels"]["jupyter-sandbox/user"]
            assert sb.namespace == kube.ns and sb.sandbox_id
            assert sb.endpoint.router_url == (
                f"http://{sb.sandbox_id}.{kube.ns}.svc.cluster.local:8888"
            )
            assert sb.status()[0] == "SandboxReady"
            assert client.list_all_sandboxes(kube.ns, label_selector="suite=sdk") == [sb.claim_name]
            raise RuntimeError("boom")
    wait_for(lambda: gone(kube, names[0]), 30, what="the claim deleted")

    with pytest.raises(SandboxWarmPoolNotFoundError):
        client.create_sandbox("no-such-pool", namespace=kube.ns)
    client.close()


def test_in_cluster_mode_presents_the_runtimes_own_token(
    kube,  # noqa: F811
    kube_cluster,
    operator_factory,  # noqa: F811
    tmp_path,
) -> None:
    """No router in between, so the SDK reads the sandbox's token Secret itself (with
    its own credentials: a caller that may not read it gets a runtime that says 401)."""
    key = b"sdk-in-cluster-runtime-key-0123456789abcdef"
    (tmp_path / "key").write_bytes(key)
    operator_factory(f"--runtime-key-file={tmp_path / 'key'}")
    make_pool(kube, service=True)
    options = {"kubeconfig": str(kube_cluster.kubeconfig)}
    client = SandboxClient(SandboxInClusterConnectionConfig(), backend_options=options)
    with client.create_sandbox("pool", namespace=kube.ns) as sb:
        uid = kube.get(SB, sb.sandbox_id)["metadata"]["uid"]
        expected = runtime_auth.token_for(key, kube.ns, sb.sandbox_id, uid)
        assert sb.endpoint.headers()[runtime_auth.HEADER] == expected
        name = sb.claim_name
    wait_for(lambda: gone(kube, name), 30, what="the claim deleted")
    client.close()


def test_sdk_router_mode_uses_the_router_url(kube, kube_cluster, warm_pool) -> None:  # noqa: F811
    config = SandboxDirectConnectionConfig(api_url="http://router.example:8080/")
    client = SandboxClient(config, backend_options={"kubeconfig": str(kube_cluster.kubeconfig)})
    with client.create_sandbox("pool", namespace=kube.ns) as sb:
        assert sb.endpoint.router_url == "http://router.example:8080"
        assert sb.endpoint.headers()["X-Sandbox-ID"] == sb.sandbox_id
        assert sb.endpoint.headers()["X-Sandbox-Namespace"] == kube.ns
        assert runtime_auth.HEADER not in sb.endpoint.headers()  # the router sends it
        name = sb.claim_name
    wait_for(lambda: gone(kube, name), 30, what="the claim deleted")
    client.close()


GATEWAY_CRD = {
    # just enough of Gateway API's CRD for a Gateway with a status
    "apiVersion": "apiextensions.k8s.io/v1",
    "kind": "CustomResourceDefinition",
    "metadata": {
        "name": "gateways.gateway.networking.k8s.io",
        # *.k8s.io groups need it; the real CRD carries the same annotation
        "annotations": {
            "api-approved.kubernetes.io": "https://github.com/kubernetes-sigs/gateway-api/pull/2466"
        },
    },
    "spec": {
        "group": "gateway.networking.k8s.io",
        "scope": "Namespaced",
        "names": {"plural": "gateways", "singular": "gateway", "kind": "Gateway"},
        "versions": [
            {
                "name": "v1",
                "served": True,
                "storage": True,
                "subresources": {"status": {}},
                "schema": {
                    "openAPIV3Schema": {
                        "type": "object",
                        "x-kubernetes-preserve-unknown-fields": True,
                    }
                },
            }
        ],
    },
}


def test_sdk_gateway_mode(kube, api_client, kube_cluster, warm_pool) -> None:  # noqa: F811
    """SandboxGatewayConnectionConfig: the router URL comes from the Gateway's
    status.addresses, which the SDK watches until one is there."""
    import threading
    import time

    from kubernetes import client as k8s

    ext = k8s.ApiextensionsV1Api(api_client)
    try:
        ext.create_custom_resource_definition(GATEWAY_CRD)
    except k8s.ApiException as exc:
        if exc.status != 409:
            raise
    group, version, plural = "gateway.networking.k8s.io", "v1", "gateways"
    wait_for(
        lambda: kube.co.list_namespaced_custom_object(group, version, kube.ns, plural) is not None,
        30,
        what="the Gateway CRD served",
    )
    gateway = {"apiVersion": f"{group}/{version}", "kind": "Gateway", "metadata": {"name": "gw"}}
    gateway["spec"] = {"gatewayClassName": "test", "listeners": []}
    kube.co.create_namespaced_custom_object(group, version, kube.ns, plural, gateway)

    def program_the_gateway() -> None:  # as a Gateway controller would, a moment later
        time.sleep(1)
        kube.co.patch_namespaced_custom_object_status(
            group,
            version,
            kube.ns,
            plural,
            "gw",
            {"status": {"addresses": [{"type": "IPAddress", "value": "10.1.2.3"}]}},
        )

    threading.Thread(target=program_the_gateway, daemon=True).start()
    config = SandboxGatewayConnectionConfig(
        gateway_name="gw", gateway_namespace=kube.ns, gateway_ready_timeout=30
    )
    client = SandboxClient(config, backend_options={"kubeconfig": str(kube_cluster.kubeconfig)})
    with client.create_sandbox("pool", namespace=kube.ns) as sb:
        assert sb.endpoint.router_url == "http://10.1.2.3"
        assert sb.endpoint.headers()["X-Sandbox-ID"] == sb.sandbox_id
        name = sb.claim_name
    wait_for(lambda: gone(kube, name), 30, what="the claim deleted")
    client.close()
