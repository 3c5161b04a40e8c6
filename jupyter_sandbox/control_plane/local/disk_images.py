"""A root daemon's workspaces as ext4 images of the pool's ``disk_mb``: the kernel
enforces the limit (a write past it fails with ENOSPC), so one sandbox cannot fill
the host's disk.

An ordinary user's daemon has no way to enforce a size (project quotas and loop
devices need root), so there the daemon measures workspaces (``disk_usage.py``)
and marks a claim that is over its limit.

The images are sparse files in ``<state>/disks``: a new 10 GB image takes about
4 MB, and mkfs takes a few milliseconds. Nothing is mounted on the host. At each
start of a sandbox the daemon attaches the image to a loop device (auto-clearing)
and the sandbox's first process mounts it over the workspace in the mount
namespace it makes for itself (``host_uid.mount_idmapped``): the mount lives as
long as the sandbox, and when the sandbox stops, however it stops, the loop device
is freed. A claim's files stay in its image between starts (suspend, resume, a
daemon restart) and the image is deleted with the claim.
"""

from __future__ import annotations

import errno
import fcntl
import logging
import os
import shutil
import struct
import subprocess
import tempfile
from dataclasses import dataclass, replace
from pathlib import Path

from .disk_usage import Usage
from .host_uid import mount, mount_idmapped
from .paths import private_dir

log = logging.getLogger(__name__)

IMAGES_SUBDIR = "disks"
# No reserved blocks (the sandbox is the only user); inode tables and the journal
# are initialised lazily, so a new image costs milliseconds and a few MB.
_MKFS = [
    "mkfs.ext4",
    "-q",
    "-F",
    "-m",
    "0",
    "-E",
    "lazy_itable_init=1,lazy_journal_init=1,root_owner=0:0",
]
# The runtime loads packages' shared libraries from the workspace: not noexec.
_MS_NOSUID, _MS_NODEV = 0x2, 0x4
_LOOP_CTL_GET_FREE = 0x4C82
_LOOP_CONFIGURE = 0x4C0A
_LO_FLAGS_AUTOCLEAR = 4
# struct loop_config: fd, block_size, struct loop_info64 (232 bytes: lo_flags at
# 52), 8 reserved u64
_LOOP_CONFIG_BYTES = 304
_LOOP_CONFIG_FLAGS_AT = 8 + 52
_PROBE_BYTES = 16 * 1024 * 1024
_TIMEOUT = 60


@dataclass
class AttachedImage:
    """An image on a loop device, held open by the daemon until the sandbox's first
    process has mounted it (``release``); the device frees itself after that."""

    device: str
    fd: int
    fresh: bool  # just made: the sandbox's first mount tidies it

    def mount_over(self, workspace: str) -> None:
        """In the child, in its own mount namespace: mount the image at
        ``workspace``; the first time, drop mkfs's lost+found and make it 0700."""
        mount(self.device, workspace, "ext4", _MS_NOSUID | _MS_NODEV)
        if self.fresh:
            os.rmdir(os.path.join(workspace, "lost+found"))  # e2fsck makes it if needed
        os.chmod(workspace, 0o700)

    def release(self) -> None:
        try:
            os.close(self.fd)
        except OSError:
            pass


class DiskImages:
    """Make, attach, measure and delete the workspace images in one directory."""

    def __init__(self, directory: Path) -> None:
        self.directory = private_dir(directory)
        self._shared: dict[str, tuple[AttachedImage, int]] = {}

    def image(self, sandbox: str) -> Path:
        return self.directory / f"{sandbox}.ext4"

    def attach(self, sandbox: str, workspace: Path, size_bytes: int) -> AttachedImage:
        """The sandbox's image on a loop device, made the first time (empty, of
        ``size_bytes``).  Raises OSError or SubprocessError (with mkfs's words) and
        leaves no image made by this call behind."""
        image = self.image(sandbox)
        fresh = not image.exists()
        if fresh:
            if _has_entries(workspace):
                # A workspace from before images: mounting over it would hide it.
                raise OSError(f"{workspace} already holds files; not mounting an image over them")
            self._make(image, size_bytes)
        private_dir(workspace)  # the mount point, empty on the host
        try:
            _wait_unattached(image)
            device, fd = _loop_device(image)
        except BaseException:
            if fresh:
                image.unlink(missing_ok=True)
            raise
        return AttachedImage(device, fd, fresh)

    def holds(self, name: str, mountpoint: Path, limited: bool) -> bool:
        """Whether ``name`` is (or is to be) an image: it is one already, or it
        is new and has a limit.  A plain directory with files stays one."""
        if self.image(name).exists():
            return True
        return limited and not _has_entries(mountpoint)

    def attach_shared(self, name: str, mountpoint: Path, size_bytes: int) -> AttachedImage:
        """An image that several sandboxes mount at once (a project's packages):
        one loop device for all of them, so every mount shares one filesystem (two
        devices over one image would corrupt it).  Each call is matched by one
        ``release_shared``; the device goes after the last."""
        held = self._shared.get(name)
        if held is not None:
            image, users = held
            self._shared[name] = (image, users + 1)
            return replace(image, fresh=False)
        image = self.attach(name, mountpoint, size_bytes)
        self._shared[name] = (image, 1)
        return image

    def release_shared(self, name: str) -> None:
        held = self._shared.pop(name, None)
        if held is None:
            return
        image, users = held
        if users > 1:
            self._shared[name] = (image, users - 1)
        else:
            image.release()

    def _make(self, image: Path, size_bytes: int) -> None:
        try:
            with open(image, "xb") as handle:
                handle.truncate(size_bytes)
            _run([*_MKFS, str(image)])
        except BaseException:
            image.unlink(missing_ok=True)
            raise

    def remove(self, sandbox: str, workspace: Path) -> None:
        """Delete the image and the (empty) mount point."""
        self.image(sandbox).unlink(missing_ok=True)
        shutil.rmtree(workspace, ignore_errors=True)

    @staticmethod
    def usage(workspace: Path) -> Usage:
        """What a mounted image holds (its filesystem's own records included), and
        whether it is full: less room left than a 100th of it, or 2 MB (ext4
        refuses a write while some room is still reserved for its metadata).
        ``workspace`` is a path that shows the mount (the sandbox's, via /proc)."""
        info = os.statvfs(workspace)
        size = _device_size(workspace)
        room = info.f_bavail * info.f_frsize
        full = room < max(2 * 1024 * 1024, size // 100) or info.f_favail == 0
        return Usage(max(0, size - room), info.f_files - info.f_ffree, True, full)


def _loop_device(image: Path) -> tuple[str, int]:
    """Attach ``image`` to a free loop device that clears itself when its last
    user goes; the device's path and an open descriptor."""
    flags = os.O_RDWR | os.O_CLOEXEC
    backing = os.open(image, flags)
    try:
        control = os.open("/dev/loop-control", flags)
        try:
            for _attempt in range(16):  # another process may take the same free one
                number = fcntl.ioctl(control, _LOOP_CTL_GET_FREE)
                device = f"/dev/loop{number}"
                fd = os.open(device, flags)
                config = bytearray(_LOOP_CONFIG_BYTES)
                struct.pack_into("<I", config, 0, backing)
                struct.pack_into("<I", config, _LOOP_CONFIG_FLAGS_AT, _LO_FLAGS_AUTOCLEAR)
                try:
                    fcntl.ioctl(fd, _LOOP_CONFIGURE, bytes(config))
                except OSError as exc:
                    os.close(fd)
                    if exc.errno == errno.EBUSY:
                        continue
                    raise
                return device, fd
            raise OSError(errno.EBUSY, "no free loop device")
        finally:
            os.close(control)
    finally:
        os.close(backing)  # the loop device holds its own reference


def _wait_unattached(image: Path, timeout: float = 10.0) -> None:
    """Wait until no loop device holds ``image``: a sandbox restarted at once must
    not mount it through a second device while the first is still being torn
    down (the kernel clears an auto-clearing device a moment after its last user)."""
    import time

    deadline = time.monotonic() + timeout
    while _attached(image):
        if time.monotonic() > deadline:
            raise OSError(errno.EBUSY, f"{image} is still on a loop device")
        time.sleep(0.05)


def _attached(image: Path) -> bool:
    for backing in Path("/sys/block").glob("loop*/loop/backing_file"):
        try:
            if backing.read_text().strip() == str(image):
                return True
        except OSError:
            continue
    return False


def _device_size(path: Path) -> int:
    """The length of the block device mounted at ``path`` (the image's size)."""
    device = os.stat(path).st_dev
    sysfs = Path(f"/sys/dev/block/{os.major(device)}:{os.minor(device)}/size")
    try:
        return int(sysfs.read_text()) * 512
    except (OSError, ValueError):
        info = os.statvfs(path)
        return info.f_blocks * info.f_frsize


def _has_entries(path: Path) -> bool:
    try:
        with os.scandir(path) as entries:
            return any(True for _ in entries)
    except FileNotFoundError:
        return False


def _run(argv: list[str]) -> None:
    result = subprocess.run(argv, capture_output=True, text=True, timeout=_TIMEOUT)
    if result.returncode != 0:
        words = (result.stderr or result.stdout).strip() or f"exit status {result.returncode}"
        raise subprocess.CalledProcessError(result.returncode, argv, result.stdout, words)


def describe(error: BaseException) -> str:
    if isinstance(error, subprocess.CalledProcessError):
        return f"{Path(error.cmd[0]).name}: {error.stderr}"
    return str(error)


def probe(base: Path) -> DiskImages | str:
    """The images, tried for real (make, attach, mount in a child's namespace,
    write), or why there are none."""
    if os.geteuid() != 0:
        return "needs a root daemon"
    if shutil.which("mkfs.ext4") is None:
        return "mkfs.ext4 not found (Debian/Ubuntu: apt install e2fsprogs)"
    images = DiskImages(base / IMAGES_SUBDIR)
    with tempfile.TemporaryDirectory(dir=base, prefix=".disk-probe-") as scratch:
        workspace = Path(scratch) / "workspace"
        name = Path(scratch).name
        try:
            attached = images.attach(name, workspace, _PROBE_BYTES)
            try:

                def write() -> None:
                    attached.mount_over(str(workspace))
                    with open(workspace / "probe", "wb") as handle:
                        handle.write(b"x")

                subprocess.run(
                    ["true"],
                    check=True,
                    stderr=subprocess.PIPE,
                    preexec_fn=lambda: mount_idmapped([], first=write),
                    timeout=_TIMEOUT,
                )
            finally:
                attached.release()
        except (OSError, subprocess.SubprocessError) as exc:
            detail = getattr(exc, "stderr", b"") or b""
            words = detail.decode(errors="replace").strip() if isinstance(detail, bytes) else ""
            return f"no workspace images: {words or describe(exc)}"
        finally:
            images.remove(name, workspace)
    return images
