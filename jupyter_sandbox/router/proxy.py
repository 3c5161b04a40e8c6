"""Request handlers that relay HTTP (streamed both ways) and WebSocket to a sandbox."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import aiohttp
from tornado import httputil, iostream, web

from .routing import (
    Route,
    RoutingError,
    forward_headers,
    origin_form,
    parse_route,
    response_headers,
)
from .settings import RouterContext
from .tokens import TokenRefused
from .upstreams import Upstream

log = logging.getLogger(__name__)

BODY_METHODS = frozenset({"POST", "PUT", "PATCH", "DELETE"})


class Refused(Exception):
    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


@dataclass(frozen=True)
class Destination:
    """Where an admitted request goes: the sandbox, and the path and query to ask it for."""

    route: Route
    upstream: Upstream
    path: str
    query: str

    @property
    def target(self) -> str:
        return f"{self.path}?{self.query}" if self.query else self.path


async def route_request(ctx: RouterContext, request: httputil.HTTPServerRequest) -> Destination:
    """Validate, authorize and resolve a request, or raise Refused with its status."""
    try:
        # The target first: whatever the caller's token, only a path may go upstream.
        path, query = origin_form(request.uri)
        route = parse_route(request.headers, ctx.default_namespace)
    except RoutingError as exc:
        raise Refused(400, str(exc)) from None
    try:
        await ctx.auth.check(request.headers, route.namespace, route.name)
    except TokenRefused as exc:
        raise Refused(exc.status, exc.reason) from None
    upstream = await ctx.lookup(route.namespace, route.name, route.port)
    if upstream is None:
        raise Refused(404, f"sandbox {route.namespace}/{route.name} not found")
    if route.pod_ip is not None and route.pod_ip != upstream.host:
        raise Refused(403, "X-Sandbox-Pod-IP does not match the sandbox")
    ctx.resolver.register(upstream)
    return Destination(route, upstream, path, query)


def send_error(handler: web.RequestHandler, status: int, message: str) -> None:
    handler.clear()
    handler.set_status(status)
    handler.set_header("Content-Type", "application/json")
    handler.finish({"detail": message})


@web.stream_request_body
class HTTPProxyHandler(web.RequestHandler):
    """Streams the request body up and the response body down, over pooled connections."""

    SUPPORTED_METHODS = ("GET", "HEAD", "POST", "PUT", "DELETE", "PATCH", "OPTIONS")

    def initialize(self, ctx: RouterContext) -> None:
        self.ctx = ctx
        self._body: asyncio.Queue[bytes | None] | None = None
        self._upstream: asyncio.Task[aiohttp.ClientResponse] | None = None
        self._response: aiohttp.ClientResponse | None = None

    async def prepare(self) -> None:
        try:
            to = await route_request(self.ctx, self.request)
        except Refused as exc:
            send_error(self, exc.status, exc.message)
            return
        try:
            url = to.upstream.http_url(to.path, to.query)
        except ValueError as exc:  # the lookup gave an address no URL can hold
            log.warning("cannot proxy to %s: %s", to.upstream, exc)
            send_error(self, 502, "the sandbox has no usable address")
            return
        route = to.route
        method = self.request.method or "GET"
        if method in BODY_METHODS:
            self._body = asyncio.Queue(maxsize=16)
        log.debug("proxy %s %s -> %s/%s", method, to.target, route.namespace, route.name)
        session = self.ctx.session_for(to.upstream)
        self._upstream = asyncio.ensure_future(
            session.request(
                method,
                url,
                headers=forward_headers(
                    self.request.headers, runtime_token=to.upstream.runtime_token
                ),
                data=self._produce_body() if self._body is not None else None,
                allow_redirects=False,
                auto_decompress=False,
                skip_auto_headers=("User-Agent", "Accept-Encoding", "Accept", "Content-Type"),
                timeout=aiohttp.ClientTimeout(
                    # X-Sandbox-Timeout may shorten the proxy timeout, never extend it.
                    total=min(route.timeout or self.ctx.proxy_timeout, self.ctx.proxy_timeout),
                    sock_connect=self.ctx.connect_timeout,
                ),
            )
        )

    async def data_received(self, chunk: bytes) -> None:
        if self._body is not None:
            await self._body.put(chunk)

    async def _produce_body(self) -> AsyncIterator[bytes]:
        assert self._body is not None
        while (chunk := await self._body.get()) is not None:
            yield chunk

    async def _relay(self) -> None:
        if self._finished or self._upstream is None:
            return
        if self._body is not None:
            await self._body.put(None)
        try:
            response = self._response = await self._upstream
        except asyncio.CancelledError:
            return  # the caller went away before the sandbox answered
        except TimeoutError:
            send_error(self, 504, "the sandbox did not answer in time")
            return
        except aiohttp.ClientError:
            send_error(self, 502, "sandbox unreachable")
            return
        try:
            self.set_status(response.status, response.reason or None)
            self.clear_header("Content-Type")
            self.clear_header("Server")
            keep = set(response_headers(response.headers))
            for name, value in response.headers.items():
                if name in keep:
                    self.add_header(name, value)
            if self.request.method != "HEAD":
                async for chunk in response.content.iter_any():
                    self.write(chunk)
                    await self.flush()
            self.finish()
        except (aiohttp.ClientError, TimeoutError):
            # Headers may be out already: all that is left is to cut the connection.
            stream = getattr(self.request.connection, "stream", None)
            if stream is not None:
                stream.close()
        except iostream.StreamClosedError:
            response.close()  # the caller went away: drop the upstream exchange too
        finally:
            response.release()

    async def get(self, *args: Any) -> None:
        await self._relay()

    async def head(self, *args: Any) -> None:
        await self._relay()

    async def post(self, *args: Any) -> None:
        await self._relay()

    async def put(self, *args: Any) -> None:
        await self._relay()

    async def delete(self, *args: Any) -> None:
        await self._relay()

    async def patch(self, *args: Any) -> None:
        await self._relay()

    async def options(self, *args: Any) -> None:
        await self._relay()

    def on_connection_close(self) -> None:
        # Tell the sandbox too: a streaming command is killed when its reader leaves.
        if self._upstream is not None and not self._upstream.done():
            self._upstream.cancel()
        if self._response is not None:
            self._response.close()
