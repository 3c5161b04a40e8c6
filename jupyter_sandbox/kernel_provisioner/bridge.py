"""Local ZMQ endpoints for jupyter_client, relayed over one WebSocket to a sandbox.

jupyter_client, the restarter, jupyter_server and nbclient connect to ordinary
ZMQ sockets: Unix sockets (``transport="ipc"``) in a directory only this user
can open, so neither other local users nor sandboxes can subscribe to a
kernel's output or send it code (a loopback TCP port is open to every local
process). Each message is checked against the bridge's key, then
sent without re-encoding (v1 binary framing) through the router to the runtime.

The provisioner hands clients the kernel's own key (``adopt_runtime_key``), so a
message's signature is valid on both sides: the signed framing carries it along
and nothing is signed twice, which for a 50 MB buffer saves a pass over all of
it. When the keys differ (a runtime that could not keep its key across a
resume), the runtime signs requests and the bridge signs what comes back. The
WebSocket reconnects by itself and resumes after the last message it received,
so a router restart loses nothing.

JupyterLab tabs take the direct link (``server_extension/direct_channels.py``),
not these sockets. The iopub socket is an XPUB, so the bridge knows whether any
ZMQ client subscribes: when none does, it neither signs nor sends output, and
the Jupyter server's activity tracking (what culling goes by) reads the
messages here, in-process, through ``on_iopub``.
"""

from __future__ import annotations

import asyncio
import hmac
import json
import logging
import os
import shutil
import tempfile
import time
import uuid
from collections import OrderedDict, deque
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any

import zmq
import zmq.asyncio
from tornado import httpclient, websocket
from tornado.netutil import Resolver

from ..control_plane.base import Endpoint
from ..protocol import framing
from ..protocol.messages import DELIM, header, parent_msg_id, sign, split_zmq, verify
from ..protocol.zmqsend import send_now
from ..router.upstreams import UnixSocketResolver, Upstream
from . import ws_client
from .receive_buffers import ReceiveBuffers

log = logging.getLogger(__name__)

REQUEST_CHANNELS = ("shell", "control", "stdin")
MAX_PENDING = 10_000
MAX_ROUTES = 10_000
MAX_WS_MESSAGE = 512 * 1024 * 1024

_recv = zmq.Socket.recv  # the synchronous receive, not zmq.asyncio's override

# Sees each iopub message's header and parts (jupyter_server's activity tracking).
IopubWatcher = Callable[[dict[str, Any], Sequence[bytes | memoryview]], None]


@dataclass(frozen=True)
class KernelIdentity:
    """Which kernel process the runtime is running: a new one means the old one died."""

    runtime_id: str
    generation: int


class Bridge:
    def __init__(
        self,
        *,
        key: bytes,
        signature_scheme: str = "hmac-sha256",
        on_kernel_state: Callable[[KernelIdentity, dict[str, Any]], None],
        on_client_request: Callable[[str, dict[str, Any]], Awaitable[bool]],
        on_disconnected: Callable[[int], Awaitable[None]],
    ) -> None:
        if signature_scheme != "hmac-sha256":
            raise ValueError(f"unsupported signature scheme {signature_scheme}")
        self.key = key
        self.ip = ""  # ipc path prefix: endpoint ``ipc://<ip>-<port>``
        self.ports: dict[str, int] = {}
        self._ipc_dir: str | None = None
        self._ctx = zmq.asyncio.Context()
        self._sockets: dict[str, zmq.asyncio.Socket] = {}
        self._tasks: list[asyncio.Task[None]] = []
        self._routes: OrderedDict[str, bytes] = OrderedDict()  # request msg_id -> client identity
        self._pending: deque[_Request] = deque()
        self._receive_buffers = ReceiveBuffers()
        self._endpoint: Endpoint | None = None
        self._ws: ws_client.KernelWebSocket | None = None
        self._connector: asyncio.Task[None] | None = None
        self._connected = asyncio.Event()
        self._last_msg_id: str | None = None
        self._closing = False
        self._held = False  # while suspended: queue requests, never connect
        self._gated = False  # resuming: connected, but requests wait for ``open_gate``
        self._on_kernel_state = on_kernel_state
        self._on_client_request = on_client_request
        self._on_disconnected = on_disconnected
        self.session_id = uuid.uuid4().hex
        self.kernel_alive = True
        self.on_iopub: IopubWatcher | None = None
        self._iopub_topics: set[bytes] = set()  # what ZMQ clients subscribe to
        self._signed = False  # this connection carries signatures (signed framing)
        self._runtime_key: bytes | None = None  # as the runtime said when we connected
        self._same_key = False  # signatures pass through both ways
        self.messages_in = 0
        self.messages_out = 0

    # -- ZMQ side -----------------------------------------------------------

    def bind(self) -> dict[str, int]:
        """Bind the five kernel sockets as Unix sockets in a private directory (once)."""
        if self.ports:
            return self.ports
        self._ipc_dir = tempfile.mkdtemp(prefix="jsbx-", dir=_ipc_parent())
        self.ip = os.path.join(self._ipc_dir, "k")
        for number, (channel, kind) in enumerate(CHANNEL_KINDS.items(), start=1):
            sock = self._ctx.socket(kind)
            sock.setsockopt(zmq.LINGER, 0)
            if kind == zmq.ROUTER:
                sock.setsockopt(zmq.ROUTER_HANDOVER, 1)
            self.ports[channel] = number
            sock.bind(self._endpoint_of(channel))
            os.link(self._path_of(channel), self._path_of(channel) + KEEPER_SUFFIX)
            self._sockets[channel] = sock
        for channel in REQUEST_CHANNELS:
            self._tasks.append(asyncio.create_task(self._read_client(channel)))
        self._tasks.append(asyncio.create_task(self._heartbeat()))
        return self.ports

    def _path_of(self, channel: str) -> str:
        return f"{self.ip}-{self.ports[channel]}"

    def _endpoint_of(self, channel: str) -> str:
        return f"ipc://{self._path_of(channel)}"

    def connection_info(self) -> dict[str, Any]:
        """The ZMQ half of a kernel connection file (without the key)."""
        return {
            "transport": "ipc",
            "ip": self.ip,
            **{f"{channel}_port": port for channel, port in self.ports.items()},
        }

    async def restore_endpoints(self) -> None:
        """Put back the socket files someone removed.

        jupyter_client deletes a kernel's ipc files on every restart
        (``cleanup_ipc_files``) while this bridge, kept across restarts, still
        listens: without the files nobody new could connect. Each socket has a
        second name (a hard link, made at bind time) to restore the first from,
        so the listening sockets and their connections are never touched.
        """
        for channel in self._sockets:
            path = self._path_of(channel)
            if not os.path.exists(path):
                os.link(path + KEEPER_SUFFIX, path)

    async def _heartbeat(self) -> None:
        sock = self._sockets["hb"]
        while True:
            try:
                frames = await sock.recv_multipart()
            except (asyncio.CancelledError, zmq.ZMQError):
                return
            if self.kernel_alive:
                await sock.send_multipart(frames)

    async def _read_client(self, channel: str) -> None:
        sock = self._sockets[channel]
        while True:
            try:
                frames = await sock.recv_multipart(copy=True)
            except (asyncio.CancelledError, zmq.ZMQError):
                return
            try:
                idents, signature, parts = split_zmq(frames)
            except ValueError:
                log.warning("dropping malformed client message on %s", channel)
                continue
            if not verify(self.key, signature, parts):
                log.warning("dropping client message with a bad signature on %s", channel)
                continue
            try:
                head = header(parts)
            except ValueError:
                continue
            if idents:
                self._routes[str(head.get("msg_id"))] = bytes(idents[0])
                while len(self._routes) > MAX_ROUTES:
                    self._routes.popitem(last=False)
            if not await self._on_client_request(channel, head):
                continue  # answered or swallowed by the provisioner
            self._to_sandbox(_Request(channel, parts, bytes(signature)))

    def _to_sandbox(self, request: _Request) -> None:
        self.messages_out += 1
        ws = self._ws
        if ws is not None and not self._held and not self._gated and self._connected.is_set():
            try:
                ws.write_binary(self._encode(request))
                return
            except websocket.WebSocketClosedError:
                pass
        if len(self._pending) >= MAX_PENDING:
            log.error("bridge queue full: dropping the oldest request")
            self._pending.popleft()
        self._pending.append(request)

    def _encode(self, request: _Request) -> bytes:
        """A request's frame for the connection we have now (queued ones wait for it)."""
        parts = request.parts
        if self._signed:  # the client's signature is the kernel's when the keys agree
            parts = [request.signature if self._same_key else b"", *parts]
        return framing.encode(request.channel, parts)

    def publish_status(self, state: str) -> None:
        """Tell every iopub subscriber the kernel's execution state (synthesized)."""
        now = time.strftime("%Y-%m-%dT%H:%M:%S.000000Z", time.gmtime())
        head = {
            "msg_id": uuid.uuid4().hex,
            "msg_type": "status",
            "username": "sandbox",
            "session": self.session_id,
            "date": now,
            "version": "5.3",
        }
        parts = [
            json.dumps(head).encode(),
            b"{}",
            b"{}",
            json.dumps({"execution_state": state}).encode(),
        ]
        self._send_iopub(parts)

    def _send_iopub(self, parts: list[bytes]) -> None:
        self._watch_iopub(header(parts), parts)
        sock = self._sockets.get("iopub")
        if sock is not None:
            sock.send_multipart(
                [b"kernel.status", DELIM, sign(self.key, parts), *parts], copy=False
            )

    def _watch_iopub(self, head: dict[str, Any], parts: Sequence[bytes | memoryview]) -> None:
        watcher = self.on_iopub
        if watcher is not None:
            try:
                watcher(head, parts)
            except Exception:
                log.exception("iopub watcher failed")

    def iopub_subscribed(self) -> bool:
        """Whether any ZMQ client subscribes to iopub now.

        The XPUB socket says so in messages of its own (``\\x01`` + topic on the
        first subscription to a topic, ``\\x00`` + topic when its last subscriber
        leaves); reading them here, right before a send, also makes libzmq apply
        any subscription that has just arrived, as a send to a PUB socket would.
        """
        sock = self._sockets.get("iopub")
        if sock is None:
            return False
        while True:
            try:
                event = _recv(sock, zmq.NOBLOCK)
            except zmq.Again:
                return bool(self._iopub_topics)
            if event[:1] == b"\x01":
                self._iopub_topics.add(event[1:])
            elif event[:1] == b"\x00":
                self._iopub_topics.discard(event[1:])

    # -- WebSocket side ---------------------------------------------------

    def connect(self, endpoint: Endpoint, gated: bool = False) -> None:
        """(Re)connect to a sandbox; requests sent meanwhile wait in a queue.

        ``gated``: they keep waiting after the connection is up, until
        ``open_gate``, so that what the bridge says first (the resumed kernel's
        status) reaches iopub before anything the kernel answers.
        """
        self._endpoint = endpoint
        self._held = False
        self._gated = gated
        if self._connector is None or self._connector.done():
            self._connector = asyncio.create_task(self._connect_loop())

    def open_gate(self) -> None:
        """Relay the requests queued since a gated ``connect``, then every new one."""
        self._gated = False
        self._flush_pending()

    def _flush_pending(self) -> None:
        ws = self._ws
        if ws is None or self._held or self._gated or not self._connected.is_set():
            return
        while self._pending:
            ws.write_binary(self._encode(self._pending.popleft()))

    def hold(self) -> None:
        """Stop relaying (sandbox suspended): requests queue until ``connect``."""
        self._held = True
        self._connected.clear()
        if self._connector is not None:
            self._connector.cancel()
            self._connector = None
        if self._ws is not None:
            self._ws.close(1000, "suspended")
            self._ws = None
        # After a resume the runtime is new: nothing of the old one to replay.
        self._last_msg_id = None

    def adopt_runtime_key(self) -> bytes | None:
        """Take the kernel's key as ours (before any client has ours); None if unknown.

        Clients given the kernel's key sign requests the kernel can check as they
        are, and the kernel's signatures are valid for them: the bridge relays
        signatures and computes none.
        """
        if self._runtime_key is None or not self._signed:
            return None
        self.key = self._runtime_key
        self._same_key = True
        return self.key

    async def wait_connected(self, timeout: float) -> None:
        await asyncio.wait_for(self._connected.wait(), timeout)

    @property
    def connected(self) -> bool:
        return self._connected.is_set()

    async def _connect_loop(self) -> None:
        delay = 0.05
        failures = 0
        while not self._closing and not self._held:
            endpoint = self._endpoint
            assert endpoint is not None
            request, resolver = channels_request(endpoint, self._last_msg_id)
            try:
                ws = await ws_client.websocket_connect(
                    request,
                    resolver=resolver,
                    subprotocols=[framing.SIGNED_SUBPROTOCOL, framing.SUBPROTOCOL],
                    max_message_size=MAX_WS_MESSAGE,
                    receive_buffers=self._receive_buffers,
                    on_message_callback=self._from_sandbox,
                    on_open=self._on_open,
                    ping_interval=20,
                    ping_timeout=20,
                )
            except asyncio.CancelledError:
                return
            except Exception as exc:  # refused, 404/502 from the router, DNS, timeouts
                failures += 1
                log.info(
                    "bridge connect to %s failed (%s); retry in %.2fs", endpoint.name, exc, delay
                )
                if failures % 5 == 0:
                    await self._on_disconnected(failures)
                await asyncio.sleep(delay)
                delay = min(delay * 2, 2.0)
                continue
            if self._held or self._closing:
                ws.close()
                return
            self._ws = ws
            failures = 0
            delay = 0.05
            self._connected.set()
            self._flush_pending()
            return

    def _on_open(self, ws: websocket.WebSocketClientConnection) -> None:
        # Before this connection's first message: how to read it, and whose key.
        self._signed = ws.selected_subprotocol == framing.SIGNED_SUBPROTOCOL
        self._runtime_key = None  # until this runtime's first event says
        self._same_key = False

    def _from_sandbox(self, message: str | bytes | None) -> None:
        if message is None:
            # Closed: reconnect unless we meant it.
            self._connected.clear()
            self._ws = None
            if not self._closing and not self._held:
                self._connector = asyncio.create_task(self._connect_loop())
            return
        if isinstance(message, str):
            return
        try:
            channel, parts = framing.decode_views(message)
        except framing.FramingError as exc:
            log.warning("bad frame from sandbox: %s", exc)
            return
        if channel == framing.EVENT_CHANNEL:
            self._on_event(parts)
            return
        signature: bytes | memoryview = b""
        if self._signed and parts:
            signature = parts.pop(0)
        if len(parts) < 4:
            return
        self.messages_in += 1
        try:
            head = header(parts)
        except ValueError:
            return
        self._last_msg_id = str(head.get("msg_id") or "") or self._last_msg_id
        if channel == "iopub":
            self._watch_iopub(head, parts)
            if not self.iopub_subscribed():
                return  # no ZMQ client: JupyterLab tabs have their own link
            sock = self._sockets["iopub"]
            signature = self._signature(signature, parts)
            self._sent(
                message, send_now(sock, [b"kernel.iopub", DELIM, signature, *parts], track=True)
            )
            return
        signature = self._signature(signature, parts)
        parent = parent_msg_id(parts)
        ident = self._routes.get(parent) if parent else None
        if ident is None:
            log.debug("no client for a %s reply on %s", head.get("msg_type"), channel)
            return
        if channel != "stdin" and str(head.get("msg_type", "")).endswith("_reply"):
            self._routes.pop(parent or "", None)
        reply_socket = self._sockets.get(channel)
        if reply_socket is not None:
            self._sent(
                message, send_now(reply_socket, [ident, DELIM, signature, *parts], track=True)
            )

    def _signature(
        self, relayed: bytes | memoryview, parts: Sequence[bytes | memoryview]
    ) -> bytes | memoryview:
        """The kernel's own signature when it holds our key, else one of ours."""
        if self._same_key and relayed:
            return relayed
        return sign(self.key, parts)

    def _sent(self, message: bytes, trackers: list[zmq.MessageTracker] | None) -> None:
        # A large message's buffer takes the next one once ZMQ is done with it.
        if trackers is not None:
            self._receive_buffers.recycle(message, trackers)

    def _on_event(self, parts: list[memoryview]) -> None:
        try:
            event = json.loads(bytes(parts[0]))
        except (ValueError, IndexError):
            return
        if event.get("event") != "kernel_state":
            return
        key = event.get("key")
        if isinstance(key, str) and key:
            self._runtime_key = key.encode()
            self._same_key = self._signed and hmac.compare_digest(self._runtime_key, self.key)
        kernel = event.get("kernel") or {}
        identity = KernelIdentity(str(event.get("runtime_id")), int(kernel.get("generation", 0)))
        self._on_kernel_state(identity, kernel)

    async def close(self) -> None:
        self._closing = True
        if self._connector is not None:
            self._connector.cancel()
        if self._ws is not None:
            self._ws.close()
            self._ws = None
        for task in self._tasks:
            task.cancel()
        for sock in self._sockets.values():
            sock.close(linger=0)
        self._sockets.clear()
        self._ctx.term()
        if self._ipc_dir is not None:
            shutil.rmtree(self._ipc_dir, ignore_errors=True)


@dataclass(frozen=True)
class _Request:
    """A client's request on its way to the sandbox, framed once a connection is up."""

    channel: str
    parts: list[bytes | memoryview]
    signature: bytes


KEEPER_SUFFIX = ".keep"  # a second name for each socket file (see restore_endpoints)

CHANNEL_KINDS = {
    "shell": zmq.ROUTER,
    "control": zmq.ROUTER,
    "stdin": zmq.ROUTER,
    "iopub": zmq.XPUB,  # a PUB that says who subscribes (see iopub_subscribed)
    "hb": zmq.ROUTER,
}


def channels_request(
    endpoint: Endpoint, last_msg_id: str | None
) -> tuple[httpclient.HTTPRequest, Resolver | None]:
    """The WebSocket request for a sandbox's kernel channels."""
    query = f"?last={last_msg_id}" if last_msg_id else ""
    return runtime_websocket_request(endpoint, "api/kernel/channels", query)


def runtime_websocket_request(
    endpoint: Endpoint, path: str, query: str = ""
) -> tuple[httpclient.HTTPRequest, Resolver | None]:
    """A WebSocket request to a sandbox's runtime, straight to its socket if we may."""
    socket_path = endpoint.unix_socket
    if socket_path and os.access(socket_path, os.R_OK | os.W_OK):
        upstream = Upstream(unix_socket=socket_path)
        resolver = UnixSocketResolver()
        resolver.register(upstream)
        url = f"ws://{upstream.authority()}/{path}{query}"
        return httpclient.HTTPRequest(url, connect_timeout=10), resolver
    url = endpoint.url(path, websocket=True) + query
    return httpclient.HTTPRequest(url, headers=endpoint.headers(), connect_timeout=10), None


def _ipc_parent() -> str | None:
    """``$XDG_RUNTIME_DIR`` (private to the user) when usable, else the temp directory.

    The socket directory itself is made 0700 either way; a short parent keeps the
    paths under the Unix socket length limit.
    """
    runtime = os.environ.get("XDG_RUNTIME_DIR")
    if runtime and os.path.isdir(runtime) and os.access(runtime, os.W_OK) and len(runtime) < 60:
        return runtime
    return None
