"""Timestamps as the Kubernetes API writes and reads them (RFC 3339, UTC)."""

from __future__ import annotations

import datetime as dt
import time


def now_rfc3339() -> str:
    """Seconds precision: ``metav1.Time`` (conditions, annotations)."""
    return dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def micro_now() -> str:
    """Microseconds precision: ``metav1.MicroTime`` (Lease renew times)."""
    return dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def rfc3339_nano(ns: int) -> str:
    """Go's ``time.RFC3339Nano`` in UTC: nanoseconds, trailing zeros trimmed."""
    seconds, fraction = divmod(ns, 1_000_000_000)
    digits = f"{fraction:09d}".rstrip("0")
    base = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(seconds))
    return f"{base}.{digits}Z" if digits else f"{base}Z"


def parse_time(value: str | None) -> float | None:
    """Seconds since the epoch; None for an absent or malformed timestamp."""
    if not value:
        return None
    try:
        parsed = dt.datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        return None
    if parsed.tzinfo is None:
        parsed = parsed.replace(tzinfo=dt.UTC)
    return parsed.timestamp()
