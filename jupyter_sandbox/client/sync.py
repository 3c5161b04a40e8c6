"""The blocking SDK: ``SandboxClient`` and ``Sandbox``.

Each call runs the asyncio implementation (``aio``) on the process-wide
background loop and waits for it, so it works the same from plain scripts,
threads, and inside a running event loop (a notebook).
"""

from __future__ import annotations

import atexit
import logging
from collections.abc import Coroutine, Iterator
from typing import Any, TypeVar

from jupyter_client.blocking import BlockingKernelClient

from ..utils.background import background
from .aio import (
    KERNEL_READY_TIMEOUT,
    AsyncCommandStream,
    AsyncSandbox,
    AsyncSandboxClient,
)
from .models import (
    ExecutionResult,
    FileEntry,
    OutputChunk,
    SandboxConnectionConfig,
    SandboxTracerConfig,
)

log = logging.getLogger(__name__)
T = TypeVar("T")


def _run(coro: Coroutine[Any, Any, T]) -> T:
    return background().run_sync(coro)


class CommandStream:
    """Iterate over a running command's ``OutputChunk``s; ``exit_code`` at the end.

    Leaving the iteration early (``break``, an exception, ``close()``) drops the
    connection and the runtime kills the command.
    """

    def __init__(self, inner: AsyncCommandStream) -> None:
        self._inner = inner

    @property
    def exit_code(self) -> int | None:
        return self._inner.exit_code

    @property
    def stdout(self) -> str:
        return self._inner.stdout

    @property
    def stderr(self) -> str:
        return self._inner.stderr

    def __iter__(self) -> Iterator[OutputChunk]:
        try:
            while True:
                try:
                    yield _run(self._inner.__anext__())
                except StopAsyncIteration:
                    return
        finally:
            if self._inner.exit_code is None:
                self.close()

    def close(self) -> None:
        _run(self._inner.aclose())

    def result(self) -> ExecutionResult:
        return _run(self._inner.result())

    def __enter__(self) -> CommandStream:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class CommandExecutor:
    def __init__(self, sandbox: AsyncSandbox) -> None:
        self._sandbox = sandbox

    def run(self, command: str, timeout: float = 60, *, shell: bool = False) -> ExecutionResult:
        """Run ``command`` in the workspace; see ``AsyncCommandExecutor.run``."""
        return _run(self._sandbox.commands.run(command, timeout, shell=shell))

    def stream(self, command: str, timeout: float = 3600, *, shell: bool = False) -> CommandStream:
        """Run ``command``, yielding output chunks as they come."""
        return CommandStream(self._sandbox.commands.stream(command, timeout, shell=shell))


class Filesystem:
    def __init__(self, sandbox: AsyncSandbox) -> None:
        self._sandbox = sandbox

    def write(
        self, path: str, content: bytes | str, timeout: float = 60, allow_unsafe_paths: bool = False
    ) -> None:
        _run(self._sandbox.files.write(path, content, timeout, allow_unsafe_paths))

    def read(self, path: str, timeout: float = 60, allow_unsafe_paths: bool = False) -> bytes:
        return _run(self._sandbox.files.read(path, timeout, allow_unsafe_paths))

    def list(self, path: str = ".", timeout: float = 60) -> list[FileEntry]:
        return _run(self._sandbox.files.list(path, timeout))

    def exists(self, path: str, timeout: float = 60) -> bool:
        return _run(self._sandbox.files.exists(path, timeout))


class Sandbox:
    """A claimed sandbox; ``with`` terminates it on the way out, exceptions included."""

    def __init__(self, inner: AsyncSandbox) -> None:
        self._inner = inner
        self._commands = CommandExecutor(inner)
        self._files = Filesystem(inner)
        self._kernel_clients: list[BlockingKernelClient] = []

    @property
    def claim_name(self) -> str | None:
        return self._inner.claim_name

    @property
    def sandbox_id(self) -> str:
        return self._inner.sandbox_id

    @property
    def namespace(self) -> str:
        return self._inner.namespace

    @property
    def connection_config(self) -> SandboxConnectionConfig:
        return self._inner.connection_config

    @property
    def endpoint(self) -> Any:
        return self._inner.endpoint

    @property
    def commands(self) -> CommandExecutor:
        self._inner.commands  # noqa: B018 - raises once the connection is closed
        return self._commands

    @property
    def files(self) -> Filesystem:
        self._inner.files  # noqa: B018 - raises once the connection is closed
        return self._files

    @property
    def is_active(self) -> bool:
        return self._inner.is_active

    def status(self) -> tuple[str, str]:
        return _run(self._inner.status())

    def suspend(self, *, force: bool = False) -> None:
        """See ``AsyncSandbox.suspend``: a busy kernel is refused unless ``force``."""
        _run(self._inner.suspend(force=force))
        self._stop_kernel_clients()

    def resume(self, timeout: float = 180) -> None:
        _run(self._inner.resume(timeout))

    def kernel(self, timeout: float = KERNEL_READY_TIMEOUT) -> BlockingKernelClient:
        """A ``BlockingKernelClient`` with started channels, on the sandbox's kernel."""
        inner = self._inner
        inner._require_claim()

        async def tunnel_info() -> dict[str, Any]:
            from . import kernel as kernel_tunnel

            async with inner._tunnel_lock:
                if inner._tunnel is None:
                    inner._tunnel, _ = await kernel_tunnel.open_tunnel(inner.endpoint, timeout)
                return inner._tunnel.connection_info()

        info = _run(tunnel_info())
        client = BlockingKernelClient()
        client.load_connection_info(info)  # type: ignore[arg-type]
        client.start_channels()
        try:
            client.wait_for_ready(timeout=timeout)
        except BaseException:
            client.stop_channels()
            raise
        self._kernel_clients.append(client)
        return client

    def _stop_kernel_clients(self) -> None:
        clients, self._kernel_clients = self._kernel_clients, []
        for client in clients:
            try:
                client.stop_channels()
            except Exception:
                log.debug("stopping kernel client channels failed", exc_info=True)

    def close_connection(self) -> None:
        self._stop_kernel_clients()
        _run(self._inner.close_connection())

    def terminate(self) -> None:
        """Close the connection and delete the claim. Idempotent."""
        try:
            self._stop_kernel_clients()
        finally:
            _run(self._inner.terminate())

    def __enter__(self) -> Sandbox:
        return self

    def __exit__(self, *exc: object) -> None:
        self.terminate()

    def __repr__(self) -> str:
        return f"<Sandbox claim={self.claim_name} sandbox={self.sandbox_id}>"


class SandboxClient:
    """Creates and tracks sandboxes; see ``AsyncSandboxClient`` for the options.

    ``SandboxClient()`` uses the local backend. ``cleanup=True`` deletes the
    client's sandboxes when the program exits (and, on the local backend, the
    daemon releases them even if the process is killed).
    """

    def __init__(
        self,
        connection_config: SandboxConnectionConfig | None = None,
        tracer_config: SandboxTracerConfig | None = None,
        cleanup: bool = False,
        *,
        backend_options: dict[str, Any] | None = None,
    ) -> None:
        self._inner = AsyncSandboxClient(
            connection_config, tracer_config, cleanup, backend_options=backend_options
        )
        self._handles: dict[int, Sandbox] = {}
        if cleanup:
            atexit.register(self._atexit)

    @property
    def connection_config(self) -> SandboxConnectionConfig:
        return self._inner.connection_config

    @property
    def backend(self) -> str:
        return self._inner.backend

    def _wrap(self, inner: AsyncSandbox) -> Sandbox:
        handle = self._handles.get(id(inner))
        if handle is None or handle._inner is not inner:
            handle = Sandbox(inner)
            self._handles[id(inner)] = handle
        return handle

    def create_sandbox(
        self,
        warmpool: str,
        namespace: str = "default",
        sandbox_ready_timeout: float = 180,
        labels: dict[str, str] | None = None,
        **kwargs: Any,
    ) -> Sandbox:
        """Claim a sandbox from ``warmpool``; see ``AsyncSandboxClient.create_sandbox``."""
        inner = _run(
            self._inner.create_sandbox(warmpool, namespace, sandbox_ready_timeout, labels, **kwargs)
        )
        return self._wrap(inner)

    def get_sandbox(
        self, claim_name: str, namespace: str = "default", resolve_timeout: float = 30
    ) -> Sandbox:
        return self._wrap(_run(self._inner.get_sandbox(claim_name, namespace, resolve_timeout)))

    def list_active_sandboxes(self) -> list[tuple[str, str]]:
        return self._inner.list_active_sandboxes()

    def list_all_sandboxes(
        self, namespace: str = "default", label_selector: str | None = None
    ) -> list[str]:
        return _run(self._inner.list_all_sandboxes(namespace, label_selector))

    def delete_sandbox(self, claim_name: str, namespace: str = "default") -> None:
        for handle in list(self._handles.values()):
            if handle.claim_name == claim_name:
                handle._stop_kernel_clients()
        _run(self._inner.delete_sandbox(claim_name, namespace))

    def delete_all(self) -> None:
        for handle in list(self._handles.values()):
            handle._stop_kernel_clients()
        self._handles.clear()
        _run(self._inner.delete_all())

    def close(self) -> None:
        for handle in list(self._handles.values()):
            handle._stop_kernel_clients()
        self._handles.clear()
        _run(self._inner.close())

    def _atexit(self) -> None:
        try:
            self.delete_all()
        except Exception as exc:  # at exit there is nobody left to tell but the log
            log.warning("sandbox cleanup at exit failed: %s", exc)

    def __enter__(self) -> SandboxClient:
        return self

    def __exit__(self, *exc: object) -> None:
        try:
            self.delete_all()
        finally:
            self.close()
