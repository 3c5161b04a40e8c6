"""Request handlers that relay HTTP (streamed both ways) and WebSocket to a sandbox."""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from tornado import httpclient, httputil, web, websocket
from tornado.simple_httpclient import HTTPStreamClosedError, HTTPTimeoutError

from .routing import Route, RoutingError, forward_headers, parse_route, response_headers
from .settings import RouterContext
from .tokens import TokenRefused, bearer
from .upstreams import Upstream

log = logging.getLogger(__name__)

BODY_METHODS = frozenset({"POST", "PUT", "PATCH", "DELETE"})


class _Refused(Exception):
    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


async def route_request(
    ctx: RouterContext, request: httputil.HTTPServerRequest
) -> tuple[Route, Upstream]:
    """Validate, authorize and resolve a request, or raise _Refused with its status."""
    try:
        route = parse_route(request.headers, ctx.default_namespace)
    except RoutingError as exc:
        raise _Refused(400, str(exc)) from None
    if ctx.authority is not None:
        token = bearer(request.headers.get("Authorization"))
        try:
            ctx.authority.check(token, route.namespace, route.name)
        except TokenRefused as exc:
            raise _Refused(exc.status, exc.reason) from None
    upstream = await ctx.lookup(route.namespace, route.name, route.port)
    if upstream is None:
        raise _Refused(404, f"sandbox {route.namespace}/{route.name} not found")
    if route.pod_ip is not None and route.pod_ip != upstream.host:
        raise _Refused(403, "X-Sandbox-Pod-IP does not match the sandbox")
    ctx.resolver.register(upstream)
    return route, upstream


def _send_error(handler: web.RequestHandler, status: int, message: str) -> None:
    handler.clear()
    handler.set_status(status)
    handler.set_header("Content-Type", "application/json")
    handler.finish({"detail": message})


@web.stream_request_body
class HTTPProxyHandler(web.RequestHandler):
    SUPPORTED_METHODS = ("GET", "HEAD", "POST", "PUT", "DELETE", "PATCH", "OPTIONS")

    def initialize(self, ctx: RouterContext) -> None:
        self.ctx = ctx
        self._body: asyncio.Queue[bytes | None] | None = None
        self._fetch: asyncio.Future[Any] | None = None
        self._headers_sent = False
        self._response_headers = httputil.HTTPHeaders()
        self._status: int | None = None
        self._reason = ""

    async def prepare(self) -> None:
        try:
            route, upstream = await route_request(self.ctx, self.request)
        except _Refused as exc:
            _send_error(self, exc.status, exc.message)
            return
        method = self.request.method or "GET"
        has_body = method in BODY_METHODS
        if has_body:
            self._body = asyncio.Queue(maxsize=16)
        uri = self.request.uri or "/"
        req = httpclient.HTTPRequest(
            url=f"http://{upstream.authority()}{uri}",
            method=method,
            headers=forward_headers(self.request.headers),
            body_producer=self._produce_body if has_body else None,
            header_callback=self._on_header_line,
            streaming_callback=self._on_chunk,
            follow_redirects=False,
            decompress_response=False,
            allow_nonstandard_methods=True,
            connect_timeout=self.ctx.connect_timeout,
            request_timeout=self.ctx.proxy_timeout,
        )
        log.debug("proxy %s %s -> %s/%s", method, uri, route.namespace, route.name)
        self._fetch = asyncio.ensure_future(self.ctx.http_client.fetch(req, raise_error=False))

    async def data_received(self, chunk: bytes) -> None:
        if self._body is not None:
            await self._body.put(chunk)

    async def _produce_body(self, write: Any) -> None:
        assert self._body is not None
        while (chunk := await self._body.get()) is not None:
            await write(chunk)

    def _on_header_line(self, line: str) -> None:
        if line.startswith("HTTP/"):
            start = httputil.parse_response_start_line(line.strip())
            self._status, self._reason = start.code, start.reason
            self._response_headers = httputil.HTTPHeaders()
        elif line.strip():
            self._response_headers.parse_line(line)

    def _start_response(self) -> None:
        if self._headers_sent or self._status is None:
            return
        self._headers_sent = True
        self.set_status(self._status, self._reason or None)
        self.clear_header("Content-Type")
        self.clear_header("Server")
        drop = set(response_headers(self._response_headers))
        for name, value in self._response_headers.get_all():
            if name in drop:
                self.add_header(name, value)

    def _on_chunk(self, chunk: bytes) -> None:
        self._start_response()
        if self.request.method != "HEAD":
            self.write(chunk)
            self.flush()

    async def _relay(self) -> None:
        if self._finished or self._fetch is None:
            return
        if self._body is not None:
            await self._body.put(None)
        try:
            response = await self._fetch
            error = response.error
        except Exception as exc:  # the upstream closed or reset mid-exchange
            error = exc
        if self._status is None or (
            error is not None and not isinstance(error, httpclient.HTTPError)
        ):
            if not self._headers_sent:
                if isinstance(error, HTTPTimeoutError):
                    _send_error(self, 504, "the sandbox did not answer in time")
                else:
                    reason = (
                        "sandbox unreachable"
                        if not isinstance(error, HTTPStreamClosedError)
                        else "the sandbox closed the connection"
                    )
                    _send_error(self, 502, reason)
                return
        self._start_response()
        self.finish()

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
        if self._fetch is not None and not self._fetch.done():
            self._fetch.cancel()


class WebSocketProxyHandler(websocket.WebSocketHandler):
    def initialize(self, ctx: RouterContext) -> None:
        self.ctx = ctx
        self.upstream: websocket.WebSocketClientConnection | None = None
        self._pending: list[str | bytes] = []
        self._opened = False

    def check_origin(self, origin: str) -> bool:
        # Authorization is a bearer token, never a cookie, so a foreign origin gains nothing.
        return True

    async def get(self, *args: Any, **kwargs: Any) -> None:
        try:
            _, upstream = await route_request(self.ctx, self.request)
        except _Refused as exc:
            _send_error(self, exc.status, exc.message)
            return
        requested = [
            p.strip()
            for p in self.request.headers.get("Sec-WebSocket-Protocol", "").split(",")
            if p.strip()
        ]
        req = httpclient.HTTPRequest(
            url=f"ws://{upstream.authority()}{self.request.uri or '/'}",
            headers=forward_headers(self.request.headers, websocket=True),
            connect_timeout=self.ctx.connect_timeout,
        )
        try:
            self.upstream = await websocket.websocket_connect(
                req,
                subprotocols=requested or None,
                resolver=self.ctx.resolver,
                max_message_size=self.ctx.max_ws_message,
                on_message_callback=self._from_upstream,
            )
        except httpclient.HTTPClientError as exc:
            _send_error(self, 502, f"sandbox refused the WebSocket ({exc.code})")
            return
        except (TimeoutError, OSError, websocket.WebSocketError):
            _send_error(self, 502, "sandbox unreachable")
            return
        await super().get(*args, **kwargs)

    def get_compression_options(self) -> dict[str, Any] | None:
        return None

    def select_subprotocol(self, subprotocols: list[str]) -> str | None:
        if self.upstream is None:
            return None
        return self.upstream.selected_subprotocol

    def open(self, *args: Any, **kwargs: Any) -> None:
        self.set_nodelay(True)
        self._opened = True
        for message in self._pending:
            self.write_message(message, binary=isinstance(message, bytes))
        self._pending = []

    def _from_upstream(self, message: str | bytes | None) -> None:
        if message is None:
            code = self.upstream.close_code if self.upstream is not None else None
            reason = self.upstream.close_reason if self.upstream is not None else None
            if self.ws_connection is not None:
                self.close(code or 1011, reason or "sandbox closed the connection")
            return
        if not self._opened:
            self._pending.append(message)
            return
        try:
            self.write_message(message, binary=isinstance(message, bytes))
        except websocket.WebSocketClosedError:
            pass

    def on_message(self, message: str | bytes) -> None:
        if self.upstream is None:
            return
        try:
            self.upstream.write_message(message, binary=isinstance(message, bytes))
        except websocket.WebSocketClosedError:
            self.close(1011, "sandbox connection lost")

    def on_close(self) -> None:
        if self.upstream is not None:
            self.upstream.close(self.close_code or 1000, self.close_reason)
            self.upstream = None
