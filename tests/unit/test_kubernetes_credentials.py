"""Choosing and loading Kubernetes credentials (jupyter_sandbox/kubernetes_credentials.py)."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
import yaml

from jupyter_sandbox import kubernetes_credentials as credentials

# The loaders are the official client's: the ``kubernetes`` extra (a local-only
# install, such as the ordinary user's test environment, has none).
pytest.importorskip("kubernetes")


def _service_account(tmp_path: Path, token: str = "sa-token", namespace: str = "team") -> Path:
    sa = tmp_path / "serviceaccount"
    sa.mkdir()
    (sa / "token").write_text(token)
    (sa / "ca.crt").write_text("-----BEGIN CERTIFICATE-----\n")
    (sa / "namespace").write_text(namespace)
    return sa


POD_ENV = {"KUBERNETES_SERVICE_HOST": "10.0.0.1", "KUBERNETES_SERVICE_PORT": "443"}


def _kubeconfig(tmp_path: Path, namespace: str | None = None) -> Path:
    ctx: dict = {"cluster": "c", "user": "u"}
    if namespace:
        ctx["namespace"] = namespace
    path = tmp_path / "kubeconfig"
    path.write_text(
        yaml.safe_dump(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "clusters": [{"name": "c", "cluster": {"server": "http://127.0.0.1:1"}}],
                "users": [{"name": "u", "user": {"token": "kc-token"}}],
                "contexts": [
                    {"name": "main", "context": ctx},
                    {"name": "other", "context": {"cluster": "c", "user": "u", "namespace": "o"}},
                ],
                "current-context": "main",
            }
        )
    )
    return path


@pytest.mark.parametrize(
    ("env", "has_token", "expected"),
    [
        (POD_ENV, True, True),
        (POD_ENV, False, False),
        ({}, True, False),
        ({"KUBERNETES_SERVICE_HOST": ""}, True, False),
    ],
)
def test_in_cluster_is_detected_from_the_environment_and_the_token(
    tmp_path, env, has_token, expected
):
    sa = _service_account(tmp_path)
    if not has_token:
        (sa / "token").unlink()
    assert credentials.in_cluster_available(sa, env) is expected


def test_in_a_pod_the_service_account_and_its_namespace_are_used(tmp_path):
    sa = _service_account(tmp_path)
    loaded = credentials.load(sa_dir=sa, environ=POD_ENV)
    assert loaded.in_cluster
    assert loaded.namespace == "team"
    assert loaded.configuration.host == "https://10.0.0.1:443"
    assert loaded.configuration.auth_settings()["BearerToken"]["value"] == "bearer sa-token"


def test_a_named_kubeconfig_wins_over_the_pods_service_account(tmp_path):
    sa = _service_account(tmp_path)
    loaded = credentials.load(kubeconfig=str(_kubeconfig(tmp_path)), sa_dir=sa, environ=POD_ENV)
    assert not loaded.in_cluster
    assert loaded.configuration.host == "http://127.0.0.1:1"


@pytest.mark.parametrize(
    ("context", "context_namespace", "expected"),
    [
        (None, None, "default"),
        (None, "mine", "mine"),
        ("other", "mine", "o"),
    ],
)
def test_the_namespace_is_the_chosen_contexts(tmp_path, context, context_namespace, expected):
    path = _kubeconfig(tmp_path, context_namespace)
    loaded = credentials.load(kubeconfig=str(path), context=context, environ={})
    assert loaded.namespace == expected


@pytest.mark.parametrize(
    ("kubeconfig", "context", "message"),
    [
        ("{tmp}/nowhere", None, "does not exist"),
        ("{kc}", "no-such-context", "no-such-context"),
    ],
)
def test_unusable_configuration_is_a_clear_error(tmp_path, kubeconfig, context, message):
    path = kubeconfig.replace("{tmp}", str(tmp_path)).replace("{kc}", str(_kubeconfig(tmp_path)))
    with pytest.raises(credentials.CredentialsError, match=message):
        credentials.load(kubeconfig=path, context=context, environ={})


def test_an_empty_service_account_token_is_a_clear_error(tmp_path):
    sa = _service_account(tmp_path, token="")
    with pytest.raises(credentials.CredentialsError, match="in-cluster"):
        credentials.load(in_cluster=True, sa_dir=sa, environ=POD_ENV)


def test_the_aiohttp_view_asks_for_the_token_only_when_due_or_forced(tmp_path):
    loaded = credentials.load(kubeconfig=str(_kubeconfig(tmp_path)), environ={})
    settings = credentials.ConnectionSettings(loaded.configuration)
    assert settings.server == "http://127.0.0.1:1"
    assert settings.ssl is True  # plain HTTP: no TLS context to build
    issued: list[str] = []

    def rotate(configuration) -> None:  # what an exec plugin or a rotated file does
        issued.append(f"Bearer token-{len(issued) + 1}")
        configuration.api_key["BearerToken"] = issued[-1]

    loaded.configuration.refresh_api_key_hook = rotate

    async def go() -> list[str | None]:
        return [
            await settings.authorization(),
            await settings.authorization(),
            await settings.authorization(force=True),
        ]

    assert asyncio.run(go()) == ["Bearer token-1", "Bearer token-1", "Bearer token-2"]
