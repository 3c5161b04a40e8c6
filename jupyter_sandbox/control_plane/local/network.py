"""Secure-by-default networking for bubblewrap sandboxes on the local backend.

Every sandbox gets its own network namespace (``bwrap --unshare-net``), so nothing
it listens on is shared with the host and the host's loopback services are out of
its reach.  Pools without network stop there: loopback only.  Pools with network
get user-mode networking from slirp4netns, attached to the namespace while
bubblewrap holds the sandbox on ``--block-fd``:

1. bubblewrap reports the sandbox's pid on ``--info-fd`` (:class:`NetnsHandshake`);
2. :meth:`UserNetwork.attach` runs a short-lived helper that joins the sandbox's
   user and network namespaces, waits for bubblewrap to have brought ``lo`` up,
   and installs ``unreachable`` routes for private ranges, shared address space,
   link-local (cloud metadata at 169.254.169.254) and the host's own addresses
   and subnets (the egress policy of the Kubernetes backend's managed
   NetworkPolicy, enforced by the sandbox's own routing table), plus rules that
   let only DNS through to slirp's resolver address;
3. it then starts slirp4netns into the namespace with ``--disable-host-loopback``
   (the gateway 10.0.2.2 does not lead to the host's 127.0.0.1) and waits for it;
4. only then is the sandbox released (:meth:`NetnsHandshake.release`).

slirp4netns rather than pasta: pasta maps the gateway address to the host's
loopback and forwards host ports unless told otherwise, and the flags to turn that
off differ between releases; slirp4netns forwards nothing without an API socket
and ``--disable-host-loopback`` has meant the same thing since 0.3.

This module imports only the standard library: the namespace helper runs it as a
script (``python -I -S network.py --configure-ns ...``) in a fresh, single-threaded
interpreter, since joining a user namespace is refused to multi-threaded processes.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import ctypes
import errno
import fcntl
import functools
import ipaddress
import json
import os
import re
import shutil
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import IO

IPNetwork = ipaddress.IPv4Network | ipaddress.IPv6Network
IPInterface = ipaddress.IPv4Interface | ipaddress.IPv6Interface

# slirp4netns defaults (--cidr is left alone).
SLIRP_NETWORK = ipaddress.IPv4Network("10.0.2.0/24")
SLIRP_GATEWAY = "10.0.2.2"
SLIRP_DNS = "10.0.2.3"
SLIRP_GUEST = "10.0.2.100"
TAP_NAME = "tap0"
MTU = 65520
MIN_SLIRP_VERSION = (0, 4, 0)  # --userns-path, --netns-type, --enable-sandbox/-seccomp

# Destinations no sandbox may reach: private ranges, shared address space (carrier
# NAT, also used by tailnets), link-local (cloud metadata) and their IPv6 equivalents.
# slirp's own 10.0.2.0/24 is more specific than 10.0.0.0/8, so it stays reachable.
BLOCKED_NETWORKS: tuple[IPNetwork, ...] = tuple(
    ipaddress.ip_network(cidr)
    for cidr in (
        "10.0.0.0/8",
        "172.16.0.0/12",
        "192.168.0.0/16",
        "100.64.0.0/10",
        "169.254.0.0/16",
        "fc00::/7",
        "fe80::/10",
    )
)

ATTACH_TIMEOUT = 10.0
STOP_GRACE = 2.0


class NetworkSetupError(RuntimeError):
    """The sandbox's network could not be set up; the sandbox must not be released."""


# ---------------------------------------------------------------------------
# Availability and policy
# ---------------------------------------------------------------------------


@functools.cache
def user_network_available() -> str | None:
    """None if sandboxes can get user-mode networking here, else the reason they cannot."""
    if not os.path.exists("/proc/self/ns/net") or not os.path.exists("/proc/self/ns/user"):
        return "the kernel has no network or user namespaces"
    slirp = shutil.which("slirp4netns")
    if slirp is None:
        return "slirp4netns is not installed"
    if not os.access("/dev/net/tun", os.R_OK | os.W_OK):
        return "/dev/net/tun is missing or not read-write for this user (it is 0666 normally)"
    try:
        result = subprocess.run(
            [slirp, "--version"], capture_output=True, text=True, timeout=5, check=False
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"slirp4netns does not run: {exc}"
    version = parse_slirp_version(result.stdout)
    if version is None:
        return f"slirp4netns printed no version: {result.stdout.strip() or result.stderr.strip()}"
    if version < MIN_SLIRP_VERSION:
        wanted = ".".join(map(str, MIN_SLIRP_VERSION))
        return f"slirp4netns {'.'.join(map(str, version))} is too old (need {wanted})"
    return None


def parse_slirp_version(text: str) -> tuple[int, ...] | None:
    match = re.search(r"slirp4netns version (\d+)\.(\d+)\.(\d+)", text)
    return tuple(int(part) for part in match.groups()) if match else None


def blocked_networks(host_interfaces: Iterable[IPInterface] = ()) -> list[IPNetwork]:
    """Everything to make unreachable inside a sandbox, most general first.

    Besides :data:`BLOCKED_NETWORKS`: each of the host's own addresses (slirp would
    otherwise connect to them from the host, reaching services bound to 0.0.0.0)
    and the subnets they are on (the host's LAN). Nothing equal to or inside
    slirp's own network is listed (that would cut the sandbox off its gateway;
    slirp itself refuses the rest of it), nor anything inside a listed network.
    """
    wanted: list[IPNetwork] = list(BLOCKED_NETWORKS)
    for iface in host_interfaces:
        if iface.ip.is_loopback or iface.ip.is_unspecified:
            continue
        wanted.append(iface.network)
        wanted.append(ipaddress.ip_network(iface.ip))
    result: list[IPNetwork] = []
    for net in sorted(set(wanted), key=lambda n: (n.version, n.prefixlen, n.network_address)):
        if net.prefixlen == 0 or any(_within(net, done) for done in result):
            continue
        if _within(net, SLIRP_NETWORK):
            continue
        result.append(net)
    return result


def _within(net: IPNetwork, other: IPNetwork) -> bool:
    return net.version == other.version and net.subnet_of(other)  # type: ignore[arg-type]


def sandbox_resolv_conf(host_resolv_conf: str = "/etc/resolv.conf") -> str:
    """A resolv.conf for sandboxes with network: slirp's DNS forwarder, host's search list.

    The host's nameservers are useless inside: a loopback one (127.0.0.53) is the
    sandbox's own loopback, and a private one is blocked. slirp4netns answers at
    10.0.2.3 by forwarding to the host's first nameserver.
    """
    lines = [f"nameserver {SLIRP_DNS}"]
    try:
        host = Path(host_resolv_conf).read_text(errors="replace")
    except OSError:
        host = ""
    for raw in host.splitlines():
        words = raw.split()
        if words and words[0] in ("search", "domain", "options"):
            lines.append(" ".join(words))
    return "\n".join(lines) + "\n"


def write_sandbox_resolv_conf(directory: str | os.PathLike[str]) -> Path:
    """Write :func:`sandbox_resolv_conf` to ``directory/resolv.conf`` (0644); bind it at
    /etc/resolv.conf in sandboxes with network."""
    path = Path(directory) / "resolv.conf"
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(sandbox_resolv_conf())
    tmp.chmod(0o644)
    tmp.replace(path)
    return path


# ---------------------------------------------------------------------------
# Minimal rtnetlink: list addresses, add unreachable routes
# ---------------------------------------------------------------------------

NETLINK_ROUTE = 0
NLMSG_ERROR = 2
NLMSG_DONE = 3
RTM_NEWADDR = 20
RTM_GETADDR = 22
RTM_NEWROUTE = 24
RTM_NEWRULE = 32
NLM_F_REQUEST = 0x1
NLM_F_ACK = 0x4
NLM_F_DUMP = 0x300
NLM_F_REPLACE = 0x100
NLM_F_CREATE = 0x400
IFA_ADDRESS = 1
IFA_LOCAL = 2
RTA_DST = 1
RT_TABLE_MAIN = 254
RTPROT_STATIC = 4
RT_SCOPE_UNIVERSE = 0
RT_SCOPE_HOST = 254
RTN_UNREACHABLE = 7
FR_ACT_TO_TBL = 1
FR_ACT_UNREACHABLE = 7
FRA_DST = 1
FRA_PRIORITY = 6
FRA_TABLE = 15
FRA_IP_PROTO = 22
FRA_DPORT_RANGE = 24
# Policy-routing rules for slirp's DNS address, ahead of the main table (32766).
DNS_RULE_PRIORITY = 100

_NLMSGHDR = struct.Struct("=IHHII")
_RTMSG = struct.Struct("=BBBBBBBBI")
_IFADDRMSG = struct.Struct("=BBBBI")
_RTATTR = struct.Struct("=HH")


def _align(length: int) -> int:
    return (length + 3) & ~3


def _attr(kind: int, data: bytes) -> bytes:
    length = _RTATTR.size + len(data)
    return _RTATTR.pack(length, kind) + data + b"\0" * (_align(length) - length)


def _parse_attrs(data: bytes) -> dict[int, bytes]:
    attrs: dict[int, bytes] = {}
    offset = 0
    while offset + _RTATTR.size <= len(data):
        length, kind = _RTATTR.unpack_from(data, offset)
        if length < _RTATTR.size:
            break
        attrs.setdefault(kind, data[offset + _RTATTR.size : offset + length])
        offset += _align(length)
    return attrs


def unreachable_route_message(network: IPNetwork, seq: int = 1) -> bytes:
    """An RTM_NEWROUTE request: ``ip route replace unreachable <network>`` in table main."""
    family = socket.AF_INET if network.version == 4 else socket.AF_INET6
    body = _RTMSG.pack(
        family,
        network.prefixlen,
        0,
        0,
        RT_TABLE_MAIN,
        RTPROT_STATIC,
        RT_SCOPE_UNIVERSE,
        RTN_UNREACHABLE,
        0,
    ) + _attr(RTA_DST, network.network_address.packed)
    flags = NLM_F_REQUEST | NLM_F_ACK | NLM_F_CREATE | NLM_F_REPLACE
    return _NLMSGHDR.pack(_NLMSGHDR.size + len(body), RTM_NEWROUTE, flags, seq, 0) + body


def _messages(data: bytes) -> Iterable[tuple[int, int, bytes]]:
    """(type, seq, payload) of each netlink message in one datagram."""
    offset = 0
    while offset + _NLMSGHDR.size <= len(data):
        length, kind, _flags, seq, _pid = _NLMSGHDR.unpack_from(data, offset)
        if length < _NLMSGHDR.size:
            break
        yield kind, seq, data[offset + _NLMSGHDR.size : offset + length]
        offset += _align(length)


def _error_code(payload: bytes) -> int:
    return -struct.unpack_from("=i", payload)[0]


def _netlink_socket() -> socket.socket:
    sock = socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, NETLINK_ROUTE)
    sock.settimeout(5)
    sock.bind((0, 0))
    return sock


def add_unreachable_routes(networks: Sequence[IPNetwork]) -> None:
    """Install an unreachable route per network in the caller's network namespace.

    IPv6 routes are skipped when the namespace has no IPv6 at all (nothing is
    reachable over it then). Any other refusal raises OSError.
    """
    with _netlink_socket() as sock:
        for seq, network in enumerate(networks, start=1):
            sock.send(unreachable_route_message(network, seq))
            code = _wait_ack(sock, seq)
            if code == 0:
                continue
            if network.version == 6 and code in (errno.EAFNOSUPPORT, errno.EOPNOTSUPP):
                continue
            raise OSError(code, f"adding unreachable route {network}: {os.strerror(code)}")


def dns_rule_messages(dns: str, first_seq: int = 1) -> list[bytes]:
    """RTM_NEWRULE requests letting only port 53 (UDP, TCP) through to ``dns``.

    slirp4netns forwards *every* port of its DNS address to the host's nameserver,
    which may be a loopback or private address of the host: so the sandbox may
    use that address for DNS and nothing else (``ip rule ... dport 53 lookup main``,
    then ``ip rule ... unreachable``).
    """
    dst = ipaddress.IPv4Address(dns).packed
    messages = []
    for offset, proto in enumerate((socket.IPPROTO_UDP, socket.IPPROTO_TCP)):
        attrs = (
            _attr(FRA_DST, dst)
            + _attr(FRA_PRIORITY, struct.pack("=I", DNS_RULE_PRIORITY + offset))
            + _attr(FRA_IP_PROTO, struct.pack("=B", proto))
            + _attr(FRA_DPORT_RANGE, struct.pack("=HH", 53, 53))
            + _attr(FRA_TABLE, struct.pack("=I", RT_TABLE_MAIN))
        )
        messages.append(_rule(FR_ACT_TO_TBL, RT_TABLE_MAIN, attrs, first_seq + offset))
    attrs = _attr(FRA_DST, dst) + _attr(FRA_PRIORITY, struct.pack("=I", DNS_RULE_PRIORITY + 2))
    messages.append(_rule(FR_ACT_UNREACHABLE, 0, attrs, first_seq + 2))
    return messages


def _rule(action: int, table: int, attrs: bytes, seq: int) -> bytes:
    body = _RTMSG.pack(socket.AF_INET, 32, 0, 0, table, 0, 0, action, 0) + attrs
    flags = NLM_F_REQUEST | NLM_F_ACK | NLM_F_CREATE
    return _NLMSGHDR.pack(_NLMSGHDR.size + len(body), RTM_NEWRULE, flags, seq, 0) + body


def restrict_dns_address(dns: str = SLIRP_DNS) -> None:
    """Install :func:`dns_rule_messages` in the caller's network namespace."""
    with _netlink_socket() as sock:
        for seq, message in enumerate(dns_rule_messages(dns), start=1):
            sock.send(message)
            code = _wait_ack(sock, seq)
            if code != 0:
                raise OSError(code, f"adding a rule for {dns}: {os.strerror(code)}")


def _wait_ack(sock: socket.socket, seq: int) -> int:
    while True:
        for kind, got_seq, payload in _messages(sock.recv(65536)):
            if kind == NLMSG_ERROR and got_seq == seq:
                return _error_code(payload)


def host_interfaces() -> list[IPInterface]:
    """The addresses (with prefix length) of the caller's network namespace, loopback excluded."""
    request = _NLMSGHDR.pack(
        _NLMSGHDR.size + _IFADDRMSG.size, RTM_GETADDR, NLM_F_REQUEST | NLM_F_DUMP, 1, 0
    ) + _IFADDRMSG.pack(socket.AF_UNSPEC, 0, 0, 0, 0)
    found: list[IPInterface] = []
    with _netlink_socket() as sock:
        sock.send(request)
        while True:
            for kind, _seq, payload in _messages(sock.recv(65536)):
                if kind == NLMSG_DONE:
                    return found
                if kind == NLMSG_ERROR:
                    code = _error_code(payload)
                    raise OSError(code, f"listing addresses: {os.strerror(code)}")
                if kind == RTM_NEWADDR:
                    iface = _parse_address(payload)
                    if iface is not None:
                        found.append(iface)


def _parse_address(payload: bytes) -> IPInterface | None:
    family, prefixlen, _flags, scope, _index = _IFADDRMSG.unpack_from(payload)
    attrs = _parse_attrs(payload[_IFADDRMSG.size :])
    raw = attrs.get(IFA_LOCAL) or attrs.get(IFA_ADDRESS)
    if raw is None or scope == RT_SCOPE_HOST or family not in (socket.AF_INET, socket.AF_INET6):
        return None
    iface = ipaddress.ip_interface(f"{ipaddress.ip_address(raw)}/{prefixlen}")
    return None if iface.ip.is_loopback else iface


# ---------------------------------------------------------------------------
# Namespaces
# ---------------------------------------------------------------------------

CLONE_NEWUSER = 0x10000000
CLONE_NEWNET = 0x40000000
NS_GET_USERNS = 0xB701  # _IO(0xb7, 0x1)


def setns(fd: int, nstype: int) -> None:
    if hasattr(os, "setns"):  # Python 3.12+
        os.setns(fd, nstype)
        return
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.setns(fd, nstype) != 0:
        code = ctypes.get_errno()
        raise OSError(code, os.strerror(code))


def owning_userns(netns_fd: int) -> int:
    """A new fd for the user namespace that owns a network namespace.

    Asked of the kernel rather than read from /proc/<pid>/ns/user, which may be a
    namespace nested below the owner.
    """
    return fcntl.ioctl(netns_fd, NS_GET_USERNS)


def same_namespace(fd: int, path: str) -> bool:
    a, b = os.fstat(fd), os.stat(path)
    return (a.st_dev, a.st_ino) == (b.st_dev, b.st_ino)


SIOCGIFFLAGS = 0x8913
IFF_UP = 0x1


def loopback_is_up() -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        request = struct.pack("16sH22x", b"lo", 0)
        flags = struct.unpack_from("16sH", fcntl.ioctl(sock.fileno(), SIOCGIFFLAGS, request))[1]
    return bool(flags & IFF_UP)


def wait_for_loopback(timeout: float = 5.0) -> None:
    """Wait until bubblewrap has set up the namespace's loopback (address, then up).

    bubblewrap reports the pid before its child does that, and it fails if
    anything brings ``lo`` up first (the kernel then adds 127.0.0.1 itself, and
    bubblewrap's own RTM_NEWADDR collides): slirp4netns --configure does.
    """
    deadline = time.monotonic() + timeout
    while not loopback_is_up():
        if time.monotonic() > deadline:
            raise NetworkSetupError("the sandbox's loopback did not come up")
        time.sleep(0.005)


def configure_namespace(
    netns_fd: int, userns_fd: int, networks: Sequence[IPNetwork], dns: str | None
) -> None:
    """Join the sandbox's namespaces and make ``networks`` unreachable there.

    Only for a fresh single-threaded process (see :func:`_main`): joining the
    user namespace first gives full capabilities inside it, without an exec that
    would drop them for a user other than root.
    """
    if same_namespace(netns_fd, "/proc/self/ns/net"):
        raise NetworkSetupError("refusing to change the host's own network namespace")
    if not same_namespace(userns_fd, "/proc/self/ns/user"):
        setns(userns_fd, CLONE_NEWUSER)
    setns(netns_fd, CLONE_NEWNET)
    wait_for_loopback()
    add_unreachable_routes(networks)
    if dns is not None:
        restrict_dns_address(dns)


def _main(argv: Sequence[str]) -> int:
    parser = argparse.ArgumentParser(description="sandbox network namespace helper")
    parser.add_argument("--configure-ns", action="store_true", required=True)
    parser.add_argument("--netns-fd", type=int, required=True)
    parser.add_argument("--userns-fd", type=int, required=True)
    parser.add_argument("--dns-only", metavar="ADDRESS", help="allow only port 53 there")
    parser.add_argument("networks", nargs="*", type=ipaddress.ip_network)
    args = parser.parse_args(argv)
    try:
        configure_namespace(args.netns_fd, args.userns_fd, args.networks, args.dns_only)
    except (OSError, NetworkSetupError) as exc:
        print(f"configuring the sandbox network namespace: {exc}", file=sys.stderr)
        return 1
    return 0


# ---------------------------------------------------------------------------
# bubblewrap hand-shake
# ---------------------------------------------------------------------------


class NetnsHandshake:
    """The two pipes for ``bwrap --info-fd`` and ``--block-fd``, and the way out.

    bubblewrap writes ``{"child-pid": N, ...}`` to the info pipe once the sandbox's
    namespaces exist, and the sandbox blocks until a byte arrives on the block pipe.
    Pass :meth:`bwrap_args` to bubblewrap and :attr:`child_fds` in ``pass_fds``, call
    :meth:`spawned` right after the spawn, then :meth:`child_pid`, attach the
    network, and :meth:`release`; on any failure, :meth:`abort`.

    bubblewrap 0.8 runs the command on *EOF* on the block pipe too, and a sandbox
    blocked there does not die with bubblewrap (its parent-death signal is lost
    with the uid switch). So closing the pipe, or killing bubblewrap, is no way to
    refuse a sandbox: :meth:`abort` kills the sandbox itself (through a pidfd taken
    while it was blocked) before closing anything, and :meth:`close` aborts a
    sandbox that was never released.
    """

    def __init__(self) -> None:
        self._info_read, self._info_write = os.pipe()
        self._block_read, self._block_write = os.pipe()
        self._pidfd = -1
        self.released = False

    @property
    def child_fds(self) -> tuple[int, int]:
        return (self._info_write, self._block_read)

    def bwrap_args(self) -> list[str]:
        return [
            "--unshare-net",
            "--info-fd",
            str(self._info_write),
            "--block-fd",
            str(self._block_read),
        ]

    def spawned(self) -> None:
        """Close the ends that now belong to bubblewrap (EOF on info if it dies)."""
        self._info_write = _close(self._info_write)
        self._block_read = _close(self._block_read)

    async def child_pid(self, timeout: float = ATTACH_TIMEOUT) -> int:
        """The sandbox's pid (in the daemon's pid namespace), from bubblewrap's info."""
        data = b""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while True:
            chunk = await _read_some(self._info_read, deadline - loop.time())
            if not chunk:
                raise NetworkSetupError(f"bubblewrap exited before reporting: {data!r}")
            data += chunk
            pid = parse_child_pid(data)
            if pid is not None:
                # Blocked, the sandbox cannot exit, so the pid is still its own.
                self._pidfd = os.pidfd_open(pid)
                return pid

    def release(self) -> None:
        """Let the sandbox run its command."""
        os.write(self._block_write, b"1")
        self.released = True
        self.close()

    def abort(self) -> None:
        """Kill the sandbox before it runs anything, then close the pipes.

        Without a pid (bubblewrap never reported one) there is no sandbox to kill.
        """
        if not self.released and self._pidfd >= 0:
            with contextlib.suppress(ProcessLookupError):
                signal.pidfd_send_signal(self._pidfd, signal.SIGKILL)
        self._close_all()

    def close(self) -> None:
        """Close everything; a sandbox that was not released is aborted."""
        if self.released:
            self._close_all()
        else:
            self.abort()

    def _close_all(self) -> None:
        for name in ("_info_read", "_info_write", "_block_read", "_block_write", "_pidfd"):
            setattr(self, name, _close(getattr(self, name)))


def parse_child_pid(data: bytes) -> int | None:
    """The child pid from bubblewrap's info JSON, or None if it is not complete yet."""
    try:
        info = json.loads(data)
    except ValueError:
        return None
    pid = info.get("child-pid") if isinstance(info, dict) else None
    if not isinstance(pid, int) or pid <= 0:
        raise NetworkSetupError(f"bubblewrap's info has no child pid: {info!r}")
    return pid


def _close(fd: int) -> int:
    if fd >= 0:
        with contextlib.suppress(OSError):
            os.close(fd)
    return -1


async def _read_some(fd: int, timeout: float) -> bytes:
    """One read from a pipe without blocking the event loop."""
    loop = asyncio.get_running_loop()
    ready: asyncio.Future[None] = loop.create_future()

    def readable() -> None:
        if not ready.done():
            ready.set_result(None)

    loop.add_reader(fd, readable)
    try:
        await asyncio.wait_for(ready, max(timeout, 0.0))
    except TimeoutError:
        raise NetworkSetupError("timed out waiting for a pipe") from None
    finally:
        loop.remove_reader(fd)
    return os.read(fd, 65536)


# ---------------------------------------------------------------------------
# The per-sandbox network
# ---------------------------------------------------------------------------


class UserNetwork:
    """slirp4netns plus the egress policy for one sandbox's network namespace."""

    # Only DNS (port 53) to slirp's DNS address: see dns_rule_messages.
    dns_only = True

    def __init__(
        self,
        *,
        log_path: str | os.PathLike[str] | None = None,
        timeout: float = ATTACH_TIMEOUT,
    ) -> None:
        self.log_path = log_path
        self.timeout = timeout
        self.blocked: list[IPNetwork] = []
        self._proc: asyncio.subprocess.Process | None = None
        self._exit_write = -1
        self._log: IO[bytes] | None = None

    @property
    def pid(self) -> int | None:
        """slirp4netns's pid while it runs."""
        return self._proc.pid if self._proc and self._proc.returncode is None else None

    async def attach(self, child_pid: int) -> None:
        """Give the (blocked) sandbox ``child_pid`` its network; raise NetworkSetupError
        (with everything stopped again) if any step fails."""
        if self._proc is not None:
            raise NetworkSetupError("this network is already attached")
        netns_fd = userns_fd = -1
        try:
            netns_fd = os.open(f"/proc/{child_pid}/ns/net", os.O_RDONLY | os.O_CLOEXEC)
            if same_namespace(netns_fd, "/proc/self/ns/net"):
                raise NetworkSetupError(
                    f"process {child_pid} shares the host's network namespace "
                    "(bubblewrap started without --unshare-net?)"
                )
            userns_fd = owning_userns(netns_fd)
            self.blocked = self.policy()
            # The policy first: it waits for bubblewrap to finish with the
            # namespace, and no interface to the outside exists without it.
            await self._apply_policy(netns_fd, userns_fd)
            await self._start_slirp(netns_fd, userns_fd)
        except BaseException as exc:
            await self.close()
            if isinstance(exc, OSError):
                raise NetworkSetupError(f"attaching the sandbox network: {exc}") from exc
            raise
        finally:
            _close(netns_fd)
            _close(userns_fd)

    def policy(self) -> list[IPNetwork]:
        """The networks to make unreachable: fixed ranges and the host's own."""
        return blocked_networks(host_interfaces())

    def slirp_command(self) -> list[str]:
        return [shutil.which("slirp4netns") or "slirp4netns"]

    def slirp_options(self) -> list[str]:
        options = [
            "--configure",
            f"--mtu={MTU}",
            "--disable-host-loopback",
            "--enable-seccomp",
        ]
        # Without root, slirp4netns (up to 1.3) builds its mount sandbox by joining
        # the user namespace of a target *pid*, never the --userns-path one: with
        # --netns-type=path it joins none and fails (a pid would name bubblewrap's
        # inner namespace, the wrong one). Seccomp alone holds it then.
        if os.geteuid() == 0:
            options.append("--enable-sandbox")
        return options

    async def _start_slirp(self, netns_fd: int, userns_fd: int) -> None:
        ready_read, ready_write = os.pipe()
        exit_read, self._exit_write = os.pipe()
        self._log = self._open_log()
        try:
            self._proc = await asyncio.create_subprocess_exec(
                *self.slirp_command(),
                *self.slirp_options(),
                f"--ready-fd={ready_write}",
                f"--exit-fd={exit_read}",
                f"--userns-path=/proc/self/fd/{userns_fd}",
                "--netns-type=path",
                f"/proc/self/fd/{netns_fd}",
                TAP_NAME,
                stdin=subprocess.DEVNULL,
                stdout=self._log,
                stderr=self._log,
                pass_fds=(ready_write, exit_read, netns_fd, userns_fd),
                start_new_session=True,
            )
            ready_write = _close(ready_write)
            await self._wait_ready(ready_read)
        finally:
            _close(ready_write)
            _close(ready_read)
            _close(exit_read)

    async def _wait_ready(self, ready_read: int) -> None:
        assert self._proc is not None
        exited = asyncio.ensure_future(self._proc.wait())
        ready = asyncio.ensure_future(_read_some(ready_read, self.timeout))
        try:
            await asyncio.wait([exited, ready], return_when=asyncio.FIRST_COMPLETED)
            if ready.done() and ready.exception() is None and ready.result() == b"1":
                return
            if ready.done() and ready.exception() is not None:
                raise NetworkSetupError(f"slirp4netns was not ready in {self.timeout:g}s")
            raise NetworkSetupError(f"slirp4netns failed: {self._log_tail()}")
        finally:
            exited.cancel()
            ready.cancel()

    async def _apply_policy(self, netns_fd: int, userns_fd: int) -> None:
        proc = await asyncio.create_subprocess_exec(
            sys.executable,
            "-I",
            "-S",
            os.path.abspath(__file__),
            "--configure-ns",
            "--netns-fd",
            str(netns_fd),
            "--userns-fd",
            str(userns_fd),
            *(["--dns-only", SLIRP_DNS] if self.dns_only else []),
            *(str(net) for net in self.blocked),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            pass_fds=(netns_fd, userns_fd),
        )
        try:
            _, stderr = await asyncio.wait_for(proc.communicate(), self.timeout)
        except TimeoutError:
            proc.kill()
            await proc.wait()
            raise NetworkSetupError("the namespace helper timed out") from None
        if proc.returncode != 0:
            raise NetworkSetupError(stderr.decode(errors="replace").strip() or "helper failed")

    def _open_log(self) -> IO[bytes]:
        if self.log_path is not None:
            return open(self.log_path, "ab")
        return tempfile.TemporaryFile()

    def _log_tail(self, limit: int = 2000) -> str:
        if self._log is None or self.log_path is not None:
            return f"see {self.log_path}" if self.log_path else "no output"
        self._log.seek(0)
        return self._log.read().decode(errors="replace")[-limit:].strip() or "no output"

    async def close(self) -> None:
        """Stop slirp4netns (which keeps the namespace alive while it runs). Idempotent."""
        self._exit_write = _close(self._exit_write)  # slirp4netns exits on EOF
        proc = self._proc
        if proc is not None and proc.returncode is None:
            await _stop(proc)
        if self._log is not None:
            self._log.close()
            self._log = None


async def _stop(proc: asyncio.subprocess.Process) -> None:
    for action in (None, proc.terminate, proc.kill):
        if action is not None:
            with contextlib.suppress(ProcessLookupError):
                action()
        try:
            await asyncio.wait_for(proc.wait(), STOP_GRACE)
            return
        except TimeoutError:
            continue
    await proc.wait()


if __name__ == "__main__":
    sys.exit(_main(sys.argv[1:]))
