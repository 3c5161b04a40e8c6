"""Upstream sandbox-router's scoped tokens (``--authz-mode=scoped-token``), byte for byte.

kubernetes-sigs/agent-sandbox ``sandbox-router/authz/scopedtoken.go`` mints and
verifies ``v1.<payload>.<signature>`` where

- ``payload`` is the unpadded base64url (Go's ``base64.RawURLEncoding``) of the
  ``encoding/json`` encoding of ``{"ns": namespace, "name": sandbox, "exp": unix
  seconds}``, in that field order;
- ``signature`` is the unpadded base64url of HMAC-SHA256(secret,
  ``"agent-sandbox/scoped-token/v1."`` + payload), the payload as it is on the wire;
- the secret is the shared one with surrounding whitespace trimmed, at least 32
  bytes; the signature is compared in constant time before the payload is read;
- a token is valid while the current Unix second is below ``exp``.

Our router accepts these beside its JWTs (same secret) and ``TokenAuthority`` can
mint them, so that either router can front the same sandboxes.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import json
import re
from dataclasses import dataclass

VERSION = "v1"
# Domain separation: a MAC made here verifies nowhere else that HMACs with the secret.
MAC_CONTEXT = b"agent-sandbox/scoped-token/" + VERSION.encode() + b"."
MIN_SECRET_BYTES = 32
INT64 = range(-(1 << 63), 1 << 63)
RAW_URL_BASE64 = re.compile(r"[A-Za-z0-9_-]*")
# unicode.IsSpace in Go, which bytes.TrimSpace trims
GO_SPACE = "\t\n\v\f\r \x85\xa0\u1680\u2000\u2001\u2002\u2003\u2004\u2005\u2006\u2007\u2008"
GO_SPACE += "\u2009\u200a\u2028\u2029\u202f\u205f\u3000"


class Malformed(ValueError):
    """Not a valid v1 token for this secret: bad shape, signature, payload or expiry."""


class Expired(Malformed):
    """A valid v1 token past its expiry."""


@dataclass(frozen=True)
class Claims:
    namespace: str
    name: str
    exp: int


def normalize_secret(secret: str | bytes) -> bytes:
    """The HMAC key of ``secret``: trimmed as Go's bytes.TrimSpace does, 32 bytes at least."""
    raw = secret.encode() if isinstance(secret, str) else bytes(secret)
    text = raw.decode("utf-8", errors="surrogateescape")
    key = text.strip(GO_SPACE).encode("utf-8", errors="surrogateescape")
    if len(key) < MIN_SECRET_BYTES:
        raise ValueError(
            f"the router token secret must be at least {MIN_SECRET_BYTES} bytes after "
            f"trimming whitespace, got {len(key)}; make one with "
            "`python3 -c 'import secrets; print(secrets.token_urlsafe(32))'`"
        )
    return key


def mint(key: bytes, namespace: str, name: str, exp: int) -> str:
    """A v1 token for ``namespace/name`` valid until Unix second ``exp`` (exclusive).

    ``key`` is a normalized secret (``normalize_secret``).
    """
    if not namespace or not name:
        raise ValueError("a scoped token needs a namespace and a sandbox name")
    payload = f'{{"ns":{go_json_string(namespace)},"name":{go_json_string(name)},"exp":{exp}}}'
    encoded = b64encode(payload.encode())
    return f"{VERSION}.{encoded}.{b64encode(sign(key, encoded))}"


def sign(key: bytes, encoded_payload: str) -> bytes:
    return hmac.new(key, MAC_CONTEXT + encoded_payload.encode("ascii"), hashlib.sha256).digest()


def verify(key: bytes, token: str, now: float) -> Claims:
    """The claims of a v1 token signed with ``key`` and not expired at ``now``.

    The steps and their order are upstream's ``ScopedTokenAuthorizer.verify``.
    """
    if not token.isascii():  # a header decoded as latin-1: no base64 in any case
        raise Malformed("not a v1 scoped token")
    version, _, rest = token.partition(".")
    encoded_payload, dot, encoded_sig = rest.partition(".")
    if version != VERSION or not dot:
        raise Malformed("not a v1 scoped token")
    if not hmac.compare_digest(b64decode(encoded_sig), sign(key, encoded_payload)):
        raise Malformed("the signature does not match")
    claims = parse_claims(b64decode(encoded_payload))
    if int(now) >= claims.exp:
        raise Expired("the token has expired")
    return claims


def parse_claims(payload: bytes) -> Claims:
    """``json.Unmarshal`` into upstream's scopedClaims, for what a signed payload can hold:
    missing fields and ``null`` are zero values, a wrong type is an error.  Unlike Go,
    field names must match exactly (Go also takes ``"NS"``; upstream never mints it)."""
    try:
        data = json.loads(payload.decode("utf-8", errors="replace"))
    except ValueError:
        raise Malformed("the payload is not JSON") from None
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise Malformed("the payload is not a JSON object")
    namespace, name, exp = data.get("ns"), data.get("name"), data.get("exp")
    if not all(v is None or isinstance(v, str) for v in (namespace, name)):
        raise Malformed("ns and name must be strings")
    if exp is not None and (type(exp) is not int or exp not in INT64):
        raise Malformed("exp must be a 64-bit integer")
    return Claims(namespace=namespace or "", name=name or "", exp=exp or 0)


def b64encode(data: bytes) -> str:
    """Go's base64.RawURLEncoding.EncodeToString."""
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode("ascii")


def b64decode(text: str) -> bytes:
    """Go's base64.RawURLEncoding.DecodeString: URL alphabet, no padding."""
    if not RAW_URL_BASE64.fullmatch(text) or len(text) % 4 == 1:
        raise Malformed("not unpadded base64url")
    try:
        return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))
    except binascii.Error:
        raise Malformed("not unpadded base64url") from None


def go_json_string(value: str) -> str:
    """A string as Go's json.Marshal writes it: HTML-safe, U+2028/9 escaped, UTF-8 kept."""
    out = ['"']
    for char in value:
        code = ord(char)
        if char in '"\\':
            out.append("\\" + char)
        elif char in GO_SHORT_ESCAPES:
            out.append(GO_SHORT_ESCAPES[char])
        elif code < 0x20 or char in "<>&" or code in (0x2028, 0x2029):
            out.append(f"\\u{code:04x}")
        elif 0xD800 <= code <= 0xDFFF:  # no UTF-8 for a lone surrogate: Go writes U+FFFD
            out.append("\\ufffd")
        else:
            out.append(char)
    out.append('"')
    return "".join(out)


GO_SHORT_ESCAPES = {"\b": "\\b", "\f": "\\f", "\n": "\\n", "\r": "\\r", "\t": "\\t"}
