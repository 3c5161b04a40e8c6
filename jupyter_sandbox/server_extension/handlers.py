"""``/api/sandbox/...``: pools, the server's sandboxed kernels, suspend/resume, events.

Every handler is a jupyter_server APIHandler: authenticated (``@web.authenticated``)
and authorized (``@authorized``, resource ``kernels``) like the server's own kernel
API; POSTs need the XSRF token or an ``Authorization`` header like any other.
Input is validated: a malformed kernel id, action, known query argument or body is a
400. Unknown query arguments are ignored: JupyterLab adds a cache-busting one to GETs.
The reference is ``docs/rest-api.md``.
"""

from __future__ import annotations

import asyncio
import json
import re
from typing import Any

from jupyter_server.auth.decorator import authorized
from jupyter_server.base.handlers import APIHandler
from jupyter_server.utils import url_path_join
from tornado import web
from tornado.iostream import StreamClosedError

from ..control_plane.base import ClaimError
from ..control_plane.factory import get_control_plane
from ..control_plane.runtime_client import RuntimeCallError
from ..control_plane.runtime_client import call as runtime_call
from ..kernel_provisioner.provisioner import SandboxProvisioner
from ..kernel_provisioner.runtime_files import RuntimeFileError
from ..utils.background import background
from .events import EventHub, kernel_entry, offer

AUTH_RESOURCE = "kernels"
# The shape jupyter_server itself routes for kernel ids.
KERNEL_ID_RE = re.compile(r"^(?=.{1,64}$)\w+-\w+-\w+-\w+-\w+$", re.ASCII)
ACTIONS = ("suspend", "resume", "copy-back")
BACKENDS = ("local", "kubernetes")
KEEPALIVE_SECONDS = 15.0
HUB_SETTING = "jupyter_sandbox_events"


def parse_bool(value: str, name: str) -> bool:
    lowered = value.strip().lower()
    if lowered in ("1", "true", "yes", "on"):
        return True
    if lowered in ("", "0", "false", "no", "off"):
        return False
    raise web.HTTPError(400, f"{name} must be true or false, not {value!r}")


def http_error(exc: RuntimeFileError) -> web.HTTPError:
    """A refused sandbox file call as this API's answer (anything unexpected: 502)."""
    status = exc.status if exc.status in (400, 403, 404, 409, 413) else 502
    return web.HTTPError(status, str(exc))


def sandbox_provisioner(kernel_manager: Any, kernel_id: str) -> SandboxProvisioner:
    """The sandbox provisioner of a kernel this server runs: 400 for a malformed id,
    404 for an unknown kernel, 409 for one that does not run in a sandbox."""
    if not KERNEL_ID_RE.match(kernel_id):
        raise web.HTTPError(400, f"{kernel_id!r} is not a kernel id (a UUID)")
    if kernel_id not in kernel_manager:
        raise web.HTTPError(404, f"no kernel {kernel_id}")
    provisioner = getattr(kernel_manager.get_kernel(kernel_id), "provisioner", None)
    if not isinstance(provisioner, SandboxProvisioner):
        raise web.HTTPError(409, f"kernel {kernel_id} does not run in a sandbox")
    return provisioner


class SandboxAPIHandler(APIHandler):  # type: ignore[misc]
    auth_resource = AUTH_RESOURCE

    @property
    def hub(self) -> EventHub | None:
        return self.settings.get(HUB_SETTING)  # type: ignore[no-any-return]

    def provisioner(self, kernel_id: str) -> SandboxProvisioner:
        return sandbox_provisioner(self.kernel_manager, kernel_id)

    def kernel_model(self, kernel_id: str, provisioner: SandboxProvisioner) -> dict[str, Any]:
        return kernel_entry(kernel_id, self.kernel_manager.get_kernel(kernel_id), provisioner)


class KernelsHandler(SandboxAPIHandler):
    @web.authenticated
    @authorized
    async def get(self) -> None:
        km = self.kernel_manager
        items = []
        for kernel_id in list(km.list_kernel_ids()):
            provisioner = getattr(km.get_kernel(kernel_id), "provisioner", None)
            if isinstance(provisioner, SandboxProvisioner):
                items.append(self.kernel_model(kernel_id, provisioner))
        starting = self.hub.starting() if self.hub is not None else []
        self.finish(json.dumps({"kernels": items, "starting": starting}, default=str))


class KernelHandler(SandboxAPIHandler):
    @web.authenticated
    @authorized
    async def get(self, kernel_id: str) -> None:
        fresh = parse_bool(self.get_query_argument("fresh", "false"), "fresh")
        usage = parse_bool(self.get_query_argument("usage", "false"), "usage")
        provisioner = self.provisioner(kernel_id)
        model = self.kernel_model(kernel_id, provisioner)
        if fresh:
            model["claim_status"], model["usage"] = await asyncio.gather(
                self.claim_status(provisioner), self.usage(provisioner)
            )
        elif usage:  # the status bar's meter: the runtime only, not the control plane
            model["usage"] = await self.usage(provisioner)
        self.finish(json.dumps(model, default=str))

    async def usage(self, provisioner: SandboxProvisioner) -> dict[str, Any] | None:
        """Memory and CPU in use now, from the runtime; None while nothing runs."""
        session = provisioner.session
        if session is None or session.suspended or session.endpoint is None:
            return None
        try:
            request = runtime_call(session.endpoint, "GET", "api/usage", timeout=10)
            return await background().run(request)
        except RuntimeCallError:
            return None

    async def claim_status(self, provisioner: SandboxProvisioner) -> dict[str, Any] | None:
        """The control plane's current view of the claim (not the cached one)."""
        session = provisioner.session
        if session is None or session.claim_name is None:
            return None
        try:
            status = await background().run(session.plane.status(session.claim_name))
        except ClaimError as exc:
            raise web.HTTPError(exc.status, exc.message) from None
        if status is None:
            return None
        data = status.to_json()
        data.pop("endpoint", None)  # carries the router token: not for the browser
        return data


class KernelActionHandler(SandboxAPIHandler):
    @web.authenticated
    @authorized
    async def post(self, kernel_id: str, action: str) -> None:
        if action not in ACTIONS:
            raise web.HTTPError(400, f"unknown action {action!r}; use one of {', '.join(ACTIONS)}")
        body: Any = {}
        if self.request.body.strip():
            try:
                body = json.loads(self.request.body)
            except ValueError:
                message = "the request body must be empty or a JSON object"
                raise web.HTTPError(400, message) from None
        force = self.parameters(action, body)
        provisioner = self.provisioner(kernel_id)
        try:
            if action == "suspend":
                await provisioner.suspend(force=force)
            elif action == "resume":
                await provisioner.resume()
            else:
                # Copy mode: bring the kernel's files back now; the report is in the model.
                await provisioner.copy_files_back()
        except ClaimError as exc:
            # (a busy kernel: KernelBusy, 409, saying what to do)
            raise web.HTTPError(exc.status, str(exc), reason=exc.reason) from None
        except RuntimeFileError as exc:
            raise http_error(exc) from None
        finally:
            if self.hub is not None:
                self.hub.poke()
        self.finish(json.dumps(self.kernel_model(kernel_id, provisioner), default=str))

    @staticmethod
    def parameters(action: str, body: Any) -> bool:
        """``force`` (suspend only, a boolean); nothing else is taken."""
        if not isinstance(body, dict):
            raise web.HTTPError(400, "the request body must be empty or a JSON object")
        allowed = {"force"} if action == "suspend" else set()
        unknown = sorted(set(body) - allowed)
        if unknown:
            takes = "only force (true or false)" if allowed else "no parameters"
            raise web.HTTPError(400, f"{action} takes {takes}, not {', '.join(unknown)}")
        force = body.get("force", False)
        if not isinstance(force, bool):
            raise web.HTTPError(400, f"force must be true or false, not {force!r}")
        return force


class PoolsHandler(SandboxAPIHandler):
    @web.authenticated
    @authorized
    async def get(self) -> None:
        backend = self.get_query_argument("backend", "local")
        if backend not in BACKENDS:
            raise web.HTTPError(400, "backend must be 'local' or 'kubernetes'")

        async def pools() -> list[dict[str, Any]]:
            plane = get_control_plane(backend)
            return [p.to_json() for p in await plane.list_pools()]

        try:
            items = await background().run(pools())
        except ClaimError as exc:
            raise web.HTTPError(exc.status, exc.message) from None
        self.finish(json.dumps({"pools": items}))


class EventsHandler(SandboxAPIHandler):
    """Server-sent events: a ``snapshot`` event on connect and on every change."""

    _queue: asyncio.Queue[str | None] | None = None

    @web.authenticated
    @authorized
    async def get(self) -> None:
        hub = self.hub
        if hub is None:
            raise web.HTTPError(503, "the sandbox event hub is not running")
        self.set_header("Content-Type", "text/event-stream; charset=utf-8")
        self.set_header("Cache-Control", "no-cache")
        self.set_header("X-Accel-Buffering", "no")  # tell reverse proxies not to buffer
        queue = self._queue = hub.subscribe()
        try:
            self.write(": connected\n\n")
            await self.flush()
            while True:
                try:
                    data = await asyncio.wait_for(queue.get(), KEEPALIVE_SECONDS)
                except TimeoutError:
                    self.write(": keep-alive\n\n")
                else:
                    if data is None:
                        break  # the server is stopping
                    self.write(f"event: snapshot\ndata: {data}\n\n")
                await self.flush()
        except StreamClosedError:
            pass  # the browser went away
        finally:
            hub.unsubscribe(queue)
        if not self._finished:
            self.finish()

    def on_connection_close(self) -> None:
        if self._queue is not None:
            offer(self._queue, None)


def default_handlers(base_url: str) -> list[tuple[str, Any]]:
    def url(path: str) -> str:
        return url_path_join(base_url, "api/sandbox", path)

    return [
        (url("kernels"), KernelsHandler),
        (url("kernels/(?P<kernel_id>[^/]+)"), KernelHandler),
        (url("kernels/(?P<kernel_id>[^/]+)/(?P<action>[^/]+)"), KernelActionHandler),
        (url("pools"), PoolsHandler),
        (url("events"), EventsHandler),
    ]
