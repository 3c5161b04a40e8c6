"""Attacks on the network of a local sandbox, made from inside it.

Each sandbox is started as the local daemon starts it (bubblewrap with its own
user, pid and network namespaces, capabilities dropped, held on ``--block-fd``
while :class:`UserNetwork` attaches slirp4netns and the egress policy) by
``tests.security.netns_driver``, which plays the daemon. Every attack runs twice:
with the daemon as the test's own user and, when that is root, as an
unprivileged user through ``runuser`` (``nobody``, or the user named by
``JUPYTER_SANDBOX_TEST_UNPRIVILEGED_USER``). Run as an ordinary user, the first
run is the unprivileged one and the second is skipped.

The controls at the end run the same attacks against weaker sandboxes (the
host's network namespace, slirp4netns without ``--disable-host-loopback``, no
unreachable routes) and require them to succeed, so none of the attacks can
pass vacuously.

Network rule of these tests: the sandbox sends packets only to loopback, to
slirp's own 10.0.2.0/24 (handled by slirp4netns on this machine), to this
machine's own addresses, and to other addresses only after reading that the
sandbox's route to them is unreachable, so that no packet can leave.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import functools
import json
import os
import pwd
import shutil
import signal
import socket
import subprocess
import sys
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from jupyter_sandbox.control_plane.local.network import (
    SLIRP_DNS,
    SLIRP_GATEWAY,
    SLIRP_GUEST,
    TAP_NAME,
    NetnsHandshake,
    NetworkSetupError,
    UserNetwork,
    user_network_available,
)
from tests.security import netns_driver

REPO = Path(__file__).resolve().parents[2]
USER_ENV = "JUPYTER_SANDBOX_TEST_UNPRIVILEGED_USER"
RUN_TIMEOUT = 15.0
UNREACHABLE = (errno.ENETUNREACH, errno.EHOSTUNREACH)
TOKEN = b"host-service-token\n"
# Addresses in ranges no sandbox may reach: only ever connected to after the
# sandbox's route to them reads unreachable.
PRIVATE_SAMPLES = ("10.0.0.1", "10.255.255.254", "172.16.0.1", "192.168.1.1", "100.64.0.1")
METADATA = "169.254.169.254"

pytestmark = [
    pytest.mark.timeout(20),
    pytest.mark.skipif(shutil.which("bwrap") is None, reason="bubblewrap is not installed"),
]

# Runs inside the sandbox, before each probe's own code.
PRELUDE = r"""
import errno, json, socket, subprocess, sys, time

def route_get(addr, *selectors):
    r = subprocess.run(["ip", "route", "get", addr, *selectors], capture_output=True,
                       text=True, timeout=5)
    return r.returncode, (r.stdout + r.stderr).strip()

def route_blocked(addr, *selectors):
    rc, out = route_get(addr, *selectors)
    return rc != 0 and ("No route to host" in out or "Network is unreachable" in out)

def ip_json(*args):
    r = subprocess.run(["ip", "-j", *args], capture_output=True, text=True, timeout=5)
    return json.loads(r.stdout or "[]")

def connect(addr, port, timeout=3.0):
    family = socket.AF_INET6 if ":" in addr else socket.AF_INET
    start = time.monotonic()
    with socket.socket(family, socket.SOCK_STREAM) as s:
        s.settimeout(timeout)
        try:
            s.connect((addr, port))
            return {"connected": True, "banner": s.recv(64).decode(errors="replace")}
        except OSError as exc:
            return {"connected": False, "errno": exc.errno, "error": str(exc),
                    "seconds": round(time.monotonic() - start, 3)}

def connect_if_blocked(addr, port):
    # Never sends to a non-local address unless its route is unreachable.
    rc, out = route_get(addr)
    if not route_blocked(addr):
        return {"connected": None, "route": out}
    result = connect(addr, port)
    result["route"] = out
    return result

def listening_ports():
    ports = set()
    for name in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            lines = open(name).read().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            fields = line.split()
            if fields[3] == "0A":
                ports.add(int(fields[1].rsplit(":", 1)[1], 16))
    return sorted(ports)

def report(**values):
    print(json.dumps(values), flush=True)
"""


# ---------------------------------------------------------------------------
# Who plays the daemon
# ---------------------------------------------------------------------------


@dataclass(frozen=True)
class Daemon:
    prefix: tuple[str, ...]
    python: str

    def command(self, *args: str) -> list[str]:
        return [*self.prefix, "env", f"PYTHONPATH={REPO}", self.python, *args]


AVAILABLE_CHECK = (
    "from jupyter_sandbox.control_plane.local.network import user_network_available as u;"
    "print(u() or '')"
)


@functools.cache
def unprivileged_daemon() -> Daemon | str:
    """The daemon as an unprivileged user, or why there is none."""
    name = os.environ.get(USER_ENV, "nobody")
    try:
        pwd.getpwnam(name)
    except KeyError:
        return f"no user {name!r} (set {USER_ENV})"
    if shutil.which("runuser") is None:
        return "runuser is not installed"
    prefix = ("runuser", "-u", name, "--")
    # The test's interpreter may live where that user cannot read (a root pyenv).
    for python in dict.fromkeys([sys.executable, "/usr/bin/python3"]):
        daemon = Daemon(prefix, python)
        probe = subprocess.run(
            daemon.command("-c", AVAILABLE_CHECK),
            capture_output=True,
            text=True,
            timeout=30,
            cwd=REPO,
            check=False,
        )
        if probe.returncode != 0:
            continue
        reason = probe.stdout.strip()
        return f"as {name}: {reason}" if reason else daemon
    return f"no Python that {name} can run imports the package"


@pytest.fixture(params=["daemon-uid", "unprivileged"])
def daemon(request: pytest.FixtureRequest) -> Daemon:
    if request.param == "daemon-uid":
        return Daemon((), sys.executable)
    if os.geteuid() != 0:
        pytest.skip("already unprivileged: the daemon-uid run is the unprivileged one")
    found = unprivileged_daemon()
    if isinstance(found, str):
        pytest.skip(found)
    return found


def needs_user_network() -> None:
    reason = user_network_available()
    if reason is not None:
        pytest.skip(reason)


# ---------------------------------------------------------------------------
# Sandboxes and host services
# ---------------------------------------------------------------------------


@contextlib.asynccontextmanager
async def sandbox(
    daemon: Daemon, body: str, *args: str, mode: str = "user-network"
) -> AsyncIterator[asyncio.subprocess.Process]:
    """A running sandbox executing PRELUDE + body; killed, with its driver, on exit."""
    code = PRELUDE + "\n" + body
    proc = await asyncio.create_subprocess_exec(
        *daemon.command("-m", "tests.security.netns_driver", "--mode", mode, "--"),
        daemon.python,
        "-c",
        code,
        *args,
        stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        cwd=REPO,
        start_new_session=True,
    )
    try:
        yield proc
    finally:
        if proc.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            await proc.wait()


async def run_probe(daemon: Daemon, body: str, *args: str, mode: str = "user-network") -> Any:
    """Run a probe to completion; the last line it printed, as JSON."""
    async with sandbox(daemon, body, *args, mode=mode) as proc:
        stdout, stderr = await asyncio.wait_for(proc.communicate(), RUN_TIMEOUT)
    lines = stdout.decode().strip().splitlines()
    assert proc.returncode == 0 and lines, f"probe failed ({proc.returncode}): {stderr.decode()}"
    return json.loads(lines[-1])


class HostService:
    """A TCP service on the host that greets with TOKEN and counts its clients."""

    def __init__(self, host: str, port: int = 0) -> None:
        self.host = host
        self.wanted_port = port
        self.accepted = 0
        self.port = 0
        self._server: asyncio.Server | None = None

    async def __aenter__(self) -> HostService:
        self._server = await asyncio.start_server(self._greet, self.host, self.wanted_port)
        self.port = self._server.sockets[0].getsockname()[1]
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self._server is not None
        self._server.close()
        await self._server.wait_closed()

    async def _greet(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.accepted += 1
        writer.write(TOKEN)
        with contextlib.suppress(OSError):
            await writer.drain()
        writer.close()


def host_address() -> str:
    """One of this machine's own non-loopback IPv4 addresses (traffic to it stays here)."""
    out = subprocess.run(
        ["ip", "-j", "-4", "addr"], capture_output=True, text=True, check=True
    ).stdout
    for link in json.loads(out):
        for info in link.get("addr_info", []):
            if info.get("scope") == "global" and not info["local"].startswith("127."):
                return str(info["local"])
    pytest.skip("this machine has no non-loopback IPv4 address")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def host_listening_ports() -> set[int]:
    ports = set()
    for name in ("/proc/net/tcp", "/proc/net/tcp6"):
        for line in Path(name).read_text().splitlines()[1:]:
            fields = line.split()
            if fields[3] == "0A":
                ports.add(int(fields[1].rsplit(":", 1)[1], 16))
    return ports


def host_connect(addr: str, port: int) -> str:
    """What a host client gets at addr:port: "connected", or the error's name."""
    try:
        with socket.create_connection((addr, port), timeout=3):
            return "connected"
    except OSError as exc:
        return type(exc).__name__


# ---------------------------------------------------------------------------
# The probes, shared by the attacks and the controls
# ---------------------------------------------------------------------------

HOST_LOOPBACK_PROBE = """
port = int(sys.argv[1])
report(loopback=connect("127.0.0.1", port), gateway=connect(sys.argv[2], port),
       gateway_route=route_get(sys.argv[2])[1])
"""


async def probe_host_loopback(daemon: Daemon, mode: str) -> tuple[dict[str, Any], int]:
    async with HostService("127.0.0.1") as service:
        result = await run_probe(
            daemon, HOST_LOOPBACK_PROBE, str(service.port), SLIRP_GATEWAY, mode=mode
        )
    return result, service.accepted


HOST_ADDRESS_PROBE = """
addr, port = sys.argv[1], int(sys.argv[2])
report(route=route_get(addr), blocked=route_blocked(addr), connect=connect(addr, port))
"""


async def probe_host_address(daemon: Daemon, mode: str) -> tuple[dict[str, Any], int]:
    async with HostService(host_address()) as service:
        result = await run_probe(
            daemon, HOST_ADDRESS_PROBE, service.host, str(service.port), mode=mode
        )
    return result, service.accepted


PROC_NET_PROBE = "report(listening=listening_ports())"

LISTENER_PROBE = """
port = int(sys.argv[1])
server = socket.socket()
server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
server.bind(("0.0.0.0", port))
server.listen(8)
print("LISTENING", flush=True)
sys.stdin.read()  # until the host has tried
server.setblocking(False)
accepted = 0
while True:
    try:
        server.accept()[0].close()
        accepted += 1
    except BlockingIOError:
        break
report(accepted=accepted)
"""


async def probe_sandbox_listener(daemon: Daemon, mode: str) -> tuple[dict[str, str], int]:
    """Host clients' results against a sandbox listening on 0.0.0.0, and its accept count."""
    port = free_port()
    async with sandbox(daemon, LISTENER_PROBE, str(port), mode=mode) as proc:
        assert proc.stdout is not None and proc.stdin is not None
        line = await asyncio.wait_for(proc.stdout.readline(), RUN_TIMEOUT)
        assert line.strip() == b"LISTENING", line
        tried = {
            "loopback": await asyncio.to_thread(host_connect, "127.0.0.1", port),
            "host-address": await asyncio.to_thread(host_connect, host_address(), port),
        }
        proc.stdin.close()
        stdout, stderr = await asyncio.wait_for(proc.communicate(), RUN_TIMEOUT)
        assert proc.returncode == 0, stderr.decode()
    return tried, json.loads(stdout.decode().strip().splitlines()[-1])["accepted"]


# ---------------------------------------------------------------------------
# The attacks
# ---------------------------------------------------------------------------


async def test_host_loopback_is_unreachable(daemon: Daemon) -> None:
    """A service on the host's 127.0.0.1 is reachable neither as the sandbox's own
    127.0.0.1 nor through slirp's gateway, which would map to the host's loopback."""
    needs_user_network()
    result, accepted = await probe_host_loopback(daemon, "user-network")
    assert result["loopback"]["connected"] is False, result
    assert result["loopback"]["errno"] == errno.ECONNREFUSED, result
    # The gateway is there (so the attempt reached slirp4netns) and refused it.
    assert f"dev {TAP_NAME}" in result["gateway_route"], result
    assert result["gateway"]["connected"] is False, result
    assert accepted == 0


async def test_host_own_address_and_private_ranges_are_unreachable(daemon: Daemon) -> None:
    """The host's own address (services bound to 0.0.0.0), its subnet and the private
    ranges have unreachable routes: the kernel refuses before any packet is sent."""
    needs_user_network()
    result, accepted = await probe_host_address(daemon, "user-network")
    assert result["blocked"], result["route"]
    assert result["connect"]["errno"] in UNREACHABLE, result
    assert accepted == 0

    body = """
report(**{addr: connect_if_blocked(addr, 80) for addr in sys.argv[1:]})
"""
    nameservers = [
        line.split()[1]
        for line in Path("/etc/resolv.conf").read_text().splitlines()
        if line.startswith("nameserver") and not line.split()[1].startswith("127.")
    ]
    samples = await run_probe(daemon, body, *PRIVATE_SAMPLES, *nameservers)
    for addr, outcome in samples.items():
        assert outcome["connected"] is False, (addr, outcome)
        assert outcome["errno"] in UNREACHABLE and outcome["seconds"] < 1, (addr, outcome)


async def test_host_listeners_are_not_visible(daemon: Daemon) -> None:
    """/proc/net/tcp inside lists the sandbox's sockets only: none of the host's."""
    async with HostService("127.0.0.1") as service:
        assert service.port in host_listening_ports()
        result = await run_probe(daemon, PROC_NET_PROBE, mode="no-network")
        networked = (
            await run_probe(daemon, PROC_NET_PROBE) if user_network_available() is None else None
        )
    assert result["listening"] == [], result
    if networked is not None:
        assert networked["listening"] == [], networked


async def test_cloud_metadata_is_unreachable(daemon: Daemon) -> None:
    """169.254.169.254 (and all link-local) routes to nowhere; connecting fails at once."""
    needs_user_network()
    body = """
report(route=route_get(sys.argv[1]), blocked=route_blocked(sys.argv[1]),
       unreachable=[r["dst"] for r in ip_json("route", "show", "type", "unreachable")],
       connect=connect_if_blocked(sys.argv[1], 80))
"""
    result = await run_probe(daemon, body, METADATA)
    assert result["blocked"], result["route"]
    assert "169.254.0.0/16" in result["unreachable"], result
    assert result["connect"]["connected"] is False, result
    assert result["connect"]["errno"] in UNREACHABLE, result
    assert result["connect"]["seconds"] < 1, result


async def test_egress_is_configured(daemon: Daemon) -> None:
    """The sandbox has an interface that is up, an address, a default route through
    slirp, and a resolver it can reach: public egress would work (nothing is sent)."""
    needs_user_network()
    body = """
report(link=ip_json("addr", "show", "dev", sys.argv[1]),
       default=ip_json("route", "show", "default"),
       public=route_get("8.8.8.8"),  # only looked up: nothing is sent
       dns_route=route_get(sys.argv[2], "ipproto", "17", "dport", "53"),
       resolv_conf=open("/etc/resolv.conf").read())
"""
    result = await run_probe(daemon, body, TAP_NAME, SLIRP_DNS)
    (link,) = result["link"]
    assert "UP" in link["flags"], link
    assert link["mtu"] == 65520
    assert {(a["local"], a["prefixlen"]) for a in link["addr_info"]} >= {(SLIRP_GUEST, 24)}
    assert result["default"] == [
        {"dst": "default", "gateway": SLIRP_GATEWAY, "dev": TAP_NAME, "flags": []}
    ], result["default"]
    assert f"via {SLIRP_GATEWAY} dev {TAP_NAME}" in result["public"][1], result
    assert f"dev {TAP_NAME}" in result["dns_route"][1], result
    assert result["resolv_conf"].splitlines()[0] == f"nameserver {SLIRP_DNS}", result


async def test_sandbox_listener_is_unreachable_from_host(daemon: Daemon) -> None:
    """A server the sandbox starts on 0.0.0.0 is not on any host address."""
    needs_user_network()
    tried, accepted = await probe_sandbox_listener(daemon, "user-network")
    assert tried == {"loopback": "ConnectionRefusedError", "host-address": "ConnectionRefusedError"}
    assert accepted == 0


async def test_sandbox_cannot_change_its_routes(daemon: Daemon) -> None:
    """Without capabilities in the namespace's owner, the routes stay as set."""
    needs_user_network()
    body = """
attempts = {}
for args in (["route", "del", "10.0.0.0/8"], ["route", "del", "169.254.0.0/16"],
             ["route", "add", "169.254.169.254/32", "via", sys.argv[1]],
             ["link", "set", sys.argv[2], "down"]):
    r = subprocess.run(["ip", *args], capture_output=True, text=True)
    attempts[" ".join(args)] = [r.returncode, r.stderr.strip()]
report(attempts=attempts, blocked=route_blocked("169.254.169.254"))
"""
    result = await run_probe(daemon, body, SLIRP_GATEWAY, TAP_NAME)
    for command, (code, stderr) in result["attempts"].items():
        assert code != 0 and "Operation not permitted" in stderr, (command, stderr)
    assert result["blocked"]


async def test_no_network_pool_has_loopback_only(daemon: Daemon) -> None:
    """Without network: loopback up, no other interface or route, host loopback unreachable."""
    body = """
report(links=[l["ifname"] for l in ip_json("link")], routes=ip_json("route"),
       public=route_get("192.0.2.1"), loopback=connect("127.0.0.1", int(sys.argv[1])))
"""
    async with HostService("127.0.0.1") as service:
        result = await run_probe(daemon, body, str(service.port), mode="no-network")
    assert result["links"] == ["lo"], result
    assert result["routes"] == [], result
    assert "Network is unreachable" in result["public"][1], result
    assert result["loopback"]["errno"] == errno.ECONNREFUSED, result
    assert service.accepted == 0


DNS_PROBE = """
addr, port, resolver_is_loopback = sys.argv[1], int(sys.argv[2]), sys.argv[3] == "yes"
tcp = ("ipproto", "6", "dport", str(port))
blocked = route_blocked(addr, *tcp)
report(dns_udp=route_get(addr, "ipproto", "17", "dport", "53"),
       dns_tcp=route_get(addr, "ipproto", "6", "dport", "53"),
       other=route_get(addr, *tcp), blocked=blocked,
       connect=connect(addr, port) if blocked or resolver_is_loopback else None)
"""


async def probe_dns_address(daemon: Daemon, mode: str) -> tuple[dict[str, Any], int]:
    """Connect to slirp's DNS address on the port of a host loopback service."""
    loopback = "yes" if mode.startswith("dns-loopback") else "no"
    async with HostService("127.0.0.1") as service:
        result = await run_probe(
            daemon, DNS_PROBE, SLIRP_DNS, str(service.port), loopback, mode=mode
        )
    return result, service.accepted


def needs_root_daemon(daemon: Daemon) -> None:
    if os.geteuid() != 0 or daemon.prefix:
        pytest.skip("slirp4netns with another resolv.conf needs a mount namespace: root")


async def test_dns_address_serves_dns_only(daemon: Daemon) -> None:
    """slirp forwards every port of 10.0.2.3 to the host's nameserver: only port 53
    routes there; other ports are refused by the kernel before anything is sent."""
    needs_user_network()
    result, accepted = await probe_dns_address(daemon, "user-network")
    for key in ("dns_udp", "dns_tcp"):
        assert result[key][0] == 0 and f"dev {TAP_NAME}" in result[key][1], result
    assert result["blocked"], result
    assert result["connect"]["errno"] in UNREACHABLE, result
    assert accepted == 0


async def test_loopback_resolver_does_not_open_host_loopback(daemon: Daemon) -> None:
    """On a host whose nameserver is local (127.0.0.53 and the like), slirp connects
    10.0.2.3 to the host's loopback, --disable-host-loopback notwithstanding: no
    port but 53 may lead there. (libslirp 4.7 itself forwards only port 53; older
    releases forwarded every port, which the rules stop in the kernel.)"""
    needs_user_network()
    needs_root_daemon(daemon)
    result, accepted = await probe_dns_address(daemon, "dns-loopback")
    assert result["blocked"], result
    assert result["connect"]["errno"] in UNREACHABLE, result
    assert accepted == 0


# ---------------------------------------------------------------------------
# Controls: the same attacks succeed against weaker sandboxes
# ---------------------------------------------------------------------------


async def test_control_shared_network_exposes_the_host(daemon: Daemon) -> None:
    """In the host's namespace the loopback probe reaches the host service, the
    /proc probe sees the host's listener, and the host reaches the sandbox's."""
    result, accepted = await probe_host_loopback(daemon, "share-net")
    assert result["loopback"]["banner"] == TOKEN.decode(), result
    assert accepted >= 1
    async with HostService("127.0.0.1") as service:
        seen = await run_probe(daemon, PROC_NET_PROBE, mode="share-net")
    assert service.port in seen["listening"]
    tried, accepted = await probe_sandbox_listener(daemon, "share-net")
    assert tried == {"loopback": "connected", "host-address": "connected"}, tried
    assert accepted == 2


async def test_control_gateway_reaches_host_loopback_without_the_flag(daemon: Daemon) -> None:
    """Without --disable-host-loopback, slirp's gateway is the host's 127.0.0.1."""
    needs_user_network()
    result, accepted = await probe_host_loopback(daemon, "host-loopback")
    assert result["gateway"]["banner"] == TOKEN.decode(), result
    assert accepted == 1


async def test_control_host_address_reachable_without_routes(daemon: Daemon) -> None:
    """Without the unreachable routes, slirp connects the sandbox to the host's own
    address (this machine's, so nothing leaves it)."""
    needs_user_network()
    result, accepted = await probe_host_address(daemon, "no-policy")
    assert not result["blocked"] and f"dev {TAP_NAME}" in result["route"][1], result
    assert result["connect"]["banner"] == TOKEN.decode(), result
    assert accepted == 1


# ---------------------------------------------------------------------------
# The API as the daemon uses it, in process
# ---------------------------------------------------------------------------


class BrokenNetwork(UserNetwork):
    def slirp_options(self) -> list[str]:
        return [*super().slirp_options(), "--no-such-option"]


async def start_blocked(network_mode: str, marker: str) -> tuple[Any, NetnsHandshake, int]:
    """bubblewrap started as the daemon starts it, held before running `echo marker`."""
    shake = NetnsHandshake()
    proc = await asyncio.create_subprocess_exec(
        *netns_driver.bwrap_command(network_mode, shake, "/etc/resolv.conf", ["echo", marker]),
        pass_fds=shake.child_fds,
        stdout=asyncio.subprocess.PIPE,
        start_new_session=True,
    )
    shake.spawned()
    return proc, shake, await shake.child_pid()


async def test_attach_release_close_in_process() -> None:
    """slirp4netns runs while the sandbox does and is gone after close (twice is fine)."""
    needs_user_network()
    proc, shake, child = await start_blocked("user-network", "RAN")
    net = UserNetwork()
    try:
        await net.attach(child)
        slirp = net.pid
        assert slirp is not None and Path(f"/proc/{slirp}").exists()
        shake.release()
        assert await asyncio.wait_for(proc.communicate(), RUN_TIMEOUT) == (b"RAN\n", None)
        await net.close()
        assert net.pid is None and not Path(f"/proc/{slirp}").exists()
        await net.close()
    finally:
        shake.close()
        await net.close()
        if proc.returncode is None:
            os.killpg(proc.pid, signal.SIGKILL)
            await proc.wait()


async def test_failed_attach_never_runs_the_sandbox() -> None:
    """When the network cannot be attached, abort kills the held sandbox: its command
    never runs (closing the block pipe alone would have run it)."""
    needs_user_network()
    proc, shake, child = await start_blocked("user-network", "MUST-NOT-RUN")
    net = BrokenNetwork()
    try:
        with pytest.raises(NetworkSetupError, match="slirp4netns failed"):
            await net.attach(child)
        assert net.pid is None
        shake.abort()
        stdout, _ = await asyncio.wait_for(proc.communicate(), RUN_TIMEOUT)
        assert stdout == b""
    finally:
        shake.close()
        if proc.returncode is None:
            os.killpg(proc.pid, signal.SIGKILL)
            await proc.wait()
