"""deploy/ passes a server-side dry run on the real API server.

The equivalent of ``kubectl apply --dry-run=server -k deploy/``: every document
is sent as a server-side apply with ``dryRun=All`` (admission, schema
validation, defaulting and RBAC escalation checks run; nothing is stored).
Namespaces are created for real first (and left: they are empty), since
namespaced objects cannot be dry-run into a namespace that does not exist.
The Helm chart is rendered with ``helm template`` when helm is available
(tests/kubernetes/build-helm.sh), and its output goes through the same dry run.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from .conftest import REPO_ROOT

pytestmark = pytest.mark.cluster

DEPLOY = REPO_ROOT / "deploy"
CHART = DEPLOY / "helm" / "jupyter-sandbox"
FIELD_MANAGER = "jupyter-sandbox-dry-run-test"


def kustomize_documents() -> list[dict]:
    kust = yaml.safe_load((DEPLOY / "kustomization.yaml").read_text())
    docs: list[dict] = []
    for rel in kust["resources"]:
        docs += [d for d in yaml.safe_load_all((DEPLOY / rel).read_text()) if d]
    return docs


def find_helm() -> str | None:
    found = shutil.which("helm")
    if found:
        return found
    cache = Path(os.environ.get("JUPYTER_SANDBOX_CACHE") or Path.home() / ".cache/jupyter-sandbox")
    for p in sorted(cache.glob("helm-*/bin/helm")):
        if os.access(p, os.X_OK):
            return str(p)
    return None


def dry_run(api_client, docs: list[dict]) -> list[str]:
    """Server-side apply each document with dryRun=All; namespaces for real. Returns kinds."""
    from kubernetes import dynamic

    dyn = dynamic.DynamicClient(api_client)
    done = []
    # namespaces first, for real (a dry-run namespace cannot hold dry-run objects)
    for doc in sorted(docs, key=lambda d: d["kind"] != "Namespace"):
        res = dyn.resources.get(api_version=doc["apiVersion"], kind=doc["kind"])
        md = doc["metadata"]
        kwargs = {"dry_run": "All"} if doc["kind"] != "Namespace" else {}
        res.server_side_apply(
            body=doc,
            name=md["name"],
            namespace=md.get("namespace") if res.namespaced else None,
            field_manager=FIELD_MANAGER,
            force_conflicts=True,
            **kwargs,
        )
        done.append(f"{doc['kind']}/{md['name']}")
    return done


def test_manifests_pass_server_side_dry_run(api_client):
    docs = kustomize_documents()
    kinds = {d["kind"] for d in docs}
    assert {
        "CustomResourceDefinition",
        "Namespace",
        "ServiceAccount",
        "ClusterRole",
        "ClusterRoleBinding",
        "Role",
        "RoleBinding",
        "Deployment",
        "Service",
        "SandboxTemplate",
        "SandboxWarmPool",
    } <= kinds
    applied = dry_run(api_client, docs)
    assert len(applied) == len(docs)
    # dry run: nothing but the namespaces was stored
    from kubernetes import client

    apps = client.AppsV1Api(api_client)
    assert apps.list_namespaced_deployment("jupyter-sandbox-system").items == []


def test_dry_run_rejects_a_broken_manifest(api_client):
    """The check has teeth: a schema violation in a custom resource is refused."""
    from kubernetes.dynamic.exceptions import DynamicApiError

    docs = [d for d in kustomize_documents() if d["kind"] in ("Namespace", "SandboxWarmPool")]
    pool = next(d for d in docs if d["kind"] == "SandboxWarmPool")
    pool["spec"]["replicas"] = -1  # minimum: 0
    with pytest.raises(DynamicApiError) as err:
        dry_run(api_client, docs)
    assert err.value.status == 422


def test_rbac_is_least_privilege():
    """The router can only read sandboxes and claims (whose user a claim names, for
    hub authorization); nothing gets wildcards; of Secrets, the operator may only
    make, read by name and update (each sandbox's runtime token), never list or
    watch them."""
    docs = kustomize_documents()
    roles = {d["metadata"]["name"]: d for d in docs if d["kind"] in ("ClusterRole", "Role")}
    router = roles["jupyter-sandbox-router"]["rules"]
    assert router == [
        {
            "apiGroups": ["agents.x-k8s.io"],
            "resources": ["sandboxes"],
            "verbs": ["get", "list", "watch"],
        },
        {
            "apiGroups": ["extensions.agents.x-k8s.io"],
            "resources": ["sandboxclaims"],
            "verbs": ["get", "list", "watch"],
        },
    ]
    for role in roles.values():
        for rule in role["rules"]:
            assert "*" not in rule["verbs"] and "*" not in rule["resources"]
            if "secrets" in rule["resources"]:
                assert rule["resources"] == ["secrets"], rule
                assert rule["verbs"] == ["get", "create", "update"], rule
                assert role["metadata"]["name"] == "jupyter-sandbox-operator", role


def test_only_labelled_namespaces_may_reach_the_router():
    """#32: the router has a NetworkPolicy of its own, not only the sandboxes."""
    docs = kustomize_documents()
    (policy,) = [
        d
        for d in docs
        if d["kind"] == "NetworkPolicy" and d["metadata"]["name"] == "jupyter-sandbox-router"
    ]
    spec = policy["spec"]
    assert spec["podSelector"] == {"matchLabels": {"app": "sandbox-router"}}
    assert spec["policyTypes"] == ["Ingress"]
    (rule,) = spec["ingress"]
    assert rule["from"] == [
        {"namespaceSelector": {"matchLabels": {"jupyter-sandbox.io/router-access": "true"}}}
    ]
    assert rule["ports"] == [{"port": "http", "protocol": "TCP"}]


def test_helm_chart_renders_and_passes_dry_run(api_client, tmp_path):
    helm = find_helm()
    if helm is None:
        # A skip, not a failure, even in CI: helm is optional tooling (6 minutes
        # to build the first time); .ci/run builds it with build-helm.sh.
        pytest.skip("helm not available: run tests/kubernetes/build-helm.sh")
    env = {**os.environ, "HELM_CACHE_HOME": str(tmp_path), "HELM_CONFIG_HOME": str(tmp_path)}
    lint = subprocess.run([helm, "lint", str(CHART)], capture_output=True, text=True, env=env)
    assert lint.returncode == 0, lint.stdout + lint.stderr
    out = subprocess.run(
        [
            helm,
            "template",
            "jupyter-sandbox",
            str(CHART),
            "--include-crds",
            "--set",
            "router.tokenSecret.create=true",
            "--set",
            "router.allowedNamespaces={jupyter-sandboxes}",
            "--set",
            "router.hubApiUrl=http://hub.jhub.svc.cluster.local:8081/hub/api",
            "--set",
            "claimService.enabled=true",
            "--set",
            "claimService.namespace=jupyter-sandboxes",
        ],
        check=True,
        capture_output=True,
        text=True,
        env=env,
    ).stdout
    docs = [d for d in yaml.safe_load_all(out) if d]
    names = {f"{d['kind']}/{d['metadata']['name']}" for d in docs}
    assert {
        "Deployment/jupyter-sandbox-operator",
        "Deployment/jupyter-sandbox-router",
        "Service/jupyter-sandbox-router",
        "Secret/jupyter-sandbox-router-token",
        "SandboxWarmPool/python",
        "SandboxTemplate/python",
        "CustomResourceDefinition/sandboxclaims.extensions.agents.x-k8s.io",
    } <= names
    router = next(
        d
        for d in docs
        if d["metadata"]["name"] == "jupyter-sandbox-router" and d["kind"] == "Deployment"
    )
    args = router["spec"]["template"]["spec"]["containers"][0]["args"]
    assert "--allowed-namespaces=jupyter-sandboxes" in args
    assert "--token-secret-file=/etc/jupyter-sandbox/router-token/secret" in args
    assert "--hub-api-url=http://hub.jhub.svc.cluster.local:8081/hub/api" in args
    # and the router's parser takes what the chart renders
    from jupyter_sandbox.router.__main__ import parse_args

    parsed = parse_args([*args, "--kubeconfig=unused"])
    assert parsed.hub_api_url.endswith("/hub/api") and parsed.resolve == "api"
    # the claim service: in the pools' namespace, the router's hub, and what it runs parses
    claims = next(
        d
        for d in docs
        if d["metadata"]["name"] == "jupyter-sandbox-claims" and d["kind"] == "Deployment"
    )
    assert claims["metadata"]["namespace"] == "jupyter-sandboxes"
    from jupyter_sandbox.claim_service.__main__ import parse_args as claim_service_args

    container = claims["spec"]["template"]["spec"]["containers"][0]
    assert container["command"] == ["jupyter-sandbox"] and container["args"][0] == "claim-service"
    service = claim_service_args(container["args"][1:])
    assert service.hub_api_url == "http://hub.jhub.svc.cluster.local:8081/hub/api"
    assert service.router_url == (
        "http://jupyter-sandbox-router.jupyter-sandbox-system.svc.cluster.local:8080"
    )
    assert (service.max_claims_per_user, service.cold_starts_per_minute) == (10, 10.0)
    assert "ValidatingAdmissionPolicy/jupyter-sandbox-claim-service-sandbox-writes" in names
    applied = dry_run(api_client, docs)
    assert len(applied) == len(docs)
