"""A root daemon's workspaces as ext4 images of the pool's ``disk_mb``: the kernel
enforces the limit (a write past it fails with ENOSPC), so one sandbox cannot fill
the host's disk.

An ordinary user's daemon has no way to enforce a size (project quotas and loop
mounts need root), so there the daemon measures workspaces (``disk_usage.py``)
and marks a claim that is over its limit.

The images are sparse files in ``<state>/disks``: a new 10 GB image takes about
4 MB, and mkfs and mount take a few milliseconds each. They are mounted in the
daemon's own mount namespace (``host_uid.private_mount_namespace``), which its
sandboxes inherit and the host does not see: when the daemon exits, however it
exits, the mounts and their loop devices go with it, and the next daemon mounts an
image again when it starts its sandbox. A claim's data lives in the image until
the claim is released; then the image is deleted with the workspace.
"""

from __future__ import annotations

import logging
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

from .disk_usage import Usage
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
_MOUNT_OPTIONS = "loop,nosuid,nodev"
_PROBE_BYTES = 16 * 1024 * 1024
_TIMEOUT = 60


class DiskImages:
    """Make, mount, measure and delete the workspace images in one directory."""

    def __init__(self, directory: Path) -> None:
        self.directory = private_dir(directory)

    def image(self, sandbox: str) -> Path:
        return self.directory / f"{sandbox}.ext4"

    def mount(self, sandbox: str, workspace: Path, size_bytes: int) -> None:
        """Mount the sandbox's image at ``workspace``, making it the first time.
        Nothing to do when it is mounted already.  Raises OSError or
        SubprocessError (with mkfs's or mount's words) and leaves no image made
        by this call behind."""
        if os.path.ismount(workspace):
            return
        image = self.image(sandbox)
        fresh = not image.exists()
        if fresh:
            if _has_entries(workspace):
                # A workspace from before images: mounting over it would hide it.
                raise OSError(f"{workspace} already holds files; not mounting an image over them")
            self._make(image, size_bytes)
        private_dir(workspace)
        try:
            _run(["mount", "-t", "ext4", "-o", _MOUNT_OPTIONS, str(image), str(workspace)])
        except BaseException:
            if fresh:
                image.unlink(missing_ok=True)
            raise
        if fresh:
            (workspace / "lost+found").rmdir()  # e2fsck makes it again if it needs one
        workspace.chmod(0o700)

    def _make(self, image: Path, size_bytes: int) -> None:
        try:
            with open(image, "xb") as handle:
                handle.truncate(size_bytes)
            _run([*_MKFS, str(image)])
        except BaseException:
            image.unlink(missing_ok=True)
            raise

    def unmount(self, workspace: Path) -> None:
        if not os.path.ismount(workspace):
            return
        try:
            _run(["umount", str(workspace)])
        except subprocess.CalledProcessError:
            # Still busy (a process of the sandbox not reaped yet): detach it now,
            # the loop device goes when the last user does.
            _run(["umount", "--lazy", str(workspace)])

    def remove(self, sandbox: str, workspace: Path) -> None:
        """Unmount and delete the image and the mount point."""
        self.unmount(workspace)
        self.image(sandbox).unlink(missing_ok=True)
        shutil.rmtree(workspace, ignore_errors=True)

    def holds(self, sandbox: str) -> bool:
        return self.image(sandbox).exists()

    @staticmethod
    def usage(workspace: Path) -> Usage:
        """What the mounted image holds (its filesystem's own records included),
        and whether it is full: less room left than a 200th of it, or 1 MB."""
        info = os.statvfs(workspace)
        size = _image_size(workspace)
        room = info.f_bavail * info.f_frsize
        full = room < max(1024 * 1024, size // 200) or info.f_favail == 0
        return Usage(max(0, size - room), info.f_files - info.f_ffree, True, full)


def _image_size(workspace: Path) -> int:
    """The mounted image's length (its pool's ``disk_mb``), from its loop device."""
    device = os.stat(workspace).st_dev
    sysfs = Path(f"/sys/dev/block/{os.major(device)}:{os.minor(device)}/size")
    try:
        return int(sysfs.read_text()) * 512
    except (OSError, ValueError):
        info = os.statvfs(workspace)
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
    """The images, tried for real (make, mount, write, unmount), or why there are
    none.  Call it in the daemon's own mount namespace."""
    if os.geteuid() != 0:
        return "needs a root daemon"
    missing = [tool for tool in ("mkfs.ext4", "mount", "umount") if shutil.which(tool) is None]
    if missing:
        return f"{', '.join(missing)} not found (Debian/Ubuntu: apt install e2fsprogs mount)"
    images = DiskImages(base / IMAGES_SUBDIR)
    with tempfile.TemporaryDirectory(dir=base, prefix=".disk-probe-") as scratch:
        workspace = Path(scratch) / "workspace"
        name = Path(scratch).name
        try:
            images.mount(name, workspace, _PROBE_BYTES)
            (workspace / "probe").write_bytes(b"x")
        except (OSError, subprocess.SubprocessError) as exc:
            return f"no workspace images: {describe(exc)}"
        finally:
            try:
                images.remove(name, workspace)
            except (OSError, subprocess.SubprocessError) as exc:
                log.warning("could not remove the disk image probe: %s", describe(exc))
    return images
