"""A runtime given a token (as the operator gives one on a cluster) answers nobody
without it; the router presents it for the sandbox it routes to, whatever a caller
sends. Real runtime process over TCP, as a pod listens; real router in front.

The review: any pod that could reach a sandbox pod's IP drove its kernel, since the
runtime checked nothing, and users can read pod IPs.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest
from tornado import httpclient, websocket
from tornado.httpserver import HTTPServer
from tornado.netutil import bind_sockets

from jupyter_sandbox.protocol import framing, runtime_auth
from jupyter_sandbox.router.app import make_router_app
from jupyter_sandbox.router.settings import RouterContext
from jupyter_sandbox.router.tokens import Scope, TokenAuthority
from jupyter_sandbox.router.upstreams import Upstream
from tests.helpers import runtime_on_loopback

TOKEN = runtime_auth.token_for(b"k" * 48, "team-a", "box", "0b3c-uid")


@pytest.fixture(scope="module")
def runtime(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    base = tmp_path_factory.mktemp("runtime-auth")
    with runtime_on_loopback(base, env={runtime_auth.ENV: TOKEN}) as port:
        yield f"http://127.0.0.1:{port}"


async def fetch(url: str, headers: dict[str, str] | None = None, **kw: Any) -> Any:
    return await httpclient.AsyncHTTPClient().fetch(
        url, headers=headers or {}, raise_error=False, request_timeout=60, **kw
    )


def execute(command: str) -> dict[str, Any]:
    return {"method": "POST", "body": json.dumps({"command": command})}


@pytest.mark.parametrize("presented", [None, "", "0" * 64, TOKEN[:-1], TOKEN + "0"])
async def test_the_pod_ip_alone_gives_nothing(runtime: str, presented: str | None) -> None:
    headers = {runtime_auth.HEADER: presented} if presented is not None else {}
    for path, kw in (
        ("/execute", execute("id")),
        ("/api/kernel", {}),
        ("/list/.", {}),
        ("/download/x", {}),
        ("/api/kernel/interrupt", {"method": "POST", "body": "{}"}),
    ):
        answer = await fetch(runtime + path, headers, **kw)
        assert answer.code == 401, (path, answer.code)
    request = httpclient.HTTPRequest(
        runtime.replace("http", "ws") + "/api/kernel/channels", headers=headers
    )
    with pytest.raises(httpclient.HTTPClientError) as refused:
        await websocket.websocket_connect(request, subprotocols=[framing.SUBPROTOCOL])
    assert refused.value.code == 401


async def test_probes_stay_open_and_the_token_opens_the_rest(runtime: str) -> None:
    assert (await fetch(runtime + "/healthz")).code == 200
    assert (await fetch(runtime + "/readyz")).code == 200
    answer = await fetch(runtime + "/execute", {runtime_auth.HEADER: TOKEN}, **execute("env"))
    assert answer.code == 200
    # the kernel's commands never see it
    assert TOKEN not in json.loads(answer.body)["stdout"]


@pytest.fixture
async def router(runtime: str) -> AsyncIterator[dict[str, Any]]:
    authority = TokenAuthority("router-secret-for-the-runtime-auth-tests-0123")
    host, port = runtime.removeprefix("http://").split(":")

    async def lookup(namespace: str, name: str, port_: int) -> Upstream | None:
        if (namespace, name) == ("team-a", "box"):
            return Upstream(host=host, port=int(port), runtime_token=TOKEN)
        if (namespace, name) == ("team-a", "no-token"):
            return Upstream(host=host, port=int(port))
        return None

    ctx = RouterContext(lookup=lookup, authority=authority)
    server = HTTPServer(make_router_app(ctx))
    sockets = bind_sockets(0, "127.0.0.1")
    server.add_sockets(sockets)
    try:
        yield {"url": f"http://127.0.0.1:{sockets[0].getsockname()[1]}", "authority": authority}
    finally:
        server.stop()
        await ctx.close()


def routed(router: dict[str, Any], name: str, **extra: str) -> dict[str, str]:
    token = router["authority"].issue(Scope("team-a", name))
    return {
        "X-Sandbox-ID": name,
        "X-Sandbox-Namespace": "team-a",
        "Authorization": f"Bearer {token}",
        **extra,
    }


async def test_the_router_presents_the_sandboxs_token_and_never_a_callers(
    router: dict[str, Any],
) -> None:
    forged = {runtime_auth.HEADER: "0" * 64}
    answer = await fetch(
        router["url"] + "/execute", routed(router, "box", **forged), **execute("id")
    )
    assert answer.code == 200, answer.body
    request = httpclient.HTTPRequest(
        router["url"].replace("http", "ws") + "/api/kernel/channels",
        headers=routed(router, "box", **forged),
    )
    ws = await websocket.websocket_connect(request, subprotocols=[framing.SUBPROTOCOL])
    ws.close()
    # a caller's own token is not passed on either: it cannot stand in for the router's
    own = {runtime_auth.HEADER: TOKEN}
    answer = await fetch(
        router["url"] + "/execute", routed(router, "no-token", **own), **execute("id")
    )
    assert answer.code == 401


def test_the_token_is_bound_to_namespace_name_and_uid() -> None:
    key = b"k" * 48
    one = runtime_auth.token_for(key, "team-a", "box", "uid-1")
    assert one == runtime_auth.token_for(key, "team-a", "box", "uid-1")
    others = {
        runtime_auth.token_for(key, "team-b", "box", "uid-1"),
        runtime_auth.token_for(key, "team-a", "box2", "uid-1"),
        runtime_auth.token_for(key, "team-a", "box", "uid-2"),
        runtime_auth.token_for(b"j" * 48, "team-a", "box", "uid-1"),
    }
    assert one not in others and len(others) == 4
    with pytest.raises(ValueError):
        runtime_auth.token_for(key, "team-a", "box", "")


def test_a_short_key_is_refused(tmp_path: Path) -> None:
    (tmp_path / "key").write_text("short\n")
    with pytest.raises(ValueError, match="at least 32"):
        runtime_auth.load_key(tmp_path / "key")
