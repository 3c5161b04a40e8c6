"""A sandbox runtime's file API, through the router: list, download, upload.

The runtime serves upstream agent-sandbox's file endpoints (``list/``,
``download/``, ``upload``), confined to the workspace. Copy mode and the
workspace browser both use them through these calls; what a sandbox answers is
untrusted, so every download is bounded by the size its caller expects.
"""

from __future__ import annotations

import asyncio
import json
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, BinaryIO
from urllib.parse import quote

from tornado import httpclient

from ..control_plane.base import Endpoint


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
    body = await _fetch(
        httpclient.HTTPRequest(
            endpoint.url("list/" + quote(path, safe="/")),
            headers=endpoint.headers(),
            request_timeout=60,
            connect_timeout=10,
        ),
        f"list {path or '.'}",
    )
    try:
        entries = json.loads(body or b"[]")
    except ValueError:
        raise RuntimeFileError(f"list {path or '.'}: the runtime's answer is not JSON") from None
    if not isinstance(entries, list):
        raise RuntimeFileError(f"list {path or '.'}: the runtime's answer is not a list")
    return [e for e in entries if isinstance(e, dict)]


async def download(
    endpoint: Endpoint, path: str, sink: Callable[[bytes], object], max_bytes: int
) -> int:
    """Stream a workspace file into ``sink``; more than ``max_bytes`` is an error."""
    received = 0
    status = 0
    refusal = bytearray()

    def head(line: str) -> None:
        nonlocal status
        if line.startswith("HTTP/"):
            status = int(line.split()[1])

    def take(chunk: bytes) -> None:
        nonlocal received
        if status >= 400:  # the runtime's refusal, kept for the message
            refusal.extend(chunk[: 300 - len(refusal)])
            return
        received += len(chunk)
        if received > max_bytes:
            raise RuntimeFileError(f"{path} is larger than {max_bytes} bytes", 413)
        sink(chunk)

    request = httpclient.HTTPRequest(
        endpoint.url("download/" + quote(path, safe="/")),
        headers=endpoint.headers(),
        header_callback=head,
        streaming_callback=take,
        request_timeout=600,
        connect_timeout=10,
    )
    try:
        await _fetch(request, f"download {path}")
    except RuntimeFileError as exc:
        if refusal:
            raise RuntimeFileError(
                f"the runtime refused {path} ({status}: {_message(bytes(refusal))})", status
            ) from None
        raise exc from None
    return received


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


async def _fetch(request: httpclient.HTTPRequest, what: str) -> bytes:
    client = httpclient.AsyncHTTPClient(force_instance=True, max_body_size=1 << 40)
    try:
        response = await client.fetch(request, raise_error=False)
    except RuntimeFileError:
        raise
    except Exception as exc:  # a callback's error (as its context) or a dropped connection
        if isinstance(exc.__context__, RuntimeFileError):
            raise exc.__context__ from None
        raise RuntimeFileError(f"{what}: sandbox runtime unreachable: {exc}") from None
    finally:
        client.close()
    if response.code == 599 or response.code >= 400:
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
