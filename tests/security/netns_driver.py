"""Start one bubblewrap sandbox the way the local daemon does, for the network tests.

``python -m tests.security.netns_driver --mode MODE -- CMD...`` runs ``CMD`` in a
sandbox (user, pid and network namespaces, read-only system, capabilities
dropped) with the driver's own standard streams, and exits with its status. The
driver plays the daemon, so the tests run it as root and, through ``runuser``, as
an unprivileged user. It imports nothing but the standard library and the
network module, so the system's Python can run it for any user.

Modes: ``user-network`` (the real thing), ``no-network`` (loopback only), and,
to show the attacks would succeed against a weaker sandbox: ``share-net`` (the
host's namespace), ``no-policy`` (slirp4netns without the unreachable routes and
DNS rules), ``host-loopback`` (slirp4netns without ``--disable-host-loopback``).
``dns-loopback`` (root only) runs slirp4netns in a mount namespace where the
host's nameserver is 127.0.0.1, as on hosts with a local resolver.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import tempfile

from jupyter_sandbox.control_plane.local.isolation import SYSTEM_DIRS, ro_binds
from jupyter_sandbox.control_plane.local.network import (
    IPNetwork,
    NetnsHandshake,
    NetworkSetupError,
    UserNetwork,
    write_sandbox_resolv_conf,
)

SANDBOX_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
MODES = (
    "user-network",
    "no-network",
    "share-net",
    "no-policy",
    "host-loopback",
    "dns-loopback",
)


class NoPolicyNetwork(UserNetwork):
    dns_only = False

    def policy(self) -> list[IPNetwork]:
        return []


class HostLoopbackNetwork(UserNetwork):
    def slirp_options(self) -> list[str]:
        return [opt for opt in super().slirp_options() if opt != "--disable-host-loopback"]


class LoopbackResolverNetwork(UserNetwork):
    """slirp4netns seeing ``nameserver 127.0.0.1`` (its own mount namespace; root only)."""

    RESOLV_CONF = "nameserver 127.0.0.1\n"

    def __init__(self) -> None:
        super().__init__()
        self._dir = tempfile.TemporaryDirectory(prefix="netns-resolver-")
        self.fake = os.path.join(self._dir.name, "resolv.conf")
        with open(self.fake, "w") as handle:
            handle.write(self.RESOLV_CONF)

    def slirp_command(self) -> list[str]:
        script = 'mount --bind "$0" /etc/resolv.conf && exec "$@"'
        return ["unshare", "--mount", "--", "sh", "-c", script, self.fake, *super().slirp_command()]

    def slirp_options(self) -> list[str]:
        # Its mount sandbox would bring back the host's /etc (a non-recursive bind).
        return [opt for opt in super().slirp_options() if opt != "--enable-sandbox"]

    async def attach(self, child_pid: int) -> None:
        await super().attach(child_pid)
        # Never let the sandbox try the resolver address unless it is this loopback.
        seen = open(f"/proc/{self.pid}/root/etc/resolv.conf").read()
        if seen != self.RESOLV_CONF:
            await self.close()
            raise NetworkSetupError(f"slirp4netns sees another resolv.conf: {seen!r}")

    async def close(self) -> None:
        await super().close()
        self._dir.cleanup()


NETWORKS: dict[str, type[UserNetwork]] = {
    "user-network": UserNetwork,
    "no-policy": NoPolicyNetwork,
    "host-loopback": HostLoopbackNetwork,
    "dns-loopback": LoopbackResolverNetwork,
}


def system_binds() -> list[str]:
    args = ro_binds(SYSTEM_DIRS)
    for raw in {sys.prefix, sys.base_prefix, os.path.dirname(sys.executable)}:
        path = os.path.realpath(raw)
        if not path.startswith(SYSTEM_DIRS):
            args += ["--ro-bind", path, path]
    return args


def bwrap_command(
    mode: str, handshake: NetnsHandshake, resolv_conf: str, inner: list[str]
) -> list[str]:
    namespace_args = handshake.bwrap_args()
    if mode == "share-net":
        namespace_args.remove("--unshare-net")
    return [
        "bwrap",
        "--die-with-parent",
        "--unshare-user",
        "--uid",
        "1000",
        "--gid",
        "1000",
        "--unshare-pid",
        "--unshare-ipc",
        "--unshare-uts",
        "--cap-drop",
        "ALL",
        *namespace_args,
        *system_binds(),
        "--ro-bind",
        resolv_conf,
        "/etc/resolv.conf",
        "--proc",
        "/proc",
        "--dev",
        "/dev",
        "--tmpfs",
        "/tmp",
        "--clearenv",
        "--setenv",
        "PATH",
        SANDBOX_PATH,
        "--setenv",
        "PYTHONUNBUFFERED",
        "1",
        "--",
        *inner,
    ]


async def run(mode: str, inner: list[str]) -> int:
    handshake = NetnsHandshake()
    network = NETWORKS[mode]() if mode in NETWORKS else None
    proc: asyncio.subprocess.Process | None = None
    with tempfile.TemporaryDirectory(prefix="netns-driver-") as tmp:
        resolv_conf = str(write_sandbox_resolv_conf(tmp)) if network else "/etc/resolv.conf"
        try:
            proc = await asyncio.create_subprocess_exec(
                *bwrap_command(mode, handshake, resolv_conf, inner),
                pass_fds=handshake.child_fds,
            )
            handshake.spawned()
            child_pid = await handshake.child_pid()
            if network is not None:
                await network.attach(child_pid)
            handshake.release()
            return await proc.wait()
        finally:
            handshake.close()  # kills the sandbox unless it was released
            if proc is not None and proc.returncode is None:
                proc.kill()
                await proc.wait()
            if network is not None:
                await network.close()


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--mode", choices=MODES, required=True)
    parser.add_argument("command", nargs="+")
    args = parser.parse_args()
    try:
        return asyncio.run(run(args.mode, args.command))
    except NetworkSetupError as exc:
        print(f"netns_driver: {exc}", file=sys.stderr)
        return 125


if __name__ == "__main__":
    sys.exit(main())
