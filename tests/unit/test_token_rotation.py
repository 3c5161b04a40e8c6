"""Rotating the router's token secret: tokens made with the previous secret keep
working while the Jupyter servers move to the new one; nothing else does."""

from __future__ import annotations

import time

import pytest

from jupyter_sandbox.router import scoped_token
from jupyter_sandbox.router.tokens import Scope, TokenAuthority, TokenRefused

OLD = "the-old-router-secret-0123456789abcdef"
NEW = "the-new-router-secret-0123456789abcdef"
OTHER = "somebody-elses-secret-0123456789abcdef"
SCOPE = Scope("team-a", "box")


@pytest.mark.parametrize("format", ["jwt", "scoped-v1"])
@pytest.mark.parametrize(
    ("made_with", "accepted"),
    [(NEW, True), (OLD, True), (OTHER, False)],
)
def test_the_previous_secret_is_accepted_while_rotating(
    format: str, made_with: str, accepted: bool
) -> None:
    router = TokenAuthority(NEW, previous=[OLD])
    token = TokenAuthority(made_with).issue(SCOPE, format=format)  # type: ignore[arg-type]
    if accepted:
        assert router.check(token, "team-a", "box").name == "box"
        with pytest.raises(TokenRefused) as other_box:
            router.check(token, "team-a", "other")
        assert other_box.value.status == 403
    else:
        with pytest.raises(TokenRefused, match="not valid"):
            router.check(token, "team-a", "box")


def test_without_the_previous_secret_its_tokens_are_refused() -> None:
    token = TokenAuthority(OLD).issue(SCOPE)
    with pytest.raises(TokenRefused, match="not valid"):
        TokenAuthority(NEW).check(token, "team-a", "box")


def test_an_expired_token_of_the_previous_secret_says_so() -> None:
    key = scoped_token.normalize_secret(OLD)
    token = scoped_token.mint(key, "team-a", "box", int(time.time()) - 10)
    with pytest.raises(TokenRefused, match="expired"):
        TokenAuthority(NEW, previous=[OLD]).check(token, "team-a", "box")


def test_tokens_are_issued_with_the_new_secret_only() -> None:
    token = TokenAuthority(NEW, previous=[OLD]).issue(SCOPE)
    TokenAuthority(NEW).check(token, "team-a", "box")
    with pytest.raises(TokenRefused):
        TokenAuthority(OLD).check(token, "team-a", "box")


def test_a_short_previous_secret_is_refused() -> None:
    with pytest.raises(ValueError, match="at least"):
        TokenAuthority(NEW, previous=["short"])
