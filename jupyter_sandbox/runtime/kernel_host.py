"""Owns the one kernel process of a sandbox and its ZMQ sockets."""

from __future__ import annotations

import ast
import asyncio
import json
import logging
import os
import time
import uuid
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any

import zmq
from jupyter_client.manager import AsyncKernelManager

from ..protocol.messages import DELIM, parent_msg_id, sign, split_zmq
from ..protocol.zmqpump import SocketPump
from .kernel_state import discard as discard_state

log = logging.getLogger(__name__)

# (channel, parts, signature): the kernel's own signature, valid for its key.
MessageSink = Callable[[str, list[bytes | memoryview], bytes], None]
StateSink = Callable[["KernelState"], None]

READY_TIMEOUT = 60.0
MAX_INTERNAL_REQUESTS = 1000
ZERO_COPY_BYTES = 64 * 1024


@dataclass
class KernelState:
    """What the bridge needs to know about the kernel process."""

    generation: int = 0
    alive: bool = False
    ready: bool = False
    exit_code: int | None = None
    pid: int | None = None
    started_at: float | None = None
    execution_state: str = "starting"
    last_activity: float = field(default_factory=time.time)
    # What this kernel got back of its predecessor's variables (a resume), or None.
    restored: dict[str, Any] | None = None

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


class KernelHost:
    """Starts, restarts and relays one ipykernel over IPC sockets.

    Messages from the kernel go to ``on_message(channel, parts, signature)``;
    ``send`` takes parts (header, parent_header, metadata, content, *buffers) and
    signs them with the kernel's key. Request/reply used internally (readiness
    probing) is not passed on.

    The key is the runtime's, not a kernel's: every kernel generation gets the same
    one (``key``, or a new random one), so a client holding it stays valid across
    restarts and the kernel's signatures can be relayed as they are.
    """

    def __init__(
        self,
        *,
        kernel_name: str,
        cwd: str,
        runtime_dir: str,
        env: dict[str, str],
        on_message: MessageSink,
        on_state: StateSink,
        key: bytes | None = None,
    ) -> None:
        self.kernel_name = kernel_name
        self.cwd = cwd
        self.runtime_dir = runtime_dir
        self.env = env
        self._on_message = on_message
        self._on_state = on_state
        self.state = KernelState()
        self._km: AsyncKernelManager | None = None
        self._ctx: zmq.Context[zmq.Socket[bytes]] = zmq.Context.instance()
        self._pumps: dict[str, SocketPump] = {}
        self._watcher: asyncio.Task[None] | None = None
        # The runtime's own requests (readiness probes, state saves), by msg_id.
        self._internal: OrderedDict[str, _InternalRequest] = OrderedDict()
        self._identity = uuid.uuid4().hex.encode()
        # Tells a reconnecting bridge whether this is still the runtime it knew.
        self.runtime_id = uuid.uuid4().hex
        self.key = key or new_key()
        self._lock = asyncio.Lock()

    # -- lifecycle -------------------------------------------------------

    async def start(self) -> None:
        """Start the kernel (if not running) and wait until it answers."""
        async with self._lock:
            if self._km is not None:
                if await self._km.is_alive():
                    return
                await self._stop_locked(now=True)
            await self._start_locked()

    async def restart(self) -> None:
        """Replace the kernel process by a new one in the same sandbox."""
        async with self._lock:
            await self._stop_locked(now=True)
            await self._start_locked()

    async def shutdown(self) -> None:
        async with self._lock:
            await self._stop_locked(now=False)

    async def interrupt(self) -> None:
        if self._km is not None:
            await self._km.interrupt_kernel()

    async def signal(self, signum: int) -> None:
        if self._km is not None:
            await self._km.signal_kernel(signum)

    async def _start_locked(self) -> None:
        os.makedirs(self.runtime_dir, mode=0o700, exist_ok=True)
        km = AsyncKernelManager(
            kernel_name=self.kernel_name,
            transport="ipc",
            ip=os.path.join(self.runtime_dir, "kernel"),
            connection_file=os.path.join(self.runtime_dir, "kernel.json"),
        )
        km.session.key = self.key
        # Stale IPC files from a previous generation would be taken for busy ports.
        for name in os.listdir(self.runtime_dir):
            if name.startswith("kernel-"):
                os.unlink(os.path.join(self.runtime_dir, name))
        self._km = km
        self._internal.clear()
        self.state = KernelState(generation=self.state.generation + 1)
        self._publish_state()
        await km.start_kernel(env=dict(self.env), cwd=self.cwd)
        self._connect(km)
        self.state.alive = True
        self.state.pid = getattr(km.provisioner, "pid", None)
        self.state.started_at = time.time()
        self._watcher = asyncio.create_task(self._watch(km))
        try:
            await self._probe_ready(READY_TIMEOUT)
        except TimeoutError:
            log.error("kernel did not answer kernel_info within %ss", READY_TIMEOUT)
            raise
        self.state.ready = True
        self.state.execution_state = "idle"
        self._publish_state()

    async def _stop_locked(self, *, now: bool) -> None:
        km = self._km
        if self._watcher is not None:
            self._watcher.cancel()
            self._watcher = None
        for pump in self._pumps.values():
            pump.close()
        self._pumps = {}
        if km is not None:
            try:
                await km.shutdown_kernel(now=now)
            except Exception:  # already dead: nothing left to stop
                log.debug("kernel shutdown raised", exc_info=True)
            self._km = None
        if self.state.alive:
            self.state.alive = False
            self.state.ready = False
            self.state.exit_code = self.state.exit_code if self.state.exit_code is not None else 0
            self._publish_state()

    def _connect(self, km: AsyncKernelManager) -> None:
        info: dict[str, Any] = dict(km.get_connection_info())
        base = str(info["ip"])

        def address(channel: str) -> str:
            return f"ipc://{base}-{info[channel + '_port']}"

        for channel in ("shell", "control", "stdin"):
            sock = self._ctx.socket(zmq.DEALER)
            # shell and stdin share an identity: ipykernel routes input_request
            # to the identity that sent the execute_request.
            sock.setsockopt(
                zmq.IDENTITY,
                self._identity if channel != "control" else self._identity + b"-control",
            )
            sock.setsockopt(zmq.LINGER, 0)
            sock.connect(address(channel))
            self._pumps[channel] = self._pump(channel, sock)
        iopub = self._ctx.socket(zmq.SUB)
        iopub.setsockopt(zmq.SUBSCRIBE, b"")
        iopub.setsockopt(zmq.LINGER, 0)
        iopub.connect(address("iopub"))
        self._pumps["iopub"] = self._pump("iopub", iopub)

    def _pump(self, channel: str, sock: zmq.Socket[bytes]) -> SocketPump:
        return SocketPump(sock, lambda received: self._received(channel, received))

    async def _watch(self, km: AsyncKernelManager) -> None:
        """Notice the kernel process dying (a crash, kill -9, or shutdown_request)."""
        provisioner = km.provisioner
        while True:
            await asyncio.sleep(0.2)
            if provisioner is None:
                return
            code = await provisioner.poll()
            if code is not None:
                self.state.alive = False
                self.state.ready = False
                self.state.exit_code = code
                self.state.execution_state = "dead"
                log.info("kernel generation %s exited with %s", self.state.generation, code)
                self._publish_state()
                return

    def _publish_state(self) -> None:
        try:
            self._on_state(self.state)
        except Exception:
            log.exception("state listener failed")

    # -- relay -----------------------------------------------------------

    def _received(self, channel: str, received: list[zmq.Frame]) -> None:
        # Large parts (output, buffers) stay in zmq's memory while sent and replayable.
        frames = [f.buffer if len(f) > ZERO_COPY_BYTES else f.bytes for f in received]
        self._dispatch(channel, frames)

    def _dispatch(self, channel: str, frames: list[bytes | memoryview]) -> None:
        try:
            _, signature, parts = split_zmq(frames)
        except ValueError:
            log.warning("dropping malformed message on %s", channel)
            return
        status = self._observe(channel, parts)
        parent = parent_msg_id(parts)
        internal = self._internal.get(parent) if parent is not None else None
        if internal is None:
            self._on_message(channel, parts, bytes(signature))
            return
        # Answers to the runtime's own requests, late ones included, reach no client.
        if channel == "shell":
            _resolve(internal.reply, parts)
        elif status == "idle":
            _resolve(internal.idle, None)

    def _observe(self, channel: str, parts: list[bytes | memoryview]) -> str | None:
        """Note the kernel's activity; a status message's execution state, else None."""
        self.state.last_activity = time.time()
        if channel != "iopub" or b'"status"' not in bytes(parts[0][:400]):
            return None
        try:
            content = json.loads(bytes(parts[3]))
            self.state.execution_state = str(content.get("execution_state", "idle"))
        except (ValueError, AttributeError):
            return None
        return self.state.execution_state

    def send(self, channel: str, parts: list[bytes], signature: bytes = b"") -> None:
        """Send parts on a request channel, signed with the kernel's key.

        ``signature``: the client's, when it signed with this same key (the kernel
        checks it); empty, to have it signed here.
        """
        pump = self._pumps.get(channel)
        if pump is None:
            raise KernelNotRunning("kernel is not running")
        self.state.last_activity = time.time()
        pump.send([DELIM, signature or sign(self.key, parts), *parts])

    async def _probe_ready(self, timeout: float) -> None:
        """Send kernel_info until the kernel answers on shell and iopub."""
        deadline = time.monotonic() + timeout
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise TimeoutError
            try:
                await self._internal_request("kernel_info_request", {}, timeout=min(1.0, remaining))
                return
            except TimeoutError:
                if not self.state.alive:
                    raise KernelNotRunning("kernel died while starting") from None
                if time.monotonic() >= deadline:
                    raise

    async def _internal_request(
        self, msg_type: str, content: dict[str, Any], *, timeout: float
    ) -> dict[str, Any]:
        """A request of the runtime's own, answered on shell; none of it reaches clients.

        Waits for the reply and the kernel's idle status. The request stays known
        after a timeout, so what the kernel still sends for it stays hidden.
        """
        msg_id = uuid.uuid4().hex
        loop = asyncio.get_running_loop()
        internal = _InternalRequest(loop.create_future(), loop.create_future())
        self._internal[msg_id] = internal
        while len(self._internal) > MAX_INTERNAL_REQUESTS:
            self._internal.popitem(last=False)
        header = {
            "msg_id": msg_id,
            "msg_type": msg_type,
            "username": "sandbox-runtime",
            "session": self._identity.decode(),
            "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "version": "5.3",
        }
        self.send(
            "shell", [json.dumps(header).encode(), b"{}", b"{}", json.dumps(content).encode()]
        )
        parts, _ = await asyncio.wait_for(
            asyncio.gather(internal.reply, internal.idle), timeout=timeout
        )
        result = json.loads(bytes(parts[3]))
        return result if isinstance(result, dict) else {}

    async def evaluate(self, expression: str, timeout: float) -> Any:
        """Evaluate ``expression`` (returning a JSON string) silently in the kernel."""
        content = {
            "code": "",
            "silent": True,
            "store_history": False,
            "user_expressions": {"result": expression},
            "allow_stdin": False,
            "stop_on_error": False,
        }
        reply = await self._internal_request("execute_request", content, timeout=timeout)
        value = (reply.get("user_expressions") or {}).get("result") or {}
        if value.get("status") != "ok":
            raise KernelStateError(f"{value.get('ename', 'error')}: {value.get('evalue', '')}")
        text = value.get("data", {}).get("text/plain", "")
        return json.loads(ast.literal_eval(text))

    # -- variables across a suspend ------------------------------------------

    async def save_state(self, directory: str, max_bytes: int, timeout: float) -> dict[str, Any]:
        """Have the kernel write its user namespace to ``directory`` (see kernel_state)."""
        if not self.state.ready:
            raise KernelNotRunning("kernel is not running")
        expression = (
            f"__import__({STATE_MODULE!r}, fromlist=['_']).save_json({directory!r}, {max_bytes:d})"
        )
        result: dict[str, Any] = await self.evaluate(expression, timeout)
        return result

    async def restore_state(self, directory: str, timeout: float) -> None:
        """Load a saved namespace into this (new) kernel and say what came back."""
        expression = f"__import__({STATE_MODULE!r}, fromlist=['_']).restore_json({directory!r})"
        try:
            restored = await self.evaluate(expression, timeout)
        except (TimeoutError, KernelStateError, ValueError) as exc:
            restored = {"restored": [], "skipped": {}, "error": f"not restored: {exc}"}
            discard_state(directory)
        self.state.restored = restored
        self._publish_state()


STATE_MODULE = "jupyter_sandbox.runtime.kernel_state"


def new_key() -> bytes:
    """A kernel key as jupyter_client makes them (a random UUID's hex digits)."""
    return uuid.uuid4().hex.encode("ascii")


@dataclass
class _InternalRequest:
    reply: asyncio.Future[list[bytes | memoryview]]
    idle: asyncio.Future[None]


def _resolve(future: asyncio.Future[Any], value: Any) -> None:
    # A timed-out request's future is already cancelled when its answer comes.
    if not future.done():
        future.set_result(value)


class KernelStateError(RuntimeError):
    """Saving or loading the kernel's variables failed inside the kernel."""


class KernelNotRunning(RuntimeError):
    """The request needs a running kernel and there is none."""
