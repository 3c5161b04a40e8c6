"""Resolve sandboxes for the router from the Kubernetes API: informer-backed caches.

``SandboxResolver`` runs one informer of Sandbox objects (cluster-wide, or one
per namespace when an allowed set is given, so a namespaced Role suffices) in
the router's event loop and keeps, per sandbox, only what routing needs: its
``podIPs``, ``serviceFQDN``, Ready condition, operating mode and claim.
``lookup`` answers from that cache without any API call:

- a Running sandbox with a pod IP -> that IP (the fast path: no DNS);
- a known sandbox without a pod IP but with a Service -> its ``serviceFQDN``;
- a known sandbox with neither (suspended, still starting) -> not found (404);
- an unknown sandbox -> ``<id>.<ns>.svc.<cluster-domain>`` (upstream router's
  rule), unless ``fallback_dns`` is off; also used while the cache is not synced
  (start-up, API server unreachable);
- a namespace outside ``allowed_namespaces`` (when set) -> not found.

With ``runtime_key`` each upstream carries its sandbox's runtime token
(protocol/runtime_auth.py), for the router to present.

With ``track_owners`` it also follows SandboxClaims and answers ``owner_of``:
the user named by the ``jupyter-sandbox/user`` annotation of the claim that
controls a sandbox (its controller ownerReference, or the claim-uid label of
a warm sandbox), for the router's per-user authorization on JupyterHub.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from ..agent_sandbox import CLAIM, CLAIM_UID_LABEL, SANDBOX
from ..kube.client import Client
from ..kube.informer import Informer
from ..operator.user_volume import CLAIM_USER_ANNOTATION
from ..protocol import runtime_auth
from .upstreams import Upstream


@dataclass(frozen=True)
class Entry:
    pod_ips: tuple[str, ...]
    service_fqdn: str | None
    ready: bool
    suspended: bool
    claim_uid: str | None = None
    uid: str = ""  # the Sandbox's own: its runtime token is derived from it


def entry_of(sandbox: dict[str, Any]) -> Entry:
    status = sandbox.get("status") or {}
    conds = {c.get("type"): c.get("status") for c in status.get("conditions") or []}
    return Entry(
        pod_ips=tuple(status.get("podIPs") or ()),
        service_fqdn=status.get("serviceFQDN") or None,
        ready=conds.get("Ready") == "True",
        suspended=(sandbox.get("spec") or {}).get("operatingMode") == "Suspended",
        claim_uid=_claim_uid(sandbox.get("metadata") or {}),
        uid=str((sandbox.get("metadata") or {}).get("uid") or ""),
    )


def _claim_uid(meta: dict[str, Any]) -> str | None:
    for ref in meta.get("ownerReferences") or ():
        if ref.get("controller") and ref.get("kind") == "SandboxClaim":
            return str(ref.get("uid") or "") or None
    return (meta.get("labels") or {}).get(CLAIM_UID_LABEL) or None


def claim_user(claim: dict[str, Any]) -> str | None:
    return ((claim.get("metadata") or {}).get("annotations") or {}).get(
        CLAIM_USER_ANNOTATION
    ) or None


def _identity(meta: dict[str, Any]) -> dict[str, Any]:
    return {k: meta[k] for k in ("name", "namespace", "uid", "resourceVersion") if k in meta}


def slim_sandbox(sandbox: dict[str, Any]) -> dict[str, Any]:
    """What the cache keeps of a Sandbox: its identity and its routing ``Entry``
    (not the pod template, which is most of the object)."""
    meta = sandbox.get("metadata") or {}
    return {"metadata": _identity(meta), "entry": entry_of(sandbox)}


def slim_claim(claim: dict[str, Any]) -> dict[str, Any]:
    """What the cache keeps of a SandboxClaim: its identity and its user."""
    return {"metadata": _identity(claim.get("metadata") or {}), "user": claim_user(claim)}


class SandboxResolver:
    def __init__(
        self,
        client: Client | None,
        *,
        allowed_namespaces: Iterable[str] | None = None,
        cluster_domain: str = "cluster.local",
        fallback_dns: bool = True,
        track_owners: bool = False,
        list_page_size: int = 500,
        runtime_key: bytes | None = None,
    ) -> None:
        if list_page_size < 1:
            raise ValueError("list_page_size must be at least 1")
        self.client = client
        allowed = {n for n in (allowed_namespaces or ()) if n}
        self.allowed: frozenset[str] | None = frozenset(allowed) if allowed else None
        self.cluster_domain = cluster_domain
        self.fallback_dns = fallback_dns
        self.track_owners = track_owners
        self.list_page_size = list_page_size
        self.runtime_key = runtime_key
        self._sandboxes: dict[str | None, Informer] = {}
        self._claims: dict[str | None, Informer] = {}
        self._stop = asyncio.Event()
        self._tasks: list[asyncio.Task[None]] = []

    # -- lifecycle ---------------------------------------------------------------

    def start(self) -> SandboxResolver:
        """Start the informers in the running event loop."""
        if self.client is None:
            raise RuntimeError("SandboxResolver.start needs an API client")
        scopes: list[str | None] = list(sorted(self.allowed)) if self.allowed else [None]
        for ns in scopes:
            self._sandboxes[ns] = Informer(
                self.client, SANDBOX, ns, transform=slim_sandbox, page_size=self.list_page_size
            )
            if self.track_owners:
                self._claims[ns] = Informer(
                    self.client,
                    CLAIM,
                    ns,
                    indexers={"uid": lambda c: [c["metadata"].get("uid", "")]},
                    transform=slim_claim,
                    page_size=self.list_page_size,
                )
        for informer in [*self._sandboxes.values(), *self._claims.values()]:
            name = f"router-watch-{informer.res.plural}-{informer.namespace or 'all'}"
            self._tasks.append(asyncio.create_task(informer.run(self._stop), name=name))
        return self

    async def stop(self) -> None:
        self._stop.set()
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        self._tasks.clear()

    def _informers(self) -> list[Informer]:
        return [*self._sandboxes.values(), *self._claims.values()]

    @property
    def synced(self) -> bool:
        informers = self._informers()
        return bool(informers) and all(i.synced.is_set() for i in informers)

    async def wait_synced(self, timeout: float = 30.0) -> bool:
        try:
            await asyncio.wait_for(
                asyncio.gather(*(i.synced.wait() for i in self._informers())), timeout
            )
        except TimeoutError:
            return False
        return self.synced

    # -- lookup ------------------------------------------------------------------

    def _scope(self, namespace: str) -> str | None:
        return namespace if self.allowed is not None else None

    def get(self, namespace: str, name: str) -> Entry | None:
        informer = self._sandboxes.get(self._scope(namespace))
        cached = informer.get(namespace, name) if informer is not None else None
        return cached["entry"] if cached is not None else None

    def owner_of(self, namespace: str, name: str) -> str | None:
        """The user the claim of ``namespace/name`` names (None: unknown, no claim,
        or a claim without a user)."""
        if not self.track_owners:
            raise RuntimeError("owner_of needs SandboxResolver(track_owners=True)")
        if self.allowed is not None and namespace not in self.allowed:
            return None
        entry = self.get(namespace, name)
        if entry is None or entry.claim_uid is None:
            return None
        claims = self._claims.get(self._scope(namespace))
        for claim in claims.by_index("uid", entry.claim_uid) if claims is not None else ():
            if claim["metadata"].get("namespace") == namespace:
                return claim["user"]  # type: ignore[no-any-return]
        return None

    def _runtime_token(self, namespace: str, name: str, entry: Entry) -> str:
        """The token this sandbox's runtime asks for (none without a key; an unknown
        sandbox, routed by DNS, gets none and its runtime refuses)."""
        if self.runtime_key is None or not entry.uid:
            return ""
        return runtime_auth.token_for(self.runtime_key, namespace, name, entry.uid)

    async def lookup(self, namespace: str, name: str, port: int) -> Upstream | None:
        if self.allowed is not None and namespace not in self.allowed:
            return None
        entry = self.get(namespace, name)
        if entry is not None:
            token = self._runtime_token(namespace, name, entry)
            if entry.pod_ips and not entry.suspended:
                return Upstream(host=entry.pod_ips[0], port=port, runtime_token=token)
            if entry.service_fqdn and not entry.suspended:
                return Upstream(host=entry.service_fqdn, port=port, runtime_token=token)
            return None
        if self.fallback_dns:
            return Upstream(host=f"{name}.{namespace}.svc.{self.cluster_domain}", port=port)
        return None
