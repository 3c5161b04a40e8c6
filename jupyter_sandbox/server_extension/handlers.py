"""``/api/sandbox/...``: pools, the server's sandboxed kernels, suspend and resume.

Every handler is a jupyter_server APIHandler: authenticated and authorized like the
server's own kernel API.
"""

from __future__ import annotations

import json
import re
from typing import Any

from jupyter_server.base.handlers import APIHandler
from jupyter_server.utils import url_path_join
from tornado import web

from ..control_plane.base import ClaimError
from ..control_plane.factory import get_control_plane
from ..kernel_provisioner.provisioner import SandboxProvisioner
from ..utils.background import background

try:
    from jupyter_server.auth.decorator import authorized
except ImportError:  # pragma: no cover - older jupyter_server

    def authorized(method: Any) -> Any:  # type: ignore[no-redef]
        return method


KERNEL_ID = r"(?P<kernel_id>[0-9a-fA-F-]{1,64})"
AUTH_RESOURCE = "kernels"
UUID = re.compile(r"^[0-9a-fA-F-]{1,64}$")


class SandboxAPIHandler(APIHandler):  # type: ignore[misc]
    auth_resource = AUTH_RESOURCE

    def provisioner(self, kernel_id: str) -> SandboxProvisioner:
        km = self.kernel_manager
        if kernel_id not in km:
            raise web.HTTPError(404, f"no kernel {kernel_id}")
        provisioner = getattr(km.get_kernel(kernel_id), "provisioner", None)
        if not isinstance(provisioner, SandboxProvisioner):
            raise web.HTTPError(409, f"kernel {kernel_id} does not run in a sandbox")
        return provisioner

    def kernel_model(self, kernel_id: str, provisioner: SandboxProvisioner) -> dict[str, Any]:
        kernel = self.kernel_manager.get_kernel(kernel_id)
        return {
            "id": kernel_id,
            "name": getattr(kernel, "kernel_name", ""),
            "execution_state": getattr(kernel, "execution_state", None),
            "backend": provisioner.backend,
            "sandbox": provisioner.describe(),
        }


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
        self.finish(json.dumps({"kernels": items}))


class KernelHandler(SandboxAPIHandler):
    @web.authenticated
    @authorized
    async def get(self, kernel_id: str) -> None:
        self.finish(json.dumps(self.kernel_model(kernel_id, self.provisioner(kernel_id))))


class KernelActionHandler(SandboxAPIHandler):
    @web.authenticated
    @authorized
    async def post(self, kernel_id: str, action: str) -> None:
        provisioner = self.provisioner(kernel_id)
        try:
            if action == "suspend":
                await provisioner.suspend()
            else:
                await provisioner.resume()
        except ClaimError as exc:
            raise web.HTTPError(exc.status, exc.message) from None
        self.finish(json.dumps(self.kernel_model(kernel_id, provisioner)))


class PoolsHandler(SandboxAPIHandler):
    @web.authenticated
    @authorized
    async def get(self) -> None:
        backend = self.get_query_argument("backend", "local")
        if backend not in ("local", "kubernetes"):
            raise web.HTTPError(400, "backend must be 'local' or 'kubernetes'")

        async def pools() -> list[dict[str, Any]]:
            plane = get_control_plane(backend)
            return [p.to_json() for p in await plane.list_pools()]

        try:
            items = await background().run(pools())
        except ClaimError as exc:
            raise web.HTTPError(exc.status, exc.message) from None
        self.finish(json.dumps({"pools": items}))


def default_handlers(base_url: str) -> list[tuple[str, Any]]:
    def url(path: str) -> str:
        return url_path_join(base_url, "api/sandbox", path)

    return [
        (url("kernels"), KernelsHandler),
        (url(f"kernels/{KERNEL_ID}"), KernelHandler),
        (url(f"kernels/{KERNEL_ID}/(?P<action>suspend|resume)"), KernelActionHandler),
        (url("pools"), PoolsHandler),
    ]
