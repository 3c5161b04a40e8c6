"""jupyter_server extension: REST API and event stream of sandbox state for JupyterLab."""

from __future__ import annotations

from typing import Any

from jupyter_server.services.kernels.connection.channels import ZMQChannelsWebsocketConnection

from .connection import SandboxWebsocketConnection
from .events import EventHub
from .handlers import HUB_SETTING, default_handlers
from .terminal import terminal_handlers
from .workspace import workspace_handlers


def _load_jupyter_server_extension(serverapp: Any) -> None:
    settings = serverapp.web_app.settings
    base = settings["base_url"]
    settings[HUB_SETTING] = EventHub(serverapp)
    # The terminal's route first: the kernel actions' route would match it too.
    handlers = workspace_handlers(base) + terminal_handlers(base) + default_handlers(base)
    serverapp.web_app.add_handlers(".*$", handlers)
    # Only replace jupyter_server's own class; another extension's choice wins.
    if settings.get("kernel_websocket_connection_class") is ZMQChannelsWebsocketConnection:
        settings["kernel_websocket_connection_class"] = SandboxWebsocketConnection
    serverapp.log.info("jupyter_sandbox: REST API at %sapi/sandbox", base)


async def _unload_jupyter_server_extension(serverapp: Any) -> None:
    hub = serverapp.web_app.settings.pop(HUB_SETTING, None)
    if hub is not None:
        await hub.close()
