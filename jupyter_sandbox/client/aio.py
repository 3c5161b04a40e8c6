"""The asyncio SDK: ``AsyncSandboxClient`` and ``AsyncSandbox``.

The synchronous ``SandboxClient`` runs these same coroutines on the process-wide
background loop, so both APIs behave alike.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import posixpath
import re
import uuid
from collections.abc import AsyncIterator, Callable
from typing import Any
from urllib.parse import quote

from jupyter_client.asynchronous import AsyncKernelClient

from ..control_plane.base import ClaimError, ClaimRequest, ClaimStatus, ControlPlane, Phase
from ..control_plane.factory import get_control_plane
from ..utils.users import current_user
from . import kernel as kernel_tunnel
from ._connection import Connector
from ._http import RuntimeHTTP
from .exceptions import (
    SandboxError,
    SandboxInvalidRequestError,
    SandboxNotFoundError,
    SandboxPathError,
    from_claim_error,
)
from .models import (
    ExecutionResult,
    FileEntry,
    LocalBackendConfig,
    OutputChunk,
    SandboxConnectionConfig,
    SandboxTracerConfig,
)

log = logging.getLogger(__name__)

LABEL_USER = "jupyter-sandbox/user"
LABEL_CLIENT = "jupyter-sandbox/client"
DEFAULT_NAMESPACE = "default"
KERNEL_READY_TIMEOUT = 120.0


def label_value(value: str) -> str:
    cleaned = "".join(c if c.isalnum() or c in "-_." else "-" for c in value)[:63].strip("-_.")
    return cleaned or "unknown"


def safe_path(path: str, *, allow_root: bool = False) -> str:
    """A workspace-relative, normalized path; refuses ``..``, NUL and control characters.

    The runtime confines paths too (symlinks included); this refuses the obvious
    escapes before anything is sent, with a clear error.
    """
    if not isinstance(path, str):
        raise SandboxPathError(f"path must be a string, not {type(path).__name__}")
    if any(ord(c) < 0x20 or ord(c) == 0x7F for c in path):
        raise SandboxPathError(f"path contains control characters: {path!r}")
    stripped = path.strip()
    normalized = posixpath.normpath(stripped).lstrip("/") if stripped else "."
    if normalized in ("", "."):
        if allow_root:
            return ""
        raise SandboxPathError(f"path {path!r} does not name a file")
    if ".." in normalized.split("/"):
        raise SandboxPathError(f"path {path!r} escapes the sandbox workspace")
    return normalized


_SELECTOR_RE = re.compile(r"^\s*([A-Za-z0-9][-A-Za-z0-9_./]*)\s*==?\s*([-A-Za-z0-9_.]*)\s*$")


def _parse_selector(selector: str | None) -> dict[str, str]:
    """``a=b,c==d`` into a dict; other selector forms are refused, not ignored."""
    labels: dict[str, str] = {}
    for part in filter(None, (p.strip() for p in (selector or "").split(","))):
        match = _SELECTOR_RE.match(part)
        if match is None:
            raise SandboxInvalidRequestError(
                f"only equality label selectors (key=value) are supported, not {part!r}"
            )
        labels[match.group(1)] = match.group(2)
    return labels


async def _released(plane: ControlPlane, name: str) -> None:
    """Release a claim, even while the caller is being cancelled."""
    task = asyncio.ensure_future(plane.release(name))
    try:
        await asyncio.shield(task)
    except asyncio.CancelledError:
        await task
        raise


# -- commands -------------------------------------------------------------------


class AsyncCommandStream:
    """Chunks of a running command's output; ``exit_code`` once it is exhausted."""

    def __init__(self, http: RuntimeHTTP, body: dict[str, Any], timeout: float) -> None:
        self._http = http
        self._body = body
        self._timeout = timeout
        self._gen: AsyncIterator[OutputChunk] | None = None
        self.exit_code: int | None = None
        self.stdout = ""
        self.stderr = ""

    async def _chunks(self) -> AsyncIterator[OutputChunk]:
        async with self._http.stream(
            "POST", "execute/stream", json=self._body, timeout=self._timeout
        ) as response:
            buffer = b""
            async for data in response.aiter_bytes():
                buffer += data
                while b"\n" in buffer:
                    line, buffer = buffer.split(b"\n", 1)
                    chunk = self._parse(line)
                    if chunk is not None:
                        yield chunk
            if buffer.strip():
                chunk = self._parse(buffer)
                if chunk is not None:
                    yield chunk
        if self.exit_code is None:
            raise SandboxError("the command's output stream ended without an exit code")

    def _parse(self, line: bytes) -> OutputChunk | None:
        if not line.strip():
            return None
        item = json.loads(line)
        if "exit_code" in item:
            self.exit_code = int(item["exit_code"])
            return None
        for name in ("stdout", "stderr"):
            if name in item:
                text = str(item[name])
                setattr(self, name, getattr(self, name) + text)
                return OutputChunk(name, text)  # type: ignore[arg-type]
        return None

    def __aiter__(self) -> AsyncIterator[OutputChunk]:
        if self._gen is None:
            self._gen = self._chunks()
        return self._gen

    async def __anext__(self) -> OutputChunk:
        return await self.__aiter__().__anext__()

    async def aclose(self) -> None:
        """Stop reading; the runtime kills the command when the connection drops."""
        if self._gen is not None:
            await self._gen.aclose()  # type: ignore[attr-defined]

    async def result(self) -> ExecutionResult:
        """Read to the end and return everything as one result."""
        async for _ in self:
            pass
        assert self.exit_code is not None
        return ExecutionResult(self.stdout, self.stderr, self.exit_code)

    async def __aenter__(self) -> AsyncCommandStream:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()


class AsyncCommandExecutor:
    def __init__(self, http: RuntimeHTTP) -> None:
        self._http = http

    async def run(
        self, command: str, timeout: float = 60, *, shell: bool = False
    ) -> ExecutionResult:
        """Run ``command`` in the workspace; wait at most ``timeout`` seconds.

        Like upstream's runtime, the command is split with shlex and run without a
        shell; ``shell=True`` runs it with ``/bin/sh -c`` (pipes, redirections).
        """
        body = {"command": command, "timeout": timeout, "shell": shell}
        response = await self._http.request("POST", "execute", json=body, timeout=timeout)
        try:
            data = response.json()
            return ExecutionResult(
                stdout=str(data.get("stdout", "")),
                stderr=str(data.get("stderr", "")),
                exit_code=int(data.get("exit_code", -1)),
            )
        except (ValueError, AttributeError, TypeError) as exc:
            raise SandboxError(
                f"invalid execution result from the sandbox: {response.text}"
            ) from exc

    def stream(
        self, command: str, timeout: float = 3600, *, shell: bool = False
    ) -> AsyncCommandStream:
        """Run ``command`` and yield its output as it comes (``async for chunk in ...``)."""
        body = {"command": command, "timeout": timeout, "shell": shell}
        return AsyncCommandStream(self._http, body, timeout)


# -- files ------------------------------------------------------------------------


class AsyncFilesystem:
    def __init__(self, http: RuntimeHTTP) -> None:
        self._http = http

    async def write(
        self, path: str, content: bytes | str, timeout: float = 60, allow_unsafe_paths: bool = False
    ) -> None:
        """Write ``content`` to ``path`` (relative to the workspace; parents are created)."""
        if isinstance(content, str):
            content = content.encode("utf-8")
        if not allow_unsafe_paths:
            path = safe_path(path)
        await self._http.request("POST", "upload", files={"file": (path, content)}, timeout=timeout)

    async def read(self, path: str, timeout: float = 60, allow_unsafe_paths: bool = False) -> bytes:
        if not allow_unsafe_paths:
            path = safe_path(path)
        response = await self._http.request(
            "GET", f"download/{quote(path, safe='')}", timeout=timeout
        )
        return response.content

    async def list(self, path: str = ".", timeout: float = 60) -> list[FileEntry]:
        path = safe_path(path, allow_root=True)
        response = await self._http.request("GET", f"list/{quote(path, safe='')}", timeout=timeout)
        try:
            return [FileEntry.from_legacy(entry) for entry in response.json() or []]
        except (ValueError, KeyError, TypeError) as exc:
            raise SandboxError(
                f"invalid directory listing from the sandbox: {response.text}"
            ) from exc

    async def exists(self, path: str, timeout: float = 60) -> bool:
        path = safe_path(path, allow_root=True)
        response = await self._http.request(
            "GET", f"exists/{quote(path, safe='')}", timeout=timeout
        )
        return bool(response.json().get("exists", False))


# -- sandbox ----------------------------------------------------------------------


class AsyncSandbox:
    """A claimed sandbox: ``commands``, ``files``, ``kernel()``, ``terminate()``.

    ``async with`` terminates it on the way out, exceptions and cancellation included.
    """

    def __init__(
        self,
        claim_name: str,
        sandbox_id: str,
        namespace: str,
        *,
        plane: ControlPlane,
        connector: Connector,
        status: ClaimStatus,
        endpoint: Any,
        connection_config: SandboxConnectionConfig,
        on_closed: Callable[[AsyncSandbox], None] | None = None,
    ) -> None:
        self.claim_name: str | None = claim_name
        self.sandbox_id = sandbox_id
        self.namespace = namespace
        self.connection_config = connection_config
        self.claim_status = status
        self._plane = plane
        self._connector = connector
        self._http = RuntimeHTTP(endpoint)
        self._commands: AsyncCommandExecutor | None = AsyncCommandExecutor(self._http)
        self._files: AsyncFilesystem | None = AsyncFilesystem(self._http)
        self._tunnel: kernel_tunnel.KernelTunnel | None = None
        self._tunnel_lock = asyncio.Lock()
        self._kernel_clients: list[AsyncKernelClient] = []
        self._on_closed = on_closed
        self._is_closed = False

    @property
    def endpoint(self) -> Any:
        return self._http.endpoint

    @property
    def commands(self) -> AsyncCommandExecutor:
        if self._commands is None:
            raise SandboxError(f"the connection to sandbox claim {self.claim_name} is closed")
        return self._commands

    @property
    def files(self) -> AsyncFilesystem:
        if self._files is None:
            raise SandboxError(f"the connection to sandbox claim {self.claim_name} is closed")
        return self._files

    @property
    def is_active(self) -> bool:
        return not self._is_closed

    async def status(self) -> tuple[str, str]:
        """``("SandboxReady" | "SandboxNotReady" | "SandboxNotFound", message)``, as upstream."""
        if not self.claim_name:
            return "SandboxNotFound", "the claim was deleted"
        try:
            status = await self._plane.status(self.claim_name)
        except ClaimError as exc:
            raise from_claim_error(exc) from exc
        if status is None:
            return "SandboxNotFound", f"claim {self.claim_name} not found"
        self.claim_status = status
        if status.phase == Phase.READY:
            return "SandboxReady", status.message
        return "SandboxNotReady", f"{status.phase.value}: {status.message}".rstrip(": ")

    async def suspend(self, *, force: bool = False) -> None:
        """Release the sandbox's compute and keep its workspace (our extension).

        A kernel running a cell is not suspended (its cell and variables would be
        lost): SandboxKernelBusyError, unless ``force``.
        """
        name = self._require_claim()
        try:
            self.claim_status = await self._plane.suspend(name, force=force)
        except ClaimError as exc:
            raise from_claim_error(exc) from exc
        await self._close_kernel()

    async def resume(self, timeout: float = 180) -> None:
        """Start a suspended sandbox again and wait until it is ready (a new kernel)."""
        name = self._require_claim()
        try:
            await self._plane.resume(name)
            status = await self._plane.wait_ready(name, timeout)
        except ClaimError as exc:
            raise from_claim_error(exc) from exc
        self.claim_status = status
        endpoint = await self._connector.endpoint(status, self._plane)
        await self._http.aclose()
        self._http.endpoint = endpoint

    def _require_claim(self) -> str:
        if not self.claim_name:
            raise SandboxNotFoundError("this sandbox was terminated")
        return self.claim_name

    async def kernel(self, timeout: float = KERNEL_READY_TIMEOUT) -> AsyncKernelClient:
        """An ``AsyncKernelClient`` with its channels started, talking to the sandbox's kernel."""
        self._require_claim()
        async with self._tunnel_lock:
            if self._tunnel is None:
                self._tunnel, _ = await kernel_tunnel.open_tunnel(self.endpoint, timeout)
            info = self._tunnel.connection_info()
        client = AsyncKernelClient()
        client.load_connection_info(info)  # type: ignore[arg-type]
        client.start_channels()
        try:
            await client.wait_for_ready(timeout=timeout)
        except BaseException:
            client.stop_channels()
            raise
        self._kernel_clients.append(client)
        return client

    async def _close_kernel(self) -> None:
        clients, self._kernel_clients = self._kernel_clients, []
        for client in clients:
            try:
                client.stop_channels()
            except Exception:  # closing is best effort
                log.debug("stopping kernel client channels failed", exc_info=True)
        tunnel, self._tunnel = self._tunnel, None
        if tunnel is not None:
            await kernel_tunnel.close_tunnel(tunnel)

    async def close_connection(self) -> None:
        """Close the client side (HTTP, kernel bridge); the sandbox keeps running."""
        if self._is_closed:
            return
        self._is_closed = True
        self._commands = None
        self._files = None
        try:
            await self._close_kernel()
        finally:
            await self._http.aclose()

    async def terminate(self) -> None:
        """Close the connection and delete the claim (and so the sandbox). Idempotent."""
        try:
            await self.close_connection()
        finally:
            name = self.claim_name
            if name:
                try:
                    await _released(self._plane, name)
                except ClaimError as exc:
                    raise from_claim_error(exc) from exc
                self.claim_name = None
            if self._on_closed is not None:
                self._on_closed(self)

    async def __aenter__(self) -> AsyncSandbox:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.terminate()

    def __repr__(self) -> str:
        return f"<AsyncSandbox claim={self.claim_name} sandbox={self.sandbox_id}>"


# -- client -----------------------------------------------------------------------


class AsyncSandboxClient:
    """Creates and tracks sandboxes. Local backend unless a Kubernetes config is given.

    ``connection_config``: ``LocalBackendConfig`` (default), or for Kubernetes
    ``SandboxDirectConnectionConfig`` (router/gateway URL),
    ``SandboxGatewayConnectionConfig``, ``SandboxLocalTunnelConnectionConfig``
    (kubectl port-forward) or ``SandboxInClusterConnectionConfig``.
    ``backend_options`` go to the Kubernetes control plane (e.g. ``kubeconfig``).
    ``cleanup``: delete this client's sandboxes at exit; on the local backend the
    daemon also releases them if this process dies without cleaning up.
    """

    def __init__(
        self,
        connection_config: SandboxConnectionConfig | None = None,
        tracer_config: SandboxTracerConfig | None = None,
        cleanup: bool = False,
        *,
        backend_options: dict[str, Any] | None = None,
    ) -> None:
        self.connection_config: SandboxConnectionConfig = connection_config or LocalBackendConfig()
        self.tracer_config = tracer_config or SandboxTracerConfig()
        self.cleanup = cleanup
        self.backend = (
            "local" if isinstance(self.connection_config, LocalBackendConfig) else "kubernetes"
        )
        self.backend_options = dict(backend_options or {})
        self._connector = Connector(self.connection_config, self.backend_options)
        self._planes: dict[str, ControlPlane] = {}
        self._owned_planes: list[ControlPlane] = []
        self._active: dict[tuple[str, str], AsyncSandbox] = {}

    async def _plane(self, namespace: str) -> ControlPlane:
        key = namespace if self.backend == "kubernetes" else ""
        plane = self._planes.get(key)
        if plane is None:
            if self.backend == "local":
                from pathlib import Path

                from ..control_plane.local.client import LocalControlPlane

                assert isinstance(self.connection_config, LocalBackendConfig)
                state_dir = self.connection_config.state_dir
                plane = LocalControlPlane(Path(state_dir) if state_dir else None)
                self._owned_planes.append(plane)
            else:
                try:
                    plane = get_control_plane(
                        "kubernetes", namespace=namespace, **self.backend_options
                    )
                except ClaimError as exc:
                    raise from_claim_error(exc) from exc
            self._planes[key] = plane
        return plane

    async def create_sandbox(
        self,
        warmpool: str,
        namespace: str = DEFAULT_NAMESPACE,
        sandbox_ready_timeout: float = 180,
        labels: dict[str, str] | None = None,
        *,
        shutdown_after_seconds: int | None = None,
        volume_claim_templates: list[dict[str, Any]] | None = None,
        pod_labels: dict[str, str] | None = None,
        pod_annotations: dict[str, str] | None = None,
        env: dict[str, str] | None = None,
    ) -> AsyncSandbox:
        """Claim a sandbox from ``warmpool`` and wait until it is ready.

        On the local backend ``namespace`` is ignored (there is one). ``env`` makes
        the claim cold-start with those variables set (our extension). Options the
        control-plane interface cannot express raise ``SandboxInvalidRequestError``.
        """
        if not warmpool:
            raise ValueError("Warmpool name cannot be empty.")
        unsupported = {
            "shutdown_after_seconds": shutdown_after_seconds,
            "volume_claim_templates": volume_claim_templates,
            "pod_labels": pod_labels,
            "pod_annotations": pod_annotations,
        }
        given = [name for name, value in unsupported.items() if value is not None]
        if given:
            raise SandboxInvalidRequestError(
                f"not supported by jupyter-sandbox's SDK yet: {', '.join(given)}"
            )
        plane = await self._plane(namespace)
        claim_name = f"sandbox-claim-{uuid.uuid4().hex[:8]}"
        all_labels = {LABEL_USER: label_value(current_user()), LABEL_CLIENT: "sdk"}
        all_labels.update(labels or {})
        request = ClaimRequest(
            pool=warmpool,
            labels=all_labels,
            env=dict(env or {}),
            owner_pid=os.getpid() if self.cleanup and self.backend == "local" else None,
            name=claim_name,
        )
        try:
            status = await plane.claim(request)
            claim_name = status.name
            if status.phase != Phase.READY:
                status = await plane.wait_ready(claim_name, sandbox_ready_timeout)
            sandbox = await self._handle(plane, status)
        except BaseException as exc:
            # Never leave an orphaned claim behind, whatever went wrong.
            try:
                await _released(plane, claim_name)
            except Exception:
                log.warning("could not release claim %s after a failure", claim_name)
            if isinstance(exc, ClaimError):
                raise from_claim_error(exc) from exc
            raise
        return sandbox

    async def _handle(self, plane: ControlPlane, status: ClaimStatus) -> AsyncSandbox:
        assert status.sandbox is not None
        endpoint = await self._connector.endpoint(status, plane)
        sandbox = AsyncSandbox(
            status.name,
            status.sandbox,
            status.namespace,
            plane=plane,
            connector=self._connector,
            status=status,
            endpoint=endpoint,
            connection_config=self.connection_config,
            on_closed=self._forget,
        )
        self._active[(self._key_namespace(status.namespace), status.name)] = sandbox
        return sandbox

    def _key_namespace(self, namespace: str) -> str:
        return namespace if self.backend == "kubernetes" else DEFAULT_NAMESPACE

    def _forget(self, sandbox: AsyncSandbox) -> None:
        for key, value in list(self._active.items()):
            if value is sandbox:
                del self._active[key]

    async def get_sandbox(
        self, claim_name: str, namespace: str = DEFAULT_NAMESPACE, resolve_timeout: float = 30
    ) -> AsyncSandbox:
        """A handle on an existing claim (made by this or another process)."""
        key = (self._key_namespace(namespace), claim_name)
        existing = self._active.get(key)
        plane = await self._plane(namespace)
        try:
            status = await plane.status(claim_name)
            if status is None:
                raise SandboxNotFoundError(f"Sandbox claim '{claim_name}' not found")
            if status.phase != Phase.READY:
                status = await plane.wait_ready(claim_name, resolve_timeout)
        except ClaimError as exc:
            raise from_claim_error(exc) from exc
        if existing is not None and existing.is_active:
            return existing
        return await self._handle(plane, status)

    def list_active_sandboxes(self) -> list[tuple[str, str]]:
        """``(namespace, claim_name)`` of the sandboxes this client holds open."""
        return [key for key, sandbox in self._active.items() if sandbox.is_active]

    async def list_all_sandboxes(
        self, namespace: str = DEFAULT_NAMESPACE, label_selector: str | None = None
    ) -> list[str]:
        """Names of all claims in ``namespace`` (equality selectors only: ``a=b,c=d``)."""
        plane = await self._plane(namespace)
        try:
            claims = await plane.list_claims(_parse_selector(label_selector))
        except ClaimError as exc:
            raise from_claim_error(exc) from exc
        return [claim.name for claim in claims]

    async def delete_sandbox(self, claim_name: str, namespace: str = DEFAULT_NAMESPACE) -> None:
        sandbox = self._active.get((self._key_namespace(namespace), claim_name))
        if sandbox is not None:
            await sandbox.terminate()
            return
        plane = await self._plane(namespace)
        try:
            await _released(plane, claim_name)
        except ClaimError as exc:
            raise from_claim_error(exc) from exc

    async def delete_all(self) -> None:
        """Terminate every sandbox this client created or attached to."""
        errors = []
        for sandbox in list(self._active.values()):
            try:
                await sandbox.terminate()
            except Exception as exc:
                log.error("cleanup of %s failed: %s", sandbox.claim_name, exc)
                errors.append(exc)
        if errors:
            raise errors[0]

    async def close(self) -> None:
        """Close connections (not the sandboxes: see ``delete_all``)."""
        for sandbox in list(self._active.values()):
            await sandbox.close_connection()
        self._active.clear()
        self._connector.close()
        planes, self._owned_planes = self._owned_planes, []
        self._planes.clear()
        for plane in planes:
            await plane.close()

    async def __aenter__(self) -> AsyncSandboxClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        try:
            await self.delete_all()
        finally:
            await self.close()
