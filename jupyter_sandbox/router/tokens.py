"""Scoped sandbox tokens: an HMAC-signed token naming one sandbox in one namespace.

The control plane issues a token when it hands out a claim; the router lets the
holder reach that sandbox and no other, until the token expires.  Two formats
share the secret: our JWT (HS256, which also carries a subject) and upstream
sandbox-router's ``v1.<payload>.<sig>`` (``router/scoped_token.py``); ``check``
accepts both, ``issue`` mints either.
"""

from __future__ import annotations

import secrets
import time
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any, Literal

import jwt

from . import scoped_token

TokenFormat = Literal["jwt", "scoped-v1"]
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
    """Issues tokens with ``secret``; accepts tokens made with it or, while a secret
    is being rotated, with one of the ``previous`` ones."""

    def __init__(self, secret: str | bytes, previous: Iterable[str | bytes] = ()) -> None:
        # Whitespace around the secret is dropped (a mounted file's newline), as
        # upstream does; what is left must be at least 32 bytes, the HMAC size.
        self._secret = scoped_token.normalize_secret(secret)
        self._keys = (self._secret, *(scoped_token.normalize_secret(p) for p in previous))
        # token -> (expiry, scope): a token never changes, so its signature is
        # checked once, not on every request it comes with (expiry still is)
        self._verified: dict[str, tuple[float, Scope]] = {}

    def issue(self, scope: Scope, ttl: float = DEFAULT_TTL, *, format: TokenFormat = "jwt") -> str:
        """A token for ``scope`` valid for ``ttl`` seconds.

        ``format="scoped-v1"`` mints upstream sandbox-router's token (as its
        ``MintScopedToken``): it holds no subject, and ``ttl`` must be 1 s or more.
        """
        if format == "scoped-v1":
            if ttl < 1:
                raise ValueError("a scoped-v1 token needs a ttl of at least 1 second")
            exp = int(time.time() + ttl)
            return scoped_token.mint(self._secret, scope.namespace, scope.name, exp)
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
        scope = hit[1] if hit is not None and hit[0] > time.time() else self._verify(token)
        if scope.namespace != namespace or scope.name != name:
            raise TokenRefused(403, "the sandbox token is for another sandbox")
        return scope

    def _verify(self, token: str) -> Scope:
        if token.startswith(scoped_token.VERSION + "."):
            exp, scope = self._verify_scoped(token)
        else:
            exp, scope = self._verify_jwt(token)
        if len(self._verified) >= VERIFIED_CACHE:
            self._verified.clear()
        self._verified[token] = (exp, scope)
        return scope

    def _verify_jwt(self, token: str) -> tuple[float, Scope]:
        claims: dict[str, Any] | None = None
        for key in self._keys:
            try:
                claims = jwt.decode(
                    token,
                    key,
                    algorithms=[ALGORITHM],
                    issuer=ISSUER,
                    options={"require": ["exp", "ns", "sbx"]},
                )
                break
            except jwt.InvalidSignatureError:
                continue  # perhaps made with a previous secret
            except jwt.ExpiredSignatureError:
                raise TokenRefused(403, "the sandbox token has expired") from None
            except jwt.InvalidTokenError:
                raise TokenRefused(403, "the sandbox token is not valid") from None
        if claims is None:
            raise TokenRefused(403, "the sandbox token is not valid")
        namespace, name = claims["ns"], claims["sbx"]
        if not isinstance(namespace, str) or not isinstance(name, str):
            raise TokenRefused(403, "the sandbox token is not valid")
        scope = Scope(namespace=namespace, name=name, subject=str(claims.get("sub", "")))
        return float(claims["exp"]), scope

    def _verify_scoped(self, token: str) -> tuple[float, Scope]:
        """Upstream's v1 token.  Refusals answer as for our JWTs (403), where upstream
        answers 401 for a bad or expired token and 403 for another sandbox."""
        for key in self._keys:
            try:
                claims = scoped_token.verify(key, token, time.time())
            except scoped_token.Expired:  # (checked after the signature)
                raise TokenRefused(403, "the sandbox token has expired") from None
            except scoped_token.Malformed:
                continue  # perhaps made with a previous secret
            return float(claims.exp), Scope(namespace=claims.namespace, name=claims.name)
        raise TokenRefused(403, "the sandbox token is not valid")
