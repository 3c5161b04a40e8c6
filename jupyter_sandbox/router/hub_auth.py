"""Who holds a JupyterHub API token: the router's per-user authorization on a hub.

Under JupyterHub every single-user server has ``$JUPYTERHUB_API_TOKEN``, and the
provisioner sends it to the router instead of a router-signed token, so no user
pod ever holds the router's secret.  The router asks the hub who the token
belongs to (``GET {hub_api}/user``: every valid token may identify itself) and
lets the request through only to sandboxes whose claim names that user (see
``router/kubernetes.py``, ``ClaimOwners``).

Answers are cached for ``ttl`` seconds under a hash of the token (never the
token itself), so the hub is asked once per token per minute, not per request.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import time
from collections import OrderedDict

import aiohttp

from .tokens import TokenRefused

log = logging.getLogger(__name__)

DEFAULT_TTL = 60.0
MAX_CACHED = 10_000


class HubUnavailable(Exception):
    """The hub could not be asked (503): the caller may retry."""


class HubIdentity:
    def __init__(
        self, api_url: str, *, ttl: float = DEFAULT_TTL, request_timeout: float = 10.0
    ) -> None:
        if not api_url.startswith(("http://", "https://")):
            raise ValueError(f"the hub API URL must be http(s)://..., not {api_url!r}")
        self.api_url = api_url.rstrip("/")
        self.ttl = ttl
        self._timeout = aiohttp.ClientTimeout(total=request_timeout)
        self._session: aiohttp.ClientSession | None = None
        self._known: OrderedDict[str, tuple[str, float]] = OrderedDict()
        self._pending: dict[str, asyncio.Future[str]] = {}

    async def user_of(self, token: str) -> str:
        """The name of the hub user holding ``token``; TokenRefused if it is not
        a valid user token, HubUnavailable if the hub cannot say."""
        key = hashlib.sha256(token.encode()).hexdigest()
        hit = self._known.get(key)
        if hit is not None and hit[1] > time.monotonic():
            self._known.move_to_end(key)
            return hit[0]
        # One hub request per token, however many requests arrive at once.
        pending = self._pending.get(key)
        if pending is None:
            pending = asyncio.ensure_future(self._ask(token))
            self._pending[key] = pending
            pending.add_done_callback(lambda _: self._pending.pop(key, None))
        user = await asyncio.shield(pending)
        self._known[key] = (user, time.monotonic() + self.ttl)
        self._known.move_to_end(key)
        while len(self._known) > MAX_CACHED:
            self._known.popitem(last=False)
        return user

    async def _ask(self, token: str) -> str:
        if self._session is None or self._session.closed:
            self._session = aiohttp.ClientSession(timeout=self._timeout)
        try:
            async with self._session.get(
                f"{self.api_url}/user", headers={"Authorization": f"token {token}"}
            ) as response:
                if response.status in (401, 403):
                    raise TokenRefused(403, "the JupyterHub token is not valid")
                if response.status != 200:
                    raise HubUnavailable(f"the hub answered {response.status}")
                model = await response.json(content_type=None)
        except (TimeoutError, aiohttp.ClientError, ValueError) as exc:
            log.warning("cannot reach the hub at %s: %s", self.api_url, exc)
            raise HubUnavailable(f"cannot reach the hub: {exc}") from None
        if not isinstance(model, dict) or model.get("kind", "user") != "user":
            # services and anything else: only users own sandboxes
            raise TokenRefused(403, "the JupyterHub token does not belong to a user")
        name = model.get("name")
        if not isinstance(name, str) or not name:
            raise HubUnavailable("the hub's answer names no user")
        return name

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None
