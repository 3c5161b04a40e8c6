"""The daemon's HTTP API, served on a Unix socket only its user can open."""

from __future__ import annotations

import asyncio
import json
import logging
from typing import Any

from tornado import web

from ...router.tokens import Scope, TokenAuthority
from ..base import ClaimNotFound, InvalidRequest, PoolNotFound
from ..http_api import JsonHandler, claim_request_from_json
from .controller import LocalController
from .model import NAMESPACE, PoolSpec
from .paths import listen_socket

log = logging.getLogger(__name__)


class DaemonContext:
    def __init__(
        self,
        controller: LocalController,
        authority: TokenAuthority,
        router_url: str,
        info: dict[str, Any],
    ) -> None:
        self.controller = controller
        self.authority = authority
        self.router_url = router_url
        self.info = info
        self.stop = asyncio.Event()


class Handler(JsonHandler):
    def initialize(self, ctx: DaemonContext) -> None:
        self.ctx = ctx

    @property
    def controller(self) -> LocalController:
        return self.ctx.controller

    def claim_json(self, name: str) -> dict[str, Any]:
        claim = self.controller.get_claim(name)
        view = self.controller.claim_view(claim)
        if claim.sandbox:
            subject = claim.labels.get("jupyter-sandbox/user", "")
            view["endpoint"] = {
                "router_url": self.ctx.router_url,
                "namespace": NAMESPACE,
                "name": claim.sandbox,
                "port": 8888,
                "token": self.ctx.authority.issue(Scope(NAMESPACE, claim.sandbox, subject)),
                "unix_socket": str(listen_socket(self.controller.base, claim.sandbox)),
            }
        else:
            view["endpoint"] = None
        return view


class InfoHandler(Handler):
    def get(self) -> None:
        self.finish(self.ctx.info)


class ShutdownHandler(Handler):
    def post(self) -> None:
        self.ctx.stop.set()
        self.finish({"stopping": True})


class PoolsHandler(Handler):
    def get(self) -> None:
        pools = [self.controller.pool_view(p) for p in self.controller.store.pools.values()]
        self.finish({"items": pools})


class PoolHandler(Handler):
    def get(self, name: str) -> None:
        pool = self.controller.store.pools.get(name)
        if pool is None:
            raise PoolNotFound(f"pool {name!r} does not exist")
        self.finish({"spec": pool.to_json(), "status": self.controller.pool_view(pool)})

    def put(self, name: str) -> None:
        spec = PoolSpec.from_json(name, self.body())
        self.controller.apply_pool(spec)
        self.finish({"spec": spec.to_json(), "status": self.controller.pool_view(spec)})

    def delete(self, name: str) -> None:
        self.controller.delete_pool(name)
        self.set_status(204)
        self.finish()


class ClaimsHandler(Handler):
    def get(self) -> None:
        selector = self.label_selector()
        items = [
            self.claim_json(c.name)
            for c in self.controller.store.claims.values()
            if all(c.labels.get(k) == v for k, v in selector.items())
        ]
        self.finish({"items": items})

    def post(self) -> None:
        request = claim_request_from_json(self.body())
        claim = self.controller.create_claim(request)
        self.set_status(201)
        self.finish(self.claim_json(claim.name))


class ClaimHandler(Handler):
    async def get(self, name: str) -> None:
        wait = self.wait_arguments()
        if wait is not None:
            await self.controller.wait_for_claim(name, *wait)
        self.finish(self.claim_json(name))

    def delete(self, name: str) -> None:
        if not self.controller.delete_claim(name):
            raise ClaimNotFound(f"claim {name!r} does not exist")
        self.set_status(204)
        self.finish()


class ClaimActionHandler(Handler):
    async def post(self, name: str, action: str) -> None:
        if action == "suspend":
            force = self.body().get("force", False)
            if not isinstance(force, bool):
                raise InvalidRequest("force must be true or false")
            await self.controller.suspend_claim(name, force=force)
        elif action == "resume":
            self.controller.set_suspended(name, False)
        elif action == "adopt":
            owner = self.body().get("owner_pid")
            if not isinstance(owner, int):
                raise InvalidRequest("owner_pid must be an integer")
            self.controller.adopt_owner(name, owner)
        self.finish(self.claim_json(name))


class EventsHandler(Handler):
    """Server-sent events: one line per change of a pool, claim or sandbox."""

    async def get(self) -> None:
        self.set_header("Content-Type", "text/event-stream")
        self.set_header("Cache-Control", "no-cache")
        queue: asyncio.Queue[tuple[str, dict[str, Any]]] = asyncio.Queue(maxsize=1000)

        def listener(kind: str, data: dict[str, Any]) -> None:
            if not queue.full():
                queue.put_nowait((kind, data))

        self.controller.listeners.add(listener)
        try:
            self.write(": connected\n\n")
            await self.flush()
            while not self.request.connection.stream.closed():  # type: ignore[union-attr]
                try:
                    kind, data = await asyncio.wait_for(queue.get(), 15)
                except TimeoutError:
                    self.write(": keep-alive\n\n")
                else:
                    self.write(f"event: {kind}\ndata: {json.dumps(data)}\n\n")
                await self.flush()
        except Exception:  # the client went away
            pass
        finally:
            self.controller.listeners.discard(listener)


def make_api_app(ctx: DaemonContext) -> web.Application:
    kw = {"ctx": ctx}
    return web.Application(
        [
            (r"/api/info", InfoHandler, kw),
            (r"/api/shutdown", ShutdownHandler, kw),
            (r"/api/events", EventsHandler, kw),
            (r"/api/pools", PoolsHandler, kw),
            (r"/api/pools/([^/]+)", PoolHandler, kw),
            (r"/api/claims", ClaimsHandler, kw),
            (r"/api/claims/([^/]+)", ClaimHandler, kw),
            (r"/api/claims/([^/]+)/(suspend|resume|adopt)", ClaimActionHandler, kw),
        ]
    )
