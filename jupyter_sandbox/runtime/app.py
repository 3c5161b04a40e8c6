"""Tornado application of the runtime server."""

from __future__ import annotations

from tornado import web

from . import handlers
from .state import RuntimeState

DEFAULT_MAX_BODY = 1024 * 1024 * 1024
DEFAULT_MAX_WS_MESSAGE = 512 * 1024 * 1024


def make_app(
    state: RuntimeState,
    *,
    max_ws_message: int = DEFAULT_MAX_WS_MESSAGE,
    max_upload_bytes: int = DEFAULT_MAX_BODY,
    runtime_token: str = "",
) -> web.Application:
    """The runtime's application; with ``runtime_token`` every request but the probes
    must present it (protocol/runtime_auth.py)."""
    return web.Application(
        [
            (r"/", handlers.HealthHandler),
            (r"/healthz", handlers.HealthHandler),
            (r"/readyz", handlers.ReadyHandler),
            (r"/api/kernel", handlers.KernelHandler),
            (r"/api/kernel/channels", handlers.ChannelsHandler),
            (r"/api/kernel/state", handlers.KernelStateHandler),
            (r"/api/usage", handlers.UsageHandler),
            (r"/api/kernel/(interrupt|restart|start|signal)", handlers.KernelActionHandler),
            (r"/api/terminal", handlers.TerminalHandler),
            (r"/execute", handlers.ExecuteHandler),
            (r"/execute/stream", handlers.ExecuteStreamHandler),
            (r"/upload", handlers.UploadHandler),
            (r"/download/(.*)", handlers.DownloadHandler),
            (r"/list/(.*)", handlers.ListHandler),
            (r"/exists/(.*)", handlers.ExistsHandler),
        ],
        runtime=state,
        websocket_max_message_size=max_ws_message,
        max_upload_bytes=max_upload_bytes,
        runtime_token=runtime_token,
    )
