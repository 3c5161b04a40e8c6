"""Router token secrets and upstream sandbox-router's ``v1.`` scoped tokens.

The known answers below come from upstream's own code: kubernetes-sigs/agent-sandbox
``sandbox-router/authz/scopedtoken.go`` (commit 2fd412d55eca), compiled unchanged
with Go 1.26 beside a driver that minted with a fixed ``exp`` (its steps, without
the clock) and ran ``ScopedTokenAuthorizer.Authorize`` with a fixed ``Clock``.  The
other table mints with ``go_mint``, a line-by-line transcription of
``MintScopedToken``, so that what is tested is not checked against itself.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from jupyter_sandbox.router import scoped_token
from jupyter_sandbox.router.tokens import Scope, TokenAuthority, TokenRefused
from tests.test_runtime_and_router import NS, fetch, routed, router, runtime  # noqa: F401

GO_SECRET = "0123456789abcdef0123456789abcdef-kav"
GO_EXP = 1900000000
GO_NOW = 1800000000
PAYLOAD = "eyJucyI6InRlYW0tYSIsIm5hbWUiOiJib3gtYSIsImV4cCI6MTkwMDAwMDAwMH0"
GO_TOKEN = f"v1.{PAYLOAD}.j1IDwpJjgzJ34rBeFBSeSLshdON4wwK7AAcnn2BvySY"
# MintScopedToken(namespace="a<b>&c", name="\u2028xé\x01\b\f"): encoding/json's escapes
GO_ESCAPES_TOKEN = (
    "v1.eyJucyI6ImFcdTAwM2NiXHUwMDNlXHUwMDI2YyIsIm5hbWUiOiJcdTIwMjh4w6lcdTAwMDFcYlxmIiwiZXhw"
    "IjoxOTAwMDAwMDAwfQ.HjzbneKmrc2zA_BDAFMKum9zGYkUbMxMOunbKxkJNhE"
)
TAMPERED_PAYLOAD = "eyJucyI6InRlYW0tYSIsIm5hbWUiOiJib3gtYiIsImV4cCI6MTkwMDAwMDAwMH0"

# (case, token, namespace, sandbox, now, upstream's verdict)
GO_VERDICTS = [
    ("valid", GO_TOKEN, "team-a", "box-a", GO_NOW, "allow"),
    ("valid in its last second", GO_TOKEN, "team-a", "box-a", GO_EXP - 1, "allow"),
    ("expired at exp", GO_TOKEN, "team-a", "box-a", GO_EXP, "unauthenticated"),
    ("other sandbox", GO_TOKEN, "team-a", "box-b", GO_NOW, "forbidden"),
    ("other namespace", GO_TOKEN, "team-b", "box-a", GO_NOW, "forbidden"),
    (
        "no domain separation",
        f"v1.{PAYLOAD}.EJApeAEK4nug1a40l_vw3pk1WHmhlfcFyHbOUFDf6GA",
        "team-a",
        "box-a",
        GO_NOW,
        "unauthenticated",
    ),
    (
        "v2 domain",
        f"v1.{PAYLOAD}.2_PFIMG7zHpMwHI5hp5JKnHbM489Fn6yYpaf8ZH6UFo",
        "team-a",
        "box-a",
        GO_NOW,
        "unauthenticated",
    ),
    (
        "tampered payload",
        f"v1.{TAMPERED_PAYLOAD}.j1IDwpJjgzJ34rBeFBSeSLshdON4wwK7AAcnn2BvySY",
        "team-a",
        "box-b",
        GO_NOW,
        "unauthenticated",
    ),
    ("v2 prefix", "v2" + GO_TOKEN[2:], "team-a", "box-a", GO_NOW, "unauthenticated"),
    ("padded signature", GO_TOKEN + "=", "team-a", "box-a", GO_NOW, "unauthenticated"),
]


def our_verdict(secret: str, token: str, namespace: str, name: str, now: int) -> str:
    try:
        claims = scoped_token.verify(scoped_token.normalize_secret(secret), token, now)
    except scoped_token.Malformed:
        return "unauthenticated"
    return "allow" if (claims.namespace, claims.name) == (namespace, name) else "forbidden"


@pytest.mark.parametrize("case,token,namespace,name,now,verdict", GO_VERDICTS)
def test_upstream_known_answers(
    case: str, token: str, namespace: str, name: str, now: int, verdict: str
) -> None:
    assert our_verdict(GO_SECRET, token, namespace, name, now) == verdict, case


def test_minting_matches_upstream_byte_for_byte() -> None:
    key = scoped_token.normalize_secret(GO_SECRET)
    assert scoped_token.mint(key, "team-a", "box-a", GO_EXP) == GO_TOKEN
    assert scoped_token.mint(key, "a<b>&c", "\u2028x\u00e9\x01\b\f", GO_EXP) == GO_ESCAPES_TOKEN


def test_a_newline_after_the_secret_changes_nothing() -> None:
    """Upstream trims the secret: a mounted file's newline must not change the key."""
    assert our_verdict(GO_SECRET + "\n", GO_TOKEN, "team-a", "box-a", GO_NOW) == "allow"
    padded = TokenAuthority(f"  {GO_SECRET}\r\n".encode())
    token = padded.issue(Scope("team-a", "box-a"), format="scoped-v1")
    assert our_verdict(GO_SECRET, token, "team-a", "box-a", int(time.time())) == "allow"


# -- a transcription of MintScopedToken, for tokens valid now --------------------------


def go_mint(
    secret: str,
    namespace: str,
    name: str,
    exp: int,
    context: bytes = b"agent-sandbox/scoped-token/v1.",
    version: str = "v1",
) -> str:
    """``MintScopedToken`` line by line, with the expiry given and the context a parameter."""
    key = secret.strip().encode()
    payload = json.dumps({"ns": namespace, "name": name, "exp": exp}, separators=(",", ":"))
    enc_payload = base64.urlsafe_b64encode(payload.encode()).rstrip(b"=").decode()
    mac = hmac.new(key, context + enc_payload.encode(), hashlib.sha256).digest()
    enc_sig = base64.urlsafe_b64encode(mac).rstrip(b"=").decode()
    return f"{version}.{enc_payload}.{enc_sig}"


SECRET = "router-tokens-test-secret-0123456789abcdef"
LATER = int(time.time()) + 3600


def tampered() -> str:
    version, _, sig = go_mint(SECRET, "team-a", "box-a", LATER).split(".")
    payload = json.dumps({"ns": "team-a", "name": "box-b", "exp": LATER}, separators=(",", ":"))
    encoded = base64.urlsafe_b64encode(payload.encode()).rstrip(b"=").decode()
    return f"{version}.{encoded}.{sig}"


@pytest.mark.parametrize(
    "case,token,namespace,name,refusal",
    [
        ("valid", go_mint(SECRET, "team-a", "box-a", LATER), "team-a", "box-a", None),
        (
            "wrong domain",
            go_mint(SECRET, "team-a", "box-a", LATER, context=b"agent-sandbox/other/v1."),
            "team-a",
            "box-a",
            "not valid",
        ),
        (
            "no domain",
            go_mint(SECRET, "team-a", "box-a", LATER, context=b""),
            "team-a",
            "box-a",
            "not valid",
        ),
        ("tampered payload", tampered(), "team-a", "box-b", "not valid"),
        (
            "expired",
            go_mint(SECRET, "team-a", "box-a", int(time.time()) - 1),
            "team-a",
            "box-a",
            "expired",
        ),
        ("other sandbox", go_mint(SECRET, "team-a", "box-a", LATER), "team-a", "box-b", "another"),
        (
            "other namespace",
            go_mint(SECRET, "team-a", "box-a", LATER),
            "team-b",
            "box-a",
            "another",
        ),
        (
            "other secret",
            go_mint("another-secret-0123456789abcdef0123456789", "team-a", "box-a", LATER),
            "team-a",
            "box-a",
            "not valid",
        ),
        (
            "other version",
            go_mint(SECRET, "team-a", "box-a", LATER, version="v2"),
            "team-a",
            "box-a",
            "not valid",
        ),
    ],
)
def test_the_authority_checks_upstream_tokens(
    case: str, token: str, namespace: str, name: str, refusal: str | None
) -> None:
    authority = TokenAuthority(SECRET)
    if refusal is None:
        assert authority.check(token, namespace, name) == Scope(namespace, name), case
        assert authority.check(token, namespace, name) == Scope(namespace, name)  # cached
        return
    with pytest.raises(TokenRefused) as err:
        authority.check(token, namespace, name)
    assert err.value.status == 403 and refusal in err.value.reason, (case, err.value.reason)


def test_the_authority_mints_what_upstream_verifies() -> None:
    """Read back by upstream's rules: field order, encodings, MAC over the domain."""
    authority = TokenAuthority(SECRET)
    before = int(time.time())
    token = authority.issue(Scope("team-a", "box-a", "alice"), ttl=60, format="scoped-v1")
    version, enc_payload, _ = token.split(".")
    assert version == "v1" and "=" not in token
    payload = base64.urlsafe_b64decode(enc_payload + "=" * (-len(enc_payload) % 4))
    claims = json.loads(payload)
    assert list(claims) == ["ns", "name", "exp"]  # no subject: upstream's format has none
    assert claims["ns"] == "team-a" and claims["name"] == "box-a"
    assert before + 60 <= claims["exp"] <= int(time.time()) + 60
    assert token == go_mint(SECRET, "team-a", "box-a", claims["exp"])
    assert authority.check(token, "team-a", "box-a") == Scope("team-a", "box-a")
    with pytest.raises(ValueError, match="1 second"):
        authority.issue(Scope("team-a", "box-a"), ttl=0.5, format="scoped-v1")


def test_jwts_and_upstream_tokens_share_the_secret() -> None:
    authority = TokenAuthority(SECRET)
    jwt_token = authority.issue(Scope("team-a", "box-a", "alice"))
    assert authority.check(jwt_token, "team-a", "box-a").subject == "alice"
    upstream = go_mint(SECRET, "team-a", "box-a", LATER)
    assert TokenAuthority(SECRET).check(upstream, "team-a", "box-a").name == "box-a"


# -- secret length -----------------------------------------------------------------------


@pytest.mark.parametrize(
    "secret",
    ["", "s3cret", "x" * 31, b"x" * 31, " \n" + "x" * 31 + "\n\t  ", "\u00e9" * 15 + "x"],
)
def test_short_secrets_are_refused(secret: str | bytes) -> None:
    with pytest.raises(ValueError, match="at least 32 bytes"):
        TokenAuthority(secret)


def test_a_32_byte_secret_is_enough() -> None:
    TokenAuthority("x" * 32)
    TokenAuthority("\u00e9" * 16)  # bytes, not characters


def test_the_router_refuses_a_short_secret_file(tmp_path: Path) -> None:
    secret = tmp_path / "router-secret"
    secret.write_text("x" * 31 + "\n")
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "jupyter_sandbox.router",
            "--address=127.0.0.1",
            "--port=0",
            "--resolve=dns",
            f"--token-secret-file={secret}",
        ],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert result.returncode != 0, "a router with a 31-byte secret started"
    assert "at least 32 bytes" in result.stderr and str(secret) in result.stderr
    assert "Traceback" not in result.stderr


# -- through a router ----------------------------------------------------------------------


async def test_upstream_tokens_open_the_router(router: dict[str, Any]) -> None:  # noqa: F811
    authority: TokenAuthority = router["authority"]
    mine = authority.issue(Scope(NS, "box-echo"), format="scoped-v1")
    r = await fetch(router, "/headers", routed(router, name="box-echo", token=mine))
    assert r.code == 200, r.body
    seen = {k.lower() for k in json.loads(r.body)}
    assert "authorization" not in seen
    other = authority.issue(Scope(NS, "box-a"), format="scoped-v1")
    r = await fetch(router, "/headers", routed(router, name="box-echo", token=other))
    assert r.code == 403
    forged = go_mint(SECRET, NS, "box-echo", LATER)  # signed with another secret
    r = await fetch(router, "/headers", routed(router, name="box-echo", token=forged))
    assert r.code == 403
