"""Small helpers to look into Jupyter messages without decoding their content."""

from __future__ import annotations

import hmac
import json
from collections.abc import Sequence
from hashlib import sha256
from typing import Any

DELIM = b"<IDS|MSG>"


def sign(key: bytes, parts: Sequence[bytes | memoryview]) -> bytes:
    """HMAC-SHA256 hex digest over header, parent_header, metadata and content."""
    if not key:
        return b""
    mac = hmac.new(key, digestmod=sha256)
    for part in parts[:4]:
        mac.update(part)
    return mac.hexdigest().encode("ascii")


def split_zmq(
    frames: Sequence[bytes | memoryview],
) -> tuple[list[bytes | memoryview], bytes | memoryview, list[bytes | memoryview]]:
    """Split a ZMQ multipart message into (identities, signature, parts)."""
    try:
        index = frames.index(DELIM)
    except ValueError:
        raise ValueError("message has no <IDS|MSG> delimiter") from None
    if len(frames) < index + 6:
        raise ValueError("message has fewer than four parts after its signature")
    return list(frames[:index]), frames[index + 1], list(frames[index + 2 :])


def verify(key: bytes, signature: bytes | memoryview, parts: Sequence[bytes | memoryview]) -> bool:
    """Check a message's signature in constant time."""
    if not key:
        return True
    return hmac.compare_digest(sign(key, parts), signature)


def header(parts: Sequence[bytes | memoryview]) -> dict[str, Any]:
    """Decode only the header part."""
    return json.loads(bytes(parts[0]))


def parent_msg_id(parts: Sequence[bytes | memoryview]) -> str | None:
    """The msg_id of the message this one answers, if any."""
    if len(parts) < 2:
        return None
    raw = bytes(parts[1])
    if raw in (b"{}", b""):
        return None
    try:
        parent = json.loads(raw)
    except ValueError:
        return None
    value = parent.get("msg_id") if isinstance(parent, dict) else None
    return value if isinstance(value, str) else None
