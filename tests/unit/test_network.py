"""The pure logic of the sandbox network module: policy, messages, parsing, hand-shake."""

from __future__ import annotations

import ipaddress
import os
import signal
import socket
import struct
import subprocess
from pathlib import Path

import pytest

from jupyter_sandbox.control_plane.local import network
from jupyter_sandbox.control_plane.local.network import (
    BLOCKED_NETWORKS,
    NetnsHandshake,
    NetworkSetupError,
    UserNetwork,
    blocked_networks,
    parse_child_pid,
    parse_slirp_version,
    sandbox_resolv_conf,
    unreachable_route_message,
    write_sandbox_resolv_conf,
)


def nets(*cidrs: str) -> list[ipaddress.IPv4Network | ipaddress.IPv6Network]:
    return [ipaddress.ip_network(c) for c in cidrs]


def ifaces(*cidrs: str) -> list[ipaddress.IPv4Interface | ipaddress.IPv6Interface]:
    return [ipaddress.ip_interface(c) for c in cidrs]


def test_fixed_policy_matches_the_kubernetes_network_policy() -> None:
    assert set(blocked_networks()) == set(BLOCKED_NETWORKS)
    assert set(BLOCKED_NETWORKS) >= set(
        nets("10.0.0.0/8", "172.16.0.0/12", "192.168.0.0/16", "169.254.0.0/16")
        + nets("fc00::/7", "fe80::/10")
    )


def test_host_public_address_and_subnet_are_blocked() -> None:
    result = blocked_networks(ifaces("203.0.113.7/24", "2001:db8::5/64"))
    assert ipaddress.ip_network("203.0.113.0/24") in result
    assert ipaddress.ip_network("2001:db8::/64") in result
    # The address itself is inside its subnet: listed once, by the subnet.
    assert ipaddress.ip_network("203.0.113.7/32") not in result


def test_host_point_to_point_address_is_blocked() -> None:
    assert ipaddress.ip_network("198.51.100.9/32") in blocked_networks(ifaces("198.51.100.9/32"))


def test_networks_inside_listed_ones_are_not_repeated() -> None:
    result = blocked_networks(ifaces("192.168.1.20/24", "10.1.2.3/16", "fd00::2/64"))
    assert result == blocked_networks()


def test_slirp_network_is_never_blocked() -> None:
    # A host on 10.0.2.0/24 (VirtualBox NAT) must not cut the sandbox off its gateway.
    result = blocked_networks(ifaces("10.0.2.15/24", "10.0.2.15/32"))
    assert all(not net.overlaps(network.SLIRP_NETWORK) or net.prefixlen < 24 for net in result)
    assert ipaddress.ip_network("10.0.2.0/24") not in result


def test_loopback_and_default_are_ignored() -> None:
    result = blocked_networks(ifaces("127.0.0.1/8", "::1/128", "0.0.0.0/0"))
    assert result == blocked_networks()


def test_most_general_first_v4_before_v6() -> None:
    result = blocked_networks(ifaces("203.0.113.7/24"))
    keys = [(n.version, n.prefixlen) for n in result]
    assert keys == sorted(keys)


def test_unreachable_route_message_v4() -> None:
    msg = unreachable_route_message(ipaddress.ip_network("169.254.0.0/16"), seq=7)
    length, kind, flags, seq, _pid = struct.unpack_from("=IHHII", msg)
    assert length == len(msg) and kind == network.RTM_NEWROUTE and seq == 7
    assert flags & network.NLM_F_ACK and flags & network.NLM_F_CREATE
    family, dst_len, _src, _tos, table, proto, scope, rtype, _f = struct.unpack_from(
        "=BBBBBBBBI", msg, 16
    )
    assert (family, dst_len, table, proto, scope, rtype) == (
        socket.AF_INET,
        16,
        network.RT_TABLE_MAIN,
        network.RTPROT_STATIC,
        network.RT_SCOPE_UNIVERSE,
        network.RTN_UNREACHABLE,
    )
    attr_len, attr_type = struct.unpack_from("=HH", msg, 28)
    assert (attr_len, attr_type) == (8, network.RTA_DST)
    assert msg[32:36] == socket.inet_aton("169.254.0.0")


def test_unreachable_route_message_v6() -> None:
    msg = unreachable_route_message(ipaddress.ip_network("fc00::/7"))
    assert msg[16] == socket.AF_INET6 and msg[17] == 7
    assert msg[32:48] == socket.inet_pton(socket.AF_INET6, "fc00::")
    assert len(msg) == 48


def test_address_messages_are_parsed() -> None:
    def payload(family: int, prefix: int, scope: int, addr: bytes, kind: int) -> bytes:
        return struct.pack("=BBBBI", family, prefix, 0, scope, 2) + network._attr(kind, addr)

    v4 = payload(socket.AF_INET, 24, 0, socket.inet_aton("192.0.2.9"), network.IFA_LOCAL)
    assert network._parse_address(v4) == ipaddress.ip_interface("192.0.2.9/24")
    v6 = socket.inet_pton(socket.AF_INET6, "2001:db8::1")
    assert network._parse_address(
        payload(socket.AF_INET6, 64, 0, v6, network.IFA_ADDRESS)
    ) == ipaddress.ip_interface("2001:db8::1/64")
    lo = payload(socket.AF_INET, 8, network.RT_SCOPE_HOST, socket.inet_aton("127.0.0.1"), 2)
    assert network._parse_address(lo) is None


def test_child_pid_from_bubblewrap_info() -> None:
    info = b'{\n    "child-pid": 4242,\n    "net-namespace": 4026532321\n}\n'
    assert parse_child_pid(info[:20]) is None  # bubblewrap may write it in pieces
    assert parse_child_pid(info) == 4242
    with pytest.raises(NetworkSetupError):
        parse_child_pid(b'{"pid-namespace": 1}')


def test_slirp_version() -> None:
    text = "slirp4netns version 1.2.0\ncommit: 656041d\nlibslirp: 4.7.0\n"
    assert parse_slirp_version(text) == (1, 2, 0)
    assert parse_slirp_version("garbage") is None


def test_resolv_conf_points_at_slirp_and_keeps_search(tmp_path: Path) -> None:
    host = tmp_path / "resolv.conf"
    host.write_text(
        "# systemd-resolved\nnameserver 127.0.0.53\nnameserver 10.1.1.1\n"
        "search corp.example\noptions edns0 trust-ad\n"
    )
    assert sandbox_resolv_conf(str(host)) == (
        "nameserver 10.0.2.3\nsearch corp.example\noptions edns0 trust-ad\n"
    )
    assert sandbox_resolv_conf(str(tmp_path / "missing")) == "nameserver 10.0.2.3\n"


def test_resolv_conf_file(tmp_path: Path) -> None:
    path = write_sandbox_resolv_conf(tmp_path)
    assert path == tmp_path / "resolv.conf"
    assert path.read_text().startswith("nameserver 10.0.2.3\n")
    assert path.stat().st_mode & 0o777 == 0o644


async def test_handshake_reads_the_pid_and_abort_kills_it() -> None:
    """The pid may come in pieces; abort kills that process (here a stand-in)."""
    stand_in = subprocess.Popen(["sleep", "30"])
    shake = NetnsHandshake()
    try:
        info_write, _ = shake.child_fds
        args = shake.bwrap_args()
        assert args == ["--unshare-net", "--info-fd", str(info_write), "--block-fd", args[-1]]
        os.write(info_write, b'{"child-pid": ')
        os.write(info_write, str(stand_in.pid).encode() + b"}")
        assert await shake.child_pid(timeout=2) == stand_in.pid
        shake.abort()
        assert stand_in.wait(timeout=5) == -signal.SIGKILL
    finally:
        shake.close()
        stand_in.kill()
        stand_in.wait()


async def test_handshake_fails_when_bubblewrap_dies_or_hangs() -> None:
    shake = NetnsHandshake()
    shake.spawned()  # no bubblewrap holds the write end: EOF at once
    with pytest.raises(NetworkSetupError, match="exited"):
        await shake.child_pid(timeout=2)
    shake.close()
    hung = NetnsHandshake()
    with pytest.raises(NetworkSetupError, match="timed out"):
        await hung.child_pid(timeout=0.1)
    hung.close()


async def test_attach_refuses_the_hosts_own_namespace(monkeypatch: pytest.MonkeyPatch) -> None:
    async def must_not_run(*args: object) -> None:
        raise AssertionError("reached a step that changes a network namespace")

    monkeypatch.setattr(UserNetwork, "_start_slirp", must_not_run)
    monkeypatch.setattr(UserNetwork, "_apply_policy", must_not_run)
    net = UserNetwork()
    with pytest.raises(NetworkSetupError, match="shares the host's network namespace"):
        await net.attach(os.getpid())
    await net.close()
    await net.close()


def test_dns_rules_allow_port_53_only() -> None:
    udp, tcp, rest = network.dns_rule_messages("10.0.2.3", first_seq=5)
    for message, proto, seq, prio in ((udp, 17, 5, 100), (tcp, 6, 6, 101)):
        _len, kind, _flags, got_seq, _pid = struct.unpack_from("=IHHII", message)
        assert (kind, got_seq) == (network.RTM_NEWRULE, seq)
        assert message[16:28] == struct.pack(
            "=BBBBBBBBI", socket.AF_INET, 32, 0, 0, 254, 0, 0, network.FR_ACT_TO_TBL, 0
        )
        attrs = network._parse_attrs(message[28:])
        assert attrs[network.FRA_DST] == socket.inet_aton("10.0.2.3")
        assert attrs[network.FRA_PRIORITY] == struct.pack("=I", prio)
        assert attrs[network.FRA_IP_PROTO] == bytes([proto])
        assert attrs[network.FRA_DPORT_RANGE] == struct.pack("=HH", 53, 53)
    assert rest[16 + 7] == network.FR_ACT_UNREACHABLE
    attrs = network._parse_attrs(rest[28:])
    assert set(attrs) == {network.FRA_DST, network.FRA_PRIORITY}
    assert attrs[network.FRA_PRIORITY] == struct.pack("=I", 102)
