"""A small asyncio Kubernetes REST client working on plain dicts.

Only what the operator needs: kubeconfig / in-cluster config, get / list /
watch / create / update / patch (merge, JSON, server-side apply) / delete, with
precise control of resourceVersion preconditions and watch bookmarks.  Objects
stay JSON dicts end to end (no model (de)serialisation), which keeps the
informer caches cheap.
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


class ApiError(Exception):
    """Non-2xx answer from the API server."""

    def __init__(self, status: int, body: dict | str, method: str = "", path: str = "") -> None:
        self.status = status
        self.body = body if isinstance(body, dict) else {"message": str(body)}
        self.reason = self.body.get("reason", "")
        super().__init__(
            f"{method} {path}: {status} {self.reason} {self.body.get('message', '')}".strip()
        )

    @property
    def not_found(self) -> bool:
        return self.status == 404

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
EVENT = Resource("", "v1", "events", "Event")
NETPOL = Resource("networking.k8s.io", "v1", "networkpolicies", "NetworkPolicy")
LEASE = Resource("coordination.k8s.io", "v1", "leases", "Lease")


def load_config(kubeconfig: str | None = None, context: str | None = None) -> ConnectionSettings:
    """kubeconfig (explicit, $KUBECONFIG, ~/.kube/config) or in-cluster service account.

    Blocking (an exec credential plugin may run): call before the event loop's
    work starts, or from a thread.
    """
    loaded = credentials.load(kubeconfig=kubeconfig, context=context)
    return ConnectionSettings(loaded.configuration)


class Client:
    """Async API client.  Create inside a running event loop; ``await close()``."""

    def __init__(
        self,
        config: ConnectionSettings,
        max_connections: int = 64,
        user_agent: str = "jupyter-sandbox-operator",
    ) -> None:
        self.config = config
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
        timeout: float = 30,
    ) -> dict:
        url = self.config.server + path
        if params:
            url += "?" + urlencode({k: v for k, v in params.items() if v is not None})
        data = (
            None if body is None else (body if isinstance(body, (bytes, str)) else json.dumps(body))
        )
        for attempt in (1, 2):
            async with self._session.request(
                method,
                url,
                data=data,
                headers=await self._headers(
                    content_type if data is not None else None, fresh_token=attempt == 2
                ),
                timeout=aiohttp.ClientTimeout(total=timeout),
                **self._connection_options(),
            ) as r:
                raw = await r.read()
                try:
                    payload = json.loads(raw) if raw else {}
                except ValueError:
                    payload = {"message": raw.decode(errors="replace")}
                # A 401 may mean the token rotated or expired since it was read:
                # ask the credentials once more before giving up.
                if r.status == 401 and attempt == 1:
                    continue
                if r.status >= 400:
                    raise ApiError(r.status, payload, method, path)
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
    ) -> AsyncIterator[dict]:
        """Yield watch events ({type, object}) until the server closes the stream."""
        params = {
            "watch": "true",
            "resourceVersion": resource_version,
            "allowWatchBookmarks": "true",
            "timeoutSeconds": str(timeout_seconds),
            "labelSelector": label_selector,
        }
        url = (
            self.config.server
            + res.path(namespace)
            + "?"
            + urlencode({k: v for k, v in params.items() if v})
        )
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
                raise ApiError(r.status, payload, "WATCH", res.path(namespace))
            buf = b""
            async for chunk in r.content.iter_any():
                buf += chunk
                while b"\n" in buf:
                    line, buf = buf.split(b"\n", 1)
                    if line.strip():
                        yield json.loads(line)


async def sleep_or_stop(stop: asyncio.Event, seconds: float) -> bool:
    """Sleep, returning True early if ``stop`` is set."""
    try:
        await asyncio.wait_for(stop.wait(), timeout=seconds)
        return True
    except TimeoutError:
        return False
