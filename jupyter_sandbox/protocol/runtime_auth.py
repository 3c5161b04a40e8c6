"""The credential a sandbox's runtime asks of every caller on a cluster.

A sandbox pod's IP is reachable from other pods wherever the CNI ignores
NetworkPolicy, and users can read pod IPs, so reachability must give nothing. Each
sandbox gets its own token, ``HMAC-SHA256(key, "<namespace>/<name>/<uid>")``: the
operator puts it in a Secret of the sandbox's own and into the runtime's environment
by reference (never its value in the pod spec), the router derives it from the same
key for the sandbox it has authorized a caller for and sends it upstream. No
sandbox can compute another's token, and one made again under the same name (a new
uid) gets a new one. ``/healthz`` and ``/readyz`` stay open for probes; they tell
nothing.
"""

from __future__ import annotations

import hashlib
import hmac
from pathlib import Path

# The header the router sends it in; a caller's own is never forwarded.
HEADER = "X-Sandbox-Runtime-Token"
# The runtime's environment variable (the runtime passes no SANDBOX_RUNTIME_* on to
# the kernel).
ENV = "SANDBOX_RUNTIME_TOKEN"
# The key in each sandbox's Secret, and the Secret's name.
SECRET_KEY = "token"
# Where the operator and the router find the key (also their --runtime-key-file).
KEY_FILE_ENV = "SANDBOX_RUNTIME_KEY_FILE"
MIN_KEY_BYTES = 32


def secret_name(sandbox_name: str) -> str:
    """The Secret holding a sandbox's token (a valid name: sandbox names are DNS labels)."""
    return f"{sandbox_name[:240]}-runtime-token"


def token_for(key: bytes, namespace: str, name: str, uid: str) -> str:
    """The token of one sandbox."""
    if not (namespace and name and uid):
        raise ValueError("a runtime token needs the sandbox's namespace, name and uid")
    message = f"{namespace}/{name}/{uid}".encode()
    return hmac.new(key, message, hashlib.sha256).hexdigest()


def load_key(path: str | Path) -> bytes:
    """The key from a file (a mounted Secret), surrounding whitespace removed; ValueError
    when it is too short to be a key."""
    key = Path(path).read_bytes().strip()
    if len(key) < MIN_KEY_BYTES:
        raise ValueError(
            f"the runtime key in {path} has {len(key)} bytes; at least {MIN_KEY_BYTES} are "
            "needed (for example: openssl rand -base64 48)"
        )
    return key


def matches(expected: str, presented: str | None) -> bool:
    """Whether a presented token is the expected one (constant time)."""
    return bool(presented) and hmac.compare_digest(expected.encode(), (presented or "").encode())
