"""The router's authorization decisions that need no cluster (see also
tests/kubernetes/test_router_hub_auth.py with a real hub)."""

from __future__ import annotations

import pytest

from jupyter_sandbox.router.authorization import Authorizer, credential
from jupyter_sandbox.router.hub_auth import HubIdentity
from jupyter_sandbox.router.tokens import Scope, TokenAuthority, TokenRefused

from .helpers import free_port

SECRET = "authorization-test-secret-0123456789abcdef"


def test_credential_schemes() -> None:
    assert credential("Bearer abc") == "abc"
    assert credential("token abc") == "abc"
    assert credential("Basic abc") is None
    assert credential("Bearer ") is None
    assert credential(None) is None


async def test_open_router_admits_everyone() -> None:
    assert await Authorizer().check({}, "ns", "sb") == ""


async def test_scoped_tokens_beside_an_unreachable_hub() -> None:
    authority = TokenAuthority(SECRET)
    hub = HubIdentity(f"http://127.0.0.1:{free_port()}/hub/api", request_timeout=5)
    auth = Authorizer(authority, hub, owner_of=lambda ns, name: "alice")
    try:
        token = authority.issue(Scope("ns", "sb", "alice"))
        # a scoped token is checked locally, whatever the hub's state
        assert await auth.check({"Authorization": f"Bearer {token}"}, "ns", "sb") == "alice"
        with pytest.raises(TokenRefused) as err:
            await auth.check({"Authorization": f"Bearer {token}"}, "ns", "other")
        assert err.value.status == 403
        # anything else is a hub token: the hub cannot be asked -> 503, retryable
        with pytest.raises(TokenRefused) as err:
            await auth.check({"Authorization": "token 0123abcd"}, "ns", "sb")
        assert err.value.status == 503 and "JupyterHub" in err.value.reason
        with pytest.raises(TokenRefused) as err:
            await auth.check({}, "ns", "sb")
        assert err.value.status == 401
    finally:
        await auth.close()


def test_hub_authorization_needs_owners_and_a_url() -> None:
    with pytest.raises(ValueError, match="owns each sandbox"):
        Authorizer(hub=HubIdentity("http://hub/hub/api"))
    with pytest.raises(ValueError, match="http"):
        HubIdentity("hub:8081")


def test_a_verified_token_still_expires() -> None:
    """Tokens are verified once and remembered, but not past their expiry."""
    import time

    authority = TokenAuthority(SECRET)
    token = authority.issue(Scope("ns", "sb"), ttl=1)
    assert authority.check(token, "ns", "sb").name == "sb"  # verified, remembered
    with pytest.raises(TokenRefused):
        authority.check(token, "ns", "other")  # remembered claims still scope it
    time.sleep(1.1)
    with pytest.raises(TokenRefused) as err:
        authority.check(token, "ns", "sb")
    assert err.value.status == 403 and "expired" in err.value.reason
