"""Our CRDs: generated from api/crds/, field for field the schema of upstream's
newest release, and structural where it embeds Kubernetes types, so the API
server validates, explains and merges the pod template like a Pod's.

Before the generator the pod template and the NetworkPolicy rules were
``x-kubernetes-preserve-unknown-fields``: of upstream's 2,854 field paths 2,642
were unschematized, a typo was stored silently and server-side apply replaced
the whole list of containers."""

from __future__ import annotations

import json
from typing import Any

import pytest

from tests.cluster import crdgen

from .conftest import SB, sandbox_body

# Where we differ from upstream on purpose, by (kind, path, attribute).
ALLOWED_DIFFERENCES = {
    # +default=ref(...) markers: the API server applies them to Pods, controller-gen
    # cannot resolve them; ours only states what the Pod gets anyway.
    ("Sandbox", "spec.podTemplate.spec.volumes[].azureDisk.cachingMode", "default"),
    ("Sandbox", "spec.podTemplate.spec.volumes[].azureDisk.kind", "default"),
    ("SandboxTemplate", "spec.podTemplate.spec.volumes[].azureDisk.cachingMode", "default"),
    ("SandboxTemplate", "spec.podTemplate.spec.volumes[].azureDisk.kind", "default"),
}
# Attributes that decide what the API server accepts, stores and merges.
COMPARED = (
    "type",
    "format",
    "enum",
    "required",
    "default",
    "pattern",
    "anyOf",
    "x-kubernetes-int-or-string",
    "x-kubernetes-list-type",
    "x-kubernetes-list-map-keys",
    "x-kubernetes-map-type",
    "x-kubernetes-preserve-unknown-fields",
)

needs_go = pytest.mark.skipif(
    crdgen.go_binary() is None,
    reason="the go toolchain downloads the Kubernetes and upstream modules",
)


@pytest.fixture(scope="module")
def upstream() -> dict[str, dict]:
    crds: dict[str, dict] = {}
    for f in sorted(crdgen.upstream_crd_dir().glob("*.yaml")):
        crds.update(crdgen.crd_schemas(f.read_text()))
    return crds


@pytest.fixture(scope="module")
def ours() -> dict[str, dict]:
    crds: dict[str, dict] = {}
    for f in sorted(crdgen.OUTPUT_DIR.glob("*.yaml")):
        crds.update(crdgen.crd_schemas(f.read_text()))
    return crds


@needs_go
def test_deploy_crds_are_what_the_generator_makes_of_api_crds():
    generated = crdgen.generate(crdgen.kubernetes_schemas())
    for name, text in generated.items():
        assert (crdgen.OUTPUT_DIR / name).read_text() == text, (
            f"deploy/crds/{name} is stale: run `python -m tests.cluster generate-crds`"
        )
    assert sorted(generated) == sorted(p.name for p in crdgen.OUTPUT_DIR.glob("*.yaml"))


@needs_go
def test_every_field_upstream_describes_we_describe_the_same_way(upstream, ours):
    report: dict[str, Any] = {}
    for kind, theirs in upstream.items():
        coverage = crdgen.compare(ours[kind], theirs)
        report[kind] = coverage
        assert coverage["missing"] == [], (kind, coverage["missing"][:20])
        assert coverage["unschematized"] == 0, kind
        our_nodes, their_nodes = crdgen.schema_nodes(ours[kind]), crdgen.schema_nodes(theirs)
        differences = [
            (kind, path, attr, our_nodes[path].get(attr), node.get(attr))
            for path, node in their_nodes.items()
            if path
            for attr in COMPARED
            if our_nodes[path].get(attr) != node.get(attr)
            and (kind, path, attr) not in ALLOWED_DIFFERENCES
        ]
        assert differences == [], differences[:20]
    total = sum(r["theirs"] for r in report.values())
    print(f"\nupstream {crdgen.UPSTREAM_VERSION}: {total} field paths, all schematized in ours")


@pytest.mark.cluster
def test_a_typo_in_the_pod_template_is_refused_when_validation_is_strict(kube):
    from kubernetes.client.rest import ApiException

    body = sandbox_body("typo")
    body["spec"]["podTemplate"]["spec"]["containers"][0]["imagePullPolcy"] = "Always"
    g, v, p = SB
    with pytest.raises(ApiException) as err:
        kube.co.create_namespaced_custom_object(g, v, kube.ns, p, body, field_validation="Strict")
    assert err.value.status == 400
    assert "imagePullPolcy" in err.value.body


@pytest.mark.cluster
def test_server_side_apply_merges_containers_by_name(kube):
    # Two managers each own one container of the same Sandbox: with the pod
    # template unschematized, the second apply replaced the first one's list.
    g, v, p = SB

    def apply(manager: str, container: dict) -> dict:
        body = sandbox_body("shared")
        body["spec"]["podTemplate"]["spec"]["containers"] = [container]
        body["spec"]["podTemplate"].pop("metadata", None)
        return kube.co.patch_namespaced_custom_object(
            g,
            v,
            kube.ns,
            p,
            "shared",
            body,
            field_manager=manager,
            _content_type="application/apply-patch+yaml",
        )

    apply("notebook", {"name": "runtime", "image": "runtime:1"})
    merged = apply("platform", {"name": "proxy", "image": "proxy:1"})
    names = [c["name"] for c in merged["spec"]["podTemplate"]["spec"]["containers"]]
    assert sorted(names) == ["proxy", "runtime"]


@pytest.mark.cluster
def test_the_api_server_publishes_the_pod_template_schema(kube):
    # what `kubectl explain sandbox.spec.podTemplate.spec.containers` reads
    cfg = kube.api_client.configuration
    response = kube.api_client.rest_client.request(
        "GET",
        cfg.host + "/openapi/v3/apis/agents.x-k8s.io/v1beta1",
        headers={"Authorization": cfg.auth_settings()["BearerToken"]["value"]},
    )
    response.read()
    schemas = json.loads(response.data)["components"]["schemas"]
    sandbox = next(s for name, s in schemas.items() if name.endswith(".Sandbox"))
    pod_spec = sandbox["properties"]["spec"]["properties"]["podTemplate"]["properties"]["spec"]
    container = pod_spec["properties"]["containers"]["items"]
    assert "imagePullPolicy" in container["properties"]
    assert "resources" in container["properties"]
