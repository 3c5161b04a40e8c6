"""Resolve sandboxes for the router from the Kubernetes API: a watch-backed cache.

``SandboxResolver`` LISTs and then WATCHes Sandbox objects (cluster-wide, or
per namespace when an allowed set is given, so a namespaced Role suffices) in a
background thread and keeps, per sandbox, what its status says: ``podIPs``,
``serviceFQDN``, Ready and operating mode.  ``lookup`` answers from that cache
without any API call:

- a Running sandbox with a pod IP -> that IP (the fast path: no DNS);
- a known sandbox without a pod IP but with a Service -> its ``serviceFQDN``;
- a known sandbox with neither (suspended, still starting) -> not found (404);
- an unknown sandbox -> ``<id>.<ns>.svc.<cluster-domain>`` (upstream router's
  rule), unless ``fallback_dns`` is off; also used while the cache is not synced
  (start-up, API server unreachable);
- a namespace outside ``allowed_namespaces`` (when set) -> not found.

With ``track_owners`` it also watches SandboxClaims and answers ``owner_of``:
the user named by the ``jupyter-sandbox/user`` annotation of the claim that
controls a sandbox (its controller ownerReference, or the claim-uid label of
a warm sandbox), for the router's per-user authorization on JupyterHub.
"""

from __future__ import annotations

import logging
import random
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from ..agent_sandbox import CLAIM_UID_LABEL
from ..control_plane.kubernetes import client as kc
from .upstreams import Upstream

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Entry:
    pod_ips: tuple[str, ...]
    service_fqdn: str | None
    ready: bool
    suspended: bool
    claim_uid: str | None = None


def entry_of(sandbox: dict[str, Any]) -> Entry:
    status = sandbox.get("status") or {}
    conds = {c.get("type"): c.get("status") for c in status.get("conditions") or []}
    return Entry(
        pod_ips=tuple(status.get("podIPs") or ()),
        service_fqdn=status.get("serviceFQDN") or None,
        ready=conds.get("Ready") == "True",
        suspended=(sandbox.get("spec") or {}).get("operatingMode") == "Suspended",
        claim_uid=_claim_uid(sandbox.get("metadata") or {}),
    )


def _claim_uid(meta: dict[str, Any]) -> str | None:
    for ref in meta.get("ownerReferences") or ():
        if ref.get("controller") and ref.get("kind") == "SandboxClaim":
            return str(ref.get("uid") or "") or None
    return (meta.get("labels") or {}).get(CLAIM_UID_LABEL) or None


def claim_user(claim: dict[str, Any]) -> str | None:
    return ((claim.get("metadata") or {}).get("annotations") or {}).get(kc.USER_ANNOTATION) or None


class SandboxResolver:
    def __init__(
        self,
        api_client: Any,
        *,
        allowed_namespaces: Iterable[str] | None = None,
        cluster_domain: str = "cluster.local",
        fallback_dns: bool = True,
        watch_timeout: int = 300,
        track_owners: bool = False,
        list_page_size: int = 500,
    ) -> None:
        self.api_client = api_client
        allowed = {n for n in (allowed_namespaces or ()) if n}
        self.allowed: frozenset[str] | None = frozenset(allowed) if allowed else None
        self.cluster_domain = cluster_domain
        self.fallback_dns = fallback_dns
        self.watch_timeout = watch_timeout
        self.track_owners = track_owners
        if list_page_size < 1:
            raise ValueError("list_page_size must be at least 1")
        self.list_page_size = list_page_size
        self._cache: dict[tuple[str, str], Entry] = {}
        # (namespace, claim uid) -> the user the claim names
        self._owners: dict[tuple[str, str], str | None] = {}
        self._synced: dict[tuple[str, str | None], bool] = {}
        self._handles: list[kc.WatchHandle] = []
        self._threads: list[threading.Thread] = []
        self._stop = threading.Event()
        self.changed = threading.Condition()

    # -- lifecycle ---------------------------------------------------------------

    def start(self) -> SandboxResolver:
        scopes: list[str | None] = list(sorted(self.allowed)) if self.allowed else [None]
        kinds = [kc.SANDBOX, kc.CLAIM] if self.track_owners else [kc.SANDBOX]
        for kind in kinds:
            for ns in scopes:
                handle = kc.WatchHandle()
                self._handles.append(handle)
                t = threading.Thread(
                    target=self._run,
                    args=(kind, ns, handle),
                    name=f"router-watch-{kind[2]}-{ns or 'all'}",
                    daemon=True,
                )
                self._threads.append(t)
                self._synced[(kind[2], ns)] = False
                t.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        for h in self._handles:
            h.stop()
        for t in self._threads:
            t.join(timeout=5)

    @property
    def synced(self) -> bool:
        return bool(self._synced) and all(self._synced.values())

    def wait_synced(self, timeout: float = 30.0) -> bool:
        deadline = time.monotonic() + timeout
        with self.changed:
            while not self.synced:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    return False
                self.changed.wait(remaining)
        return True

    # -- lookup ------------------------------------------------------------------

    def get(self, namespace: str, name: str) -> Entry | None:
        return self._cache.get((namespace, name))

    def owner_of(self, namespace: str, name: str) -> str | None:
        """The user the claim of ``namespace/name`` names (None: unknown, no claim,
        or a claim without a user)."""
        if not self.track_owners:
            raise RuntimeError("owner_of needs SandboxResolver(track_owners=True)")
        if self.allowed is not None and namespace not in self.allowed:
            return None
        entry = self._cache.get((namespace, name))
        if entry is None or entry.claim_uid is None:
            return None
        return self._owners.get((namespace, entry.claim_uid))

    async def lookup(self, namespace: str, name: str, port: int) -> Upstream | None:
        if self.allowed is not None and namespace not in self.allowed:
            return None
        entry = self._cache.get((namespace, name))
        if entry is not None:
            if entry.pod_ips and not entry.suspended:
                return Upstream(host=entry.pod_ips[0], port=port)
            if entry.service_fqdn and not entry.suspended:
                return Upstream(host=entry.service_fqdn, port=port)
            return None
        if self.fallback_dns:
            return Upstream(host=f"{name}.{namespace}.svc.{self.cluster_domain}", port=port)
        return None

    # -- the watch thread -------------------------------------------------------------

    def _list_watch_fns(
        self, kind: tuple[str, str, str], ns: str | None
    ) -> tuple[Any, tuple[Any, ...]]:
        from kubernetes import client

        co = client.CustomObjectsApi(self.api_client)
        g, v, p = kind
        if ns is None:
            return co.list_cluster_custom_object, (g, v, p)
        return co.list_namespaced_custom_object, (g, v, ns, p)

    def _store(self, kind: tuple[str, str, str]) -> tuple[dict[Any, Any], Callable[..., Any]]:
        """The cache for ``kind`` and how one object becomes (key, value) in it."""
        if kind == kc.SANDBOX:
            return self._cache, lambda md, obj: (
                (md.get("namespace", ""), md["name"]),
                entry_of(obj),
            )
        return self._owners, lambda md, obj: ((md.get("namespace", ""), md["uid"]), claim_user(obj))

    def _run(self, kind: tuple[str, str, str], ns: str | None, handle: kc.WatchHandle) -> None:
        fn, args = self._list_watch_fns(kind, ns)
        cache, item = self._store(kind)
        what = f"{kind[2]} watch ({ns or 'all namespaces'})"
        backoff = 0.5
        while not self._stop.is_set():
            try:
                rv = self._relist(fn, args, kind, ns)
                backoff = 0.5
                while not self._stop.is_set():
                    for event in kc.watch(
                        fn,
                        *args,
                        resource_version=rv,
                        timeout_seconds=self.watch_timeout,
                        handle=handle,
                    ):
                        obj = event.get("object") or {}
                        md = obj.get("metadata") or {}
                        rv = md.get("resourceVersion", rv)
                        if event.get("type") == "BOOKMARK":
                            continue
                        key, value = item(md, obj)
                        if event.get("type") == "DELETED":
                            cache.pop(key, None)
                        else:
                            cache[key] = value
                        self._notify()
            except kc.ApiStatus as exc:
                if not exc.gone:
                    log.warning("%s: %s", what, exc)
                    self._mark(kind, ns, False)
                    self._stop.wait(backoff)
                    backoff = min(backoff * 2, 30.0)
            except kc.Unreachable as exc:
                if self._stop.is_set():
                    return
                log.warning("%s: %s", what, exc)
                self._mark(kind, ns, False)
                self._stop.wait(backoff * (1 + random.random()))
                backoff = min(backoff * 2, 30.0)
            except Exception:
                log.exception("%s failed", what)
                self._mark(kind, ns, False)
                self._stop.wait(backoff)
                backoff = min(backoff * 2, 30.0)

    def _relist(
        self, fn: Any, args: tuple[Any, ...], kind: tuple[str, str, str], ns: str | None
    ) -> str:
        # In pages, as the API server prefers for large lists; every page belongs to
        # the first one's snapshot, whose resourceVersion the watch starts from.  An
        # expired continue token (410) fails the relist and the caller starts over.
        cache, item = self._store(kind)
        fresh: dict[Any, Any] = {}
        token: str | None = None
        version: str | None = None
        while True:
            page = {"limit": self.list_page_size, **({"_continue": token} if token else {})}
            data = kc.call(fn, *args, _request_timeout=(5, 60), **page)
            fresh.update(item(obj.get("metadata") or {}, obj) for obj in data.get("items") or [])
            meta = data.get("metadata") or {}
            version = version or str(meta["resourceVersion"])
            token = meta.get("continue") or None
            if token is None:
                break
        for key in [k for k in cache if ns is None or k[0] == ns]:
            if key not in fresh:
                cache.pop(key, None)
        cache.update(fresh)
        self._mark(kind, ns, True)
        return version

    def _mark(self, kind: tuple[str, str, str], ns: str | None, synced: bool) -> None:
        self._synced[(kind[2], ns)] = synced
        self._notify()

    def _notify(self) -> None:
        with self.changed:
            self.changed.notify_all()
