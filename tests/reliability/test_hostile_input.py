"""Hostile input: fuzzed routing headers, tokens and paths never crash the router."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from tornado import httpclient
from tornado.httpserver import HTTPServer
from tornado.netutil import bind_sockets

from jupyter_sandbox.router.app import make_router_app
from jupyter_sandbox.router.settings import RouterContext
from jupyter_sandbox.router.tokens import Scope, TokenAuthority
from jupyter_sandbox.router.upstreams import Upstream

ALLOWED = {400, 401, 403, 404, 502}
SECRET = "fuzzing-secret-0123456789abcdef0123456789abcdef"
FUZZED = {"requests": 0}

header_text = st.text(
    alphabet=st.characters(min_codepoint=0x20, max_codepoint=0x7E), min_size=0, max_size=80
)
names = st.one_of(
    header_text,
    st.sampled_from(
        [
            "box",
            "box-a",
            "localhost",
            "127.0.0.1",
            "..",
            "a" * 64,
            "-x",
            "kube-system",
            "default",
            "169.254.169.254",
            "box.default",
            "box/../x",
        ]
    ),
)


@pytest.fixture(scope="module")
def loop() -> AsyncIterator[asyncio.AbstractEventLoop]:
    event_loop = asyncio.new_event_loop()
    yield event_loop  # type: ignore[misc]
    event_loop.close()
    print(
        f"\nrouter fuzzing: {FUZZED['requests']} requests, none answered outside {sorted(ALLOWED)}"
    )


@pytest.fixture(scope="module")
def router(loop: asyncio.AbstractEventLoop) -> dict[str, Any]:
    async def lookup(namespace: str, name: str, port: int) -> Upstream | None:
        # One sandbox exists, and nothing listens where it points: 502 at most.
        if (namespace, name) == ("team", "box"):
            return Upstream(host="127.0.0.1", port=9)
        return None

    async def start() -> dict[str, Any]:
        ctx = RouterContext(lookup=lookup, authority=TokenAuthority(SECRET), connect_timeout=2)
        server = HTTPServer(make_router_app(ctx))
        sockets = bind_sockets(0, "127.0.0.1")
        server.add_sockets(sockets)
        return {"url": f"http://127.0.0.1:{sockets[0].getsockname()[1]}", "ctx": ctx}

    return loop.run_until_complete(start())


def request(
    loop: asyncio.AbstractEventLoop,
    url: str,
    headers: dict[str, str],
    method: str = "GET",
    path: str = "/",
) -> int:
    async def go() -> int:
        client = httpclient.AsyncHTTPClient()
        response = await client.fetch(
            url + path,
            method=method,
            headers=headers,
            raise_error=False,
            request_timeout=20,
            body=b"{}" if method == "POST" else None,
        )
        return response.code

    FUZZED["requests"] += 1
    return loop.run_until_complete(go())


@settings(
    max_examples=300,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
@given(
    sandbox=st.one_of(st.none(), names),
    namespace=st.one_of(st.none(), names),
    port=st.one_of(st.none(), header_text, st.integers(-5, 70000).map(str)),
    pod_ip=st.one_of(
        st.none(),
        st.sampled_from(
            ["127.0.0.1", "::1", "169.254.169.254", "10.0.0.1", "0.0.0.0", "fe80::1", "x"]
        ),
    ),
    token=st.one_of(st.none(), header_text, st.just("valid")),
    host=st.one_of(st.none(), st.sampled_from(["localhost", "127.0.0.1:22", "metadata"])),
)
def test_fuzzed_routing_headers_never_crash_the_router(
    router: dict[str, Any],
    loop: asyncio.AbstractEventLoop,
    sandbox: str | None,
    namespace: str | None,
    port: str | None,
    pod_ip: str | None,
    token: str | None,
    host: str | None,
) -> None:
    headers: dict[str, str] = {}
    for key, value in (
        ("X-Sandbox-ID", sandbox),
        ("X-Sandbox-Namespace", namespace),
        ("X-Sandbox-Port", port),
        ("X-Sandbox-Pod-IP", pod_ip),
        ("Host", host),
    ):
        if value is not None:
            headers[key] = value
    if token == "valid":
        token = TokenAuthority(SECRET).issue(Scope(namespace or "default", sandbox or ""))
    if token is not None:
        headers["Authorization"] = f"Bearer {token}"
    code = request(loop, router["url"], headers)
    assert code in ALLOWED, (code, headers)


def test_loopback_and_other_namespaces_are_unreachable(
    router: dict[str, Any], loop: asyncio.AbstractEventLoop
) -> None:
    good = TokenAuthority(SECRET).issue(Scope("team", "box"))
    base = {"X-Sandbox-ID": "box", "X-Sandbox-Namespace": "team", "Authorization": f"Bearer {good}"}
    # Pointing the sandbox at loopback or the metadata address is refused outright.
    for ip in ("127.0.0.1", "169.254.169.254", "::1"):
        assert request(loop, router["url"], {**base, "X-Sandbox-Pod-IP": ip}) == 400
    # Any other address is not this sandbox's.
    assert request(loop, router["url"], {**base, "X-Sandbox-Pod-IP": "10.1.2.3"}) == 403
    # The same token in another namespace, or for another name there, does not pass.
    assert request(loop, router["url"], {**base, "X-Sandbox-Namespace": "kube-system"}) == 403
    assert request(loop, router["url"], {**base, "X-Sandbox-ID": "coredns"}) == 403
    # A Host header is never a route.
    assert (
        request(loop, router["url"], {"Host": "box.team.svc", "Authorization": f"Bearer {good}"})
        == 400
    )
