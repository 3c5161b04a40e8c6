"""The host uid a root daemon's sandboxes run as.

An ordinary user's sandboxes are that user on the host: bubblewrap maps uid 1000
inside to the user's uid. Run as root, the same mapping made every sandbox host
uid 0 to the kernel, the owner of everything root owns. Instead, as rootful
Podman does with ``--userns=auto``, a root daemon runs its sandboxes as an
unprivileged host uid that owns nothing:

* One user namespace per daemon maps uid 0 to host root and ``SANDBOX_UID`` to
  ``host_uid``. bubblewrap enters it (``--userns``) as uid 0, so it still reaches
  root-only source paths (a Python under ``/root``, the state directory); the
  runtime's first act (``become_sandbox_user``) is to become ``SANDBOX_UID``,
  which drops every capability for good. The namespace allows no nested ones.
* The directories a sandbox writes (its workspace, its runtime directory, the
  notebook's directory) are bound through idmapped mounts that show their owner
  as ``host_uid``: the sandbox writes them as their owner would, and what it
  writes lands on disk owned by that owner, not by a uid nobody knows. The
  mounts are made between fork and exec in the sandbox's own mount namespace,
  so the host never sees them and nothing is left to clean up.

Files a sandbox writes there are owned on disk by the directory's owner (often
root), so the seccomp filter refuses set-user-ID and set-group-ID bits.
"""

from __future__ import annotations

import ctypes
import functools
import logging
import os
import subprocess
import tempfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from .isolation import SANDBOX_UID, WORKSPACE

log = logging.getLogger(__name__)

# A root daemon's sandboxes on the host: far above any distribution's user and
# subordinate ranges (useradd's /etc/subuid ranges start at 100000, systemd's
# dynamic users end at 65519), and below the 2**31 that some tools treat as signed.
DEFAULT_HOST_UID = 2_100_000_000
HOST_UID_ENV = "JUPYTER_SANDBOX_HOST_UID"

_CLONE_NEWUSER = 0x10000000
_CLONE_NEWNS = 0x00020000
_MS_REC = 0x4000
_MS_SLAVE = 1 << 19
# The new mount API (Linux 5.12 for idmapped mounts); the numbers are the same on
# every architecture.
_SYS_OPEN_TREE = 428
_SYS_MOVE_MOUNT = 429
_SYS_MOUNT_SETATTR = 442
_OPEN_TREE_CLONE = 1
_AT_FDCWD = -100
_AT_EMPTY_PATH = 0x1000
_MOVE_MOUNT_F_EMPTY_PATH = 0x4
_MOUNT_ATTR_NOSUID = 0x2
_MOUNT_ATTR_NODEV = 0x4
_MOUNT_ATTR_IDMAP = 0x00100000

_libc = ctypes.CDLL(None, use_errno=True)


class _MountAttr(ctypes.Structure):
    _fields_ = [
        ("attr_set", ctypes.c_uint64),
        ("attr_clr", ctypes.c_uint64),
        ("propagation", ctypes.c_uint64),
        ("userns_fd", ctypes.c_uint64),
    ]


def _check(result: int, what: str) -> int:
    if result < 0:
        err = ctypes.get_errno()
        raise OSError(err, f"{what}: {os.strerror(err)}")
    return result


def mount(source: str, target: str, fstype: str | None, flags: int) -> None:
    """mount(2), with no data; OSError naming what failed."""
    kind = fstype.encode() if fstype is not None else None
    _check(
        _libc.mount(source.encode(), target.encode(), kind, ctypes.c_ulong(flags), None),
        f"mount {source} on {target}",
    )


def _unshare(flags: int) -> None:
    _check(_libc.unshare(ctypes.c_int(flags)), "unshare")


def host_uid_setting() -> int:
    """The host uid for a root daemon's sandboxes: JUPYTER_SANDBOX_HOST_UID, else the default."""
    raw = os.environ.get(HOST_UID_ENV, "")
    try:
        uid = int(raw) if raw else DEFAULT_HOST_UID
    except ValueError:
        raise ValueError(f"{HOST_UID_ENV} must be a uid, not {raw!r}") from None
    if not 0 < uid < 2**32 - 1:
        raise ValueError(f"{HOST_UID_ENV} must be a uid above 0, not {uid}")
    return uid


def user_namespace(uid_map: str, gid_map: str, *, nested: bool) -> int:
    """A new user namespace with these maps, as an open descriptor.

    A short-lived child creates it; the daemon, as root, writes the maps (no
    ``setgroups`` deny needed for a privileged writer); the child then forbids
    nested namespaces unless ``nested`` and exits, as ``bwrap --disable-userns``
    does. The descriptor keeps the namespace alive.
    """
    # The write needs CAP_SYS_RESOURCE in the new namespace: a program executed after
    # the maps are written runs as its uid 0, with every capability there.
    closing = "exec /bin/sh -c 'echo 0 > /proc/sys/user/max_user_namespaces'"
    script = "read go" if nested else f"read go && {closing}"
    child = subprocess.Popen(
        ["/bin/sh", "-c", script],
        stdin=subprocess.PIPE,
        stderr=subprocess.PIPE,
        preexec_fn=lambda: _unshare(_CLONE_NEWUSER),
    )
    assert child.stdin is not None and child.stderr is not None
    try:
        Path(f"/proc/{child.pid}/uid_map").write_text(uid_map)
        Path(f"/proc/{child.pid}/gid_map").write_text(gid_map)
        fd = os.open(f"/proc/{child.pid}/ns/user", os.O_RDONLY | os.O_CLOEXEC)
        child.stdin.write(b"go\n")
        child.stdin.close()
        if child.wait(timeout=10) != 0:
            os.close(fd)
            why = child.stderr.read().decode(errors="replace").strip()
            raise OSError(f"could not close the user namespace to nested ones: {why}")
        return fd
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
        child.stderr.close()


@dataclass(frozen=True)
class IdmappedMount:
    """A directory shown to the sandbox with its owner as the sandbox's host uid."""

    path: str
    userns_fd: int


@dataclass
class HostIdentity:
    """How a root daemon's sandboxes become ``host_uid``: the namespace bubblewrap
    enters, and one idmapping per owner of a directory the sandboxes write."""

    host_uid: int
    userns_fd: int
    _idmaps: dict[tuple[int, int], int] = field(default_factory=dict)
    _idmap_by_device: dict[int, str | None] = field(default_factory=dict)

    def idmapped(self, path: str | os.PathLike[str]) -> IdmappedMount:
        """``path`` through a mount that shows its owner (uid and gid) as ``host_uid``."""
        info = os.stat(path)
        owner = (info.st_uid, info.st_gid)
        if owner not in self._idmaps:
            self._idmaps[owner] = user_namespace(
                f"{owner[0]} {self.host_uid} 1\n", f"{owner[1]} {self.host_uid} 1\n", nested=True
            )
        return IdmappedMount(os.fspath(path), self._idmaps[owner])

    @property
    def sandbox_description(self) -> str:
        return f"runs as host uid {self.host_uid}, not root"

    def idmap_refusal(self, path: str | os.PathLike[str]) -> str | None:
        """Why ``path``'s filesystem cannot be shown to the sandboxes through an
        idmapped mount (NFS, FUSE, ramfs, ...), or None.  The start probe tried
        only the state directory's filesystem; a notebook directory may be on
        another.  Tried on a detached clone that is never attached anywhere."""
        device = os.stat(path).st_dev
        if device not in self._idmap_by_device:
            self._idmap_by_device[device] = _try_idmap(os.fspath(path), self.userns_fd)
        return self._idmap_by_device[device]


def mount_idmapped(
    mounts: Sequence[IdmappedMount], *, first: Callable[[], None] | None = None
) -> None:
    """Between fork and exec: in a mount namespace of the child's own, run
    ``first`` (it mounts the workspace's image), then put an idmapped clone of each
    directory over itself (nosuid, nodev).

    bubblewrap, started next, copies this namespace and binds the directories from
    there. Errors go to the child's stderr (the sandbox's log) before they are raised,
    since subprocess reports only that the pre-exec function failed.
    """
    try:
        private_mount_namespace()
        if first is not None:
            first()
        for mount in mounts:
            _idmap_over_itself(mount)
    except OSError as exc:
        os.write(2, f"jupyter-sandbox: cannot prepare the sandbox's mounts: {exc}\n".encode())
        raise


def private_mount_namespace() -> None:
    """Move the calling process (single-threaded) into a mount namespace of its own:
    mounts the host makes later still appear, and nothing mounted here goes back."""
    _unshare(_CLONE_NEWNS)
    mount("none", "/", None, _MS_REC | _MS_SLAVE)  # mount --make-rslave /


def _idmap_over_itself(mount: IdmappedMount) -> None:
    path = os.fsencode(mount.path)
    tree = _open_tree_clone(mount.path)
    try:
        _set_idmap(tree, mount.userns_fd, mount.path)
        _check(
            _libc.syscall(_SYS_MOVE_MOUNT, tree, b"", _AT_FDCWD, path, _MOVE_MOUNT_F_EMPTY_PATH),
            f"move_mount onto {mount.path}",
        )
    finally:
        os.close(tree)


def _try_idmap(path: str, userns_fd: int) -> str | None:
    try:
        tree = _open_tree_clone(path)
        try:
            _set_idmap(tree, userns_fd, path)
        finally:
            os.close(tree)  # the clone was never attached: closing it drops it
    except OSError as exc:
        return str(exc)
    return None


def _open_tree_clone(path: str) -> int:
    """A detached copy of the mount at ``path`` (a file descriptor)."""
    return _check(
        _libc.syscall(
            _SYS_OPEN_TREE, _AT_FDCWD, os.fsencode(path), _OPEN_TREE_CLONE | os.O_CLOEXEC
        ),
        f"open_tree {path}",
    )


def _set_idmap(tree: int, userns_fd: int, path: str) -> None:
    attr = _MountAttr(_MOUNT_ATTR_IDMAP | _MOUNT_ATTR_NOSUID | _MOUNT_ATTR_NODEV, 0, 0, userns_fd)
    _check(
        _libc.syscall(
            _SYS_MOUNT_SETATTR,
            tree,
            b"",
            _AT_EMPTY_PATH,
            ctypes.byref(attr),
            ctypes.c_size_t(ctypes.sizeof(attr)),
        ),
        f"idmapped mount of {path}",
    )


def become_sandbox_user_code() -> str:
    """Python run first in the sandbox (as uid 0 of the sandboxes' namespace, with
    only CAP_SETUID and CAP_SETGID): become SANDBOX_UID, which clears every
    capability (no_new_privs, set by bubblewrap, keeps them from coming back), and
    enter the workspace, which that uid 0 may not."""
    uid = SANDBOX_UID
    return (
        f"import os; os.setgroups([]); os.setresgid({uid}, {uid}, {uid}); "
        f"os.setresuid({uid}, {uid}, {uid}); os.chdir({WORKSPACE!r}); "
    )


@functools.cache
def probe(state_dir: str) -> HostIdentity | str:
    """The identity for a root daemon's sandboxes, or why there is none.

    Tried for real: the namespace, and an idmapped mount of a directory in the
    state directory (the filesystem must support them: ext4, xfs, btrfs, tmpfs
    since Linux 6.3, ...).
    """
    if os.geteuid() != 0:
        return "not root: sandboxes run as the daemon's own user"
    try:
        host_uid = host_uid_setting()
        maps = f"0 0 1\n{SANDBOX_UID} {host_uid} 1\n"
        fd = user_namespace(maps, maps, nested=False)
    except (OSError, ValueError, subprocess.SubprocessError) as exc:
        return f"no user namespace for the sandboxes: {exc}"
    identity = HostIdentity(host_uid, fd)
    try:
        with tempfile.TemporaryDirectory(dir=state_dir, prefix=".idmap-probe-") as scratch:
            mount = identity.idmapped(scratch)
            subprocess.run(
                ["true"],
                check=True,
                stderr=subprocess.PIPE,
                preexec_fn=lambda: mount_idmapped([mount]),
            )
    except (OSError, subprocess.SubprocessError) as exc:
        detail = getattr(exc, "stderr", b"") or b""
        why = detail.decode(errors="replace").strip() or str(exc)
        os.close(fd)
        return f"no idmapped mounts in {state_dir}: {why}"
    return identity


_PR_CAPBSET_DROP = 24
_PR_SET_SECUREBITS = 28
# No capabilities from being uid 0 at an exec, none kept or raised at a uid change,
# each setting locked.
_SECUREBITS = 0x01 | 0x02 | 0x04 | 0x08 | 0x20 | 0x40 | 0x80
_CAPABILITY_VERSION_3 = 0x20080522


class _CapHeader(ctypes.Structure):
    _fields_ = [("version", ctypes.c_uint32), ("pid", ctypes.c_int)]


class _CapData(ctypes.Structure):
    _fields_ = [
        ("effective", ctypes.c_uint32),
        ("permitted", ctypes.c_uint32),
        ("inheritable", ctypes.c_uint32),
    ]


def drop_capabilities() -> None:
    """Between fork and exec, for a root daemon's sandbox without bubblewrap (Landlock
    alone): still uid 0, so it reads a Python installed under /root, but with no
    capability, now or after any exec. Landlock keeps it to its own files."""
    try:
        last = int(Path("/proc/sys/kernel/cap_last_cap").read_text())
        _check(_libc.prctl(_PR_SET_SECUREBITS, _SECUREBITS, 0, 0, 0), "securebits")
        for cap in range(last + 1):
            _check(_libc.prctl(_PR_CAPBSET_DROP, cap, 0, 0, 0), f"drop capability {cap}")
        data = (_CapData * 2)()
        _check(_libc.capset(ctypes.byref(_CapHeader(_CAPABILITY_VERSION_3, 0)), data), "capset")
    except OSError as exc:
        os.write(2, f"jupyter-sandbox: cannot drop root's capabilities: {exc}\n".encode())
        raise
