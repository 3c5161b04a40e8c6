"""A sandbox runtime's file API, through the router: list, download, upload.

The runtime serves upstream agent-sandbox's file endpoints (``list/``,
``download/``, ``upload``), confined to the workspace. Copy mode and the
workspace browser both use them through these calls; what a sandbox answers is
untrusted, so every download is bounded by the size its caller expects and
paced by its sink, a listing by LIST_MAX_BYTES, and any other answer by
ANSWER_MAX_BYTES, each before it is held in memory or parsed.
"""

from __future__ import annotations

import asyncio
import inspect
import json
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, BinaryIO
from urllib.parse import quote

from tornado import httpclient

from ..control_plane.base import Endpoint

# A directory listing (JSON, about 100 bytes an entry): 160,000 entries or so.
LIST_MAX_BYTES = 16 * 1024 * 1024
# Anything else the runtime answers in one piece (an upload's acknowledgement).
ANSWER_MAX_BYTES = 1024 * 1024
# A sink may return an awaitable; the download reads nothing more until it is done
# (anything else it returns, say a file's write count, is ignored).
Sink = Callable[[bytes], Awaitable[None] | object]


class RuntimeFileError(Exception):
    """The runtime refused a file call or could not be reached; ``status`` says which."""

    def __init__(self, message: str, status: int = 502) -> None:
        super().__init__(message)
        self.status = status


@dataclass(frozen=True)
class UploadPart:
    path: str  # relative to the workspace
    size: int
    open: Callable[[], BinaryIO]


async def list_dir(endpoint: Endpoint, path: str) -> list[dict[str, Any]]:
    """The entries of one workspace directory: name, size, type, mod_time."""
    what = f"list {path or '.'}"
    body = bytearray()
    answer = _Answer(what, LIST_MAX_BYTES, body.extend, f"{what}: the listing is over")
    await _get(endpoint, "list/" + quote(path, safe="/"), answer, timeout=60)
    try:
        entries = json.loads(body or b"[]")
    except ValueError:
        raise RuntimeFileError(f"{what}: the runtime's answer is not JSON") from None
    if not isinstance(entries, list):
        raise RuntimeFileError(f"{what}: the runtime's answer is not a list")
    return [e for e in entries if isinstance(e, dict)]


async def download(endpoint: Endpoint, path: str, sink: Sink, max_bytes: int) -> int:
    """Stream a workspace file into ``sink``; more than ``max_bytes`` is an error.

    When ``sink`` returns an awaitable (a handler's ``flush``), nothing more is read
    from the runtime until it is done: a file streams at the pace of whoever takes it,
    with at most one chunk held here.
    """
    answer = _Answer(f"download {path}", max_bytes, sink, f"{path} is larger than")
    await _get(endpoint, "download/" + quote(path, safe="/"), answer, timeout=600)
    return answer.received


class _Answer:
    """A runtime's answer as it streams in: its status, a bound, and where it goes."""

    def __init__(self, what: str, max_bytes: int, sink: Sink, too_big: str) -> None:
        self.what = what
        self.max_bytes = max_bytes
        self.sink = sink
        self.too_big = too_big
        self.status = 0
        self.received = 0
        self.refusal = bytearray()
        self.failure: RuntimeFileError | None = None

    def head(self, line: str) -> None:
        if line.startswith("HTTP/"):
            self.status = int(line.split()[1])

    def take(self, chunk: bytes) -> Awaitable[None] | None:
        if self.status >= 400:  # the runtime's refusal, kept for the message
            self.refusal.extend(chunk[: 300 - len(self.refusal)])
            return None
        self.received += len(chunk)
        if self.received > self.max_bytes:
            # kept here too: tornado does not always chain a callback's error
            self.failure = RuntimeFileError(f"{self.too_big} {self.max_bytes} bytes", 413)
            raise self.failure
        taken = self.sink(chunk)
        # tornado awaits what the callback returns before it reads on
        return taken if inspect.isawaitable(taken) else None

    def refused(self) -> RuntimeFileError | None:
        if not self.refusal:
            return None
        return RuntimeFileError(
            f"the runtime refused {self.what} ({self.status}: {_message(bytes(self.refusal))})",
            self.status,
        )


async def upload(endpoint: Endpoint, parts: list[UploadPart]) -> None:
    """Write files into the workspace in one streamed multipart request."""
    boundary = uuid.uuid4().hex
    heads = [
        (
            f'--{boundary}\r\nContent-Disposition: form-data; name="file"; '
            f'filename="{quote(part.path, safe="/")}"\r\n'
            "Content-Type: application/octet-stream\r\n\r\n"
        ).encode()
        for part in parts
    ]
    tail = f"--{boundary}--\r\n".encode()
    length = sum(len(h) + p.size + 2 for h, p in zip(heads, parts, strict=True)) + len(tail)

    async def produce(write: Callable[[bytes], Any]) -> None:
        for head, part in zip(heads, parts, strict=True):
            await write(head)
            sent = 0
            with part.open() as handle:
                while sent < part.size and (chunk := handle.read(min(1 << 20, part.size - sent))):
                    await write(chunk)
                    sent += len(chunk)
            if sent != part.size:
                raise RuntimeFileError(f"{part.path} changed while it was being copied", 409)
            await write(b"\r\n")
        await write(tail)

    request = httpclient.HTTPRequest(
        endpoint.url("upload"),
        method="POST",
        headers={
            **endpoint.headers(),
            "Content-Type": f"multipart/form-data; boundary={boundary}",
            "Content-Length": str(length),
        },
        body_producer=lambda write: asyncio.ensure_future(produce(write)),
        request_timeout=600,
        connect_timeout=10,
    )
    await _fetch(request, "upload")


async def _get(endpoint: Endpoint, route: str, answer: _Answer, timeout: float) -> None:
    request = httpclient.HTTPRequest(
        endpoint.url(route), headers=endpoint.headers(), request_timeout=timeout, connect_timeout=10
    )
    await _fetch(request, answer.what, answer)


async def _fetch(
    request: httpclient.HTTPRequest, what: str, answer: _Answer | None = None
) -> bytes:
    """The runtime's answer. With ``answer`` its body streams through it (bounded,
    paced by its sink) and nothing is held here; without, the body is held up to
    ANSWER_MAX_BYTES."""
    if answer is not None:
        request.header_callback = answer.head
        request.streaming_callback = answer.take
    # a streamed answer is bounded by ``answer`` itself, at the size its caller expects
    held = ANSWER_MAX_BYTES if answer is None else 1 << 40
    client = httpclient.AsyncHTTPClient(force_instance=True, max_body_size=held)
    try:
        response = await client.fetch(request, raise_error=False)
    except Exception as exc:  # a callback's error, a dropped connection, an oversized body
        if answer is not None and answer.failure is not None:
            raise answer.failure from None
        if isinstance(exc.__context__, RuntimeFileError):
            raise exc.__context__ from None
        raise RuntimeFileError(f"{what}: sandbox runtime unreachable: {exc}") from None
    finally:
        client.close()
    if response.code == 599 or response.code >= 400:
        refused = answer.refused() if answer is not None else None
        if refused is not None:
            raise refused
        if isinstance(response.error, RuntimeFileError):
            raise response.error
        status = response.code if response.code != 599 else 502
        why = _message(response.body or b"")
        raise RuntimeFileError(
            f"{what}: the runtime answered {response.code} {why}".strip(), status
        )
    return response.body or b""


def _message(body: bytes) -> str:
    """The ``message`` of a runtime's JSON error, else the start of the body."""
    try:
        return str(json.loads(body)["message"])
    except (ValueError, KeyError, TypeError):
        return body.decode(errors="replace")[:200]
