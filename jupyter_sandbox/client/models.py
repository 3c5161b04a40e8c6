"""Results, directory entries and connection settings, named as in upstream's SDK.

``ExecutionResult``, ``FileEntry`` and the ``Sandbox*ConnectionConfig`` classes
keep upstream's (``k8s-agent-sandbox``) field names, so code written for it
reads the same here. They are plain dataclasses, not pydantic models.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, Literal

_NAMESPACE_RE = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")


@dataclass
class ExecutionResult:
    """What a command printed and how it ended.

    A command that outlives its ``timeout`` is killed (with its whole process
    group) and reported with ``exit_code`` 124, as coreutils' ``timeout`` does.
    """

    stdout: str = ""
    stderr: str = ""
    exit_code: int = -1

    @property
    def ok(self) -> bool:
        return self.exit_code == 0


@dataclass
class OutputChunk:
    """One piece of a streamed command's output."""

    stream: Literal["stdout", "stderr"]
    text: str


@dataclass
class FileEntry:
    """A file or directory in the sandbox's workspace."""

    name: str
    size: int
    type: Literal["file", "directory"]
    modified: datetime
    mode: str | None = None

    @classmethod
    def from_legacy(cls, entry: dict[str, Any]) -> FileEntry:
        """From the runtime's ``GET /list/<path>`` entry (``mod_time`` in POSIX seconds)."""
        return cls(
            name=str(entry["name"]),
            size=int(entry["size"]),
            type="directory" if entry.get("type") == "directory" else "file",
            modified=datetime.fromtimestamp(float(entry.get("mod_time", 0)), tz=UTC),
        )


# -- how to reach sandboxes -----------------------------------------------------


@dataclass
class LocalBackendConfig:
    """The embedded local backend (the default): sandboxes are local processes.

    ``state_dir`` selects the daemon (default ``$JUPYTER_SANDBOX_HOME``, else the
    Jupyter data directory's ``sandbox`` folder); one daemon serves one state dir.
    """

    state_dir: str | None = None


@dataclass
class SandboxDirectConnectionConfig:
    """Kubernetes backend, through a router reachable at ``api_url`` (a gateway URL)."""

    api_url: str
    server_port: int = 8888


@dataclass
class SandboxGatewayConnectionConfig:
    """Kubernetes backend, through the router behind a Gateway API ``Gateway``.

    The router's address is read from the Gateway's ``status.addresses``.
    """

    gateway_name: str
    gateway_namespace: str = "default"
    gateway_ready_timeout: int = 180
    server_port: int = 8888


@dataclass
class SandboxLocalTunnelConnectionConfig:
    """Kubernetes backend, through ``kubectl port-forward`` to the router's Service."""

    port_forward_ready_timeout: int = 30
    server_port: int = 8888
    router_namespace: str = "agent-sandbox-system"
    router_service: str = "svc/sandbox-router-svc"
    router_port: int = 8080

    def __post_init__(self) -> None:
        if not _NAMESPACE_RE.match(self.router_namespace):
            raise ValueError("Invalid Kubernetes namespace name format")


@dataclass
class SandboxInClusterConnectionConfig:
    """Kubernetes backend, from a pod in the same cluster straight to the sandbox.

    Bypasses the router: ``http://<sandbox>.<namespace>.svc.cluster.local:<port>``.
    The managed NetworkPolicy admits only the router, so the calling pod must be
    allowed by the template's network policy for this to work.
    """

    server_port: int = 8888


KubernetesConnectionConfig = (
    SandboxDirectConnectionConfig
    | SandboxGatewayConnectionConfig
    | SandboxLocalTunnelConnectionConfig
    | SandboxInClusterConnectionConfig
)
SandboxConnectionConfig = LocalBackendConfig | KubernetesConnectionConfig


@dataclass
class SandboxTracerConfig:
    """Accepted for upstream compatibility; tracing is not implemented here."""

    enable_tracing: bool = False
    trace_service_name: str = "sandbox-client"
    extra: dict[str, Any] = field(default_factory=dict)
