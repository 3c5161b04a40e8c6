"""The router application: every path is proxied; WebSocket upgrades get their own handler."""

from __future__ import annotations

from typing import Any

from tornado import httputil, routing, web

from .proxy import HTTPProxyHandler
from .settings import RouterContext
from .ws_tunnel import WebSocketTunnelHandler


class _UpgradeAwareRouter(routing.Router):
    def __init__(self, app: web.Application, ctx: RouterContext) -> None:
        self.app = app
        self.ctx = ctx

    def find_handler(
        self, request: httputil.HTTPServerRequest, **kwargs: Any
    ) -> httputil.HTTPMessageDelegate | None:
        upgrade = request.headers.get("Upgrade", "").lower() == "websocket"
        target = WebSocketTunnelHandler if upgrade else HTTPProxyHandler
        return self.app.get_handler_delegate(request, target, {"ctx": self.ctx})


def make_router_app(ctx: RouterContext) -> web.Application:
    app = web.Application(websocket_max_message_size=ctx.max_ws_message)
    app.default_router = _UpgradeAwareRouter(app, ctx)  # type: ignore[assignment]
    app.wildcard_router = app.default_router  # type: ignore[assignment]
    return app
