"""May this caller reach this sandbox?  The router's two ways to say yes.

- a scoped token: a JWT signed with the router's secret naming exactly this
  sandbox (``router/tokens.py``; what the local backend and the SDK's gateway
  mode hand out), or upstream sandbox-router's ``v1.`` scoped token made with
  the same secret (``router/scoped_token.py``);
- a JupyterHub API token whose user is the one the sandbox's claim names
  (``router/hub_auth.py``; what single-user servers send on a hub).

With neither configured every caller is admitted (upstream's in-cluster
behaviour), which ``jupyter-sandbox router`` refuses unless told
``--allow-unauthenticated``; the local daemon's router always has a secret.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass

from .hub_auth import HubIdentity, HubUnavailable
from .tokens import TokenAuthority, TokenRefused

# (namespace, sandbox name) -> the user its claim names, or None
OwnerLookup = Callable[[str, str], "str | None"]


def credential(header_value: str | None) -> str | None:
    """The token of ``Authorization: Bearer <t>`` or ``Authorization: token <t>``."""
    if not header_value:
        return None
    scheme, _, value = header_value.partition(" ")
    if scheme.lower() not in ("bearer", "token") or not value.strip():
        return None
    return value.strip()


def looks_like_jwt(token: str) -> bool:
    """A scoped token (a JWT or a ``v1.`` token: three dot-separated parts), not a hub token."""
    return token.count(".") == 2


@dataclass
class Authorizer:
    authority: TokenAuthority | None = None
    hub: HubIdentity | None = None
    owner_of: OwnerLookup | None = None

    def __post_init__(self) -> None:
        if self.hub is not None and self.owner_of is None:
            raise ValueError("hub authorization needs to know who owns each sandbox")

    @property
    def open(self) -> bool:
        return self.authority is None and self.hub is None

    def describe(self) -> str:
        ways = [w for w, on in (("scoped tokens", self.authority), ("JupyterHub", self.hub)) if on]
        return " or ".join(ways) or "none (every caller admitted)"

    async def check(self, headers: Mapping[str, str], namespace: str, name: str) -> str:
        """The caller's identity (a user name, possibly empty) if it may reach
        ``namespace/name``; raises TokenRefused (401/403/503) otherwise."""
        if self.open:
            return ""
        token = credential(headers.get("Authorization"))
        if not token:
            raise TokenRefused(401, "a sandbox token is required (Authorization: Bearer ...)")
        if self.authority is not None and (self.hub is None or looks_like_jwt(token)):
            return self.authority.check(token, namespace, name).subject
        assert self.hub is not None and self.owner_of is not None
        try:
            user = await self.hub.user_of(token)
        except HubUnavailable as exc:
            raise TokenRefused(503, f"cannot check the JupyterHub token now: {exc}") from None
        if self.owner_of(namespace, name) != user:
            # The same answer whether the sandbox is another user's or does not
            # exist: a caller learns nothing about sandboxes that are not theirs.
            raise TokenRefused(403, f"user {user!r} may not reach sandbox {namespace}/{name}")
        return user

    async def close(self) -> None:
        if self.hub is not None:
            await self.hub.close()
