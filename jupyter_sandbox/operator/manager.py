"""Wires informers, reconcilers, leader election and the metrics endpoint."""

from __future__ import annotations

import asyncio
import logging
import signal
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from ..agent_sandbox import (
    CLAIM,
    EXT_GROUP,
    NAME_HASH_LABEL,
    SANDBOX,
    SANDBOX_GROUP,
    TEMPLATE,
    WARM_POOL_LABEL,
    WARMPOOL,
)
from ..kube.client import NETPOL, POD, PVC, SERVICE, Client, load_config
from ..kube.informer import Informer, key_of
from ..kubernetes_credentials import ConnectionSettings
from .claim import ClaimReconciler
from .core import Controller, EventRecorder, LeaderElector
from .sandbox import SandboxReconciler
from .template import TemplateReconciler
from .util import controller_of, group_of
from .warmpool import WarmPoolReconciler

log = logging.getLogger("jupyter_sandbox.operator")


@dataclass
class Options:
    kubeconfig: str | None = None
    context: str | None = None  # kubeconfig context (None: the current one)
    namespace: str | None = None  # None: all namespaces
    workers: int = 8
    leader_elect: bool = True
    leader_election_namespace: str = "default"
    leader_election_id: str = "jupyter-sandbox-operator"
    identity: str | None = None
    lease_duration: float = 15.0
    renew_deadline: float = 10.0
    retry_period: float = 2.0
    metrics_bind_address: str = "127.0.0.1:8080"  # "0" disables
    cluster_domain: str = "cluster.local"
    warm_pool_replenish_delay: float = 0.0
    router_namespace: str = "agent-sandbox-system"
    router_labels: dict[str, str] = field(default_factory=lambda: {"app": "sandbox-router"})
    # Each sandbox's runtime asks callers for a token derived from this key
    # (protocol/runtime_auth.py); None: runtimes ask nothing.
    runtime_key: bytes | None = None


def _controller_idx(obj: dict) -> list[str]:
    ref = controller_of(obj)
    return [ref["uid"]] if ref and ref.get("uid") else []


def _pool_idx(obj: dict) -> list[str]:
    v = (obj["metadata"].get("labels") or {}).get(WARM_POOL_LABEL)
    return [v] if v else []


class Operator:
    def __init__(self, opts: Options) -> None:
        self.opts = opts
        self.cluster_domain = opts.cluster_domain
        self.replenish_delay = opts.warm_pool_replenish_delay
        self.router_namespace = opts.router_namespace
        self.router_labels = opts.router_labels
        self.stop = asyncio.Event()
        self.ready = False

    def _build(self, settings: ConnectionSettings) -> None:
        c = self.client = Client(settings, max_connections=max(32, self.opts.workers * 8))
        ns = self.opts.namespace
        self.events = EventRecorder(c)
        sel = NAME_HASH_LABEL  # children we create always carry it
        self.sandboxes = Informer(
            c, SANDBOX, ns, indexers={"controller-uid": _controller_idx, "warm-pool": _pool_idx}
        )
        self.pods = Informer(c, POD, ns, label_selector=sel)
        self.services = Informer(c, SERVICE, ns, label_selector=sel)
        self.pvcs = Informer(c, PVC, ns, label_selector=sel)
        self.templates = Informer(c, TEMPLATE, ns)
        self.pools = Informer(c, WARMPOOL, ns)
        self.claims = Informer(c, CLAIM, ns)
        self.netpols = Informer(c, NETPOL, ns)
        self.informers = [
            self.sandboxes,
            self.pods,
            self.services,
            self.pvcs,
            self.templates,
            self.pools,
            self.claims,
            self.netpols,
        ]

        w = self.opts.workers
        self.sandbox_r = SandboxReconciler(self)
        self.template_r = TemplateReconciler(self)
        self.pool_r = WarmPoolReconciler(self)
        self.claim_r = ClaimReconciler(self)
        self.c_sandbox = Controller("sandbox", self.sandbox_r.reconcile, workers=w * 2)
        self.c_template = Controller("sandboxtemplate", self.template_r.reconcile, workers=2)
        self.c_pool = Controller("sandboxwarmpool", self.pool_r.reconcile, workers=2)
        self.c_claim = Controller("sandboxclaim", self.claim_r.reconcile, workers=w * 2)
        self.controllers = [self.c_sandbox, self.c_template, self.c_pool, self.c_claim]
        self._wire()

    def _wire(self) -> None:
        def own(obj: dict | None, kind: str, group: str, ctrl: Controller) -> None:
            ref = controller_of(obj) if obj else None
            if (
                obj
                and ref
                and ref.get("kind") == kind
                and group_of(ref.get("apiVersion", "")) == group
            ):
                ctrl.enqueue((obj["metadata"]["namespace"], ref["name"]))

        def on_sandbox(old: dict | None, new: dict | None) -> None:
            obj = new or old
            assert obj is not None
            if new is not None:
                self.c_sandbox.enqueue(key_of(new))
            for o in (old, new):
                own(o, "SandboxWarmPool", EXT_GROUP, self.c_pool)
                own(o, "SandboxClaim", EXT_GROUP, self.c_claim)

        def on_child(old: dict | None, new: dict | None) -> None:
            for o in (old, new):
                own(o, "Sandbox", SANDBOX_GROUP, self.c_sandbox)

        def on_template(old: dict | None, new: dict | None) -> None:
            obj = new or old
            assert obj is not None
            if new is not None:
                self.c_template.enqueue(key_of(new))
            ns, name = key_of(obj)
            for p in self.pools.items():
                if (
                    p["metadata"]["namespace"] == ns
                    and (p.get("spec", {}).get("sandboxTemplateRef") or {}).get("name") == name
                ):
                    self.c_pool.enqueue(key_of(p))
            self._requeue_unbound_claims(ns)

        def on_pool(old: dict | None, new: dict | None) -> None:
            if new is not None:
                self.c_pool.enqueue(key_of(new))
                if old is None or old.get("metadata", {}).get("generation") != new["metadata"].get(
                    "generation"
                ):
                    self._requeue_unbound_claims(new["metadata"]["namespace"])

        def on_claim(old: dict | None, new: dict | None) -> None:
            self.c_claim.enqueue(key_of(new or old))  # type: ignore[arg-type]

        def on_netpol(old: dict | None, new: dict | None) -> None:
            for o in (old, new):
                own(o, "SandboxTemplate", EXT_GROUP, self.c_template)

        self.sandboxes.add_handler(on_sandbox)
        for inf in (self.pods, self.services, self.pvcs):
            inf.add_handler(on_child)
        self.templates.add_handler(on_template)
        self.pools.add_handler(on_pool)
        self.claims.add_handler(on_claim)
        self.netpols.add_handler(on_netpol)

    def _requeue_unbound_claims(self, ns: str) -> None:
        for c in self.claims.items():
            if c["metadata"]["namespace"] == ns and not (c.get("status") or {}).get(
                "sandbox", {}
            ).get("name"):
                self.c_claim.enqueue(key_of(c))

    # -- run ---------------------------------------------------------------------

    async def _metrics_server(self) -> web.AppRunner | None:
        addr = self.opts.metrics_bind_address
        if not addr or addr == "0":
            return None
        host, _, port = addr.rpartition(":")

        async def metrics(_: web.Request) -> web.Response:
            return web.Response(
                body=generate_latest(), headers={"Content-Type": CONTENT_TYPE_LATEST}
            )

        async def healthz(_: web.Request) -> web.Response:
            return web.Response(text="ok")

        async def readyz(_: web.Request) -> web.Response:
            return web.Response(
                text="ok" if self.ready else "not ready", status=200 if self.ready else 503
            )

        app = web.Application()
        app.router.add_get("/metrics", metrics)
        app.router.add_get("/healthz", healthz)
        app.router.add_get("/readyz", readyz)
        runner = web.AppRunner(app, access_log=None)
        await runner.setup()
        await web.TCPSite(runner, host or "0.0.0.0", int(port)).start()
        log.info("metrics listening", extra={"address": addr})
        return runner

    async def run(self) -> int:
        self._build(await asyncio.to_thread(load_config, self.opts.kubeconfig, self.opts.context))
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            try:
                loop.add_signal_handler(sig, self.stop.set)
            except (NotImplementedError, RuntimeError):
                pass
        runner = await self._metrics_server()
        tasks = [asyncio.create_task(i.run(self.stop)) for i in self.informers]
        # Ready means "caches synced, can take over", leader or standby: a Deployment
        # of two replicas must become Available although only one of them leads.
        tasks.append(asyncio.create_task(self._ready_when_synced()))
        elector = None
        rc = 0
        try:
            # warm the caches while waiting for leadership: fast fail-over
            if self.opts.leader_elect:
                elector = LeaderElector(
                    self.client,
                    self.opts.leader_election_namespace,
                    self.opts.leader_election_id,
                    lease_duration=self.opts.lease_duration,
                    renew_deadline=self.opts.renew_deadline,
                    retry_period=self.opts.retry_period,
                    **({"identity": self.opts.identity} if self.opts.identity else {}),
                )
                if not await elector.acquire(self.stop):
                    return 0
            await self._wait_synced()
            if self.stop.is_set():
                return 0
            log.info("caches synced, starting controllers", extra={"workers": self.opts.workers})
            # every object seen by the initial LIST is already queued (ADDED events)
            tasks += [asyncio.create_task(c.run(self.stop)) for c in self.controllers]
            self.ready = True
            if elector is not None:
                await elector.hold(self.stop)
                if not self.stop.is_set():
                    rc = 1  # lost leadership: exit so we restart clean
                    self.stop.set()
            else:
                await self.stop.wait()
        finally:
            self.stop.set()
            for t in tasks:
                t.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            try:
                await asyncio.wait_for(self.events.drain(), 5)  # best effort, briefly
            except TimeoutError:
                pass
            if elector is not None and rc == 0:
                await elector.release()
            if runner is not None:
                await runner.cleanup()
            await self.client.close()
            log.info("operator stopped", extra={"rc": rc})
        return rc

    async def _ready_when_synced(self) -> None:
        await self._wait_synced()
        if not self.stop.is_set():
            self.ready = True

    async def _wait_synced(self) -> None:
        waits = [asyncio.create_task(i.synced.wait()) for i in self.informers]
        stop = asyncio.create_task(self.stop.wait())
        try:
            gathered: asyncio.Future[Any] = asyncio.gather(*waits)
            await asyncio.wait([gathered, stop], return_when=asyncio.FIRST_COMPLETED)
        finally:
            stop.cancel()
            for w in waits:
                w.cancel()
