"""Credentials for the Kubernetes API, loaded one way for every part of the project.

The operator (asyncio, aiohttp), the router and the Kubernetes backend (the
synchronous ``kubernetes`` client) all start here, so all of them understand the
same kubeconfigs: contexts, exec credential plugins (cloud auth helpers such as
``aws eks get-token`` or ``gke-gcloud-auth-plugin``), OIDC and in-cluster
service-account tokens with rotation.  The parsing is the official client's
(``kubernetes.config``); what this module adds is the choice between in-cluster
and kubeconfig, the context's namespace, clear errors, and an asyncio-friendly
view of the result for aiohttp (:class:`ConnectionSettings`).
"""

from __future__ import annotations

import asyncio
import os
import ssl
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

SA_DIR = Path("/var/run/secrets/kubernetes.io/serviceaccount")

# How long a bearer token is reused before asking the loader again.  The loader
# itself decides whether that means re-reading a rotated service-account token or
# re-running an exec plugin (it does so only near the credential's expiry).
TOKEN_RECHECK_SECONDS = 30.0


class CredentialsError(Exception):
    """No usable Kubernetes configuration (missing file, unknown context, bad data)."""


@dataclass
class LoadedConfig:
    """A ``kubernetes.client.Configuration`` and the namespace to work in."""

    configuration: Any  # kubernetes.client.Configuration
    namespace: str
    in_cluster: bool


def in_cluster_available(sa_dir: Path = SA_DIR, environ: Mapping[str, str] = os.environ) -> bool:
    return bool(environ.get("KUBERNETES_SERVICE_HOST")) and (sa_dir / "token").exists()


def load(
    *,
    kubeconfig: str | None = None,
    context: str | None = None,
    in_cluster: bool | None = None,
    sa_dir: Path = SA_DIR,
    environ: Mapping[str, str] = os.environ,
) -> LoadedConfig:
    """Load in-cluster credentials or a kubeconfig context.

    ``in_cluster=None`` picks the pod's service account when there is one and no
    kubeconfig was named.  Blocking (an exec plugin may run): call it from a
    thread in asyncio code.
    """
    from kubernetes import client, config
    from kubernetes.config.incluster_config import InClusterConfigLoader

    cfg = client.Configuration()
    use_cluster = (
        in_cluster
        if in_cluster is not None
        else (kubeconfig is None and in_cluster_available(sa_dir, environ))
    )
    try:
        if use_cluster:
            InClusterConfigLoader(
                token_filename=str(sa_dir / "token"),
                cert_filename=str(sa_dir / "ca.crt"),
                environ=dict(environ),
            ).load_and_set(cfg)
            return LoadedConfig(cfg, _read(sa_dir / "namespace") or "default", True)
        path = kubeconfig or environ.get("KUBECONFIG", "").split(os.pathsep)[0] or None
        path = os.path.expanduser(path) if path else None
        if path and not os.path.isfile(path):
            raise CredentialsError(f"kubeconfig {path} does not exist")
        config.load_kube_config(config_file=path, context=context, client_configuration=cfg)
        contexts, active = config.list_kube_config_contexts(config_file=path)
        if context:
            active = next((c for c in contexts if c.get("name") == context), active)
    except config.ConfigException as exc:
        where = "in-cluster service account" if use_cluster else "kubeconfig"
        raise CredentialsError(f"no usable Kubernetes configuration ({where}): {exc}") from None
    namespace = ((active or {}).get("context") or {}).get("namespace") or "default"
    return LoadedConfig(cfg, namespace, False)


def _read(path: Path) -> str:
    try:
        return path.read_text().strip()
    except OSError:
        return ""


class ConnectionSettings:
    """What an aiohttp client needs from a loaded configuration.

    TLS settings become one ``SSLContext``; the bearer token is asked of the
    configuration (which refreshes rotated or expiring credentials) at most every
    :data:`TOKEN_RECHECK_SECONDS`, in a thread, or at once after a 401.
    """

    def __init__(self, configuration: Any, namespace: str = "default") -> None:
        self.configuration = configuration
        # the namespace of the kubeconfig context or of the pod's service account
        self.namespace = namespace
        self.server: str = str(configuration.host).rstrip("/")
        self.ssl: ssl.SSLContext | bool = _ssl_context(configuration) if self.tls else True
        self.server_hostname: str | None = getattr(configuration, "tls_server_name", None) or None
        self.proxy: str | None = getattr(configuration, "proxy", None) or None
        self._authorization: str | None = None
        self._checked_at = float("-inf")
        self._lock = threading.Lock()

    @property
    def tls(self) -> bool:
        return self.server.startswith("https")

    def _read_authorization(self) -> str | None:
        with self._lock:
            value = self.configuration.auth_settings().get("BearerToken", {}).get("value")
            self._authorization = value or None
            self._checked_at = time.monotonic()
            return self._authorization

    async def authorization(self, force: bool = False) -> str | None:
        """The ``Authorization`` header value (None: the TLS client certificate is enough)."""
        if force or time.monotonic() - self._checked_at > TOKEN_RECHECK_SECONDS:
            return await asyncio.to_thread(self._read_authorization)
        return self._authorization


def _ssl_context(configuration: Any) -> ssl.SSLContext:
    ctx = ssl.create_default_context(cafile=configuration.ssl_ca_cert or None)
    if not configuration.verify_ssl:
        ctx.check_hostname = False
        ctx.verify_mode = ssl.CERT_NONE
    if configuration.cert_file and configuration.key_file:
        ctx.load_cert_chain(configuration.cert_file, configuration.key_file)
    return ctx
