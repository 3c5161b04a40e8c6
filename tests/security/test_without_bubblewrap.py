"""A fresh machine without bubblewrap: the README's first command must still give
sandboxes that cannot read the user's files (Landlock), or refuse, naming the
package to install.

The review, on a machine without bubblewrap: "isolation: none", and a sandbox read
~/.ssh/id_rsa, the router secret and a host-loopback service. Here bubblewrap is
hidden from the daemon's PATH (a farm of links to every other program) and an
attacker's code runs inside a sandbox claimed through the SDK, as root and as an
ordinary user.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import tempfile
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from jupyter_sandbox.runtime import landlock

from .attacker import run_attacker
from .test_local_escapes import _kill_processes_mentioning, attacker_env, fake_home

pytestmark = pytest.mark.skipif(landlock.abi_version() < 4, reason="Landlock ABI 4 needed here")

PROBE = """
import json, os, socket
out = {}
for name, path in PATHS.items():
    try:
        open(path).read()
        out[name] = "read"
    except OSError as exc:
        out[name] = type(exc).__name__
s = socket.socket()
s.settimeout(5)
try:
    s.connect(("127.0.0.1", PORT))
    out["host loopback service"] = "connected"
except OSError as exc:
    out["host loopback service"] = type(exc).__name__
try:
    os.kill(HOST_PID, 0)
    out["signal a process of the user's"] = "sent"
except OSError as exc:
    out["signal a process of the user's"] = type(exc).__name__
for what in ("environ", "cmdline", "mem"):
    try:
        open(f"/proc/{HOST_PID}/{what}", "rb").read(1)
        out[f"a process of the user's: {what}"] = "read"
    except OSError as exc:
        out[f"a process of the user's: {what}"] = type(exc).__name__
open("made-here.txt", "w").write("the workspace is the sandbox's own")
out["own workspace"] = open("made-here.txt").read() == "the workspace is the sandbox's own"
try:
    os.chown("made-here.txt", 4242, 4242)
    out["give a file away (CAP_CHOWN)"] = "done"
except OSError as exc:
    out["give a file away (CAP_CHOWN)"] = type(exc).__name__
import ctypes  # (/proc/self/status is not the sandbox's to read)
class Header(ctypes.Structure):
    _fields_ = [("version", ctypes.c_uint32), ("pid", ctypes.c_int)]
class Data(ctypes.Structure):
    _fields_ = [("effective", ctypes.c_uint32), ("permitted", ctypes.c_uint32),
                ("inheritable", ctypes.c_uint32)]
libc = ctypes.CDLL(None)
data = (Data * 2)()
assert libc.capget(ctypes.byref(Header(0x20080522, 0)), data) == 0
out["capabilities"] = {
    field: data[0].__getattribute__(field) | data[1].__getattribute__(field)
    for field in ("effective", "permitted", "inheritable")
}
out["capabilities"]["bounding"] = sum(libc.prctl(23, cap, 0, 0, 0) == 1 for cap in range(64))
print(json.dumps(out))
"""


@pytest.fixture
def path_without_bwrap() -> Iterator[str]:
    """A PATH with every program on this one but bubblewrap."""
    farm = Path(tempfile.mkdtemp(prefix="jsbx-nobwrap-"))
    seen: set[str] = set()
    for directory in os.environ.get("PATH", "").split(os.pathsep):
        if not os.path.isdir(directory):
            continue
        for entry in os.scandir(directory):
            if entry.name != "bwrap" and entry.name not in seen:
                seen.add(entry.name)
                (farm / entry.name).symlink_to(entry.path)
    yield str(farm)
    shutil.rmtree(farm, ignore_errors=True)


@pytest.fixture
def loopback_service() -> Iterator[int]:
    server = socket.create_server(("127.0.0.1", 0))
    port = server.getsockname()[1]

    def accept() -> None:
        try:
            conn, _ = server.accept()
            conn.close()
        except OSError:
            pass

    threading.Thread(target=accept, daemon=True).start()
    yield port
    server.close()


def test_without_bubblewrap_a_sandbox_still_cannot_read_the_users_files(
    path_without_bwrap: str, loopback_service: int
) -> None:
    home = fake_home(Path(tempfile.mkdtemp(prefix="jsbx-")))
    state = home / ".local" / "share" / "jupyter" / "sandbox"
    env = attacker_env(home, PATH=path_without_bwrap)
    paths = {
        "ssh key": str(home / ".ssh" / "id_ed25519"),
        "cloud credentials": str(home / ".aws" / "credentials"),
        "router secret": str(state / "router-secret"),
        "daemon info": str(state / "daemon.json"),
    }
    # this test's own process: the user's, outside every sandbox, with its secrets
    code = f"PATHS = {paths!r}\nPORT = {loopback_service}\nHOST_PID = {os.getpid()}\n" + PROBE
    try:
        result = run_attacker(code, env, home)
    finally:
        _kill_processes_mentioning(str(home))
        shutil.rmtree(home.parent, ignore_errors=True)
    seen = json.loads(str(result["stdout"]))
    assert seen.pop("own workspace") is True, seen
    # not even a root daemon's sandbox keeps a capability, nor (as root, whose exec
    # would grant them) one to regain at an exec: its bounding set is empty
    held = seen.pop("capabilities")
    bounding = held.pop("bounding")
    assert held == {"effective": 0, "permitted": 0, "inheritable": 0}, seen
    if os.geteuid() == 0:
        assert bounding == 0, seen
    assert seen.pop("give a file away (CAP_CHOWN)") == "PermissionError", seen
    assert all(outcome != "read" for outcome in seen.values()), seen
    assert seen["host loopback service"] != "connected", seen
    assert seen["signal a process of the user's"] != "sent", seen
