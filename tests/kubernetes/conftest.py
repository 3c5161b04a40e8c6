# ruff: noqa: F811 - the imported fixtures are used as parameters by name
"""Fixtures for the Kubernetes backend, router resolver and deploy tests.

They reuse the operator tests' helpers: a namespace per test on the real test
control plane (``kube_cluster``) and our operator as a subprocess scoped to it.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from tests.helpers import runtime_on_loopback  # noqa: F401 - used by the tests here
from tests.operator.conftest import (  # noqa: F401 - fixtures are used by name
    CLAIM,
    POOL,
    SB,
    TPL,
    Kube,
    api_client,
    claim_body,
    is_ready,
    kube,
    operator,
    operator_factory,
    pool_body,
    sandbox_body,
    template_body,
    wait_for,
)

REPO_ROOT = Path(__file__).resolve().parents[2]


def make_pool(k: Kube, name: str = "pool", replicas: int = 2, **template_spec: Any) -> dict:
    """A SandboxTemplate ``python`` and a warm pool of it, waited until all members are Ready."""
    k.create(TPL, template_body("python", **template_spec))
    k.create(POOL, pool_body(name, "python", replicas))
    return wait_for(
        lambda: (
            (p := k.get(POOL, name))
            and (p.get("status") or {}).get("readyReplicas") == replicas
            and p
        ),
        90,
        what=f"pool {name} with {replicas} ready members",
    )


@pytest.fixture
def warm_pool(kube: Kube, operator: Any) -> dict:
    return make_pool(kube, service=True)


@pytest.fixture
async def plane(kube: Kube, kube_cluster: Any) -> AsyncIterator[Any]:
    from jupyter_sandbox.control_plane.kubernetes import KubernetesControlPlane

    p = KubernetesControlPlane(namespace=kube.ns, kubeconfig=str(kube_cluster.kubeconfig))
    yield p
    await p.close()
