"""The agent-sandbox resource model: upstream's name hash, REST paths, API versions."""

from __future__ import annotations

import pytest

from jupyter_sandbox.agent_sandbox import CLAIM, SANDBOX, TEMPLATE, WARMPOOL, Resource, name_hash


@pytest.mark.parametrize(
    ("name", "digest"),
    [("", "811c9dc5"), ("a", "e40c292c"), ("foobar", "bf9cf968")],  # FNV-1a 32 vectors
)
def test_name_hash_matches_upstream(name: str, digest: str) -> None:
    assert name_hash(name) == digest


POD = Resource("", "v1", "pods", "Pod")


@pytest.mark.parametrize(
    ("resource", "args", "path"),
    [
        (SANDBOX, ("ns", None, None), "/apis/agents.x-k8s.io/v1beta1/namespaces/ns/sandboxes"),
        (
            CLAIM,
            ("ns", "c1", "status"),
            "/apis/extensions.agents.x-k8s.io/v1beta1/namespaces/ns/sandboxclaims/c1/status",
        ),
        (WARMPOOL, (None, None, None), "/apis/extensions.agents.x-k8s.io/v1beta1/sandboxwarmpools"),
        (POD, ("ns", "p", None), "/api/v1/namespaces/ns/pods/p"),
    ],
)
def test_rest_paths(resource: Resource, args: tuple, path: str) -> None:
    assert resource.path(*args) == path


def test_api_versions_and_custom_object_triples() -> None:
    assert SANDBOX.api_version == "agents.x-k8s.io/v1beta1"
    assert TEMPLATE.api_version == "extensions.agents.x-k8s.io/v1beta1"
    assert POD.api_version == "v1"
    assert CLAIM.gvp == ("extensions.agents.x-k8s.io", "v1beta1", "sandboxclaims")
