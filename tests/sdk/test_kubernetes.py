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
    SandboxInClusterConnectionConfig,
    SandboxWarmPoolNotFoundError,
)
from tests.kubernetes.conftest import (  # noqa: F401 - fixtures are used by name
    CLAIM,
    api_client,
    kube,
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


def test_sdk_router_mode_uses_the_router_url(kube, kube_cluster, warm_pool) -> None:  # noqa: F811
    config = SandboxDirectConnectionConfig(api_url="http://router.example:8080/")
    client = SandboxClient(config, backend_options={"kubeconfig": str(kube_cluster.kubeconfig)})
    with client.create_sandbox("pool", namespace=kube.ns) as sb:
        assert sb.endpoint.router_url == "http://router.example:8080"
        assert sb.endpoint.headers()["X-Sandbox-ID"] == sb.sandbox_id
        assert sb.endpoint.headers()["X-Sandbox-Namespace"] == kube.ns
        name = sb.claim_name
    wait_for(lambda: gone(kube, name), 30, what="the claim deleted")
    client.close()
