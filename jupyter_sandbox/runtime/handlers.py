"""HTTP and WebSocket handlers of the runtime server."""

from __future__ import annotations

import asyncio
import json
import logging
import os
import signal
from contextlib import aclosing
from typing import Any

from tornado import web, websocket

from ..protocol import framing, runtime_auth, ws_frames
from ..protocol import terminal as terminal_messages
from . import commands
from .kernel_host import KernelNotRunning, KernelStateError
from .kernel_state import discard as discard_state
from .paths import PathInvalid, PathRefused, confine
from .state import RuntimeState, save_key
from .terminal import InputOverflow, PtyShell
from .upload import StreamingUpload
from .usage import read_usage

log = logging.getLogger(__name__)

DEFAULT_STATE_BYTES = 1 << 30
DEFAULT_STATE_TIMEOUT = 60.0
MAX_TERMINALS = 8


def require_runtime_token(handler: web.RequestHandler) -> None:
    """401 unless the caller presents this sandbox's token, when it was given one
    (on a cluster: runtime_auth.py; a local runtime's socket is the daemon's alone)."""
    expected = handler.settings.get("runtime_token")
    presented = handler.request.headers.get(runtime_auth.HEADER)
    if expected and not runtime_auth.matches(expected, presented):
        raise web.HTTPError(401, "this sandbox's runtime token is required")


class BaseHandler(web.RequestHandler):
    open_to_probes = False  # /healthz and /readyz: for the kubelet, and tell nothing

    @property
    def runtime(self) -> RuntimeState:
        return self.settings["runtime"]  # type: ignore[no-any-return]

    def prepare(self) -> None:
        if not self.open_to_probes:
            require_runtime_token(self)

    def write_error(self, status_code: int, **kwargs: Any) -> None:
        self.set_header("Content-Type", "application/json")
        message = self._reason
        exc_info = kwargs.get("exc_info")
        if exc_info and isinstance(exc_info[1], web.HTTPError) and exc_info[1].log_message:
            message = exc_info[1].log_message
        self.finish(json.dumps({"message": message}))

    def json_body(self) -> dict[str, Any]:
        try:
            body = json.loads(self.request.body or b"{}")
        except ValueError:
            raise web.HTTPError(400, "request body is not JSON") from None
        if not isinstance(body, dict):
            raise web.HTTPError(400, "request body must be a JSON object")
        return body

    def workspace_path(self, user_path: str) -> str:
        try:
            return confine(self.runtime.workspace, user_path)
        except PathInvalid as exc:
            raise web.HTTPError(400, str(exc)) from None
        except PathRefused:
            raise web.HTTPError(403, "Access denied") from None


class HealthHandler(BaseHandler):
    open_to_probes = True

    def get(self) -> None:
        self.finish({"status": "ok", "message": "Sandbox Runtime is active."})


class ReadyHandler(BaseHandler):
    open_to_probes = True

    def get(self) -> None:
        state = self.runtime.kernel.state
        if not state.ready:
            self.set_status(503)
        self.finish({"ready": state.ready, "kernel": state.to_json()})


class KernelHandler(BaseHandler):
    def get(self) -> None:
        self.finish(self.runtime.describe())


class UsageHandler(BaseHandler):
    """``GET /api/usage``: memory and CPU the sandbox's processes use now."""

    async def get(self) -> None:
        self.finish(await read_usage())


class KernelStateHandler(BaseHandler):
    """``POST /api/kernel/state``: save the kernel's variables before a suspend.

    Body (all optional): ``max_bytes`` (the size cap), ``timeout`` (seconds). The
    next runtime started on this workspace loads them into its new kernel.
    """

    async def post(self) -> None:
        body = self.json_body()
        max_bytes = body.get("max_bytes", DEFAULT_STATE_BYTES)
        timeout = body.get("timeout", DEFAULT_STATE_TIMEOUT)
        if isinstance(max_bytes, bool) or not isinstance(max_bytes, int) or max_bytes <= 0:
            raise web.HTTPError(400, "max_bytes must be a positive integer")
        if isinstance(timeout, bool) or not isinstance(timeout, int | float) or not 0 < timeout:
            raise web.HTTPError(400, "timeout must be a positive number of seconds")
        directory = self.runtime.state_dir
        try:
            result = await self.runtime.kernel.save_state(directory, max_bytes, float(timeout))
        except KernelNotRunning as exc:
            raise web.HTTPError(409, str(exc)) from None
        except TimeoutError:
            discard_state(directory)
            raise web.HTTPError(504, f"saving took longer than {timeout:g}s") from None
        except KernelStateError as exc:
            discard_state(directory)
            raise web.HTTPError(500, f"saving failed: {exc}") from None
        save_key(directory, self.runtime.kernel.key)
        self.finish(result)


class KernelActionHandler(BaseHandler):
    async def post(self, action: str) -> None:
        kernel = self.runtime.kernel
        try:
            if action == "interrupt":
                await kernel.interrupt()
            elif action == "restart":
                await kernel.restart()
            elif action == "start":
                await kernel.start()
            elif action == "signal":
                signum = self.json_body().get("signum")
                if not isinstance(signum, int) or signum not in signal.valid_signals():
                    raise web.HTTPError(400, "signum must be a valid signal number")
                await kernel.signal(signum)
            else:
                raise web.HTTPError(404, f"unknown kernel action {action!r}")
        except KernelNotRunning as exc:
            raise web.HTTPError(409, str(exc)) from None
        except TimeoutError:
            raise web.HTTPError(504, "kernel did not become ready") from None
        self.finish(self.runtime.describe())


class ChannelsHandler(websocket.WebSocketHandler):
    """Kernel channels in the v1 binary framing; ``?last=<msg_id>`` resumes a session.

    A client that asks for the signed framing (the bridge) gets the kernel's key in
    the event that opens the connection and every message's signature with it.
    Whoever reaches this endpoint may run code in the kernel, which can read its own
    connection file: the key tells such a client nothing new.
    """

    signed = False

    @property
    def runtime(self) -> RuntimeState:
        return self.settings["runtime"]  # type: ignore[no-any-return]

    def select_subprotocol(self, subprotocols: list[str]) -> str | None:
        for protocol in (framing.SIGNED_SUBPROTOCOL, framing.SUBPROTOCOL):
            if protocol in subprotocols:
                return protocol
        return None

    def prepare(self) -> None:
        require_runtime_token(self)

    def check_origin(self, origin: str) -> bool:
        return True  # reached only through the router, which authorizes (and vouches)

    def open(self) -> None:  # type: ignore[override]
        protocol = self.selected_subprotocol
        if protocol not in (framing.SUBPROTOCOL, framing.SIGNED_SUBPROTOCOL):
            self.close(1002, f"subprotocol {framing.SUBPROTOCOL} required")
            return
        self.signed = protocol == framing.SIGNED_SUBPROTOCOL
        self.set_nodelay(True)
        self.runtime.hub.send_event_to(self, self.runtime.event_payload(with_key=self.signed))
        self.runtime.hub.attach(self, self.get_query_argument("last", None))

    def send_frame(self, frame: framing.Pieces) -> None:
        # A large output goes out as its pieces, never joined (nothing is negotiated).
        ws_frames.write_binary(self, frame.pieces)

    def on_message(self, message: str | bytes) -> None:
        if isinstance(message, str):
            self.close(1003, "binary frames only")
            return
        try:
            channel, parts = framing.decode(message)
        except framing.FramingError as exc:
            log.warning("bad frame from client: %s", exc)
            return
        signature = parts.pop(0) if self.signed and parts else b""
        if channel not in ("shell", "control", "stdin") or len(parts) < 4:
            log.warning("ignoring message on channel %r", channel)
            return
        self.runtime.hub.record_request(self, parts)
        try:
            self.runtime.kernel.send(channel, parts, signature)
        except KernelNotRunning:
            log.info("dropping %s message: kernel is not running", channel)

    def on_close(self) -> None:
        self.runtime.hub.detach(self)


class TerminalHandler(websocket.WebSocketHandler):
    """A shell on a terminal in the sandbox, in terminado's protocol; one per connection.

    The shell is hung up when the connection closes. Output is read only as fast
    as the client takes it.
    """

    _shell: PtyShell | None = None
    _sender: asyncio.Task[None] | None = None

    @property
    def runtime(self) -> RuntimeState:
        return self.settings["runtime"]  # type: ignore[no-any-return]

    def prepare(self) -> None:
        require_runtime_token(self)
        if len(self.runtime.terminals) >= MAX_TERMINALS:
            raise web.HTTPError(429, f"this sandbox already has {MAX_TERMINALS} terminals open")

    def check_origin(self, origin: str) -> bool:
        return True  # reached only through the router, which authorizes (and vouches)

    async def open(self) -> None:  # type: ignore[override]
        self.set_nodelay(True)
        try:
            self._shell = PtyShell(cwd=self.runtime.kernel.cwd, env=self.runtime.command_env)
        except OSError as exc:
            log.warning("no terminal: %s", exc)
            self.close(1011, f"no shell could be started: {exc}"[:120])
            return
        self.runtime.terminals.add(self)
        self.write_message(terminal_messages.encode_output(terminal_messages.Output("setup")))
        self._sender = asyncio.create_task(self._send_output(self._shell))

    async def _send_output(self, shell: PtyShell) -> None:
        try:
            while (text := await shell.read()) is not None:
                for start in range(0, len(text), terminal_messages.MAX_OUTPUT_CHARS):
                    piece = text[start : start + terminal_messages.MAX_OUTPUT_CHARS]
                    message = terminal_messages.Output("stdout", piece)
                    await self.write_message(terminal_messages.encode_output(message))
            disconnect = terminal_messages.Output("disconnect")
            await self.write_message(terminal_messages.encode_output(disconnect))
            self.close(1000, "the shell exited")
        except websocket.WebSocketClosedError:
            pass

    def on_message(self, message: str | bytes) -> None:
        shell = self._shell
        if shell is None:
            return
        parsed = terminal_messages.accept_input(message, log)
        if parsed is None:
            return
        if isinstance(parsed, terminal_messages.Resize):
            shell.resize(parsed.rows, parsed.columns)
            return
        try:
            shell.write(parsed.text)
        except InputOverflow as exc:
            log.warning("terminal input refused: %s", exc)

    def on_close(self) -> None:
        self.runtime.terminals.discard(self)
        if self._sender is not None:
            self._sender.cancel()
        if self._shell is not None:
            shell, self._shell = self._shell, None
            closing = asyncio.ensure_future(shell.close())
            self.runtime.terminals_closing.add(closing)
            closing.add_done_callback(self.runtime.terminals_closing.discard)


class ExecuteHandler(BaseHandler):
    async def post(self) -> None:
        body = self.json_body()
        command = body.get("command")
        if not isinstance(command, str) or not command.strip():
            raise web.HTTPError(400, "command must be a non-empty string")
        timeout = _timeout(body.get("timeout"))
        try:
            argv = commands.argv_for(command, bool(body.get("shell", False)))
        except ValueError as exc:
            raise web.HTTPError(400, f"cannot parse command: {exc}") from None
        result = await commands.run(
            argv, cwd=self.runtime.workspace, env=self.runtime.command_env, timeout=timeout
        )
        self.finish(
            {"stdout": result.stdout, "stderr": result.stderr, "exit_code": result.exit_code}
        )


class ExecuteStreamHandler(BaseHandler):
    """Newline-delimited JSON: {"stdout": ...} and {"stderr": ...} chunks, then {"exit_code": n}.

    If the caller goes away the command's whole process group is killed.
    """

    _task: asyncio.Task[None] | None = None

    async def post(self) -> None:
        body = self.json_body()
        command = body.get("command")
        if not isinstance(command, str) or not command.strip():
            raise web.HTTPError(400, "command must be a non-empty string")
        try:
            argv = commands.argv_for(command, bool(body.get("shell", False)))
        except ValueError as exc:
            raise web.HTTPError(400, f"cannot parse command: {exc}") from None
        timeout = _timeout(body.get("timeout"))
        self.set_header("Content-Type", "application/x-ndjson")
        self._task = asyncio.create_task(self._relay(argv, timeout))
        try:
            await self._task
        except asyncio.CancelledError:
            return  # the connection closed; stream()'s cleanup killed the command
        self.finish()

    async def _relay(self, argv: list[str], timeout: float) -> None:
        output = commands.stream(
            argv, cwd=self.runtime.workspace, env=self.runtime.command_env, timeout=timeout
        )
        async with aclosing(output):  # closing it kills the command if we stop early
            async for kind, value in output:
                await self._send(kind, value)

    async def _send(self, kind: str, value: bytes | int) -> None:
        if kind == "exit":
            self.write(json.dumps({"exit_code": value}) + "\n")
        else:
            assert isinstance(value, bytes)
            self.write(json.dumps({kind: value.decode(errors="replace")}) + "\n")
        await self.flush()

    def on_connection_close(self) -> None:
        if self._task is not None and not self._task.done():
            self._task.cancel()


def _timeout(value: Any) -> float:
    if value is None:
        return commands.DEFAULT_TIMEOUT
    if isinstance(value, bool) or not isinstance(value, int | float) or value <= 0:
        raise web.HTTPError(400, "timeout must be a positive number of seconds")
    return float(min(value, commands.MAX_TIMEOUT))


# Refused uploads are still read (up to this much more) so the client, and a proxy
# in between, get the error response instead of a reset connection.
DRAIN_BYTES = 64 * 1024 * 1024


@web.stream_request_body
class UploadHandler(BaseHandler):
    """Upstream-compatible ``POST /upload`` (multipart field ``file``), streamed to disk."""

    upload: StreamingUpload | None = None
    refused: web.HTTPError | None = None

    def prepare(self) -> None:
        super().prepare()
        limit = int(self.settings.get("max_upload_bytes", 1 << 30))
        self.request.connection.set_max_body_size(limit + DRAIN_BYTES)  # type: ignore[union-attr]
        length = self.request.headers.get("Content-Length")
        if length is not None and length.isdigit() and int(length) > limit:
            self.refused = web.HTTPError(413, f"upload larger than {limit} bytes")
            return
        try:
            self.upload = StreamingUpload(
                self.runtime.workspace, self.request.headers.get("Content-Type", ""), limit
            )
        except web.HTTPError as exc:
            self.refused = exc

    def data_received(self, chunk: bytes) -> None:
        if self.refused is not None or self.upload is None:
            return
        try:
            self.upload.feed(chunk)
        except web.HTTPError as exc:
            self.refused = exc

    def post(self) -> None:
        if self.refused is not None:
            raise self.refused
        assert self.upload is not None
        names = self.upload.commit()
        self.finish({"message": f"File '{names[0]}' uploaded successfully."})

    def on_finish(self) -> None:
        if self.upload is not None and self.get_status() >= 400:
            self.upload.discard()


class DownloadHandler(BaseHandler):
    async def get(self, user_path: str) -> None:
        path = self.workspace_path(user_path)
        if not os.path.isfile(path):
            raise web.HTTPError(404, "File not found")
        self.set_header("Content-Type", "application/octet-stream")
        self.set_header("Content-Length", str(os.path.getsize(path)))
        with open(path, "rb") as handle:
            while chunk := handle.read(1 << 20):
                self.write(chunk)
                await self.flush()
        self.finish()


class ListHandler(BaseHandler):
    def get(self, user_path: str) -> None:
        path = self.workspace_path(user_path)
        if not os.path.isdir(path):
            raise web.HTTPError(404, "Path is not a directory")
        entries = []
        with os.scandir(path) as it:
            for entry in it:
                try:
                    stats = entry.stat(follow_symlinks=False)
                except OSError:
                    continue
                entries.append(
                    {
                        "name": entry.name,
                        "size": stats.st_size,
                        "type": "directory" if entry.is_dir(follow_symlinks=False) else "file",
                        "mod_time": stats.st_mtime,
                    }
                )
        self.set_header("Content-Type", "application/json")
        self.finish(json.dumps(entries))


class ExistsHandler(BaseHandler):
    def get(self, user_path: str) -> None:
        path = self.workspace_path(user_path)
        self.finish({"path": user_path, "exists": os.path.exists(path)})
