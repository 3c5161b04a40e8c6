"""Kubernetes API access shared by the control-plane backend and the router.

Built on the official synchronous ``kubernetes`` client, used from threads:

- it is already a dependency, and its configuration loading is the complete one
  (kubeconfig contexts, exec credential plugins such as cloud auth helpers,
  in-cluster service accounts with token refresh), which matters because a
  Jupyter server runs with whatever kubeconfig its user has;
- our calls are few and short (create, get, patch, delete), except watches,
  which run with server-side timeouts in a dedicated, bounded thread pool so they
  never starve the event loop's default executor;
- objects stay plain JSON dicts (``_preload_content=False``): no model
  deserialisation, and custom resources need none anyway.

``kubernetes_asyncio`` would avoid the threads but is another dependency whose
release line lags (the upstream SDK pins it below 34), and the operator's own
aiohttp client (``operator/kube.py``) has no exec-plugin support.
"""

from __future__ import annotations

import json
import socket
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from ... import agent_sandbox
from ... import kubernetes_credentials as credentials
from ...operator.user_volume import CLAIM_USER_ANNOTATION

SANDBOX = agent_sandbox.SANDBOX.gvp
TEMPLATE = agent_sandbox.TEMPLATE.gvp
WARMPOOL = agent_sandbox.WARMPOOL.gvp
CLAIM = agent_sandbox.CLAIM.gvp

# On a claim: the exact name of the user it is for (labels hold a sanitized
# copy); the router's JupyterHub authorization admits only that user, and the
# operator mounts only that user's volume (operator/user_volume.py).
USER_ANNOTATION = CLAIM_USER_ANNOTATION


class Unreachable(Exception):
    """The API server could not be reached (connection refused, DNS, TLS, timeout)."""


class ApiStatus(Exception):
    """A non-2xx answer from the API server, with its Status body."""

    def __init__(self, status: int, body: Any) -> None:
        self.status = status
        self.body = body if isinstance(body, dict) else {"message": str(body or "")}
        self.reason = str(self.body.get("reason", ""))
        self.message = str(self.body.get("message", "")) or f"HTTP {status}"
        super().__init__(f"{status} {self.reason}: {self.message}")

    @property
    def not_found(self) -> bool:
        return self.status == 404

    @property
    def resource_missing(self) -> bool:
        """404 for the resource type itself (CRD not installed), not for one object."""
        return self.status == 404 and not self.body.get("details")

    @property
    def gone(self) -> bool:
        return self.status == 410


@dataclass
class KubeConfig:
    api_client: Any  # kubernetes.client.ApiClient
    namespace: str
    in_cluster: bool


def load(
    *,
    kubeconfig: str | None = None,
    context: str | None = None,
    in_cluster: bool | None = None,
    pool_size: int = 64,
) -> KubeConfig:
    """An ApiClient and the default namespace (in-cluster, or the kubeconfig context's).

    Blocking (exec plugins may run): call from a thread.
    """
    from kubernetes import client

    try:
        loaded = credentials.load(kubeconfig=kubeconfig, context=context, in_cluster=in_cluster)
    except credentials.CredentialsError as exc:
        raise Unreachable(str(exc)) from None
    cfg = loaded.configuration
    cfg.connection_pool_maxsize = max(pool_size, 4)
    cfg.retries = 1
    api = client.ApiClient(cfg)
    api.user_agent = "jupyter-sandbox"
    return KubeConfig(api_client=api, namespace=loaded.namespace, in_cluster=loaded.in_cluster)


def _body(exc: Any) -> Any:
    raw = getattr(exc, "body", None)
    if isinstance(raw, bytes):
        raw = raw.decode(errors="replace")
    if isinstance(raw, str):
        try:
            return json.loads(raw)
        except ValueError:
            return {"message": raw.strip()[:500]}
    return {"message": str(getattr(exc, "reason", "") or exc)}


def call(fn: Any, *args: Any, **kwargs: Any) -> Any:
    """Run one client call returning the decoded JSON; map failures to our exceptions."""
    import urllib3
    from kubernetes.client.rest import ApiException

    kwargs.setdefault("_request_timeout", (5, 30))
    kwargs["_preload_content"] = False
    try:
        resp = fn(*args, **kwargs)
    except ApiException as exc:
        if exc.status in (0, None):
            raise Unreachable(str(exc.reason or exc)) from None
        raise ApiStatus(int(exc.status), _body(exc)) from None
    except (urllib3.exceptions.HTTPError, OSError) as exc:
        raise Unreachable(str(exc)) from None
    try:
        data = resp.data
    finally:
        resp.release_conn()
    return json.loads(data) if data else None


class WatchHandle:
    """Lets another thread interrupt a blocking watch.

    Closing the response from another thread would block on the reader's buffer
    lock; shutting the socket down wakes the reader instead, which then closes.
    """

    def __init__(self) -> None:
        self.stopped = threading.Event()
        self._resp: Any = None
        self._lock = threading.Lock()

    def attach(self, resp: Any) -> None:
        with self._lock:
            self._resp = resp
        if self.stopped.is_set():
            self._shutdown(resp)

    def detach(self) -> None:
        with self._lock:
            self._resp = None

    def stop(self) -> None:
        self.stopped.set()
        with self._lock:
            resp = self._resp
        if resp is not None:
            self._shutdown(resp)

    @staticmethod
    def _shutdown(resp: Any) -> None:
        sock = getattr(getattr(resp, "connection", None), "sock", None)
        if sock is None:
            return
        try:
            sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass


def watch(
    fn: Any,
    *args: Any,
    resource_version: str,
    timeout_seconds: int,
    handle: WatchHandle | None = None,
    **kwargs: Any,
) -> Iterator[dict[str, Any]]:
    """Yield watch events (``{"type", "object"}``) until the server closes the stream.

    Raises ApiStatus(410) when ``resource_version`` is too old; the caller relists.
    """
    import urllib3
    from kubernetes.client.rest import ApiException

    try:
        resp = fn(
            *args,
            watch=True,
            allow_watch_bookmarks=True,
            resource_version=resource_version,
            timeout_seconds=max(1, int(timeout_seconds)),
            _preload_content=False,
            _request_timeout=(5, timeout_seconds + 30),
            **kwargs,
        )
    except ApiException as exc:
        if exc.status in (0, None):
            raise Unreachable(str(exc.reason or exc)) from None
        raise ApiStatus(int(exc.status), _body(exc)) from None
    except (urllib3.exceptions.HTTPError, OSError) as exc:
        raise Unreachable(str(exc)) from None
    if handle is not None:
        handle.attach(resp)
    try:
        buf = b""
        for chunk in resp.stream(amt=None, decode_content=False):
            buf += chunk
            while b"\n" in buf:
                line, buf = buf.split(b"\n", 1)
                if not line.strip():
                    continue
                event = json.loads(line)
                if event.get("type") == "ERROR":
                    obj = event.get("object") or {}
                    raise ApiStatus(int(obj.get("code") or 500), obj)
                yield event
            if handle is not None and handle.stopped.is_set():
                return
    except ApiStatus:
        raise
    except Exception as exc:
        if handle is not None and handle.stopped.is_set():
            return  # closed under our feet by stop()
        if isinstance(exc, urllib3.exceptions.HTTPError | OSError | ValueError):
            raise Unreachable(f"watch interrupted: {exc}") from None
        raise
    finally:
        if handle is not None:
            handle.detach()
        resp.close()
        resp.release_conn()
