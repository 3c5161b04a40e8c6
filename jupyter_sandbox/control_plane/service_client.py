"""The Kubernetes backend through a claim service: no Kubernetes credentials here.

Selected by the Kubernetes backend's ``claim_service_url`` option (JupyterHub's
single-user servers). Every call shows the service this server's
``$JUPYTERHUB_API_TOKEN``; the service acts only on that hub user's claims
(``claim_service/``). The same token admits this server at the router to the
user's own sandboxes, so it is every endpoint's credential too.
"""

from __future__ import annotations

import os
from typing import Any

from .base import ClaimError, ClaimRequest, ClaimStatus, InvalidRequest
from .http_client import HttpControlPlane
from .kubernetes.options import parse_options
from .runtime_client import before_suspend

# The options that mean something here; the others are for a server that calls
# the Kubernetes API itself.
SERVICE_OPTIONS = frozenset(
    {"claim_service_url", "router_auth", "save_state", "state_max_mb", "state_timeout"}
)


class ClaimServiceControlPlane(HttpControlPlane):
    service = "the claim service"

    def __init__(self, **options: Any) -> None:
        """``options``: the Kubernetes backend's (``claim_service_url`` set)."""
        given = {k for k, v in options.items() if v is not None}
        extra = sorted(given - SERVICE_OPTIONS)
        if extra:
            raise InvalidRequest(
                f"with claim_service_url, the claim service decides {', '.join(extra)}",
                hint="leave out: " + ", ".join(extra),
            )
        o = parse_options(options)
        url = o["claim_service_url"] or ""
        if not url.startswith(("http://", "https://")):
            raise InvalidRequest(f"claim_service_url must be an http(s) URL, not {url!r}")
        if o["router_auth"] not in (None, "jupyterhub"):
            raise InvalidRequest("with claim_service_url the router is shown the hub token")
        self.url = url.rstrip("/")
        self.hub_token = os.environ.get("JUPYTERHUB_API_TOKEN") or ""
        if not self.hub_token:
            raise InvalidRequest(
                "claim_service_url needs JUPYTERHUB_API_TOKEN",
                hint="JupyterHub sets it for every single-user server",
            )
        self.server_name = os.environ.get("JUPYTERHUB_SERVER_NAME", "")
        self.save_state = o["save_state"]
        self.state_max_bytes = o["state_max_mb"] * 1024 * 1024
        self.state_timeout = o["state_timeout"]
        super().__init__()

    @property
    def base_url(self) -> str:
        return self.url

    def headers(self) -> dict[str, str]:
        return {"Authorization": f"token {self.hub_token}"}

    def status_from_json(self, data: dict[str, Any]) -> ClaimStatus:
        status = ClaimStatus.from_json(data)
        if status.endpoint is not None:
            status.endpoint.token = self.hub_token
        return status

    def router_token(self, status: ClaimStatus) -> str | None:
        return self.hub_token

    def claim_body(self, request: ClaimRequest) -> dict[str, Any]:
        body = super().claim_body(request)
        # Process ids mean nothing to a service on another host.
        body.pop("owner_pid", None)
        body.pop("orphan_grace", None)
        body["server_name"] = self.server_name
        return body

    async def adopt(self, name: str, owner_pid: int) -> ClaimStatus | None:
        return await self.status(name)

    async def suspend(self, name: str, *, force: bool = False) -> ClaimStatus:
        # The runtime answers this server (through the router), not the service.
        try:
            status = await self.status(name)
        except ClaimError:
            status = None
        await before_suspend(
            status,
            force=force,
            save=self.save_state,
            max_bytes=self.state_max_bytes,
            timeout=self.state_timeout,
        )
        return await super().suspend(name, force=True)
