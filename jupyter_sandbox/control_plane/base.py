"""The one interface both control planes implement.

The kernel provisioner, the server extension and the SDK speak only this; the
local daemon and Kubernetes (SandboxClaim objects) sit behind it.
"""

from __future__ import annotations

import abc
from dataclasses import asdict, dataclass, field
from enum import StrEnum
from typing import Any
from urllib.parse import urlsplit, urlunsplit

from ..protocol import runtime_auth


class Phase(StrEnum):
    PENDING = "Pending"  # claimed, sandbox not ready yet (cold start or waiting for the pool)
    READY = "Ready"
    SUSPENDING = "Suspending"
    SUSPENDED = "Suspended"
    RESUMING = "Resuming"
    FAILED = "Failed"
    TERMINATING = "Terminating"


class ClaimError(Exception):
    """A claim could not be made or used; ``reason`` is a stable machine-readable word."""

    reason = "ClaimFailed"
    status = 500

    def __init__(self, message: str, *, hint: str = "") -> None:
        super().__init__(message)
        self.message = message
        self.hint = hint

    def __str__(self) -> str:
        # The hint travels with the message: a traceback's last line says what to do.
        return f"{self.message} ({self.hint})" if self.hint else self.message

    def to_json(self) -> dict[str, str]:
        return {"reason": self.reason, "message": self.message, "hint": self.hint}


class PoolNotFound(ClaimError):
    reason = "PoolNotFound"
    status = 404


class ClaimNotFound(ClaimError):
    reason = "ClaimNotFound"
    status = 404


class ClaimTimeout(ClaimError):
    reason = "Timeout"
    status = 504


class QuotaExceeded(ClaimError):
    reason = "QuotaExceeded"
    status = 429


class InvalidRequest(ClaimError):
    reason = "Invalid"
    status = 400


class FilesNotBindable(InvalidRequest):
    """The notebook's directory cannot be bound into a sandbox here (its
    filesystem has no idmapped mounts); its files can still be copied."""

    reason = "FilesNotBindable"


class KernelBusy(ClaimError):
    """The sandbox's kernel is running a cell: suspending it now would lose that
    cell and the kernel's variables (they cannot be saved until it ends)."""

    reason = "KernelBusy"
    status = 409


class StateNotSaved(ClaimError):
    """The kernel's variables could not be saved before a suspend, which would lose them."""

    reason = "KernelStateNotSaved"
    status = 409


class BackendUnavailable(ClaimError):
    reason = "BackendUnavailable"
    status = 503


ERRORS: dict[str, type[ClaimError]] = {
    cls.reason: cls
    for cls in (
        ClaimError,
        PoolNotFound,
        ClaimNotFound,
        ClaimTimeout,
        QuotaExceeded,
        InvalidRequest,
        FilesNotBindable,
        KernelBusy,
        StateNotSaved,
        BackendUnavailable,
    )
}


def kernel_busy_error(name: str) -> KernelBusy:
    return KernelBusy(
        f"the kernel of claim {name} is running a cell: suspending now would lose that "
        "cell and the kernel's variables",
        hint="wait until it finishes, interrupt it, or suspend with force",
    )


def state_not_saved_error(name: str, reason: str) -> StateNotSaved:
    return StateNotSaved(
        f"the kernel's variables of claim {name} could not be saved ({reason}): "
        "suspending now would lose them",
        hint="try again, shut the kernel down instead, or suspend with force",
    )


def error_from_json(body: dict[str, Any]) -> ClaimError:
    cls = ERRORS.get(str(body.get("reason")), ClaimError)
    return cls(str(body.get("message", "claim failed")), hint=str(body.get("hint", "")))


# A claim labelled with this set to "false" is suspended without saving its kernel's variables.
LABEL_SAVE_STATE = "jupyter-sandbox/save-state"


@dataclass
class Endpoint:
    """How to reach a sandbox's runtime through the router."""

    router_url: str
    namespace: str
    name: str
    port: int = 8888
    token: str | None = None
    # The runtime's own socket, for a caller on its host that may open it (the
    # local backend's user, who owns the daemon): the kernel channels then skip
    # the router's hop.  Entitlement is the file's permission, as for the daemon.
    unix_socket: str | None = None
    # The runtime's own token (protocol/runtime_auth.py), for a caller that reaches
    # the runtime without the router (the SDK's in-cluster mode); the router sends it
    # for everyone else.
    runtime_token: str | None = field(default=None, repr=False)

    def headers(self) -> dict[str, str]:
        headers = {
            "X-Sandbox-ID": self.name,
            "X-Sandbox-Namespace": self.namespace,
            "X-Sandbox-Port": str(self.port),
        }
        if self.token:
            headers["Authorization"] = f"Bearer {self.token}"
        if self.runtime_token:
            headers[runtime_auth.HEADER] = self.runtime_token
        return headers

    def url(self, path: str, *, websocket: bool = False) -> str:
        parts = urlsplit(self.router_url)
        scheme = parts.scheme
        if websocket:
            scheme = "wss" if scheme == "https" else "ws"
        base = parts.path.rstrip("/")
        return urlunsplit((scheme, parts.netloc, base + "/" + path.lstrip("/"), "", ""))


@dataclass
class ClaimRequest:
    pool: str
    labels: dict[str, str] = field(default_factory=dict)
    env: dict[str, str] = field(default_factory=dict)
    owner_pid: int | None = None
    name: str | None = None
    # Seconds the claim outlives a dead owner before it is released (None: the backend's).
    orphan_grace: float | None = None
    # The notebook's directory: the kernel works there (when the pool mounts it).
    files_dir: str | None = None
    # Only inherited, not asked for: a directory that may not be mounted is skipped.
    files_optional: bool = False
    # Whose claim this is, and which of their servers made it (Kubernetes: the
    # claim's annotations). None: the backend's own identity (the hub user it runs
    # for, or the OS user). A claim service sets both from the caller it verified.
    user: str | None = None
    server_name: str | None = None


@dataclass
class ClaimStatus:
    name: str
    namespace: str
    pool: str
    phase: Phase
    sandbox: str | None = None
    warm: bool | None = None  # adopted from the pool (True) or cold-started (False)
    isolation: str = "unknown"  # bubblewrap | kubernetes | none
    isolation_detail: str = ""
    workspace: str | None = None
    labels: dict[str, str] = field(default_factory=dict)
    created: float = 0.0
    ready_at: float | None = None
    message: str = ""
    endpoint: Endpoint | None = None
    resources: dict[str, Any] = field(default_factory=dict)
    # Whose claim it is, exactly (Kubernetes: the claim's jupyter-sandbox/user
    # annotation); "" where the backend does not record it.
    user: str = ""

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, body: dict[str, Any]) -> ClaimStatus:
        data = dict(body)
        data["phase"] = Phase(data["phase"])
        if data.get("endpoint"):
            data["endpoint"] = Endpoint(**data["endpoint"])
        return cls(**data)


@dataclass
class PoolStatus:
    name: str
    namespace: str
    replicas: int
    ready: int
    starting: int = 0
    claimed: int = 0
    isolation: str = "unknown"
    limits: str = ""  # how resource limits are enforced (local backend)
    display_name: str = ""
    message: str = ""  # why members do not get ready, when they keep failing
    # What its sandboxes get (local backend): limits in force, network, files.
    settings: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


class ControlPlane(abc.ABC):
    """Claim, wait ready, suspend, resume, release, status and list."""

    #: Whether a claim's ``files_dir`` is settled by the claim itself (the local
    #: backend binds it, or refuses, or falls back as its pool says). When False
    #: only the runtime knows whether its kernel works there (a Kubernetes pool
    #: may or may not mount the user's volume), and the session asks it.
    settles_files_dir: bool = False

    @abc.abstractmethod
    async def claim(self, request: ClaimRequest) -> ClaimStatus:
        """Create a claim against a pool; returns at once, possibly still Pending."""

    @abc.abstractmethod
    async def wait_ready(self, name: str, timeout: float) -> ClaimStatus:
        """Wait until the claim's sandbox is Ready; ClaimTimeout after ``timeout``."""

    @abc.abstractmethod
    async def suspend(self, name: str, *, force: bool = False) -> ClaimStatus:
        """Stop the sandbox's compute, keep its workspace.

        Unless ``force``, a kernel running a cell is refused (KernelBusy), and so
        is one whose variables cannot be saved first (StateNotSaved): a suspend
        never loses work unless asked to.
        """

    @abc.abstractmethod
    async def resume(self, name: str) -> ClaimStatus:
        """Start a suspended sandbox again (returns when asked, not when Ready)."""

    @abc.abstractmethod
    async def release(self, name: str) -> None:
        """Delete the claim and its sandbox. Idempotent: a missing claim is fine."""

    @abc.abstractmethod
    async def status(self, name: str) -> ClaimStatus | None:
        """The claim's current state, or None when it does not exist."""

    @abc.abstractmethod
    async def list_claims(self, labels: dict[str, str] | None = None) -> list[ClaimStatus]:
        """Claims whose labels include all of ``labels``."""

    async def adopt(self, name: str, owner_pid: int) -> ClaimStatus | None:
        """Hand a claim to another process of ours (a restarted server re-attaching).

        Backends that do not tie claims to processes have nothing to do.
        """
        return await self.status(name)

    def router_token(self, status: ClaimStatus) -> str | None:
        """What to show a router for ``status``'s sandbox (``Authorization: Bearer``),
        whichever router URL the caller uses; None when the router wants nothing."""
        return status.endpoint.token if status.endpoint else None

    @abc.abstractmethod
    async def list_pools(self) -> list[PoolStatus]:
        """Pools with their warm and target counts."""

    async def close(self) -> None:  # noqa: B027 - optional hook, nothing to release by default
        """Release client resources (not the claims)."""
