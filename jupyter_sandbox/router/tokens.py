"""Scoped sandbox tokens: an HMAC-signed JWT naming one sandbox in one namespace.

The control plane issues a token when it hands out a claim; the router lets the
holder reach that sandbox and no other, until the token expires.
"""

from __future__ import annotations

import secrets
import time
from dataclasses import dataclass
from typing import Any

import jwt

ALGORITHM = "HS256"
ISSUER = "jupyter-sandbox"
DEFAULT_TTL = 7 * 24 * 3600


class TokenRefused(Exception):
    """The token is missing, malformed, expired or for another sandbox."""

    def __init__(self, status: int, reason: str) -> None:
        super().__init__(reason)
        self.status = status
        self.reason = reason


@dataclass(frozen=True)
class Scope:
    namespace: str
    name: str
    subject: str = ""


def new_secret() -> str:
    return secrets.token_urlsafe(32)


VERIFIED_CACHE = 4096


class TokenAuthority:
    def __init__(self, secret: str | bytes) -> None:
        if not secret:
            raise ValueError("the token secret must not be empty")
        self._secret = secret.encode() if isinstance(secret, str) else secret
        # token -> its verified claims: a token never changes, so its signature
        # is checked once, not on every request it comes with (expiry still is)
        self._verified: dict[str, tuple[float, dict[str, Any]]] = {}

    def issue(self, scope: Scope, ttl: float = DEFAULT_TTL) -> str:
        now = int(time.time())
        claims = {
            "iss": ISSUER,
            "ns": scope.namespace,
            "sbx": scope.name,
            "sub": scope.subject,
            "iat": now,
            "exp": now + int(ttl),
        }
        return jwt.encode(claims, self._secret, algorithm=ALGORITHM)

    def check(self, token: str | None, namespace: str, name: str) -> Scope:
        """Return the token's scope if it grants access to ``namespace/name``."""
        if not token:
            raise TokenRefused(401, "a sandbox token is required (Authorization: Bearer ...)")
        hit = self._verified.get(token)
        claims = hit[1] if hit is not None and hit[0] > time.time() else self._verify(token)
        if claims.get("ns") != namespace or claims.get("sbx") != name:
            raise TokenRefused(403, "the sandbox token is for another sandbox")
        return Scope(namespace=namespace, name=name, subject=str(claims.get("sub", "")))

    def _verify(self, token: str) -> dict[str, Any]:
        try:
            claims: dict[str, Any] = jwt.decode(
                token,
                self._secret,
                algorithms=[ALGORITHM],
                issuer=ISSUER,
                options={"require": ["exp", "ns", "sbx"]},
            )
        except jwt.ExpiredSignatureError:
            raise TokenRefused(403, "the sandbox token has expired") from None
        except jwt.InvalidTokenError:
            raise TokenRefused(403, "the sandbox token is not valid") from None
        if len(self._verified) >= VERIFIED_CACHE:
            self._verified.clear()
        self._verified[token] = (float(claims["exp"]), claims)
        return claims
