"""Turn a ready claim into the endpoint its runtime is reached at, per connection mode.

- local backend: the endpoint the daemon hands out (its loopback router and a
  scoped token);
- gateway / router URL (``SandboxDirectConnectionConfig``): that URL, with the
  routing headers and the claim's token;
- ``SandboxGatewayConnectionConfig``: the address of a Gateway API Gateway;
- local tunnel: ``kubectl port-forward`` to the router's Service;
- in-cluster: straight to the sandbox's Service DNS name, bypassing the router.
"""

from __future__ import annotations

import asyncio
import ipaddress
import logging
import shutil
import socket
import subprocess
import time
from typing import Any

from ..agent_sandbox import Resource
from ..control_plane.base import ClaimStatus, ControlPlane, Endpoint
from .exceptions import SandboxNotReadyError, SandboxPortForwardError
from .models import (
    LocalBackendConfig,
    SandboxConnectionConfig,
    SandboxDirectConnectionConfig,
    SandboxGatewayConnectionConfig,
    SandboxInClusterConnectionConfig,
    SandboxLocalTunnelConnectionConfig,
)

GATEWAY = Resource("gateway.networking.k8s.io", "v1", "gateways", "Gateway")
log = logging.getLogger(__name__)

DEFAULT_RUNTIME_PORT = 8888


def _host(address: str) -> str:
    try:
        return f"[{address}]" if ipaddress.ip_address(address).version == 6 else address
    except ValueError:
        return address  # a hostname


class Connector:
    """Resolves endpoints for one client; owns a port-forward if the mode needs one."""

    def __init__(
        self, config: SandboxConnectionConfig, backend_options: dict[str, Any] | None = None
    ) -> None:
        self.config = config
        self.backend_options = dict(backend_options or {})
        self._base_url: str | None = None
        self._tunnel: subprocess.Popen[bytes] | None = None
        self._lock = asyncio.Lock()

    @property
    def port(self) -> int:
        return int(getattr(self.config, "server_port", DEFAULT_RUNTIME_PORT))

    async def endpoint(self, status: ClaimStatus, plane: ControlPlane) -> Endpoint:
        if not status.sandbox:
            raise SandboxNotReadyError(f"claim {status.name} has no sandbox yet")
        given = status.endpoint
        if isinstance(self.config, LocalBackendConfig):
            if given is None:
                raise SandboxNotReadyError(f"claim {status.name} has no endpoint yet")
            return given
        if isinstance(self.config, SandboxInClusterConnectionConfig):
            # straight to the sandbox: no router, so no router credential either, but
            # the runtime's own token where the operator gave it one
            url = f"http://{status.sandbox}.{status.namespace}.svc.cluster.local:{self.port}"
            token = await self._runtime_token(status.namespace, status.sandbox)
            return Endpoint(url, status.namespace, status.sandbox, self.port, runtime_token=token)
        token = plane.router_token(status)
        return Endpoint(await self.router_url(), status.namespace, status.sandbox, self.port, token)

    async def router_url(self) -> str:
        async with self._lock:
            if isinstance(self.config, SandboxDirectConnectionConfig):
                return self.config.api_url.rstrip("/")
            if isinstance(self.config, SandboxGatewayConnectionConfig):
                if self._base_url is None:
                    address = await self._gateway_address()
                    self._base_url = f"http://{_host(address)}"
                return self._base_url
            if isinstance(self.config, SandboxLocalTunnelConnectionConfig):
                return await self._ensure_tunnel(self.config)
        raise TypeError(f"no router URL for {type(self.config).__name__}")

    async def _runtime_token(self, namespace: str, sandbox: str) -> str | None:
        """The sandbox's runtime token from its Secret (protocol/runtime_auth.py), read
        with the SDK's own credentials; None where there is none or they may not read
        it (the runtime then answers 401, naming the token)."""
        import base64

        from ..kube.client import SECRET, ApiError, Client, load_config
        from ..protocol import runtime_auth

        settings = await asyncio.to_thread(
            load_config, self.backend_options.get("kubeconfig"), self.backend_options.get("context")
        )
        client = Client(settings, user_agent="jupyter-sandbox-sdk")
        try:
            secret = await client.get(SECRET, namespace, runtime_auth.secret_name(sandbox))
        except ApiError as exc:
            log.debug("no runtime token for %s/%s: %s", namespace, sandbox, exc)
            return None
        finally:
            await client.close()
        value = (secret.get("data") or {}).get(runtime_auth.SECRET_KEY)
        return base64.b64decode(value).decode() if value else None

    # -- Gateway API ---------------------------------------------------------

    async def _gateway_address(self) -> str:
        """The first address in the Gateway's status, watched until it has one."""
        from ..kube.client import Client, load_config
        from ..kube.informer import Informer

        assert isinstance(self.config, SandboxGatewayConnectionConfig)
        cfg = self.config
        settings = await asyncio.to_thread(
            load_config, self.backend_options.get("kubeconfig"), self.backend_options.get("context")
        )
        client = Client(settings, user_agent="jupyter-sandbox-sdk")
        gateways = Informer(
            client,
            GATEWAY,
            cfg.gateway_namespace,
            field_selector=f"metadata.name={cfg.gateway_name}",
        )

        def address() -> str | None:
            gateway = gateways.get(cfg.gateway_namespace, cfg.gateway_name) or {}
            for entry in (gateway.get("status") or {}).get("addresses") or []:
                if entry.get("value"):
                    return str(entry["value"])
            return None

        try:
            async with gateways.running():
                return await gateways.wait_until(address, cfg.gateway_ready_timeout)
        except TimeoutError:
            raise SandboxNotReadyError(
                f"Gateway {cfg.gateway_namespace}/{cfg.gateway_name} has no address "
                f"after {cfg.gateway_ready_timeout}s"
            ) from None
        finally:
            await client.close()

    # -- kubectl port-forward ----------------------------------------------------

    async def _ensure_tunnel(self, cfg: SandboxLocalTunnelConnectionConfig) -> str:
        if self._tunnel is not None and self._tunnel.poll() is None and self._base_url:
            return self._base_url
        self._stop_tunnel()
        kubectl = shutil.which("kubectl")
        if kubectl is None:
            raise SandboxPortForwardError("the local tunnel mode needs kubectl on PATH")
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            port = sock.getsockname()[1]
        argv = [kubectl, "port-forward", cfg.router_service, f"{port}:{cfg.router_port}"]
        argv += ["-n", cfg.router_namespace]
        if self.backend_options.get("kubeconfig"):
            argv += ["--kubeconfig", str(self.backend_options["kubeconfig"])]
        self._tunnel = subprocess.Popen(
            argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE
        )
        deadline = time.monotonic() + cfg.port_forward_ready_timeout
        while time.monotonic() < deadline:
            if self._tunnel.poll() is not None:
                _, err = self._tunnel.communicate()
                self._tunnel = None
                raise SandboxPortForwardError(f"kubectl port-forward exited: {err.decode()}")
            try:
                _, writer = await asyncio.open_connection("127.0.0.1", port)
            except OSError:
                await asyncio.sleep(0.05)
                continue
            writer.close()
            self._base_url = f"http://127.0.0.1:{port}"
            return self._base_url
        self._stop_tunnel()
        raise SandboxPortForwardError(
            f"kubectl port-forward not ready after {cfg.port_forward_ready_timeout}s"
        )

    def _stop_tunnel(self) -> None:
        proc, self._tunnel = self._tunnel, None
        self._base_url = None
        if proc is not None and proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(2)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()

    def close(self) -> None:
        self._stop_tunnel()
