"""The claim service's HTTP API: the claims API, scoped to the hub user calling it.

Every request carries a JupyterHub API token (``Authorization: token ...``, as
single-user servers have in ``$JUPYTERHUB_API_TOKEN``); the hub says whose it
is (``router/hub_auth.py``). The service then acts with its own Kubernetes
credentials, and only on that user's claims:

- a claim it creates is annotated with the user (exactly) and labelled with
  them (as a label value, for listing); whatever the body says about users,
  owners or names is not the caller's to choose;
- a claim that is not the caller's is answered as one that does not exist
  (404), so nobody learns another user's claim names;
- per-user limits (``claim_service/limits.py``) refuse with 429 and the reason.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import defaultdict
from dataclasses import dataclass, field

from tornado import web

from ..control_plane.base import (
    BackendUnavailable,
    ClaimError,
    ClaimNotFound,
    ClaimStatus,
    ControlPlane,
    InvalidRequest,
    Phase,
)
from ..control_plane.http_api import JsonHandler, claim_request_from_json
from ..router.authorization import credential
from ..router.hub_auth import HubIdentity, HubUnavailable
from ..router.tokens import TokenRefused
from ..utils.users import label_value
from .limits import UserLimits

log = logging.getLogger(__name__)

USER_LABEL = "jupyter-sandbox/user"
# Labels that say whose a claim is or who manages it: set here, never by a caller.
RESERVED_LABELS = frozenset({USER_LABEL, "jupyter-sandbox/owner", "app.kubernetes.io/managed-by"})
MAX_SERVER_NAME = 255


class Unauthorized(ClaimError):
    reason = "Unauthorized"
    status = 401


class Forbidden(ClaimError):
    reason = "Forbidden"
    status = 403


@dataclass
class ServiceContext:
    plane: ControlPlane
    hub: HubIdentity
    limits: UserLimits
    locks: dict[str, asyncio.Lock] = field(default_factory=lambda: defaultdict(asyncio.Lock))

    async def close(self) -> None:
        await self.hub.close()
        await self.plane.close()


class Handler(JsonHandler):
    def initialize(self, ctx: ServiceContext) -> None:
        self.ctx = ctx
        self.user = ""

    async def prepare(self) -> None:
        token = credential(self.request.headers.get("Authorization"))
        if not token:
            raise Unauthorized(
                "a JupyterHub API token is required (Authorization: token ...)",
                hint="single-user servers send $JUPYTERHUB_API_TOKEN",
            )
        try:
            self.user = await self.ctx.hub.user_of(token)
        except TokenRefused as exc:
            raise Forbidden(exc.reason) from None
        except HubUnavailable as exc:
            raise BackendUnavailable(f"cannot check the JupyterHub token now: {exc}") from None

    def owns(self, status: ClaimStatus | None) -> bool:
        return status is not None and status.user == self.user

    async def own_claim(self, name: str) -> ClaimStatus:
        status = await self.ctx.plane.status(name)
        if not self.owns(status):
            raise ClaimNotFound(f"claim {name!r} does not exist")
        assert status is not None
        return status

    async def own_claims(self, selector: dict[str, str] | None = None) -> list[ClaimStatus]:
        selector = {**(selector or {}), USER_LABEL: label_value(self.user)}
        # The label is lossy (alice.b and alice-b share it); the annotation is exact.
        return [s for s in await self.ctx.plane.list_claims(selector) if self.owns(s)]

    def answer(self, status: ClaimStatus) -> None:
        self.finish(status.to_json())


class InfoHandler(Handler):
    async def get(self) -> None:
        held = [s for s in await self.own_claims() if s.phase != Phase.TERMINATING]
        limits = self.ctx.limits.limits
        self.finish(
            {
                "user": self.user,
                "claims": len(held),
                "max_claims_per_user": limits.max_claims_per_user,
                "cold_starts_per_minute": limits.cold_starts_per_minute,
            }
        )


class PoolsHandler(Handler):
    async def get(self) -> None:
        pools = await self.ctx.plane.list_pools()
        self.finish({"items": [p.to_json() for p in pools]})


class ClaimsHandler(Handler):
    async def get(self) -> None:
        claims = await self.own_claims(self.label_selector())
        self.finish({"items": [s.to_json() for s in claims]})

    async def post(self) -> None:
        request = claim_request_from_json(self.body())
        if request.name:
            raise InvalidRequest("the claim service names claims itself: leave name out")
        server = request.server_name or ""
        if len(server) > MAX_SERVER_NAME:
            raise InvalidRequest(f"server_name is longer than {MAX_SERVER_NAME} characters")
        request.user = self.user
        request.labels = {k: v for k, v in request.labels.items() if k not in RESERVED_LABELS}
        request.labels[USER_LABEL] = label_value(self.user)
        # Process ids and orphan grace mean nothing across hosts.
        request.owner_pid = None
        request.orphan_grace = None
        async with self.ctx.locks[self.user]:
            held = [s for s in await self.own_claims() if s.phase != Phase.TERMINATING]
            pools = {p.name: p for p in await self.ctx.plane.list_pools()}
            pool = pools.get(request.pool)
            cold = pool is not None and pool.ready == 0
            self.ctx.limits.check_claim(self.user, len(held), cold, time.monotonic())
            status = await self.ctx.plane.claim(request)
        log.info("claim %s for %s in pool %s", status.name, self.user, request.pool)
        self.set_status(201)
        self.answer(status)


class ClaimHandler(Handler):
    async def get(self, name: str) -> None:
        status = await self.own_claim(name)
        wait = self.wait_arguments()
        if wait is not None and Phase.READY in wait[0] and status.phase != Phase.READY:
            status = await self.ctx.plane.wait_ready(name, wait[1])
        self.answer(status)

    async def delete(self, name: str) -> None:
        await self.own_claim(name)
        await self.ctx.plane.release(name)
        log.info("claim %s of %s released", name, self.user)
        self.set_status(204)
        self.finish()


class ClaimActionHandler(Handler):
    async def post(self, name: str, action: str) -> None:
        await self.own_claim(name)
        if action == "suspend":
            # Whether the kernel is busy is the caller's to check (claim_service_url
            # clients do): the runtime answers the user's server, not this service.
            status = await self.ctx.plane.suspend(name, force=True)
        else:
            status = await self.ctx.plane.resume(name)
        self.answer(status)


class HealthHandler(web.RequestHandler):
    """For probes: no token needed, nothing said."""

    def get(self) -> None:
        self.finish("ok")


def make_app(ctx: ServiceContext) -> web.Application:
    kw = {"ctx": ctx}
    return web.Application(
        [
            (r"/healthz", HealthHandler),
            (r"/api/info", InfoHandler, kw),
            (r"/api/pools", PoolsHandler, kw),
            (r"/api/claims", ClaimsHandler, kw),
            (r"/api/claims/([^/]+)", ClaimHandler, kw),
            (r"/api/claims/([^/]+)/(suspend|resume)", ClaimActionHandler, kw),
        ]
    )
