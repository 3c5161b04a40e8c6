"""Where a bridge opens a sandbox's kernel channels: its socket when it may, else the router."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest

from jupyter_sandbox.control_plane.base import Endpoint
from jupyter_sandbox.kernel_provisioner.bridge import channels_request
from jupyter_sandbox.router.upstreams import UNIX_DOMAIN


@pytest.fixture
def listening(tmp_path: Path) -> str:
    path = tmp_path / "rt.sock"
    sock = socket.socket(socket.AF_UNIX)
    sock.bind(str(path))
    return str(path)


def endpoint(unix_socket: str | None) -> Endpoint:
    return Endpoint("http://127.0.0.1:9", "ns", "box", token="t0k", unix_socket=unix_socket)


@pytest.mark.parametrize(
    ("where", "last", "direct", "query"),
    [
        ("none", None, False, ""),
        ("none", "m1", False, "?last=m1"),
        ("missing", None, False, ""),
        ("unreadable", None, False, ""),
        ("socket", None, True, ""),
        ("socket", "m2", True, "?last=m2"),
    ],
)
def test_the_socket_is_used_only_when_it_can_be_opened(
    listening: str, tmp_path: Path, where: str, last: str | None, direct: bool, query: str
) -> None:
    path = {"none": None, "missing": str(tmp_path / "gone.sock"), "socket": listening}.get(where)
    if where == "unreadable":
        path = listening
        Path(listening).chmod(0)
    request, resolver = channels_request(endpoint(path), last)
    if where == "unreadable" and (resolver is not None):
        pytest.skip("root opens any file: permissions do not apply")
    assert request.url.endswith("/api/kernel/channels" + query)
    if direct:
        assert resolver is not None
        assert request.url.startswith("ws://") and UNIX_DOMAIN in request.url
        # the router's routing and credentials mean nothing to the runtime itself
        assert "Authorization" not in request.headers
    else:
        assert resolver is None
        assert request.url.startswith("ws://127.0.0.1:9/")
        assert request.headers["Authorization"] == "Bearer t0k"
        assert request.headers["X-Sandbox-ID"] == "box"
