"""Fan kernel messages out to WebSocket clients, buffer while none is connected.

Every frame sent to clients gets a place in a bounded replay ring keyed by its
msg_id. A client that reconnects with ``?last=<msg_id>`` gets everything after that
message again (what it may have missed while its connection died); a new client
gets what was produced while nobody was connected. Replies go back to the client
that sent the request when it is still connected.

Clients of the signed framing (the bridge) get each message with the kernel's
signature as its first part; v1 clients get the parts alone.
"""

from __future__ import annotations

import logging
from collections import OrderedDict, deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

from ..protocol import framing
from ..protocol.messages import header, parent_msg_id

log = logging.getLogger(__name__)

DEFAULT_RING_BYTES = 64 * 1024 * 1024
DEFAULT_RING_MESSAGES = 20_000
MAX_TRACKED_REQUESTS = 10_000


class Client(Protocol):
    # Whether this client's frames carry each message's signature (signed framing).
    signed: bool

    # A frame kept as its pieces: the kernel's own buffers are sent and replayed uncopied.
    def send_frame(self, frame: framing.Pieces) -> None: ...


@dataclass
class _Entry:
    seq: int
    msg_id: str
    channel: str
    parts: list[bytes | memoryview]
    signature: bytes
    size: int
    delivered: bool

    def frame_for(self, client: Client) -> framing.Pieces:
        parts = [self.signature, *self.parts] if client.signed else self.parts
        return framing.encode_pieces(self.channel, parts)


class ChannelHub:
    def __init__(
        self,
        *,
        ring_bytes: int = DEFAULT_RING_BYTES,
        ring_messages: int = DEFAULT_RING_MESSAGES,
    ) -> None:
        self._ring: deque[_Entry] = deque()
        self._ring_bytes = 0
        self._max_bytes = ring_bytes
        self._max_messages = ring_messages
        self._seq = 0
        self._index: dict[str, int] = {}
        self._clients: list[Client] = []
        self._requests: OrderedDict[str, Client] = OrderedDict()
        self.on_idle_change: Callable[[bool], None] | None = None

    @property
    def connected(self) -> int:
        return len(self._clients)

    def attach(self, client: Client, last_msg_id: str | None) -> None:
        """Register a client and replay what it missed."""
        self._clients.append(client)
        start_seq = None
        if last_msg_id:
            start_seq = self._index.get(last_msg_id)
            if start_seq is None:
                log.warning("client resumed after %s, which the ring no longer holds", last_msg_id)
        for entry in list(self._ring):
            if start_seq is not None:
                if entry.seq > start_seq:
                    client.send_frame(entry.frame_for(client))
                    entry.delivered = True
            elif not entry.delivered:
                client.send_frame(entry.frame_for(client))
                entry.delivered = True

    def detach(self, client: Client) -> None:
        if client in self._clients:
            self._clients.remove(client)
        for msg_id in [k for k, v in self._requests.items() if v is client]:
            del self._requests[msg_id]

    def record_request(self, client: Client, parts: list[bytes]) -> None:
        """Remember who sent a request so its replies go back to it."""
        try:
            msg_id = header(parts)["msg_id"]
        except (ValueError, KeyError, TypeError):
            return
        self._requests[msg_id] = client
        while len(self._requests) > MAX_TRACKED_REQUESTS:
            self._requests.popitem(last=False)

    def publish(
        self, channel: str, parts: list[bytes | memoryview], signature: bytes = b""
    ) -> None:
        """Send a kernel message to its client(s), keeping it for replay."""
        try:
            msg_id = str(header(parts).get("msg_id", ""))
        except ValueError:
            msg_id = ""
        targets: list[Client]
        if channel == "iopub":
            targets = list(self._clients)
        else:
            parent = parent_msg_id(parts)
            owner = self._requests.get(parent) if parent else None
            targets = (
                [owner] if owner is not None and owner in self._clients else list(self._clients)
            )
        entry = self._remember(msg_id, channel, parts, signature, delivered=bool(targets))
        frames: dict[bool, framing.Pieces] = {}
        for client in targets:
            frame = frames.get(client.signed)
            if frame is None:
                frame = frames[client.signed] = entry.frame_for(client)
            client.send_frame(frame)

    def send_event(self, payload: bytes) -> None:
        """Runtime events are current state, not history: never replayed."""
        for client in list(self._clients):
            self.send_event_to(client, payload)

    @staticmethod
    def send_event_to(client: Client, payload: bytes) -> None:
        client.send_frame(framing.encode_pieces(framing.EVENT_CHANNEL, [payload]))

    def _remember(
        self,
        msg_id: str,
        channel: str,
        parts: list[bytes | memoryview],
        signature: bytes,
        *,
        delivered: bool,
    ) -> _Entry:
        self._seq += 1
        size = sum(len(part) for part in parts)
        entry = _Entry(self._seq, msg_id, channel, parts, signature, size, delivered)
        self._ring.append(entry)
        self._ring_bytes += size
        if msg_id:
            self._index[msg_id] = entry.seq
        while self._ring and (
            self._ring_bytes > self._max_bytes or len(self._ring) > self._max_messages
        ):
            old = self._ring.popleft()
            self._ring_bytes -= old.size
            if old.msg_id and self._index.get(old.msg_id) == old.seq:
                del self._index[old.msg_id]
            if not old.delivered:
                log.warning("replay ring full: dropped an undelivered message")
        return entry
