"""A small asyncio Kubernetes REST client working on plain dicts.

What the operator, the router and the backend need: get / list / watch /
create / update / patch (merge, JSON, strategic, server-side apply) / delete,
with precise control of resourceVersion preconditions and watch bookmarks.
Objects stay JSON dicts end to end (no model (de)serialisation), which keeps
the informer caches cheap.  The ``kubernetes`` package is used for what it does
best, loading credentials (``jupyter_sandbox.kubernetes_credentials``: exec
plugins, OIDC, in-cluster tokens); its synchronous REST client is not, because
watches would each pin a thread.

Failures are one of two exceptions: ``ApiError`` for an answer from the API
server (with its Status), ``Unreachable`` for no answer at all.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from typing import Any
from urllib.parse import urlencode

import aiohttp

from .. import kubernetes_credentials as credentials
from ..agent_sandbox import Resource
from ..kubernetes_credentials import ConnectionSettings


class Unreachable(Exception):
    """No answer from the API server (connection refused, DNS, TLS, timeout)."""


class ApiError(Exception):
    """Non-2xx answer from the API server, with its Status body."""

    def __init__(self, status: int, body: dict | str, method: str = "", path: str = "") -> None:
        self.status = status
        self.body = body if isinstance(body, dict) else {"message": str(body)}
        self.reason = str(self.body.get("reason", ""))
        self.message = str(self.body.get("message", "")) or f"HTTP {status}"
        super().__init__(f"{method} {path}: {status} {self.reason} {self.message}".strip())

    @property
    def not_found(self) -> bool:
        return self.status == 404

    @property
    def resource_missing(self) -> bool:
        """404 for the resource type itself (CRD not installed), not for one object."""
        return self.status == 404 and not self.body.get("details")

    @property
    def conflict(self) -> bool:
        return self.status == 409

    @property
    def already_exists(self) -> bool:
        return self.status == 409 and self.reason == "AlreadyExists"

    @property
    def gone(self) -> bool:
        return self.status == 410


POD = Resource("", "v1", "pods", "Pod")
SERVICE = Resource("", "v1", "services", "Service")
PVC = Resource("", "v1", "persistentvolumeclaims", "PersistentVolumeClaim")
SECRET = Resource("", "v1", "secrets", "Secret")
EVENT = Resource("", "v1", "events", "Event")
NETPOL = Resource("networking.k8s.io", "v1", "networkpolicies", "NetworkPolicy")
LEASE = Resource("coordination.k8s.io", "v1", "leases", "Lease")


def load_config(
    kubeconfig: str | None = None, context: str | None = None, in_cluster: bool | None = None
) -> ConnectionSettings:
    """kubeconfig (explicit, $KUBECONFIG, ~/.kube/config) or in-cluster service account.

    Blocking (an exec credential plugin may run): call before the event loop's
    work starts, or from a thread.  Raises ``CredentialsError`` with the reason.
    """
    loaded = credentials.load(kubeconfig=kubeconfig, context=context, in_cluster=in_cluster)
    return ConnectionSettings(loaded.configuration, namespace=loaded.namespace)


class Client:
    """Async API client.  Create inside a running event loop; ``await close()``."""

    def __init__(
        self,
        config: ConnectionSettings,
        max_connections: int = 64,
        user_agent: str = "jupyter-sandbox-operator",
        request_timeout: float = 30,
    ) -> None:
        """``max_connections`` bounds the open connections, watches included."""
        self.config = config
        self.request_timeout = request_timeout
        self._session = aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(limit=max_connections, ssl=config.ssl),
            headers={"User-Agent": user_agent},
        )

    async def close(self) -> None:
        await self._session.close()

    async def _headers(
        self, content_type: str | None = None, fresh_token: bool = False
    ) -> dict[str, str]:
        h = {"Accept": "application/json"}
        authorization = await self.config.authorization(force=fresh_token)
        if authorization:
            h["Authorization"] = authorization
        if content_type:
            h["Content-Type"] = content_type
        return h

    def _connection_options(self) -> dict[str, Any]:
        options: dict[str, Any] = {}
        if self.config.server_hostname:
            options["server_hostname"] = self.config.server_hostname
        if self.config.proxy:
            options["proxy"] = self.config.proxy
        return options

    async def request(
        self,
        method: str,
        path: str,
        body: Any = None,
        params: dict[str, Any] | None = None,
        content_type: str = "application/json",
        timeout: float | None = None,
    ) -> dict:
        url = self.config.server + path
        if params:
            url += "?" + urlencode({k: v for k, v in params.items() if v is not None})
        data = (
            None if body is None else (body if isinstance(body, (bytes, str)) else json.dumps(body))
        )
        for attempt in (1, 2):
            try:
                async with self._session.request(
                    method,
                    url,
                    data=data,
                    headers=await self._headers(
                        content_type if data is not None else None, fresh_token=attempt == 2
                    ),
                    timeout=aiohttp.ClientTimeout(total=timeout or self.request_timeout),
                    **self._connection_options(),
                ) as r:
                    raw = await r.read()
                    status = r.status
            except NETWORK_ERRORS as exc:
                raise Unreachable(f"{method} {path}: {_describe(exc)}") from None
            try:
                payload = json.loads(raw) if raw else {}
            except ValueError:
                payload = {"message": raw.decode(errors="replace")}
            # A 401 may mean the token rotated or expired since it was read:
            # ask the credentials once more before giving up.
            if status == 401 and attempt == 1:
                continue
            if status >= 400:
                raise ApiError(status, payload, method, path)
            return payload
        raise AssertionError("unreachable")

    # -- verbs -----------------------------------------------------------------

    async def get(
        self, res: Resource, namespace: str | None, name: str, sub: str | None = None
    ) -> dict:
        return await self.request("GET", res.path(namespace, name, sub))

    async def list(self, res: Resource, namespace: str | None = None, **params: Any) -> dict:
        return await self.request("GET", res.path(namespace), params=params)

    async def create(self, res: Resource, namespace: str | None, obj: dict, **params: Any) -> dict:
        obj.setdefault("apiVersion", res.api_version)
        obj.setdefault("kind", res.kind)
        return await self.request("POST", res.path(namespace), obj, params=params or None)

    async def replace(self, res: Resource, obj: dict, sub: str | None = None) -> dict:
        """PUT; the object's metadata.resourceVersion is the optimistic-lock precondition."""
        md = obj["metadata"]
        return await self.request("PUT", res.path(md.get("namespace"), md["name"], sub), obj)

    async def patch(
        self,
        res: Resource,
        namespace: str | None,
        name: str,
        patch: Any,
        sub: str | None = None,
        kind: str = "merge",
        field_manager: str | None = None,
        force: bool | None = None,
    ) -> dict:
        ctype = {
            "merge": "application/merge-patch+json",
            "json": "application/json-patch+json",
            "strategic": "application/strategic-merge-patch+json",
            "apply": "application/apply-patch+yaml",
        }[kind]
        params: dict[str, Any] = {}
        if field_manager:
            params["fieldManager"] = field_manager
        if force is not None:
            params["force"] = "true" if force else "false"
        return await self.request(
            "PATCH", res.path(namespace, name, sub), patch, params=params, content_type=ctype
        )

    async def delete(
        self,
        res: Resource,
        namespace: str | None,
        name: str,
        propagation: str | None = "Background",
        uid: str | None = None,
        resource_version: str | None = None,
    ) -> dict:
        body: dict[str, Any] = {"kind": "DeleteOptions", "apiVersion": "v1"}
        if propagation:
            body["propagationPolicy"] = propagation
        pre: dict[str, str] = {}
        if uid:
            pre["uid"] = uid
        if resource_version:
            pre["resourceVersion"] = resource_version
        if pre:
            body["preconditions"] = pre
        return await self.request("DELETE", res.path(namespace, name), body)

    async def watch(
        self,
        res: Resource,
        namespace: str | None,
        resource_version: str,
        label_selector: str | None = None,
        timeout_seconds: int = 300,
        *,
        field_selector: str | None = None,
    ) -> AsyncIterator[dict]:
        """Yield watch events ({type, object}) until the server closes the stream."""
        params = {
            "resourceVersion": resource_version,
            "timeoutSeconds": str(timeout_seconds),
            "labelSelector": label_selector,
            "fieldSelector": field_selector,
        }
        async for event in self.watch_path(res.path(namespace), params, timeout_seconds):
            yield event

    async def watch_path(
        self, path: str, params: dict[str, str | None], timeout_seconds: int = 300
    ) -> AsyncIterator[dict]:
        """``watch`` for any collection path (with bookmarks)."""
        query = {"watch": "true", "allowWatchBookmarks": "true", **params}
        url = self.config.server + path + "?" + urlencode({k: v for k, v in query.items() if v})
        try:
            async with self._session.get(
                url,
                headers=await self._headers(),
                timeout=aiohttp.ClientTimeout(
                    total=None, sock_connect=30, sock_read=timeout_seconds + 30
                ),
                **self._connection_options(),
            ) as r:
                if r.status == 401:
                    await self.config.authorization(force=True)
                if r.status >= 400:
                    raw = await r.read()
                    try:
                        payload = json.loads(raw)
                    except ValueError:
                        payload = {"message": raw.decode(errors="replace")}
                    raise ApiError(r.status, payload, "WATCH", path)
                buf = b""
                async for chunk in r.content.iter_any():
                    buf += chunk
                    while b"\n" in buf:
                        line, buf = buf.split(b"\n", 1)
                        if line.strip():
                            yield json.loads(line)
        except NETWORK_ERRORS as exc:
            raise Unreachable(f"WATCH {path}: {_describe(exc)}") from None


NETWORK_ERRORS = (aiohttp.ClientError, OSError, TimeoutError)


def _describe(exc: BaseException) -> str:
    return str(exc) or type(exc).__name__


async def sleep_or_stop(stop: asyncio.Event, seconds: float) -> bool:
    """Sleep, returning True early if ``stop`` is set."""
    try:
        await asyncio.wait_for(stop.wait(), timeout=seconds)
        return True
    except TimeoutError:
        return False
